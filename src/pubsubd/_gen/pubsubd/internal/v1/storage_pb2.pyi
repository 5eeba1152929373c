from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AppendRequest(_message.Message):
    __slots__ = ("protocol_version", "ledger_id", "epoch", "first_offset", "frames", "last_add_confirmed")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    ledger_id: int
    epoch: int
    first_offset: int
    frames: bytes
    last_add_confirmed: int
    def __init__(self, protocol_version: _Optional[int] = ..., ledger_id: _Optional[int] = ..., epoch: _Optional[int] = ..., first_offset: _Optional[int] = ..., frames: _Optional[bytes] = ..., last_add_confirmed: _Optional[int] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("end_offset",)
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    end_offset: int
    def __init__(self, end_offset: _Optional[int] = ...) -> None: ...

class AppendStreamRequest(_message.Message):
    __slots__ = ("request_id", "append")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    append: AppendRequest
    def __init__(self, request_id: _Optional[int] = ..., append: _Optional[_Union[AppendRequest, _Mapping]] = ...) -> None: ...

class AppendStreamResponse(_message.Message):
    __slots__ = ("request_id", "end_offset", "code", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    end_offset: int
    code: int
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[int] = ..., end_offset: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("protocol_version", "ledger_id", "epoch")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    ledger_id: int
    epoch: int
    def __init__(self, protocol_version: _Optional[int] = ..., ledger_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class FenceResponse(_message.Message):
    __slots__ = ("exists", "first_offset", "end_offset", "last_add_confirmed", "fenced_epoch")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    FENCED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    first_offset: int
    end_offset: int
    last_add_confirmed: int
    fenced_epoch: int
    def __init__(self, exists: _Optional[bool] = ..., first_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., last_add_confirmed: _Optional[int] = ..., fenced_epoch: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("protocol_version", "ledger_id", "start_offset", "end_offset", "max_bytes")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    ledger_id: int
    start_offset: int
    end_offset: int
    max_bytes: int
    def __init__(self, protocol_version: _Optional[int] = ..., ledger_id: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("frames", "node_end_offset")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    NODE_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    frames: bytes
    node_end_offset: int
    def __init__(self, frames: _Optional[bytes] = ..., node_end_offset: _Optional[int] = ...) -> None: ...

class LedgerInfo(_message.Message):
    __slots__ = ("ledger_id", "first_offset", "end_offset", "last_add_confirmed", "fenced_epoch", "bytes", "digest", "healthy_disks")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    FENCED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_DISKS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_offset: int
    end_offset: int
    last_add_confirmed: int
    fenced_epoch: int
    bytes: int
    digest: int
    healthy_disks: int
    def __init__(self, ledger_id: _Optional[int] = ..., first_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., last_add_confirmed: _Optional[int] = ..., fenced_epoch: _Optional[int] = ..., bytes: _Optional[int] = ..., digest: _Optional[int] = ..., healthy_disks: _Optional[int] = ...) -> None: ...

class ListLedgersRequest(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class ListLedgersResponse(_message.Message):
    __slots__ = ("ledgers", "fenced_only")
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    FENCED_ONLY_FIELD_NUMBER: _ClassVar[int]
    ledgers: _containers.RepeatedCompositeFieldContainer[LedgerInfo]
    fenced_only: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ledgers: _Optional[_Iterable[_Union[LedgerInfo, _Mapping]]] = ..., fenced_only: _Optional[_Iterable[int]] = ...) -> None: ...

class DeleteLedgerRequest(_message.Message):
    __slots__ = ("protocol_version", "ledger_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    ledger_id: int
    def __init__(self, protocol_version: _Optional[int] = ..., ledger_id: _Optional[int] = ...) -> None: ...

class DeleteLedgerResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class Disk(_message.Message):
    __slots__ = ("path", "healthy", "free_bytes", "error")
    PATH_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    path: str
    healthy: bool
    free_bytes: int
    error: str
    def __init__(self, path: _Optional[str] = ..., healthy: _Optional[bool] = ..., free_bytes: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("node_id", "zone", "protocol_version", "min_protocol_version", "disks", "free_bytes", "ledgers", "serving")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MIN_PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    zone: str
    protocol_version: int
    min_protocol_version: int
    disks: _containers.RepeatedCompositeFieldContainer[Disk]
    free_bytes: int
    ledgers: int
    serving: bool
    def __init__(self, node_id: _Optional[str] = ..., zone: _Optional[str] = ..., protocol_version: _Optional[int] = ..., min_protocol_version: _Optional[int] = ..., disks: _Optional[_Iterable[_Union[Disk, _Mapping]]] = ..., free_bytes: _Optional[int] = ..., ledgers: _Optional[int] = ..., serving: _Optional[bool] = ...) -> None: ...
