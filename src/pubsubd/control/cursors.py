"""Named cursors of the replay API: positions a reader (e.g. a Spark query) has committed.

A cursor belongs to one topic *incarnation* (its storage uid): a topic deleted and re-created
under the same name starts without cursors, as its positions start again at 0. Cursors live in the
metadata store (``cursors`` table, SQLite ``synchronous=FULL``), so a commit answered to a client
survives kill -9.

Pinning: a cursor pins its topic's log (``TopicSources.pins``, pin ``cursor:{name}``) at its
committed positions, so retention never deletes what it has not committed past, even on a topic
without subscriptions (which otherwise keeps nothing). Kafka consumer groups do not pin; we do
because our retention is ack-driven, not time-driven. A source the cursor never committed is not
pinned. An abandoned cursor pins until it is deleted: DeleteCursor (``pubsubd cursors delete
TOPIC NAME``) removes its row, its pin and its lag gauge, so the next retention pass may trim what
it held; ListCursors (``pubsubd cursors list TOPIC``) finds them. Committing it to the latest
positions also releases the data, but keeps the cursor.

Lag (latest committed position minus the cursor's, per source) is reported in ``/status`` and as
the ``pubsubd_cursor_lag_messages`` gauge.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pubsubd.core.errors import CursorNotFound, InvalidArgument, OutOfRange
from pubsubd.observability import metrics
from pubsubd.storage.metadata import CursorRecord

if TYPE_CHECKING:
    from pubsubd.control.catalog import Catalog, TopicEntry
    from pubsubd.data.publish.source import TopicSources

MAX_CURSOR_NAME_BYTES = 256


def cursor_pin(name: str) -> str:
    return f"cursor:{name}"


def check_name(name: str) -> None:
    if not name:
        raise InvalidArgument("name: a cursor name is required")
    if len(name.encode()) > MAX_CURSOR_NAME_BYTES:
        raise InvalidArgument(f"name: longer than {MAX_CURSOR_NAME_BYTES} bytes")


def check_offsets(offsets: Mapping[int, int], ranges: Mapping[int, tuple[int, int]]) -> None:
    """Validate committed positions against each source's (earliest, latest) range (pure).

    A position below the retained range is allowed (the reader is behind what is kept); one
    above the latest position is not: nothing was read there.
    """
    for source, offset in offsets.items():
        if source not in ranges:
            raise InvalidArgument(
                f"offsets: source {source} does not exist (the topic has sources {sorted(ranges)})"
            )
        if offset < 0:
            raise InvalidArgument(f"offsets[{source}]: {offset} is negative")
        earliest, latest = ranges[source]
        if offset > latest:
            raise OutOfRange(
                f"offsets[{source}]: offset {offset} is above the latest position {latest} "
                f"(retained range [{earliest}, {latest}))"
            )


def lag(offsets: Mapping[int, int], ranges: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """Per source, messages between the cursor and the latest position (pure). A source the
    cursor never committed counts from the earliest retained position."""
    out = {}
    for source, (earliest, latest) in ranges.items():
        at = offsets.get(source, earliest)
        out[source] = max(0, latest - max(at, earliest))
    return out


def topic_cursors(records: Iterable[CursorRecord], topic_uid: str) -> list[CursorRecord]:
    """The cursors of one topic incarnation, sorted by name (pure)."""
    return sorted((r for r in records if r.topic_uid == topic_uid), key=lambda r: r.name)


def source_ranges(sources: TopicSources) -> dict[int, tuple[int, int]]:
    return {i: (log.start_offset, log.committed_offset) for i, log in enumerate(sources.logs)}


class Cursors:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.store = catalog.store
        # (topic uid, name) -> record
        self.records: dict[tuple[str, str], CursorRecord] = {}
        catalog.topic_deleted_listeners.append(self.forget_topic)

    def load(self) -> None:
        """Restore cursors of live topics and install their pins (before the first trim).

        Cursors of topic incarnations that no longer exist are deleted."""
        live = {e.record.uid for e in self.catalog.topics.values()}
        for rec in self.store.load_cursors():
            if rec.topic_uid not in live:
                self.store.delete_cursor(rec.topic_uid, rec.name)
                continue
            if rec.topic_uid in self.catalog.publishing.failed_topics:
                continue  # its storage cannot be opened (kept, for when it is repaired)
            self._install(rec)

    def _sources(self, topic_uid: str) -> TopicSources:
        return self.catalog.publishing.open_topic(topic_uid)

    def _install(self, rec: CursorRecord) -> None:
        self.records[(rec.topic_uid, rec.name)] = rec
        sources = self._sources(rec.topic_uid)
        if rec.offsets:
            sources.pins[cursor_pin(rec.name)] = dict(rec.offsets)
        metrics.CURSOR_LAG.labels(rec.topic, rec.name).set_function(
            lambda: float(self._total_lag(rec))
        )

    def _total_lag(self, rec: CursorRecord) -> int:
        sources = self.catalog.publishing.topics.get(rec.topic_uid)
        if sources is None or self.records.get((rec.topic_uid, rec.name)) is not rec:
            return 0  # superseded by a later commit, or the topic's storage is gone
        return sum(lag(rec.offsets, source_ranges(sources)).values())

    def get(self, topic: TopicEntry, name: str) -> CursorRecord:
        """The cursor, or an empty one (no offsets, commit time 0) if it was never committed."""
        check_name(name)
        found = self.records.get((topic.record.uid, name))
        if found is not None:
            return found
        return CursorRecord(topic.record.uid, name, topic.record.name)

    def commit(self, topic: TopicEntry, name: str, offsets: Mapping[int, int]) -> CursorRecord:
        """Set the positions of the given sources (others keep theirs); durable when it
        returns. Positions may move backwards (a reader rewinding)."""
        check_name(name)
        uid = topic.record.uid
        check_offsets(offsets, source_ranges(self._sources(uid)))
        old = self.records.get((uid, name))
        merged = dict(old.offsets) if old is not None else {}
        merged.update(offsets)
        rec = CursorRecord(uid, name, topic.record.name, merged, time.time_ns() // 1000)
        self.store.put_cursor(rec)
        if old is not None and old.topic != rec.topic:
            metrics.CURSOR_LAG.remove(old.topic, old.name)
        self._install(rec)
        return rec

    def for_topic(self, topic: TopicEntry) -> list[CursorRecord]:
        """Every committed cursor of the topic's current incarnation, sorted by name."""
        return topic_cursors(self.records.values(), topic.record.uid)

    def delete(self, topic: TopicEntry, name: str) -> None:
        """Delete a cursor: its row (durable when this returns), then its pin and lag gauge, so
        the next trim may delete what it held. NOT_FOUND if the topic has no such cursor."""
        check_name(name)
        uid = topic.record.uid
        rec = self.records.get((uid, name))
        if rec is None:
            raise CursorNotFound(topic.record.name, name)
        self.store.delete_cursor(uid, name)
        del self.records[(uid, name)]
        sources = self.catalog.publishing.topics.get(uid)
        if sources is not None:
            sources.pins.pop(cursor_pin(name), None)
        metrics.CURSOR_LAG.remove(rec.topic, rec.name)

    def forget_topic(self, topic_uid: str) -> None:
        """The topic was deleted: drop its cursors (rows, records, lag gauges)."""
        for rec in topic_cursors(self.records.values(), topic_uid):
            self.store.delete_cursor(topic_uid, rec.name)
            del self.records[(topic_uid, rec.name)]
            metrics.CURSOR_LAG.remove(rec.topic, rec.name)

    def status(self) -> dict[str, Any]:
        """Per topic name, per cursor: committed offsets, commit time and lag."""
        out: dict[str, Any] = {}
        live = {e.record.uid for e in self.catalog.topics.values()}
        for (uid, name), rec in sorted(self.records.items(), key=lambda kv: kv[1].topic):
            sources = self.catalog.publishing.topics.get(uid)
            if uid not in live or sources is None:
                continue
            by_source = lag(rec.offsets, source_ranges(sources))
            out.setdefault(rec.topic, {})[name] = {
                "offsets": {str(k): v for k, v in sorted(rec.offsets.items())},
                "commit_time_us": rec.commit_time_us,
                "lag": sum(by_source.values()),
                "lag_by_source": {str(k): v for k, v in sorted(by_source.items())},
            }
        return out
