from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TailRequest(_message.Message):
    __slots__ = ("protocol_version", "topic_uid", "source", "from_offset", "max_bytes")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_UID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    topic_uid: str
    source: int
    from_offset: int
    max_bytes: int
    def __init__(self, protocol_version: _Optional[int] = ..., topic_uid: _Optional[str] = ..., source: _Optional[int] = ..., from_offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class TailResponse(_message.Message):
    __slots__ = ("source_count", "start_offset", "committed_offset", "first_offset", "frames", "damage_policy")
    SOURCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    DAMAGE_POLICY_FIELD_NUMBER: _ClassVar[int]
    source_count: int
    start_offset: int
    committed_offset: int
    first_offset: int
    frames: bytes
    damage_policy: str
    def __init__(self, source_count: _Optional[int] = ..., start_offset: _Optional[int] = ..., committed_offset: _Optional[int] = ..., first_offset: _Optional[int] = ..., frames: _Optional[bytes] = ..., damage_policy: _Optional[str] = ...) -> None: ...

class SubscriptionRequest(_message.Message):
    __slots__ = ("protocol_version", "topic_uid", "subscription_uid")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_UID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_UID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    topic_uid: str
    subscription_uid: str
    def __init__(self, protocol_version: _Optional[int] = ..., topic_uid: _Optional[str] = ..., subscription_uid: _Optional[str] = ...) -> None: ...

class CursorState(_message.Message):
    __slots__ = ("source", "mark_delete", "ranges")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    source: int
    mark_delete: int
    ranges: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, source: _Optional[int] = ..., mark_delete: _Optional[int] = ..., ranges: _Optional[_Iterable[int]] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("protocol_version", "topic_uid", "subscription_uid", "start_offsets")
    class StartOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_UID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_UID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    topic_uid: str
    subscription_uid: str
    start_offsets: _containers.ScalarMap[int, int]
    def __init__(self, protocol_version: _Optional[int] = ..., topic_uid: _Optional[str] = ..., subscription_uid: _Optional[str] = ..., start_offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class AttachResponse(_message.Message):
    __slots__ = ("cursors", "source_count")
    CURSORS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    cursors: _containers.RepeatedCompositeFieldContainer[CursorState]
    source_count: int
    def __init__(self, cursors: _Optional[_Iterable[_Union[CursorState, _Mapping]]] = ..., source_count: _Optional[int] = ...) -> None: ...

class RecordAcksRequest(_message.Message):
    __slots__ = ("protocol_version", "topic_uid", "subscription_uid", "acks")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_UID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_UID_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    topic_uid: str
    subscription_uid: str
    acks: _containers.RepeatedCompositeFieldContainer[CursorState]
    def __init__(self, protocol_version: _Optional[int] = ..., topic_uid: _Optional[str] = ..., subscription_uid: _Optional[str] = ..., acks: _Optional[_Iterable[_Union[CursorState, _Mapping]]] = ...) -> None: ...

class ResetCursorsRequest(_message.Message):
    __slots__ = ("protocol_version", "topic_uid", "subscription_uid", "cursors")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_UID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_UID_FIELD_NUMBER: _ClassVar[int]
    CURSORS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    topic_uid: str
    subscription_uid: str
    cursors: _containers.RepeatedCompositeFieldContainer[CursorState]
    def __init__(self, protocol_version: _Optional[int] = ..., topic_uid: _Optional[str] = ..., subscription_uid: _Optional[str] = ..., cursors: _Optional[_Iterable[_Union[CursorState, _Mapping]]] = ...) -> None: ...

class SetPublishBlockRequest(_message.Message):
    __slots__ = ("protocol_version", "topic_uid", "subscription_uid", "reason", "from_us")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_UID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_UID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FROM_US_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    topic_uid: str
    subscription_uid: str
    reason: str
    from_us: int
    def __init__(self, protocol_version: _Optional[int] = ..., topic_uid: _Optional[str] = ..., subscription_uid: _Optional[str] = ..., reason: _Optional[str] = ..., from_us: _Optional[int] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
