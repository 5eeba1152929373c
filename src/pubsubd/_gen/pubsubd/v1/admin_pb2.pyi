from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
