"""The ``pubsubd`` Spark data source: streaming and batch readers over a topic's retained log.

Where each method runs (Spark pickles the source, readers and writers with cloudpickle):

* ``initialOffset``, ``latestOffset``, ``partitions``, ``commit``, ``reportLatestOffset`` and
  ``stop`` run in one long-lived Python process on the driver; state kept on ``self`` survives
  between micro-batches there.
* ``read(partition)`` runs in executor Python workers on another copy of the reader, so everything
  it needs travels in the :class:`RangePartition`.

Offsets are ``{"<topic>": {"<partition>": next offset}}`` (Kafka's form); Spark's checkpoint is
the only thing that decides where a restarted query resumes. The ``subscription`` option names a
cursor that ``commit`` advances (one micro-batch behind Spark, so it never runs ahead of what
Spark made durable) so that the service's backlog metrics show the pipeline's lag.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np  # a dependency of pandas (the spark extra) and of PySpark's Arrow path
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pubsubd.core import ids
from pubsubd.core.client_security import ClientSecurity
from pubsubd.spark import offsets as off
from pubsubd.spark.client import ReplayError, get_client
from pubsubd.spark.options import SourceOptions

log = logging.getLogger("pubsubd.spark")

SCHEMA_DDL = (
    "topic string, partition int, offset long, message_id string, ordering_key string, "
    "data binary, attributes map<string,string>, publish_time timestamp"
)

# Spark compares a returned RecordBatch's schema with its own Arrow schema exactly
# (pyspark.sql.pandas.types.to_arrow_schema(schema, timezone="UTC")).
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("message_id", pa.string()),
        ("ordering_key", pa.string()),
        ("data", pa.binary()),
        ("attributes", pa.map_(pa.string(), pa.string())),
        ("publish_time", pa.timestamp("us", tz="UTC")),
    ]
)

# The same schema as Spark types: what a user-specified schema is checked against.
DEFAULT_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("message_id", StringType()),
        StructField("ordering_key", StringType()),
        StructField("data", BinaryType()),
        StructField("attributes", MapType(StringType(), StringType())),
        StructField("publish_time", TimestampType()),
    ]
)
_NEVER_NULL = frozenset(DEFAULT_SCHEMA.names) - {"ordering_key"}

_BYTES_SAMPLE = 64  # messages read per partition to estimate message size for maxBytesPerTrigger


class DataLossError(RuntimeError):
    """Offsets the query needs are no longer retained (``failOnDataLoss=true``)."""


class SchemaError(ValueError):
    """A user-specified schema that is not a selection of the source's columns."""


@dataclass(frozen=True)
class Projection:
    """The columns a query reads: ``names`` (of the default schema, in the order the user
    asked for them) and ``schema``, the Arrow schema Spark expects of each batch (the user's
    field names and nullability)."""

    names: tuple[str, ...]
    schema: pa.Schema


FULL = Projection(tuple(ARROW_SCHEMA.names), ARROW_SCHEMA)


def projection_for(schema: StructType | None) -> Projection:
    """The projection a schema Spark hands to ``reader``/``streamReader`` asks for: the default
    schema (or none) reads every column; a user-specified schema (``.schema("offset long, data
    binary")``) may name any of the default columns, each once, in any order, with its default
    type (names match case-insensitively, as Spark resolves columns), and reads only those.
    ``NOT NULL`` is accepted for every column but ``ordering_key`` (null for unkeyed messages).
    Anything else raises :class:`SchemaError`."""
    if schema is None:
        return FULL
    default = {f.name: f.dataType for f in DEFAULT_SCHEMA.fields}
    names: list[str] = []
    for f in schema.fields:
        name = f.name.lower()
        if name not in default:
            raise SchemaError(
                f"pubsubd source has no column {f.name!r}; a user-specified schema may select "
                f"any of: {SCHEMA_DDL}"
            )
        if name in names:
            raise SchemaError(f"pubsubd source: column {f.name!r} appears twice in the schema")
        if f.dataType.simpleString() != default[name].simpleString():
            raise SchemaError(
                f"pubsubd source: column {f.name!r} is {default[name].simpleString()}, "
                f"not {f.dataType.simpleString()} (cast it after load())"
            )
        if not f.nullable and name not in _NEVER_NULL:
            raise SchemaError(f"pubsubd source: column {f.name!r} may be null (unkeyed messages)")
        names.append(name)
    if not names:
        raise SchemaError("pubsubd source: the schema selects no column")
    arrow = to_arrow_schema(schema, timezone="UTC")
    return FULL if arrow.equals(ARROW_SCHEMA) else Projection(tuple(names), arrow)


@dataclass
class RangePartition(InputPartition):
    """Offsets ``[start, end)`` of one partition, plus what an executor needs to read them."""

    topic: str
    partition: int
    start: int
    end: int
    endpoint: str
    fetch_size: int
    fail_on_data_loss: bool
    security: ClientSecurity = field(default_factory=ClientSecurity)
    projection: Projection = FULL


def _report_loss(loss: off.DataLoss, topic: str, fail: bool) -> None:
    text = loss.describe(topic)
    if fail:
        raise DataLossError(text)
    log.warning("%s", text)


def _message_ids(partition: int, offsets: pa.Array) -> pa.Array:
    """Message IDs of a partition's rows: the decimal of position(partition, offset)."""
    base = ids.position(partition, 0)
    positions = pc.bit_wise_or(offsets, pa.scalar(base, pa.int64())) if base else offsets
    return pc.cast(positions, pa.string())


def columns_to_record_batch(
    topic: str, partition: int, columns: Any, projection: Projection = FULL
) -> pa.RecordBatch:
    """One columnar Read page (``ReadColumns``) of a partition -> a RecordBatch with exactly
    ``projection.schema`` (``ARROW_SCHEMA`` by default). Only the projection's columns are built.
    Integer columns go through numpy (upb containers export them without a Python int per row),
    message IDs are computed by Arrow from the offsets, and the attribute maps are built from
    their flattened keys and values with offsets from the per-row counts."""
    offsets = pa.array(np.asarray(columns.offsets, dtype=np.int64))
    n = len(offsets)
    counts = np.asarray(columns.attribute_counts, dtype=np.int32)
    keys, values = columns.attribute_keys, columns.attribute_values
    if not (
        len(counts)
        == len(columns.ordering_keys)
        == len(columns.publish_time_us)
        == len(columns.data)
        == n
    ) or not (int(counts.sum()) == len(keys) == len(values)):
        raise ValueError(f"pubsubd Read returned columns of different lengths ({topic})")

    def ordering_keys() -> pa.Array:
        keyed_rows = columns.ordering_keys[:]
        if not any(keyed_rows):
            return pa.nulls(n, pa.string())
        keyed = pa.array(keyed_rows, pa.string())
        return pc.if_else(pc.equal(keyed, ""), pa.scalar(None, pa.string()), keyed)

    def attributes() -> pa.Array:
        map_offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=map_offsets[1:])
        return pa.MapArray.from_arrays(
            pa.array(map_offsets), pa.array(keys[:], pa.string()), pa.array(values[:], pa.string())
        )

    build: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), n),
        "partition": lambda: pa.repeat(pa.scalar(partition, pa.int32()), n),
        "offset": lambda: offsets,
        "message_id": lambda: _message_ids(partition, offsets),
        "ordering_key": ordering_keys,
        "data": lambda: pa.array(columns.data[:], pa.binary()),
        "attributes": attributes,
        "publish_time": lambda: pa.array(
            np.asarray(columns.publish_time_us, dtype=np.int64), ARROW_SCHEMA.field(7).type
        ),
    }
    return pa.RecordBatch.from_arrays(
        [build[name]() for name in projection.names], schema=projection.schema
    )


# The rows of an Arrow page (``ReadResponse.arrow_ipc``, the server's ``replay_arrow``): the
# columns the server stores; topic, partition and message ID are derived here.
PAGE_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("data", pa.binary()),
        ("ordering_key", pa.string()),
        ("publish_time", pa.timestamp("us", tz="UTC")),
        ("attributes", pa.map_(pa.string(), pa.string())),
    ]
)


def page_rows(ipc: bytes) -> pa.RecordBatch:
    """The batch of an Arrow page: its buffers are mapped, no row is copied or touched."""
    batch = pa.ipc.open_stream(ipc).read_next_batch()
    if not batch.schema.equals(PAGE_SCHEMA):
        raise ValueError(
            f"pubsubd Read returned an Arrow page of schema {batch.schema}, not {PAGE_SCHEMA}"
        )
    return batch


def arrow_to_record_batch(
    topic: str, partition: int, page: pa.RecordBatch, projection: Projection = FULL
) -> pa.RecordBatch:
    """One Arrow Read page (:func:`page_rows`) of a partition -> a RecordBatch with exactly
    ``projection.schema``: the page's columns as they are, topic and partition repeated and
    message IDs computed by Arrow from the offsets."""
    n = page.num_rows
    offsets = page.column(0)

    build: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), n),
        "partition": lambda: pa.repeat(pa.scalar(partition, pa.int32()), n),
        "offset": lambda: offsets,
        "message_id": lambda: _message_ids(partition, offsets),
        "ordering_key": lambda: page.column(2),
        "data": lambda: page.column(1),
        "attributes": lambda: page.column(4),
        "publish_time": lambda: page.column(3),
    }
    return pa.RecordBatch.from_arrays(
        [build[name]() for name in projection.names], schema=projection.schema
    )


def _page_offsets(page: Any) -> tuple[int, int] | None:
    """First and last offset of a page in either form (Arrow batch, ``ReadColumns``); None if
    it has no rows."""
    if isinstance(page, pa.RecordBatch):
        if not page.num_rows:
            return None
        offsets = page.column(0)
        return offsets[0].as_py(), offsets[-1].as_py()
    if not page.offsets:
        return None
    return page.offsets[0], page.offsets[-1]


def read_range(p: RangePartition) -> Iterator[pa.RecordBatch]:
    """Read ``[p.start, p.end)`` in pages; a retention gap is data loss (fail or skip).

    The next page is fetched by a helper thread while this one becomes a RecordBatch and Spark
    takes it (the call waits on the server without the GIL), so the server and the task work
    at the same time."""
    client = get_client(p.endpoint, p.security)

    def fetch(offset: int) -> tuple[Any, int]:
        """A page as an Arrow batch when the server answers in Arrow (mapped in this helper
        thread), else as ``ReadColumns`` (an older server, or one without pyarrow)."""
        page, next_offset = client.read_page(p.topic, p.partition, offset, p.end, p.fetch_size)
        return (page_rows(page) if isinstance(page, bytes) else page), next_offset

    cur = p.start
    with ThreadPoolExecutor(1, thread_name_prefix="pubsubd-read") as pool:
        ahead: tuple[int, Future[tuple[Any, int]]] | None = None
        while cur < p.end:
            page = ahead[1] if ahead is not None and ahead[0] == cur else pool.submit(fetch, cur)
            ahead = None
            try:
                rows, next_offset = page.result()
            except ReplayError as exc:
                if exc.code != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                bounds = client.topic_bounds(p.topic).get(p.partition)
                earliest = bounds.earliest if bounds is not None else p.end
                if earliest <= cur:
                    raise
                latest = bounds.latest if bounds is not None else p.end
                _report_loss(
                    off.DataLoss(p.partition, cur, earliest, latest), p.topic, p.fail_on_data_loss
                )
                cur = earliest
                continue
            span = _page_offsets(rows)
            if span is not None:
                first, last = span
                if first > cur:
                    loss = off.DataLoss(p.partition, cur, first, p.end)
                    _report_loss(loss, p.topic, p.fail_on_data_loss)
                cur = max(next_offset, last + 1)
                if cur < p.end:
                    ahead = (cur, pool.submit(fetch, cur))
                if isinstance(rows, pa.RecordBatch):
                    yield arrow_to_record_batch(p.topic, p.partition, rows, p.projection)
                else:
                    yield columns_to_record_batch(p.topic, p.partition, rows, p.projection)
            elif next_offset > cur:
                cur = next_offset
            else:
                raise RuntimeError(
                    f"pubsubd Read made no progress at offset {cur} of partition {p.partition} "
                    f"of {p.topic} (end {p.end})"
                )


def _partitions(
    opts: SourceOptions,
    parts: list[off.OffsetRange],
    frozen: tuple[int | None, int | None] | None = None,
    projection: Projection = FULL,
) -> list[RangePartition]:
    """One RangePartition per piece of ``parts``, split by ``frozen`` (the split recorded in a
    micro-batch's end offset) or else by the options."""
    min_parts, max_per_part = frozen or (opts.min_partitions, opts.max_offsets_per_partition)
    pieces = off.split(parts, min_parts, max_per_part)
    return [
        RangePartition(
            topic=opts.topic,
            partition=r.partition,
            start=r.start,
            end=r.end,
            endpoint=opts.endpoint,
            security=opts.security,
            fetch_size=opts.fetch_size,
            fail_on_data_loss=opts.fail_on_data_loss,
            projection=projection,
        )
        for r in pieces
    ]


class PubsubdStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader with admission control (maxOffsetsPerTrigger / maxBytesPerTrigger)."""

    def __init__(self, opts: SourceOptions, projection: Projection = FULL) -> None:
        self.opts = opts
        self.projection = projection
        self._initial: off.Positions | None = None
        self._target: off.Positions | None = None
        self._head: off.Positions | None = None
        self._committed: off.Positions | None = None

    def _bounds(self) -> dict[int, off.SourceBounds]:
        bounds = get_client(self.opts.endpoint, self.opts.security).topic_bounds(self.opts.topic)
        self._head = {p: b.latest for p, b in bounds.items()}
        return bounds

    def _json(self, positions: off.Positions) -> dict[str, Any]:
        return off.positions_to_json(self.opts.topic, positions)

    def _positions(self, obj: dict[str, Any]) -> off.Positions:
        return off.positions_from_json(obj, self.opts.topic)

    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:
            self._initial = self._resolve_initial()
        return self._json(self._initial)

    def _resolve_initial(self) -> off.Positions:
        opts = self.opts
        client = get_client(opts.endpoint, opts.security)
        bounds = self._bounds()
        if opts.subscription:
            cursor = client.get_cursor(opts.topic, opts.subscription)
            if cursor:
                return off.with_new_partitions(cursor, bounds)
        if opts.starting_timestamp is not None:
            found = client.lookup_offsets(opts.topic, opts.starting_timestamp)
            return off.with_new_partitions(found, bounds)
        spec = off.parse_spec(opts.starting_offsets, opts.topic, off.LATEST)
        return off.resolve(spec, bounds)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {p: b.latest for p, b in self._bounds().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        opts = self.opts
        bounds = self._bounds()
        begin = off.with_new_partitions(self._positions(start), bounds)
        losses = off.find_data_loss(begin, bounds)
        for loss in losses:
            _report_loss(loss, opts.topic, opts.fail_on_data_loss)
        if losses:
            begin = off.skip_lost(begin, bounds)
        head = {p: b.latest for p, b in bounds.items()}
        if self._target is not None:
            head = {
                p: max(begin.get(p, 0), min(h, self._target.get(p, begin.get(p, 0))))
                for p, h in head.items()
            }
        max_rows = max_bytes = None
        if not isinstance(limit, ReadAllAvailable):
            max_rows = opts.max_offsets_per_trigger
            max_bytes = opts.max_bytes_per_trigger
            if isinstance(limit, ReadMaxRows):
                max_rows = limit.max_rows
            elif isinstance(limit, ReadMaxBytes):
                max_bytes = limit.max_bytes
        avg = self._sample_sizes(begin, head) if max_bytes else None
        end = off.admit(begin, head, max_rows, max_bytes, avg)
        if end == begin and self._positions(start) == begin:
            return start  # no data: the same offset, so Spark plans no batch
        # Record the split with the batch, so that a replay after a restart with other options
        # plans the same Spark partitions (see offsets.SPLIT_KEY).
        split = off.split_to_json(opts.min_partitions, opts.max_offsets_per_partition)
        return {**self._json(end), off.SPLIT_KEY: split}

    def _sample_sizes(self, begin: off.Positions, head: off.Positions) -> dict[int, float]:
        """Average message size per partition with a backlog, from its first few messages."""
        client = get_client(self.opts.endpoint, self.opts.security)
        sizes: dict[int, float] = {}
        for p, pos in begin.items():
            if head.get(p, pos) <= pos:
                continue
            end = min(head[p], pos + _BYTES_SAMPLE)
            try:
                columns, _ = client.read_columns(self.opts.topic, p, pos, end, _BYTES_SAMPLE)
            except ReplayError:
                continue
            if columns.offsets:
                total = sum(
                    sum(map(len, field))
                    for field in (
                        columns.data,
                        columns.ordering_keys,
                        columns.attribute_keys,
                        columns.attribute_values,
                    )
                )
                sizes[p] = total / len(columns.offsets)
        return sizes

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._head is None else self._json(self._head)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = self._positions(start)
        stop = self._positions(end)
        if any(p not in begin for p in stop):  # partitions added since ``start`` was planned
            bounds = get_client(self.opts.endpoint, self.opts.security).topic_bounds(
                self.opts.topic
            )
            begin = off.with_new_partitions(begin, bounds)
        return _partitions(
            self.opts, off.ranges(begin, stop), off.split_from_json(end), self.projection
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(partition)

    def commit(self, end: dict[str, Any]) -> None:
        name = self.opts.subscription
        if not name:
            return
        positions = self._positions(end)
        if positions == self._committed:
            return
        try:
            get_client(self.opts.endpoint, self.opts.security).commit_cursor(
                self.opts.topic, name, positions
            )
        except ReplayError as exc:  # the next commit catches up; Spark's checkpoint is the truth
            log.warning("could not advance cursor %s of %s: %s", name, self.opts.topic, exc)
            return
        self._committed = positions

    def stop(self) -> None:
        # The channel is per process and shared; nothing to release per query.
        pass


class PubsubdBatchReader(DataSourceReader):
    """Backfills: ``startingOffsets`` (default earliest) .. ``endingOffsets`` (default latest), or
    ``startingTimestamp`` / ``endingTimestamp``."""

    def __init__(self, opts: SourceOptions, projection: Projection = FULL) -> None:
        self.opts = opts
        self.projection = projection

    def plan(self) -> list[off.OffsetRange]:
        opts = self.opts
        client = get_client(opts.endpoint, opts.security)
        bounds = client.topic_bounds(opts.topic)
        if opts.starting_timestamp is not None:
            begin = off.with_new_partitions(
                client.lookup_offsets(opts.topic, opts.starting_timestamp), bounds
            )
        else:
            spec = off.parse_spec(opts.starting_offsets, opts.topic, off.EARLIEST)
            begin = off.resolve(spec, bounds)
        if opts.ending_timestamp is not None:
            stop = off.with_new_partitions(
                client.lookup_offsets(opts.topic, opts.ending_timestamp), bounds
            )
        else:
            spec = off.parse_spec(opts.ending_offsets, opts.topic, off.LATEST)
            stop = off.resolve(spec, bounds)
        losses = [x for x in off.find_data_loss(begin, bounds) if x.wanted < x.earliest]
        for loss in losses:
            _report_loss(loss, opts.topic, opts.fail_on_data_loss)
        if losses:
            begin = off.skip_lost(begin, bounds)
        stop = {p: min(v, bounds[p].latest) if p in bounds else v for p, v in stop.items()}
        return off.ranges(begin, stop)

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(self.opts, self.plan(), projection=self.projection)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(partition)


class PubsubdDataSource(DataSource):
    """``format("pubsubd")``: streaming source and sink, batch reader and writer.

    Register it once per session: ``spark.dataSource.register(PubsubdDataSource)``.
    """

    @classmethod
    def name(cls) -> str:
        return "pubsubd"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return PubsubdBatchReader(SourceOptions.parse(self.options), projection_for(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PubsubdStreamReader(SourceOptions.parse(self.options), projection_for(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pubsubd.spark.sink import PubsubdBatchWriter

        return PubsubdBatchWriter(schema, self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pubsubd.spark.sink import PubsubdStreamWriter

        return PubsubdStreamWriter(schema, self.options)
