from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

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
