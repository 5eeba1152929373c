"""Snapshots, Seek, DetachSubscription and retention pins: the control plane of replay.

* **Snapshots** capture a subscription's ack state (per source: mark-delete plus acked ranges) and
  its topic's storage uid. They live in the metadata store, are loaded at start-up and pin what
  they still need in the topic's logs (``TopicSources.pins``) until they expire: 7 days after the
  oldest unacked message they capture (docs/GOOGLE_API.md §6).
* **Seek** replaces a subscription's ack state through ``SubscriptionDispatcher.reset`` (which
  journals it): to a snapshot's state, or to "acked before a time" (data/retention.py says which
  messages are still retained and so can come back). Outstanding ack IDs stop leasing anything.
* **DetachSubscription** marks the subscription detached, ends its streams with
  FAILED_PRECONDITION and drops its backlog (its ack journal), so it no longer holds messages.
* **Retention pins**: a topic's ``message_retention_duration`` and ``pubsubd-retention-bytes``
  (one pin: kept while inside both, Pulsar's rule) and each subscription's
  ``retain_acked_messages`` window (not bounded by the topic's size limit) become pins,
  refreshed on admin changes and periodically (control/expiry.py). Unacked messages older than
  a subscription's retention leave its backlog.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pubsubd.acks.cursor import CursorState
from pubsubd.control import quotas
from pubsubd.control.catalog import SubscriptionEntry, TopicEntry, _apply_mask, _SortedNames
from pubsubd.core import names, pb, validation
from pubsubd.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from pubsubd.data import retention
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange
from pubsubd.storage.metadata import SnapshotRecord

if TYPE_CHECKING:
    from pubsubd.control.catalog import Catalog
    from pubsubd.data.publish.source import TopicSources
    from pubsubd.data.subscribe.dispatcher import SubscriptionDispatcher

log = logging.getLogger(__name__)

SNAPSHOT_UPDATABLE = frozenset({"labels", "expire_time"})
DEFAULT_SUBSCRIPTION_RETENTION_US = validation.DEFAULT_SUBSCRIPTION_RETENTION_S * retention.US_PER_S


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(slots=True)
class SnapshotEntry:
    record: SnapshotRecord
    snapshot: Any  # google.pubsub.v1.Snapshot as stored

    @property
    def expire_us(self) -> int:
        return retention.timestamp_us(self.snapshot.expire_time)

    def states(self) -> dict[int, CursorState]:
        return {
            source: CursorState(md, tuple((s, e) for s, e in ranges))
            for source, (md, ranges) in self.record.cursors.items()
        }


class Snapshots:
    """Snapshot registry plus Seek, detach and retention pins, over the catalog."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.entries: dict[str, SnapshotEntry] = {}
        self._names = _SortedNames()

    # --- start-up -----------------------------------------------------------------------------

    def load(self) -> None:
        """Restore snapshots (and their pins) and the retention pins of every topic."""
        for rec in self.catalog.store.load_snapshots():
            self._add(SnapshotEntry(rec, pb.Snapshot.FromString(rec.body)))
        self.refresh_pins()
        if self.entries:
            log.info("loaded %d snapshots", len(self.entries))

    def _add(self, entry: SnapshotEntry) -> None:
        self.entries[entry.record.name] = entry
        self._names.add(entry.record.name)
        sources = self.catalog.publishing.topics.get(entry.record.topic_uid)
        if sources is not None:
            sources.pins[retention.snapshot_pin(entry.record.name)] = _snapshot_pin(
                entry, len(sources.logs)
            )

    def sources_added(self, topic_uid: str) -> None:
        """A topic got new sources: its snapshots pin them whole (all after the snapshot)."""
        sources = self.catalog.publishing.topics.get(topic_uid)
        if sources is None:
            return
        for entry in self.entries.values():
            if entry.record.topic_uid == topic_uid:
                sources.pins[retention.snapshot_pin(entry.record.name)] = _snapshot_pin(
                    entry, len(sources.logs)
                )

    def _remove(self, entry: SnapshotEntry) -> None:
        name = entry.record.name
        self.catalog.store.delete_snapshot(name)
        self.entries.pop(name, None)
        self._names.remove(name)
        sources = self.catalog.publishing.topics.get(entry.record.topic_uid)
        if sources is not None:
            sources.pins.pop(retention.snapshot_pin(name), None)

    # --- snapshots ----------------------------------------------------------------------------

    def create(self, request: Any) -> Any:
        name = request.name
        if name:
            names.snapshot(name)
        names.subscription(request.subscription)
        validation.labels("labels", request.labels)
        if not name:
            # Google: a nameless snapshot gets a random name in the subscription's project.
            project = names.parse(request.subscription, "subscriptions").project
            name = f"projects/{project}/snapshots/snapshot-{uuid.uuid4().hex}"
        sub = self.catalog.subscription(request.subscription)
        now = now_us()
        self.delete_expired(now)
        if name in self.entries:
            raise AlreadyExists("snapshot", name)
        dispatcher = self._dispatcher(sub)
        states = {s: c.snapshot() for s, c in dispatcher.journal.cursors.items()}
        oldest = _oldest_unacked_us(dispatcher.sources, states)
        expire = retention.snapshot_expire_us(oldest, now)
        if expire - now < retention.SNAPSHOT_MIN_LIFETIME_US:
            raise FailedPrecondition(
                f"snapshot {name} would expire in less than 1 hour: the oldest unacked message "
                f"of {request.subscription} is too old"
            )
        snapshot = pb.Snapshot(name=name, topic=sub.subscription.topic, labels=request.labels)
        _set_timestamp(snapshot.expire_time, expire)
        record = SnapshotRecord(
            name,
            sub.record.topic_uid,
            snapshot.SerializeToString(),
            {s: (st.mark_delete, list(st.ranges)) for s, st in states.items()},
        )
        self.catalog.store.put_snapshot(record)
        entry = SnapshotEntry(record, snapshot)
        self._add(entry)
        return self._view(entry)

    def entry(self, name: str) -> SnapshotEntry:
        names.snapshot(name)
        entry = self.entries.get(name)
        if entry is not None and entry.expire_us <= now_us():
            self._remove(entry)
            entry = None
        if entry is None:
            raise NotFound("snapshot", name)
        return entry

    def get(self, name: str) -> Any:
        return self._view(self.entry(name))

    def update(self, request: Any) -> Any:
        if not request.HasField("snapshot"):
            raise InvalidArgument("snapshot: required")
        entry = self.entry(request.snapshot.name)
        paths = list(request.update_mask.paths)
        if not paths:
            raise InvalidArgument("update_mask: must name at least one field to update")
        for p in paths:
            if p not in SNAPSHOT_UPDATABLE:
                raise InvalidArgument(f"update_mask: {p!r} is not a known updatable snapshot field")
        updated = pb.Snapshot()
        updated.CopyFrom(entry.snapshot)
        _apply_mask(paths, request.snapshot, updated)
        validation.labels("labels", updated.labels)
        if "expire_time" in paths and retention.timestamp_us(updated.expire_time) <= now_us():
            raise InvalidArgument("expire_time: must be in the future")
        entry.record.body = updated.SerializeToString()
        self.catalog.store.put_snapshot(entry.record)
        entry.snapshot = updated
        return self._view(entry)

    def delete(self, name: str) -> None:
        self._remove(self.entry(name))

    def list_project(self, project: str, page_size: int, token: str) -> tuple[list[Any], str]:
        names.project(project)
        self.delete_expired(now_us())
        page, next_token = self._names.page(f"{project}/snapshots/", page_size, token)
        return [self._view(self.entries[n]) for n in page], next_token

    def list_topic(self, topic: str, page_size: int, token: str) -> tuple[list[str], str]:
        uid = self.catalog.topic(topic).record.uid
        self.delete_expired(now_us())
        pager = _SortedNames()
        pager.names = sorted(n for n, e in self.entries.items() if e.record.topic_uid == uid)
        return pager.page("", page_size, token)

    def delete_expired(self, now: int) -> int:
        expired = [e for e in self.entries.values() if e.expire_us <= now]
        for entry in expired:
            log.info("snapshot %s expired", entry.record.name)
            self._remove(entry)
        return len(expired)

    def _view(self, entry: SnapshotEntry) -> Any:
        """The snapshot as clients see it: its topic shows ``_deleted-topic_`` once deleted."""
        topic = self.catalog.topics.get(entry.snapshot.topic)
        if topic is not None and topic.record.uid == entry.record.topic_uid:
            return entry.snapshot
        view = pb.Snapshot()
        view.CopyFrom(entry.snapshot)
        view.topic = names.DELETED_TOPIC
        return view

    # --- seek ---------------------------------------------------------------------------------

    async def seek(self, request: Any) -> None:
        names.subscription(request.subscription)
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidArgument("seek: one of time or snapshot is required")
        if target == "snapshot":
            names.snapshot(request.snapshot)
        sub = self.catalog.subscription(request.subscription)
        dispatcher = self._dispatcher(sub)
        sources = dispatcher.sources
        if target == "snapshot":
            snap = self.entry(request.snapshot)
            if snap.record.topic_uid != sub.record.topic_uid:
                raise FailedPrecondition(
                    f"The subscription's topic ({sub.subscription.topic}) is different from that "
                    f"of the snapshot ({snap.snapshot.topic})."
                )
            # A source added after the snapshot holds only later messages: all unacked.
            captured = snap.states()
            states = {
                s: retention.seek_state(st, st.mark_delete, None, sources.logs[s].start_offset)
                for s in range(len(sources.logs))
                for st in [captured.get(s, CursorState(0, ()))]
            }
        else:
            states = self._seek_time_states(sub, dispatcher, retention.timestamp_us(request.time))
        dispatcher.reset(states)
        # The new state is durable before Seek answers.
        await self._flush(dispatcher)

    def _seek_time_states(
        self, sub: SubscriptionEntry, dispatcher: SubscriptionDispatcher, time_us: int
    ) -> dict[int, CursorState]:
        now = now_us()
        topic_retention, retain_acked = self._retention_us(sub)
        # The topic's size limit bounds what its retention keeps (topics_by_uid: live topics,
        # so a re-created topic of the same name does not count, as in _retention_us).
        _, topic_bytes = _topic_retention(self.catalog.topics_by_uid.get(sub.record.topic_uid))
        states: dict[int, CursorState] = {}
        for source, cursor in dispatcher.journal.cursors.items():
            log_ = dispatcher.sources.logs[source]
            floor = retention.replay_floor(
                log_,
                now,
                topic_retention_us=topic_retention,
                retain_acked_us=retain_acked,
                sync_start=sub.record.start_offsets.get(source, 0),
                topic_retention_bytes=topic_bytes,
            )
            states[source] = retention.seek_state(
                cursor.snapshot(), log_.offset_for_time(time_us), floor, log_.start_offset
            )
        return states

    def _retention_us(self, sub: SubscriptionEntry) -> tuple[int | None, int | None]:
        """(topic retention, retain-acked retention) that apply to a subscription's messages."""
        topic_retention = None
        topic = self.catalog.topics.get(sub.subscription.topic)
        if (
            topic is not None
            and topic.record.uid == sub.record.topic_uid
            and topic.topic.HasField("message_retention_duration")
        ):
            topic_retention = retention.duration_us(topic.topic.message_retention_duration)
        retain_acked = None
        if sub.subscription.retain_acked_messages:
            retain_acked = _subscription_retention_us(sub.subscription)
        return topic_retention, retain_acked

    def _dispatcher(self, sub: SubscriptionEntry) -> SubscriptionDispatcher:
        if sub.subscription.detached:
            raise FailedPrecondition(f"subscription {sub.record.name} is detached")
        return self.catalog.subscribing.dispatcher(sub.record.name)

    async def _flush(self, dispatcher: SubscriptionDispatcher) -> None:
        await self.catalog.publishing.flush_journal(dispatcher.journal)  # DiskFull if full

    # --- detach -------------------------------------------------------------------------------

    async def detach(self, name: str) -> None:
        """Detach: streams end with FAILED_PRECONDITION, the backlog is dropped, and Pull,
        StreamingPull and Acknowledge answer FAILED_PRECONDITION from now on."""
        sub = self.catalog.subscription(name)
        if sub.subscription.detached:
            return
        sub.subscription.detached = True
        sub.record.body = sub.subscription.SerializeToString()
        self.catalog.store.put_subscription(sub.record)
        self.catalog.subscribing.close_subscription(
            name, FailedPrecondition(f"subscription {name} is detached")
        )
        await self.catalog.publishing.detach(sub.record.topic_uid, sub.record.uid)
        self.refresh_pins(sub.record.topic_uid)

    # --- retention ----------------------------------------------------------------------------

    def refresh_pins(self, topic_uid: str | None = None, *, stored_only: bool = False) -> None:
        """Recompute the time-based pins (topic retention, retain_acked_messages) of one topic's
        sources, or of every topic's; ``stored_only``: of every topic written to (the periodic
        refresh: a topic never written to keeps the pins of its last refresh, which hold back
        everything its log will get until the next one)."""
        publishing = self.catalog.publishing
        if topic_uid is None and stored_only:
            targets = {u: publishing.topics[u] for u in publishing.stored if u in publishing.topics}
        elif topic_uid is None:
            targets = dict(publishing.topics)
        else:
            found = publishing.topics.get(topic_uid)
            targets = {topic_uid: found} if found is not None else {}
        if not targets:
            return
        now = now_us()
        # Work per target topic only: one topic's refresh (every admin change) and the periodic
        # one (topics written to) must not scan every topic and subscription.
        for uid, sources in targets.items():
            topic = self.catalog.topics_by_uid.get(uid)
            subs = self.catalog.subscriptions_of(uid)
            if not sources.pins and not subs and topic is None:
                continue  # nothing pinned, nothing to pin
            pins: dict[str, dict[int, int]] = {}
            keep_us, keep_bytes = _topic_retention(topic)
            topic_pins = _topic_pins(sources, keep_us, keep_bytes, now)
            if topic_pins is not None:
                pins[retention.TOPIC_PIN] = topic_pins
            for sub in subs:
                if sub.subscription.retain_acked_messages and not sub.subscription.detached:
                    keep = _subscription_retention_us(sub.subscription)
                    pins[retention.retain_acked_pin(sub.record.uid)] = _time_pins(
                        sources, keep, now
                    )
            # Only the pins this method computes are replaced; snapshots, named cursors
            # (control/cursors.py) and the dedup window (data/publish/dedup.py) own theirs.
            for name in [
                n
                for n in sources.pins
                if (n == retention.TOPIC_PIN or n.startswith("retain-acked:")) and n not in pins
            ]:
                del sources.pins[name]
            sources.pins.update(pins)

    def expire_unacked(self) -> int:
        """Unacked messages older than their subscription's message_retention_duration leave
        its backlog (they become acked). Returns how many subscriptions changed."""
        now = now_us()
        changed = 0
        publishing = self.catalog.publishing
        for dispatcher in list(self.catalog.subscribing.dispatchers.values()):
            if not dispatcher.sources.on_disk():
                continue  # never written to: no messages
            journal = dispatcher.journal
            touched = False
            for source, cursor in journal.cursors.items():
                if source >= len(dispatcher.sources.logs):
                    continue
                log_ = dispatcher.sources.logs[source]
                md = cursor.mark_delete
                if md >= log_.committed_offset:
                    continue  # no backlog (most subscriptions most of the time)
                keep = _subscription_retention_us(dispatcher.subscription)
                cut = retention.unacked_expiry_cut(log_, keep, now, md)
                if cut <= md:
                    continue
                journal.record(source, cursor.ack_range(md, cut))
                read = dispatcher.read_offsets.get(source, md)
                dispatcher.read_offsets[source] = max(read, cut)
                touched = True
            if touched:
                publishing.mark_dirty(journal)
                dispatcher.schedule_pump()
                changed += 1
        return changed


def _snapshot_pin(entry: SnapshotEntry, source_count: int) -> dict[int, int]:
    """What a snapshot keeps: per captured source its mark-delete; a source added to the
    topic after the snapshot was taken is kept whole (Seek makes all of it unacked)."""
    pin = dict.fromkeys(range(source_count), 0)
    pin.update((s, md) for s, (md, _) in entry.record.cursors.items())
    return pin


def _subscription_retention_us(subscription: Any) -> int:
    if subscription.HasField("message_retention_duration"):
        return retention.duration_us(subscription.message_retention_duration)
    return DEFAULT_SUBSCRIPTION_RETENTION_US


def _time_pins(sources: TopicSources, keep_us: int, now: int) -> dict[int, int]:
    return {i: retention.time_pin(log_, keep_us, now) for i, log_ in enumerate(sources.logs)}


def _topic_retention(topic: TopicEntry | None) -> tuple[int | None, int | None]:
    """A topic's own retention: (message_retention_duration in us, pubsubd-retention-bytes)."""
    if topic is None:
        return None, None
    keep_us = None
    if topic.topic.HasField("message_retention_duration"):
        keep_us = retention.duration_us(topic.topic.message_retention_duration)
    return keep_us, quotas.retention_bytes(topic.topic.labels)


def _topic_pins(
    sources: TopicSources, keep_us: int | None, keep_bytes: int | None, now: int
) -> dict[int, int] | None:
    """The topic-retention pin per source (time and/or size, ``retention.topic_pin``)."""
    pins: dict[int, int] = {}
    for i, log_ in enumerate(sources.logs):
        pin = retention.topic_pin(log_, now, retention_us=keep_us, retention_bytes=keep_bytes)
        if pin is None:
            return None  # no topic retention
        pins[i] = pin
    return pins


def _oldest_unacked_us(sources: TopicSources, states: dict[int, CursorState]) -> int | None:
    """Publish time of the oldest unacked message of an ack state (None: nothing unacked)."""
    oldest: int | None = None
    for source, state in states.items():
        if source >= len(sources.logs):
            continue
        log_ = sources.logs[source]
        offset = max(state.mark_delete, log_.start_offset)
        if offset >= log_.committed_offset:
            continue
        try:
            t = log_.publish_time_us(offset)
        except (OffsetOutOfRange, DamagedEntries):
            continue
        oldest = t if oldest is None else min(oldest, t)
    return oldest


def _set_timestamp(ts: Any, us: int) -> None:
    seconds, micros = divmod(us, retention.US_PER_S)
    ts.seconds = seconds
    ts.nanos = micros * 1000
