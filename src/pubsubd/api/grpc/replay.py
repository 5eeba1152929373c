"""pubsubd.v1.Replay servicer: the replayable read API beside google.pubsub.v1 (docs/REPLAY_API.md).

Positions are per publish message source of a topic: offsets in that source's log, the same
numbers message IDs are made of (``core/ids.py``). Reads go straight to the log through the
topic's shared decode cache; named cursors are kept by control/cursors.py and the dedup window by
data/publish/dedup.py.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import OrderedDict
from itertools import accumulate, repeat
from operator import attrgetter
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError

from pubsubd._gen.pubsubd.v1 import replay_pb2 as r
from pubsubd.api.grpc import replay_arrow
from pubsubd.api.grpc.status import in_process, rpc, unary_method
from pubsubd.control.catalog import Catalog, TopicEntry
from pubsubd.control.cursors import Cursors
from pubsubd.control.router import Routes
from pubsubd.control.snapshots import Snapshots
from pubsubd.core import ids
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.dedup_batches import DedupBatch, flat_request
from pubsubd.core.errors import (
    DataLoss,
    InvalidArgument,
    OutOfRange,
    ResourceExhausted,
    Unavailable,
)
from pubsubd.core.records import Entry
from pubsubd.core.retention import timestamp_us
from pubsubd.core.roles import PublishingForwarderApi
from pubsubd.data.decoding import DecodeCache, DecodedEntry
from pubsubd.data.publish.dedup import validate_messages
from pubsubd.observability import metrics
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange
from pubsubd.storage.metadata import CursorRecord

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

SERVICE = "pubsubd.v1.Replay"
DEFAULT_READ_MESSAGES = 1000
MAX_READ_MESSAGES = 10_000
DEFAULT_READ_BYTES = 4 << 20
MAX_READ_BYTES = 16 << 20  # below the server's 32 MB send limit


def below_range(offset: int, start: int, end: int) -> OutOfRange:
    return OutOfRange(f"offset {offset} is below the retained range [{start}, {end})")


# One Read's rows: (decoded entry, first index, end index) per log entry, in offset order.
Page: TypeAlias = list[tuple[DecodedEntry, int, int]]

_data = attrgetter("data")
_attributes = attrgetter("attributes")


class TopicLog:
    """One source of a topic as a Read sees it: reads through the publishing forwarder's
    interface, entries decoded through this frontend's cache of the topic."""

    __slots__ = ("cache", "publishing", "source", "topic_uid")

    def __init__(
        self, publishing: PublishingForwarderApi, topic_uid: str, source: int, cache: DecodeCache
    ) -> None:
        self.publishing = publishing
        self.topic_uid = topic_uid
        self.source = source
        self.cache = cache

    def read(self, offset: int, max_entries: int, max_bytes: int) -> list[Entry]:
        return self.publishing.read(self.topic_uid, self.source, offset, max_entries, max_bytes)

    def decoded(self, entry: Entry) -> DecodedEntry:
        return self.cache.decoded(self.source, entry)


def _page(log: TopicLog, request: Any) -> tuple[Page, int]:
    """The rows a Read returns and its ``next_offset``, for both answer forms (rows, columns).

    Range checks and limits (docs/REPLAY_API.md): a row is taken while fewer than
    ``max_messages`` are, its offset is below ``end_offset`` and the serialized messages taken
    so far, it included, fit in ``max_bytes`` (the first row always fits); the page ends at the
    first row refused. Work per row is done by C loops (sizes, prefix sums, bisection)."""
    span = log.publishing.ranges(log.topic_uid)[log.source]
    start, latest = span.start_offset, span.committed_offset
    source = log.source
    offset = request.start_offset
    if offset < 0:
        raise InvalidArgument(f"start_offset: {offset} is negative")
    if offset < start:
        raise below_range(offset, start, latest)
    if offset > latest:
        raise OutOfRange(
            f"offset {offset} is above the latest position {latest} (retained range "
            f"[{start}, {latest}))"
        )
    end = request.end_offset or latest
    if end < 0:
        raise InvalidArgument(f"end_offset: {end} is negative")
    end = min(end, latest)
    max_messages = request.max_messages or DEFAULT_READ_MESSAGES
    max_bytes = request.max_bytes or DEFAULT_READ_BYTES
    if max_messages < 0 or max_bytes < 0:
        raise InvalidArgument("max_messages, max_bytes: must not be negative")
    max_messages = min(max_messages, MAX_READ_MESSAGES)
    max_bytes = min(max_bytes, MAX_READ_BYTES)
    rows: Page = []
    taken = size = 0
    next_offset = offset
    full = False
    # Synchronous from here on: no trim can run between the range check and the reads.
    while not full and next_offset < end:
        try:
            entries = log.read(next_offset, max_messages, max_bytes)
        except OffsetOutOfRange as e:
            raise below_range(next_offset, e.start, e.end) from None
        except DamagedEntries as e:
            if rows:
                break  # the page ends before the damage; the next Read starts at it
            if e.restoring:
                raise Unavailable(
                    f"topic storage {log.topic_uid}, source {source}: entries from offset "
                    f"{e.damaged.first_offset} are being restored from the storage nodes; retry"
                ) from None
            if log.publishing.damage_policy(log.topic_uid) is DamagePolicy.SKIP:
                next_offset = e.damaged.end_offset  # lost: the page skips them
                continue
            raise DataLoss(
                f"topic storage {log.topic_uid}, source {source}: {e.damaged.messages} "
                f"messages are damaged, {e.damaged.describe()}; read on from offset "
                f"{e.damaged.end_offset}, restore the bytes, or set the topic label "
                f"pubsubd-damaged-entries=skip"
            ) from None
        if not entries:
            break
        for entry in entries:
            decoded = log.decoded(entry)
            base = entry.base_offset
            count = len(decoded.messages)
            lo = max(next_offset - base, 0)  # rows below the start are skipped
            if lo >= count:
                continue
            # Rows lo..hi-1 are below end_offset and within max_messages.
            hi = min(count, end - base, lo + max_messages - taken)
            if hi <= lo:
                full = True
                break
            # sums[i]: bytes of the page with the entry's first i candidate rows added.
            sums = list(accumulate(map(len, decoded.messages[lo:hi]), initial=size))
            fit = max(bisect_right(sums, max_bytes) - 1, 1 if not taken else 0)
            if fit:
                rows.append((decoded, lo, lo + fit))
                taken += fit
                size = sums[fit]
                next_offset = base + lo + fit
            if lo + fit < count:  # the next row of this entry is refused
                full = True
                break
    return rows, next_offset


def _fill_messages(messages: Any, source: int, rows: Page) -> None:
    """ReadResponse.messages: one ReplayMessage per row."""
    add = messages.add
    for decoded, lo, hi in rows:
        entry = decoded.entry
        seconds, micros = divmod(entry.publish_time_us, 1_000_000)
        nanos = micros * 1000
        parsed = decoded.parsed
        for j in range(lo, hi):
            m = parsed[j]
            at = entry.base_offset + j
            msg = add(
                offset=at,
                message_id=ids.message_id(source, at),
                data=m.data,
                ordering_key=m.ordering_key,
            )
            if m.attributes:
                msg.attributes.update(m.attributes)
            msg.publish_time.seconds = seconds
            msg.publish_time.nanos = nanos


def _fill_columns(columns: Any, rows: Page) -> None:
    """ReadResponse.columns (ReadColumns): every field in one ``extend`` from lists built per
    entry; per row only ``data`` and the attribute map are touched (offsets, publish time and
    ordering key are per entry), and not even those for an entry without attributes (its data
    list comes from the decode cache). Message IDs are not sent: the client derives them."""
    offsets: list[int] = []
    data: list[bytes] = []
    ordering_keys: list[str] = []
    publish_times: list[int] = []
    counts: list[int] = []
    keys: list[str] = []
    values: list[str] = []
    for decoded, lo, hi in rows:
        entry = decoded.entry
        n = hi - lo
        offsets.extend(range(entry.base_offset + lo, entry.base_offset + hi))
        publish_times.extend(repeat(entry.publish_time_us, n))
        ordering_keys.extend(repeat(decoded.ordering_key, n))  # one per entry
        plain = decoded.plain_data()
        if plain is not None:  # no attributes: no parsed message touched
            data.extend(plain[lo:hi])
            counts.extend(repeat(0, n))
            continue
        parsed = decoded.parsed[lo:hi]
        data.extend(map(_data, parsed))
        maps = list(map(_attributes, parsed))
        sizes = list(map(len, maps))
        counts.extend(sizes)
        if any(sizes):
            for attrs in maps:
                for key in attrs:  # faster than .items() on a upb map
                    keys.append(key)
                    values.append(attrs[key])
    columns.SetInParent()  # present even on an empty page
    columns.offsets.extend(offsets)
    columns.data.extend(data)
    columns.ordering_keys.extend(ordering_keys)
    columns.publish_time_us.extend(publish_times)
    columns.attribute_counts.extend(counts)
    columns.attribute_keys.extend(keys)
    columns.attribute_values.extend(values)


# Topics whose decoded entries this frontend keeps (each cache holds up to DECODE_CACHE_BYTES).
DECODE_CACHE_TOPICS = 16


class ReplayServicer:
    def __init__(
        self,
        catalog: Catalog,
        routes: Routes,
        cursors: Cursors,
        snapshots: Snapshots,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.catalog = catalog
        self.snapshots = snapshots
        self.clock = clock
        self.routes = routes
        self.cursors = cursors
        self._caches: OrderedDict[str, DecodeCache] = OrderedDict()

    def _topic(self, topic: str) -> tuple[TopicEntry, PublishingForwarderApi]:
        entry = self.catalog.topic(topic)  # INVALID_ARGUMENT bad name, NOT_FOUND unknown
        uid = entry.record.uid
        return entry, self.routes.publishing(uid)

    def _log(self, publishing: PublishingForwarderApi, topic_uid: str, source: int) -> TopicLog:
        count = publishing.source_count(topic_uid)
        if not 0 <= source < count:
            raise InvalidArgument(
                f"source: {source} is not a source of this topic (it has sources 0..{count - 1})"
            )
        cache = self._caches.get(topic_uid)
        if cache is None:
            cache = self._caches[topic_uid] = DecodeCache()
            if len(self._caches) > DECODE_CACHE_TOPICS:
                self._caches.popitem(last=False)
        else:
            self._caches.move_to_end(topic_uid)
        return TopicLog(publishing, topic_uid, source, cache)

    @rpc
    async def GetTopicRanges(self, request: Any, context: Context) -> Any:
        entry, publishing = self._topic(request.topic)
        return r.GetTopicRangesResponse(
            sources=[
                r.SourceRange(
                    source=i, earliest_offset=span.start_offset, latest_offset=span.committed_offset
                )
                for i, span in enumerate(publishing.ranges(entry.record.uid))
            ]
        )

    @rpc
    async def LookupOffsets(self, request: Any, context: Context) -> Any:
        entry, publishing = self._topic(request.topic)
        uid = entry.record.uid
        at = timestamp_us(request.time)
        return r.LookupOffsetsResponse(
            offsets={
                i: max(publishing.offset_for_time(uid, i, at), span.start_offset)
                for i, span in enumerate(publishing.ranges(uid))
            }
        )

    @rpc
    async def Read(self, request: Any, context: Context) -> Any:
        entry, publishing = self._topic(request.topic)
        source = request.source
        rows, next_offset = _page(self._log(publishing, entry.record.uid, source), request)
        if request.arrow and replay_arrow.AVAILABLE:
            return replay_arrow.read_response(next_offset, replay_arrow.page_ipc(rows))
        out = r.ReadResponse(next_offset=next_offset)
        if request.columnar:
            _fill_columns(out.columns, rows)
        else:
            _fill_messages(out.messages, source, rows)
        return out.SerializeToString()

    def _cursor(self, rec: CursorRecord) -> Any:
        cursor = r.Cursor(topic=rec.topic, name=rec.name, offsets=rec.offsets)
        if rec.commit_time_us:
            seconds, micros = divmod(rec.commit_time_us, 1_000_000)
            cursor.commit_time.seconds = seconds
            cursor.commit_time.nanos = micros * 1000
        return cursor

    @rpc
    async def GetCursor(self, request: Any, context: Context) -> Any:
        entry = self.catalog.topic(request.topic)
        return self._cursor(self.cursors.get(entry, request.name))

    @rpc
    async def CommitCursor(self, request: Any, context: Context) -> Any:
        entry = self.catalog.topic(request.topic)
        return self._cursor(self.cursors.commit(entry, request.name, dict(request.offsets)))

    @rpc
    async def ListCursors(self, request: Any, context: Context) -> Any:
        entry = self.catalog.topic(request.topic)
        return r.ListCursorsResponse(
            cursors=[self._cursor(rec) for rec in self.cursors.for_topic(entry)]
        )

    @rpc
    async def DeleteCursor(self, request: Any, context: Context) -> Any:
        entry = self.catalog.topic(request.topic)
        self.cursors.delete(entry, request.name)  # NOT_FOUND for a cursor it does not have
        return r.DeleteCursorResponse()

    @rpc
    async def PublishDeduplicated(self, raw: bytes, context: Context) -> Any:
        message_ids, duplicates = await self.publish_deduplicated(raw)
        return r.PublishDeduplicatedResponse(message_ids=message_ids, duplicates=duplicates)

    async def publish_in_process(self, raw: bytes) -> tuple[list[str], int]:
        """PublishDeduplicated for a caller in this process (the Pulsar front's producers,
        pulsar/gateway.py, when the gRPC port checks no caller): the method's own work on the
        request's bytes, counted as the method; raises PubsubError as the method answers."""
        return await in_process("PublishDeduplicated", self.publish_deduplicated(raw))

    async def publish_deduplicated(self, raw: bytes) -> tuple[list[str], int]:
        """PublishDeduplicated's work: (every message's ID, how many were duplicates)."""
        # The Spark sink's requests (IDs and data only) are read flat from the wire bytes,
        # already checked; anything else is parsed and checked message by message.
        flat = flat_request(raw)
        entry = self.catalog.topic(flat.topic) if flat is not None else None
        batch: DedupBatch | list[tuple[str, Any]]
        if flat is not None and entry is not None and entry.schema_settings is None:
            batch, source = flat.batch, flat.source
        else:
            try:
                request = r.PublishDeduplicatedRequest.FromString(raw)
            except DecodeError:
                raise InvalidArgument(
                    "request: not a valid pubsubd.v1.PublishDeduplicatedRequest"
                ) from None
            entry = self.catalog.topic(request.topic)
            batch = [(m.dedup_id, m) for m in request.messages]  # stored without a copy
            validate_messages(batch, len(raw), now_s=self.clock.time_us() / 1e6)
            if entry.schema_settings is not None:  # the same schema checks as Publish
                self.catalog.schemas.conform(entry.schema_settings, request.messages)
            source = request.source if request.HasField("source") else None
        uid = entry.record.uid
        publishing = self.routes.publishing(uid)
        blocked = publishing.publish_blocked(uid)
        if blocked is not None:
            raise ResourceExhausted(blocked)
        started = time.perf_counter()
        message_ids, duplicates = await publishing.publish_deduplicated(uid, batch, source)
        metrics.PUBLISH_LATENCY.observe(time.perf_counter() - started)
        stored = len(message_ids) - duplicates
        metrics.PUBLISHED_MESSAGES.inc(stored)
        metrics.DEDUP_DUPLICATES.inc(duplicates)
        return message_ids, duplicates

    @rpc
    async def SeekOffsets(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        await self.snapshots.seek_offsets(request.subscription, dict(request.offsets))
        return r.SeekOffsetsResponse()


def handlers(servicer: ReplayServicer) -> grpc.GenericRpcHandler:
    unary = unary_method
    s = servicer
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetTopicRanges": unary(
                s.GetTopicRanges, r.GetTopicRangesRequest, r.GetTopicRangesResponse
            ),
            "LookupOffsets": unary(
                s.LookupOffsets, r.LookupOffsetsRequest, r.LookupOffsetsResponse
            ),
            "Read": unary(s.Read, r.ReadRequest, None),  # answers bytes: see the method
            "GetCursor": unary(s.GetCursor, r.GetCursorRequest, r.Cursor),
            "CommitCursor": unary(s.CommitCursor, r.CommitCursorRequest, r.Cursor),
            "PublishDeduplicated": unary(  # takes the raw bytes: see the method
                s.PublishDeduplicated, None, r.PublishDeduplicatedResponse
            ),
            "ListCursors": unary(s.ListCursors, r.ListCursorsRequest, r.ListCursorsResponse),
            "DeleteCursor": unary(s.DeleteCursor, r.DeleteCursorRequest, r.DeleteCursorResponse),
            "SeekOffsets": unary(s.SeekOffsets, r.SeekOffsetsRequest, r.SeekOffsetsResponse),
        },
    )
