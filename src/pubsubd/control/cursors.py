"""Named cursors of the replay API: positions a reader (e.g. a Spark query) has committed.

A cursor belongs to one topic *incarnation* (its storage uid): a topic deleted and re-created
under the same name starts without cursors, as its positions start again at 0. Cursors live in the
metadata store (``cursors`` table, SQLite ``synchronous=FULL``), so a commit answered to a client
survives kill -9.

Pinning: a cursor pins its topic's log (pin ``cursor:{name}``, installed by the publishing
forwarder from the cursor's record, ``data/reconcile.py``) at its committed positions, so
retention never deletes what it has not committed past, even on a topic without subscriptions
(which otherwise keeps nothing). Kafka consumer groups do not pin; we do because our retention
is ack-driven, not time-driven. A source the cursor never committed is not pinned. An abandoned
cursor pins until it is deleted: DeleteCursor (``pubsubd cursors delete TOPIC NAME``) removes
its row, its pin and its lag gauge, so the next retention pass may trim what it held;
ListCursors (``pubsubd cursors list TOPIC``) finds them. Committing it to the latest positions
also releases the data, but keeps the cursor.

Lag (latest committed position minus the cursor's, per source) is reported in ``/status`` and as
the ``pubsubd_cursor_lag_messages`` gauge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pubsubd.control.catalog import Catalog, TopicEntry
from pubsubd.control.router import Routes
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.errors import CursorNotFound, DataLoss, InvalidArgument, OutOfRange, Unavailable
from pubsubd.core.roles import PublishingForwarderApi
from pubsubd.observability import metrics
from pubsubd.storage.metadata import Change, CursorRecord

MAX_CURSOR_NAME_BYTES = 256


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


def source_ranges(publishing: PublishingForwarderApi, topic_uid: str) -> dict[int, tuple[int, int]]:
    return {
        i: (r.start_offset, r.committed_offset) for i, r in enumerate(publishing.ranges(topic_uid))
    }


class Cursors:
    def __init__(self, catalog: Catalog, routes: Routes, clock: Clock = SYSTEM_CLOCK) -> None:
        self.catalog = catalog
        self.routes = routes
        self.clock = clock
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
            self._install(rec)
        self.store.changes.watch(self._remote_change)

    def _remote_change(self, change: Change) -> None:
        """Another process committed or deleted a cursor (ours are in the view already)."""
        rec = change.record
        if not change.remote or not isinstance(rec, CursorRecord):
            return
        if change.deleted:
            if self.records.pop((rec.topic_uid, rec.name), None) is not None:
                metrics.CURSOR_LAG.remove(rec.topic, rec.name)
        else:
            self._install(rec)

    def _install(self, rec: CursorRecord) -> None:
        """Remember a committed cursor (its pin is the publishing forwarder's, from the
        record) and report its lag."""
        self.records[(rec.topic_uid, rec.name)] = rec
        metrics.CURSOR_LAG.labels(rec.topic, rec.name).set_function(
            lambda: float(self._total_lag(rec))
        )

    def _ranges(self, topic_uid: str) -> dict[int, tuple[int, int]] | None:
        try:
            return source_ranges(self.routes.publishing(topic_uid), topic_uid)
        except (DataLoss, Unavailable):
            return None  # the topic's storage cannot be opened, or is another forwarder's

    def _total_lag(self, rec: CursorRecord) -> int:
        if self.records.get((rec.topic_uid, rec.name)) is not rec:
            return 0  # superseded by a later commit, or deleted
        ranges = self._ranges(rec.topic_uid)
        return sum(lag(rec.offsets, ranges).values()) if ranges is not None else 0

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
        check_offsets(offsets, source_ranges(self.routes.publishing(uid), uid))
        old = self.records.get((uid, name))
        merged = dict(old.offsets) if old is not None else {}
        merged.update(offsets)
        rec = CursorRecord(uid, name, topic.record.name, merged, self.clock.time_us())
        self.store.put_cursor(rec)  # the publishing forwarder moves its pin
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
        self.store.delete_cursor(uid, name)  # the publishing forwarder drops its pin
        del self.records[(uid, name)]
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
            ranges = self._ranges(uid) if uid in live else None
            if ranges is None:
                continue
            by_source = lag(rec.offsets, ranges)
            out.setdefault(rec.topic, {})[name] = {
                "offsets": {str(k): v for k, v in sorted(rec.offsets.items())},
                "commit_time_us": rec.commit_time_us,
                "lag": sum(by_source.values()),
                "lag_by_source": {str(k): v for k, v in sorted(by_source.items())},
            }
        return out
