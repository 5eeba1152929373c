from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RoutingConstraints(_message.Message):
    __slots__ = ("drained_forwarders", "drained_zones", "pinned_topics")
    class PinnedTopicsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DRAINED_FORWARDERS_FIELD_NUMBER: _ClassVar[int]
    DRAINED_ZONES_FIELD_NUMBER: _ClassVar[int]
    PINNED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    drained_forwarders: _containers.RepeatedScalarFieldContainer[str]
    drained_zones: _containers.RepeatedScalarFieldContainer[str]
    pinned_topics: _containers.ScalarMap[str, str]
    def __init__(self, drained_forwarders: _Optional[_Iterable[str]] = ..., drained_zones: _Optional[_Iterable[str]] = ..., pinned_topics: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetRoutingConstraintsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TopicPin(_message.Message):
    __slots__ = ("topic", "forwarder_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    forwarder_id: str
    def __init__(self, topic: _Optional[str] = ..., forwarder_id: _Optional[str] = ...) -> None: ...

class ChangeRoutingConstraintsRequest(_message.Message):
    __slots__ = ("drain_forwarder", "undrain_forwarder", "drain_zone", "undrain_zone", "pin_topic", "unpin_topic")
    DRAIN_FORWARDER_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FORWARDER_FIELD_NUMBER: _ClassVar[int]
    DRAIN_ZONE_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_ZONE_FIELD_NUMBER: _ClassVar[int]
    PIN_TOPIC_FIELD_NUMBER: _ClassVar[int]
    UNPIN_TOPIC_FIELD_NUMBER: _ClassVar[int]
    drain_forwarder: str
    undrain_forwarder: str
    drain_zone: str
    undrain_zone: str
    pin_topic: TopicPin
    unpin_topic: str
    def __init__(self, drain_forwarder: _Optional[str] = ..., undrain_forwarder: _Optional[str] = ..., drain_zone: _Optional[str] = ..., undrain_zone: _Optional[str] = ..., pin_topic: _Optional[_Union[TopicPin, _Mapping]] = ..., unpin_topic: _Optional[str] = ...) -> None: ...

class DamagedRange(_message.Message):
    __slots__ = ("topic", "source", "first_offset", "end_offset", "file", "byte_start", "byte_stop", "reason", "found", "topic_storage")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    BYTE_START_FIELD_NUMBER: _ClassVar[int]
    BYTE_STOP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    TOPIC_STORAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    source: int
    first_offset: int
    end_offset: int
    file: str
    byte_start: int
    byte_stop: int
    reason: str
    found: str
    topic_storage: str
    def __init__(self, topic: _Optional[str] = ..., source: _Optional[int] = ..., first_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., file: _Optional[str] = ..., byte_start: _Optional[int] = ..., byte_stop: _Optional[int] = ..., reason: _Optional[str] = ..., found: _Optional[str] = ..., topic_storage: _Optional[str] = ...) -> None: ...

class ListDamagedRangesRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class ListDamagedRangesResponse(_message.Message):
    __slots__ = ("ranges",)
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[DamagedRange]
    def __init__(self, ranges: _Optional[_Iterable[_Union[DamagedRange, _Mapping]]] = ...) -> None: ...

class SkipDamagedRangesRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class SkipDamagedRangesResponse(_message.Message):
    __slots__ = ("skipped", "messages_lost")
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_LOST_FIELD_NUMBER: _ClassVar[int]
    skipped: _containers.RepeatedCompositeFieldContainer[DamagedRange]
    messages_lost: int
    def __init__(self, skipped: _Optional[_Iterable[_Union[DamagedRange, _Mapping]]] = ..., messages_lost: _Optional[int] = ...) -> None: ...
