import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetTopicRangesRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class SourceRange(_message.Message):
    __slots__ = ("source", "earliest_offset", "latest_offset")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LATEST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    source: int
    earliest_offset: int
    latest_offset: int
    def __init__(self, source: _Optional[int] = ..., earliest_offset: _Optional[int] = ..., latest_offset: _Optional[int] = ...) -> None: ...

class GetTopicRangesResponse(_message.Message):
    __slots__ = ("sources",)
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedCompositeFieldContainer[SourceRange]
    def __init__(self, sources: _Optional[_Iterable[_Union[SourceRange, _Mapping]]] = ...) -> None: ...

class LookupOffsetsRequest(_message.Message):
    __slots__ = ("topic", "time")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    time: _timestamp_pb2.Timestamp
    def __init__(self, topic: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LookupOffsetsResponse(_message.Message):
    __slots__ = ("offsets",)
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.ScalarMap[int, int]
    def __init__(self, offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("topic", "source", "start_offset", "end_offset", "max_messages", "max_bytes", "columnar", "arrow")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_FIELD_NUMBER: _ClassVar[int]
    ARROW_FIELD_NUMBER: _ClassVar[int]
    topic: str
    source: int
    start_offset: int
    end_offset: int
    max_messages: int
    max_bytes: int
    columnar: bool
    arrow: bool
    def __init__(self, topic: _Optional[str] = ..., source: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., columnar: _Optional[bool] = ..., arrow: _Optional[bool] = ...) -> None: ...

class ReplayMessage(_message.Message):
    __slots__ = ("offset", "message_id", "data", "attributes", "ordering_key", "publish_time")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    offset: int
    message_id: str
    data: bytes
    attributes: _containers.ScalarMap[str, str]
    ordering_key: str
    publish_time: _timestamp_pb2.Timestamp
    def __init__(self, offset: _Optional[int] = ..., message_id: _Optional[str] = ..., data: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, str]] = ..., ordering_key: _Optional[str] = ..., publish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReadColumns(_message.Message):
    __slots__ = ("offsets", "data", "ordering_keys", "publish_time_us", "attribute_counts", "attribute_keys", "attribute_values")
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEYS_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_US_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_KEYS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_VALUES_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    data: _containers.RepeatedScalarFieldContainer[bytes]
    ordering_keys: _containers.RepeatedScalarFieldContainer[str]
    publish_time_us: _containers.RepeatedScalarFieldContainer[int]
    attribute_counts: _containers.RepeatedScalarFieldContainer[int]
    attribute_keys: _containers.RepeatedScalarFieldContainer[str]
    attribute_values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, offsets: _Optional[_Iterable[int]] = ..., data: _Optional[_Iterable[bytes]] = ..., ordering_keys: _Optional[_Iterable[str]] = ..., publish_time_us: _Optional[_Iterable[int]] = ..., attribute_counts: _Optional[_Iterable[int]] = ..., attribute_keys: _Optional[_Iterable[str]] = ..., attribute_values: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("messages", "next_offset", "columns", "arrow_ipc")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ReplayMessage]
    next_offset: int
    columns: ReadColumns
    arrow_ipc: bytes
    def __init__(self, messages: _Optional[_Iterable[_Union[ReplayMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., columns: _Optional[_Union[ReadColumns, _Mapping]] = ..., arrow_ipc: _Optional[bytes] = ...) -> None: ...

class GetCursorRequest(_message.Message):
    __slots__ = ("topic", "name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Cursor(_message.Message):
    __slots__ = ("topic", "name", "offsets", "commit_time")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    offsets: _containers.ScalarMap[int, int]
    commit_time: _timestamp_pb2.Timestamp
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ..., offsets: _Optional[_Mapping[int, int]] = ..., commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CommitCursorRequest(_message.Message):
    __slots__ = ("topic", "name", "offsets")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    offsets: _containers.ScalarMap[int, int]
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ..., offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class DeduplicatedMessage(_message.Message):
    __slots__ = ("dedup_id", "data", "attributes", "ordering_key")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEDUP_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    dedup_id: str
    data: bytes
    attributes: _containers.ScalarMap[str, str]
    ordering_key: str
    def __init__(self, dedup_id: _Optional[str] = ..., data: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, str]] = ..., ordering_key: _Optional[str] = ...) -> None: ...

class PublishDeduplicatedRequest(_message.Message):
    __slots__ = ("topic", "messages", "source")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    messages: _containers.RepeatedCompositeFieldContainer[DeduplicatedMessage]
    source: int
    def __init__(self, topic: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[DeduplicatedMessage, _Mapping]]] = ..., source: _Optional[int] = ...) -> None: ...

class PublishDeduplicatedResponse(_message.Message):
    __slots__ = ("message_ids", "duplicates")
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    duplicates: int
    def __init__(self, message_ids: _Optional[_Iterable[str]] = ..., duplicates: _Optional[int] = ...) -> None: ...

class SeekOffsetsRequest(_message.Message):
    __slots__ = ("subscription", "offsets")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    subscription: str
    offsets: _containers.ScalarMap[int, int]
    def __init__(self, subscription: _Optional[str] = ..., offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class SeekOffsetsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCursorsRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class ListCursorsResponse(_message.Message):
    __slots__ = ("cursors",)
    CURSORS_FIELD_NUMBER: _ClassVar[int]
    cursors: _containers.RepeatedCompositeFieldContainer[Cursor]
    def __init__(self, cursors: _Optional[_Iterable[_Union[Cursor, _Mapping]]] = ...) -> None: ...

class DeleteCursorRequest(_message.Message):
    __slots__ = ("topic", "name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteCursorResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
