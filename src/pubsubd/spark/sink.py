"""The ``pubsubd`` sink: Arrow writers that publish rows with deterministic dedup IDs.

Columns: ``data`` (binary or string, required); ``attributes`` (map<string,string>),
``ordering_key`` (string) and ``dedup_id`` (string) are optional; other columns are ignored, so a
frame read from the ``pubsubd`` source can be written as it is.

Every row is published through ``PublishDeduplicated`` with a dedup ID, and the server drops an ID
it has already stored (within its dedup window). Without a ``dedup_id`` column the ID is

* streaming: ``{queryId}:{batchId}:{partitionId}:{row}`` -- the query ID is stable across restarts
  from a checkpoint, so a micro-batch replayed after a crash publishes nothing twice;
* batch: ``{writeId}:{partitionId}:{row}`` with the ``writeId`` option (a caller-chosen stable id
  makes a re-run of the same job idempotent) or a fresh id per write (task retries are then
  idempotent).

Row numbers are stable only when the rows of a partition arrive in the same order on replay (a
source -> projection -> sink plan; no shuffle or non-deterministic expression before the sink).
Otherwise give each row its own ``dedup_id``.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import accumulate
from operator import add
from typing import Any, cast

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from pubsubd._gen.pubsubd.v1 import replay_pb2
from pubsubd.core.dedup_batches import encode_request
from pubsubd.spark.client import PendingPublish, get_client
from pubsubd.spark.options import OptionError, SinkOptions

log = logging.getLogger("pubsubd.spark")

_MAX_REQUEST_BYTES = 8 * 1024 * 1024  # below the server's 10 MB per request
_OVERHEAD_BYTES = 6  # tags and lengths per field (an estimate; the limit above leaves room)
# Requests in flight per task: the worker builds the next while the server stores the last. Two
# is enough to overlap them; more would only queue behind the server's single event loop.
_IN_FLIGHT = 2


@dataclass
class PublishCommit(WriterCommitMessage):
    """What one task published: rows sent and how many the server had already stored."""

    partition_id: int
    published: int
    duplicates: int


def check_schema(schema: StructType) -> None:
    """Fail on the driver, before any task runs, when the columns cannot be published."""
    fields = {f.name: f.dataType for f in schema.fields}
    data = fields.get("data")
    if data is None:
        raise OptionError("the pubsubd sink needs a column data (binary or string)")
    if not isinstance(data, BinaryType | StringType):
        raise OptionError(f"column data must be binary or string, not {data.simpleString()}")
    attrs = fields.get("attributes")
    if attrs is not None and not (
        isinstance(attrs, MapType)
        and isinstance(attrs.keyType, StringType)
        and isinstance(attrs.valueType, StringType)
    ):
        raise OptionError(
            f"column attributes must be map<string,string>, not {attrs.simpleString()}"
        )
    for name in ("ordering_key", "dedup_id"):
        typ = fields.get(name)
        if typ is not None and not isinstance(typ, StringType):
            raise OptionError(f"column {name} must be a string, not {typ.simpleString()}")


def publish_batches(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], id_prefix: str, partition_id: int
) -> PublishCommit:
    """Publish every row of ``batches`` in requests of at most ``opts.batch_size`` messages,
    keeping up to ``_IN_FLIGHT`` requests in flight (one when rows have ordering keys, so a
    key's messages are stored in row order). Rows of only ``data`` (no attributes, ordering
    keys or own dedup IDs) become request bytes directly (``core.dedup_batches.encode_request``,
    no per-row message object); others are built from the Arrow columns, one ``add`` per row."""
    client = get_client(opts.endpoint, opts.security)
    in_flight: deque[PendingPublish] = deque()
    published = duplicates = row = 0
    request: Any = None
    request_bytes = 0
    limit = _IN_FLIGHT
    plain: list[bytes] = []  # data-only rows waiting for a request, from row number ``row``

    def collect(keep: int) -> None:
        nonlocal published, duplicates
        while len(in_flight) > keep:
            answered, dups = in_flight.popleft().result()
            published += answered
            duplicates += dups

    def submit(message: Any) -> None:
        collect(limit - 1)
        in_flight.append(client.start_publish(message))

    def send() -> None:
        nonlocal request, request_bytes
        if request is not None:
            submit(request)
        request, request_bytes = None, 0

    def send_plain(final: bool) -> None:
        """Requests of the waiting data-only rows; a last partial one only if ``final``."""
        nonlocal plain, row
        while len(plain) >= opts.batch_size or (final and plain):
            count = _plain_rows(plain, opts.batch_size, len(id_prefix) + 20)
            ids = [f"{id_prefix}:{n}".encode() for n in range(row, row + count)]
            submit(encode_request(opts.topic, ids, plain[:count]))
            row += count
            del plain[:count]

    for batch in batches:
        names = batch.schema.names
        data = _binary_column(batch.column(names.index("data")))
        attrs = _column(batch, "attributes")
        keys = _column(batch, "ordering_key")
        dedup = _column(batch, "dedup_id")
        if attrs is None and keys is None and dedup is None:
            send()
            plain += [d or b"" for d in data] if None in data else cast(list[bytes], data)
            send_plain(final=False)
            continue
        send_plain(final=True)
        if keys is not None and any(keys):
            send()
            collect(0)
            limit = 1
        for i in range(batch.num_rows):
            payload = data[i] or b""
            dedup_id = dedup[i] if dedup is not None and dedup[i] else f"{id_prefix}:{row}"
            row += 1
            attributes = attrs[i] if attrs is not None else None
            key = keys[i] if keys is not None else None
            size = len(payload) + len(dedup_id) + _OVERHEAD_BYTES
            if attributes:
                size += sum(len(k) + len(v) + _OVERHEAD_BYTES for k, v in attributes)
            if key:
                size += len(key)
            if request is not None and (
                len(request.messages) >= opts.batch_size
                or request_bytes + size > _MAX_REQUEST_BYTES
            ):
                send()
            if request is None:
                request = replay_pb2.PublishDeduplicatedRequest(topic=opts.topic)
            message = request.messages.add(dedup_id=dedup_id, data=payload)
            if attributes:
                message.attributes.update(dict(attributes))
            if key:
                message.ordering_key = key
            request_bytes += size
    send_plain(final=True)
    send()
    collect(0)
    return PublishCommit(partition_id, published, duplicates)


def _plain_rows(data: list[bytes], batch_size: int, id_bytes: int) -> int:
    """How many of the waiting data-only rows (from the first) the next request takes: at most
    ``batch_size``, within ``_MAX_REQUEST_BYTES`` (at least one)."""
    n = min(len(data), batch_size)
    per_row = id_bytes + 2 * _OVERHEAD_BYTES
    sizes = accumulate(map(len, data[:n]))
    total = list(map(add, sizes, range(per_row, per_row * (n + 1), per_row)))
    return max(bisect_right(total, _MAX_REQUEST_BYTES), 1)


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i).to_pylist()


def _binary_column(column: pa.Array) -> list[bytes | None]:
    """The ``data`` column as bytes (a string column is UTF-8 already: cast without a copy)."""
    if not pa.types.is_binary(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()  # type: ignore[no-any-return]


def _task() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the pubsubd writer must run inside a Spark task")
    return ctx


class PubsubdBatchWriter(DataSourceArrowWriter):
    """``df.write.format("pubsubd")``."""

    def __init__(self, schema: StructType, options: Mapping[str, Any]) -> None:
        check_schema(schema)
        self.opts = SinkOptions.parse(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishCommit:
        pid = _task().partitionId()
        return publish_batches(self.opts, iterator, f"{self.opts.write_id}:{pid}", pid)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(self.opts.topic, f"write {self.opts.write_id}", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("pubsubd write %s to %s aborted", self.opts.write_id, self.opts.topic)


class PubsubdStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("pubsubd")``: effectively-once through dedup IDs."""

    def __init__(self, schema: StructType, options: Mapping[str, Any]) -> None:
        check_schema(schema)
        self.opts = SinkOptions.parse(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishCommit:
        ctx = _task()
        pid = ctx.partitionId()
        query = ctx.getLocalProperty("sql.streaming.queryId") or self.opts.write_id
        batch = ctx.getLocalProperty("streaming.sql.batchId") or "0"
        return publish_batches(self.opts, iterator, f"{query}:{batch}:{pid}", pid)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_commit(self.opts.topic, f"batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("pubsubd sink batch %s to %s aborted", batchId, self.opts.topic)


def _log_commit(topic: str, what: str, messages: list[WriterCommitMessage | None]) -> None:
    done = [m for m in messages if isinstance(m, PublishCommit)]
    log.info(
        "pubsubd %s to %s: %d rows published, %d already stored",
        what,
        topic,
        sum(m.published for m in done),
        sum(m.duplicates for m in done),
    )
