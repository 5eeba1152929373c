from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GiveBackRequest(_message.Message):
    __slots__ = ("protocol_version", "subscription", "ack_ids")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ACK_IDS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    subscription: str
    ack_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, protocol_version: _Optional[int] = ..., subscription: _Optional[str] = ..., ack_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GiveBackResponse(_message.Message):
    __slots__ = ("given_back",)
    GIVEN_BACK_FIELD_NUMBER: _ClassVar[int]
    given_back: int
    def __init__(self, given_back: _Optional[int] = ...) -> None: ...

class IdentifyRequest(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class IdentifyResponse(_message.Message):
    __slots__ = ("protocol_version", "session_id", "forwarder_id", "version")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    session_id: int
    forwarder_id: str
    version: str
    def __init__(self, protocol_version: _Optional[int] = ..., session_id: _Optional[int] = ..., forwarder_id: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class SubscriptionCursorsRequest(_message.Message):
    __slots__ = ("protocol_version", "subscription")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    subscription: str
    def __init__(self, protocol_version: _Optional[int] = ..., subscription: _Optional[str] = ...) -> None: ...

class SourceCursor(_message.Message):
    __slots__ = ("source", "mark_delete", "ranges")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    source: int
    mark_delete: int
    ranges: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, source: _Optional[int] = ..., mark_delete: _Optional[int] = ..., ranges: _Optional[_Iterable[int]] = ...) -> None: ...

class SubscriptionCursorsResponse(_message.Message):
    __slots__ = ("cursors",)
    CURSORS_FIELD_NUMBER: _ClassVar[int]
    cursors: _containers.RepeatedCompositeFieldContainer[SourceCursor]
    def __init__(self, cursors: _Optional[_Iterable[_Union[SourceCursor, _Mapping]]] = ...) -> None: ...

class CatchUpRequest(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class CatchUpResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
