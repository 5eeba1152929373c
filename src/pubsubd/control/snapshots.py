"""Snapshots, Seek, DetachSubscription and retention pins: the control plane of replay.

* **Snapshots** capture a subscription's ack state (per source: mark-delete plus acked ranges) and
  its topic's storage uid. They live in the metadata store, and the topic's publishing forwarder
  pins what they still need from their records (``data/reconcile.py``) until they expire: 7 days
  after the oldest unacked message they capture (docs/GOOGLE_API.md §6).
* **Seek** replaces a subscription's ack state through its subscribing forwarder (which has it
  journaled before Seek answers): to a snapshot's state, or to "acked before a time"
  (core/retention.py says which messages are still retained and so can come back).
  Outstanding ack IDs stop leasing anything.
* **DetachSubscription** marks the subscription detached in its record; its forwarders end its
  streams with FAILED_PRECONDITION and drop its backlog (its ack journal).
* **Retention pins**: a topic's ``message_retention_duration`` and ``pubsubd-retention-bytes``
  (one pin: kept while inside both, Pulsar's rule) and each subscription's
  ``retain_acked_messages`` window (not bounded by the topic's size limit) become pins,
  refreshed when a topic or subscription record changes and periodically (control/expiry.py),
  and set on the publishing forwarders through the router. Unacked messages older than a
  subscription's retention leave its backlog.

Everything here reaches the forwarders through ``core.roles`` with plain values.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pubsubd.control.catalog import Catalog, SubscriptionEntry, TopicEntry
from pubsubd.control.paging import SortedNames, apply_mask
from pubsubd.control.router import Routes
from pubsubd.core import names, pb, quotas, retention, validation
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from pubsubd.core.records import CursorState
from pubsubd.core.roles import PublishingForwarderApi
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange
from pubsubd.storage.metadata import (
    Change,
    RecordChanged,
    SnapshotRecord,
    SubscriptionRecord,
    TopicRecord,
)

log = logging.getLogger(__name__)

SNAPSHOT_UPDATABLE = frozenset({"labels", "expire_time"})
DEFAULT_SUBSCRIPTION_RETENTION_US = validation.DEFAULT_SUBSCRIPTION_RETENTION_S * retention.US_PER_S


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


class LogView:
    """One source of a topic as retention sees it (``core.retention.SizedLog``), read through
    the publishing forwarder's interface."""

    __slots__ = ("_publishing", "_source", "_topic")

    def __init__(self, publishing: PublishingForwarderApi, topic_uid: str, source: int) -> None:
        self._publishing = publishing
        self._topic = topic_uid
        self._source = source

    @property
    def start_offset(self) -> int:
        return self._publishing.start_offset(self._topic, self._source)

    @property
    def committed_offset(self) -> int:
        return self._publishing.committed_offset(self._topic, self._source)

    def offset_for_time(self, publish_time_us: int) -> int:
        return self._publishing.offset_for_time(self._topic, self._source, publish_time_us)

    def segment_sizes(self) -> list[tuple[int, int]]:
        return self._publishing.segment_sizes(self._topic, self._source)


def log_views(publishing: PublishingForwarderApi, topic_uid: str) -> list[LogView]:
    return [LogView(publishing, topic_uid, i) for i in range(publishing.source_count(topic_uid))]


class Snapshots:
    """Snapshot registry plus Seek, detach and retention pins, over the catalog."""

    def __init__(self, catalog: Catalog, routes: Routes, clock: Clock = SYSTEM_CLOCK) -> None:
        self.catalog = catalog
        self.routes = routes
        self.clock = clock
        self.entries: dict[str, SnapshotEntry] = {}
        self._names = SortedNames()
        # (subscription uid, name, the ack state known here) -> every source's as of now
        # (a spread subscription's, from the forwarders serving its other sources).
        self.gather: (
            Callable[[str, str, Mapping[int, CursorState]], Awaitable[dict[int, CursorState]]]
            | None
        ) = None

    def now_us(self) -> int:
        return self.clock.time_us()

    # --- start-up -----------------------------------------------------------------------------

    def load(self) -> None:
        """Restore snapshots (the forwarders pin for them) and the retention pins of every
        topic; from then on, follow topic and subscription changes."""
        for rec in self.catalog.store.load_snapshots():
            self._add(SnapshotEntry(rec, pb.Snapshot.FromString(rec.body)))
        self.refresh_pins()
        self.catalog.store.changes.watch(self._on_change)
        if self.entries:
            log.info("loaded %d snapshots", len(self.entries))

    def _on_change(self, change: Change) -> None:
        """A topic or subscription changed (retention settings, sources): its pins follow.

        The feed calls this while the store write returns, before the writer (the catalog)
        updates its own view: the changed record stands in for the catalog's entry."""
        record = change.record
        if isinstance(record, SnapshotRecord):
            if change.remote:  # another process's: ours are in the view already
                self._remote_snapshot(record, change.deleted)
            return
        if isinstance(record, TopicRecord):
            self.refresh_pins(record.uid, changed=change)
        elif isinstance(record, SubscriptionRecord):
            self.refresh_pins(record.topic_uid, changed=change)

    def _remote_snapshot(self, record: SnapshotRecord, deleted: bool) -> None:
        if record.name in self.entries:
            self.entries.pop(record.name)
            self._names.remove(record.name)
        if not deleted:
            self._add(SnapshotEntry(record, pb.Snapshot.FromString(record.body)))

    def _add(self, entry: SnapshotEntry) -> None:
        self.entries[entry.record.name] = entry
        self._names.add(entry.record.name)

    def _remove(self, entry: SnapshotEntry) -> None:
        name = entry.record.name
        self.catalog.store.delete_snapshot(name)  # the publishing forwarder drops its pin
        self.entries.pop(name, None)
        self._names.remove(name)

    # --- snapshots ----------------------------------------------------------------------------

    async def create_now(self, request: Any) -> Any:
        """CreateSnapshot: :meth:`create` with every source's position as of now. A spread
        subscription's dispatcher here knows only its own sources' acks; ``gather`` (set in a
        cluster of forwarders, ``data/subscribe/leg_cursors.py``) reads the other sources'
        from the forwarders serving them."""
        if self.gather is None:
            return self.create(request)
        names.subscription(request.subscription)
        sub = self.catalog.subscription(request.subscription)
        self._check_attached(sub)
        uid, name = sub.record.uid, sub.record.name
        states = await self.gather(uid, name, self.routes.subscribing(uid).cursor_states(name))
        return self.create(request, states)

    def create(self, request: Any, states: Mapping[int, CursorState] | None = None) -> Any:
        """CreateSnapshot with ``states`` (default: the subscription's ack state as its
        dispatcher here knows it)."""
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
        now = self.now_us()
        self.delete_expired(now)
        if name in self.entries or self._look_further(name) is not None:
            raise AlreadyExists("snapshot", name)
        self._check_attached(sub)
        topic_uid = sub.record.topic_uid
        if states is None:
            states = self.routes.subscribing(sub.record.uid).cursor_states(sub.record.name)
        oldest = _oldest_unacked_us(self.routes.reader(topic_uid), topic_uid, states)
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
            topic_uid,
            snapshot.SerializeToString(),
            {s: (st.mark_delete, list(st.ranges)) for s, st in states.items()},
        )
        # Create-only: another process creating the name a moment ago (past the check above,
        # through a shared store) makes this AlreadyExists, as Google answers the second one.
        self.catalog.store.put_snapshot(record, create=True)  # the publishing forwarder pins it
        entry = SnapshotEntry(record, snapshot)
        self._add(entry)
        return self._view(entry)

    def _look_further(self, name: str) -> SnapshotEntry | None:
        """A snapshot this view lacks may have been created through another process a
        moment ago (a cluster's shared store): read it from the store."""
        if not getattr(self.catalog.store, "shared", False):
            return None
        record = self.catalog.store.find_snapshot(name)  # type: ignore[attr-defined]
        if record is None:
            return None
        self._remote_snapshot(record, False)
        return self.entries.get(name)

    def entry(self, name: str) -> SnapshotEntry:
        names.snapshot(name)
        entry = self.entries.get(name) or self._look_further(name)
        if entry is not None and entry.expire_us <= self.now_us():
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
        apply_mask(paths, request.snapshot, updated)
        validation.labels("labels", updated.labels)
        if "expire_time" in paths and retention.timestamp_us(updated.expire_time) <= self.now_us():
            raise InvalidArgument("expire_time: must be in the future")
        record = SnapshotRecord(
            entry.record.name,
            entry.record.topic_uid,
            updated.SerializeToString(),
            entry.record.cursors,
        )
        try:
            self.catalog.store.put_snapshot(record, expected=entry.record.body)
        except RecordChanged as e:
            raise ConcurrentUpdate("snapshot", entry.record.name) from e
        entry.record = record
        entry.snapshot = updated
        return self._view(entry)

    def delete(self, name: str) -> None:
        self._remove(self.entry(name))

    def list_project(self, project: str, page_size: int, token: str) -> tuple[list[Any], str]:
        names.project(project)
        self.delete_expired(self.now_us())
        page, next_token = self._names.page(f"{project}/snapshots/", page_size, token)
        return [self._view(self.entries[n]) for n in page], next_token

    def list_topic(self, topic: str, page_size: int, token: str) -> tuple[list[str], str]:
        uid = self.catalog.topic(topic).record.uid
        self.delete_expired(self.now_us())
        pager = SortedNames(sorted(n for n, e in self.entries.items() if e.record.topic_uid == uid))
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
        self._check_attached(sub)
        topic_uid = sub.record.topic_uid
        publishing = self.routes.reader(topic_uid)
        if target == "snapshot":
            snap = self.entry(request.snapshot)
            if snap.record.topic_uid != topic_uid:
                raise FailedPrecondition(
                    f"The subscription's topic ({sub.subscription.topic}) is different from that "
                    f"of the snapshot ({snap.snapshot.topic})."
                )
            # A source added after the snapshot holds only later messages: all unacked.
            captured = snap.states()
            states = {
                s: retention.seek_state(st, st.mark_delete, None, span.start_offset)
                for s, span in enumerate(publishing.ranges(topic_uid))
                for st in [captured.get(s, CursorState(0, ()))]
            }
        else:
            states = self._seek_time_states(sub, publishing, retention.timestamp_us(request.time))
        # The new state is durable before Seek answers.
        await self.routes.subscribing(sub.record.uid).reset(sub.record.name, states)

    async def seek_offsets(self, name: str, offsets: Mapping[int, int]) -> None:
        """Replay API SeekOffsets: in each source named, every message from its offset on is
        unacked (anything the log still holds: the log's start is the floor, not retention)
        and every one before it acked; an offset past the committed end counts as the end.
        Other sources keep their ack state; as with Seek, outstanding ack IDs stop working
        and what was delivered but not acked is delivered again."""
        names.subscription(name)
        sub = self.catalog.subscription(name)
        self._check_attached(sub)
        topic_uid = sub.record.topic_uid
        publishing = self.routes.reader(topic_uid)
        count = publishing.source_count(topic_uid)
        for source, offset in offsets.items():
            if not 0 <= source < count:
                raise InvalidArgument(
                    f"offsets: {source} is not a source of the topic (it has 0..{count - 1})"
                )
            if offset < 0:
                raise InvalidArgument(f"offsets[{source}]: must not be negative")
        subscribing = self.routes.subscribing(sub.record.uid)
        current = subscribing.cursor_states(sub.record.name)
        states: dict[int, CursorState] = {}
        for source, offset in offsets.items():
            log_ = LogView(publishing, topic_uid, source)
            start = log_.start_offset
            target = min(offset, log_.committed_offset)
            states[source] = retention.seek_state(
                current.get(source, CursorState(0, ())), target, start, start
            )
        await subscribing.reset(sub.record.name, states)

    def _seek_time_states(
        self, sub: SubscriptionEntry, publishing: PublishingForwarderApi, time_us: int
    ) -> dict[int, CursorState]:
        now = self.now_us()
        topic_retention, retain_acked = self._retention_us(sub)
        # The topic's size limit bounds what its retention keeps (topics_by_uid: live topics,
        # so a re-created topic of the same name does not count, as in _retention_us).
        _, topic_bytes = _topic_retention(self.catalog.topics_by_uid.get(sub.record.topic_uid))
        topic_uid = sub.record.topic_uid
        current = self.routes.subscribing(sub.record.uid).cursor_states(sub.record.name)
        states: dict[int, CursorState] = {}
        for source, state in current.items():
            log_ = LogView(publishing, topic_uid, source)
            floor = retention.replay_floor(
                log_,
                now,
                topic_retention_us=topic_retention,
                retain_acked_us=retain_acked,
                sync_start=sub.record.start_offsets.get(source, 0),
                topic_retention_bytes=topic_bytes,
            )
            states[source] = retention.seek_state(
                state, log_.offset_for_time(time_us), floor, log_.start_offset
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

    @staticmethod
    def _check_attached(sub: SubscriptionEntry) -> None:
        if sub.subscription.detached:
            raise FailedPrecondition(f"subscription {sub.record.name} is detached")

    # --- detach -------------------------------------------------------------------------------

    async def detach(self, name: str) -> None:
        """Detach: streams end with FAILED_PRECONDITION, the backlog is dropped, and Pull,
        StreamingPull and Acknowledge answer FAILED_PRECONDITION from now on."""
        sub = self.catalog.subscription(name)
        if sub.subscription.detached:
            return
        updated = pb.Subscription()
        updated.CopyFrom(sub.subscription)
        updated.detached = True
        record = SubscriptionRecord(
            sub.record.name,
            sub.record.uid,
            sub.record.topic_uid,
            updated.SerializeToString(),
            sub.record.start_offsets,
        )
        pending = self.catalog.store.put_subscription(record)  # its forwarders let it go
        sub.record, sub.subscription = record, updated
        if pending is not None:
            await pending

    # --- retention ----------------------------------------------------------------------------

    def refresh_pins(
        self,
        topic_uid: str | None = None,
        *,
        stored_only: bool = False,
        changed: Change | None = None,
    ) -> None:
        """Recompute the time-based pins (topic retention, retain_acked_messages) of one topic's
        sources, or of every topic's; ``stored_only``: of every topic written to (the periodic
        refresh: a topic never written to keeps the pins of its last refresh, which hold back
        everything its log will get until the next one); ``changed``: a topic or subscription
        record just written, newer than the catalog's entry."""
        if topic_uid is not None:
            if not self.routes.serves_topic(topic_uid):
                return  # another forwarder's: it refreshes the pins
            targets = [(topic_uid, self.routes.publishing(topic_uid))]
        else:
            targets = [
                (uid, publishing)
                for publishing in self.routes.all_publishing()
                for uid in publishing.topic_uids(written_only=stored_only)
            ]
        if not targets:
            return
        now = self.now_us()
        # Work per target topic only: one topic's refresh (every admin change) and the periodic
        # one (topics written to) must not scan every topic and subscription.
        for uid, publishing in targets:
            if not publishing.has_topic(uid):
                continue  # not open here (dropped, or its storage cannot be opened)
            topic = self.catalog.topics_by_uid.get(uid)
            subs = self.catalog.subscriptions_of(uid)
            if changed is not None:
                topic, subs = _with_change(uid, topic, subs, changed)
            owners = publishing.pin_owners(uid)
            if not owners and not subs and topic is None:
                continue  # nothing pinned, nothing to pin
            pins: dict[str, dict[int, int]] = {}
            keep_us, keep_bytes = _topic_retention(topic)
            views = log_views(publishing, uid)
            topic_pins = _topic_pins(views, keep_us, keep_bytes, now)
            if topic_pins is not None:
                pins[retention.TOPIC_PIN] = topic_pins
            for sub in subs:
                if sub.subscription.retain_acked_messages and not sub.subscription.detached:
                    keep = _subscription_retention_us(sub.subscription)
                    pins[retention.retain_acked_pin(sub.record.uid)] = _time_pins(views, keep, now)
            # Only the pins this method computes are replaced; snapshots, named cursors
            # and the dedup window own theirs.
            for owner in owners:
                computed = owner == retention.TOPIC_PIN or owner.startswith("retain-acked:")
                if computed and owner not in pins:
                    publishing.set_pins(uid, owner, None)
            for owner, pin in pins.items():
                publishing.set_pins(uid, owner, pin)

    def expire_unacked(self) -> int:
        """Unacked messages older than their subscription's message_retention_duration leave
        its backlog (they become acked). Returns how many subscriptions changed."""
        now = self.now_us()
        changed = 0
        for sub in list(self.catalog.subscriptions.values()):
            if sub.subscription.detached:
                continue
            topic_uid = sub.record.topic_uid
            routes = self.routes
            if not routes.serves_topic(topic_uid) or not routes.serves_subscription(sub.record.uid):
                continue  # another forwarder's (a subscription may be served apart from its topic)
            publishing = routes.publishing(topic_uid)
            subscribing = routes.subscribing(sub.record.uid)
            name = sub.record.name
            if not publishing.on_disk(topic_uid) or not subscribing.serves(name):
                continue  # never written to: no messages
            touched = False
            keep = _subscription_retention_us(sub.subscription)
            spans = publishing.ranges(topic_uid)
            for source, state in subscribing.cursor_states(name).items():
                if source >= len(spans):
                    continue
                md = state.mark_delete
                if md >= spans[source].committed_offset:
                    continue  # no backlog (most subscriptions most of the time)
                log_ = LogView(publishing, topic_uid, source)
                cut = retention.unacked_expiry_cut(log_, keep, now, md)
                if cut > md and subscribing.ack_below(name, source, cut):
                    touched = True
            if touched:
                changed += 1
        return changed


def _with_change(
    topic_uid: str, topic: TopicEntry | None, subs: list[SubscriptionEntry], change: Change
) -> tuple[TopicEntry | None, list[SubscriptionEntry]]:
    """The catalog's view of a topic and its subscriptions, with ``change`` applied."""
    record = change.record
    if isinstance(record, TopicRecord) and record.uid == topic_uid:
        topic = None if change.deleted else TopicEntry(record, pb.Topic.FromString(record.body))
    elif isinstance(record, SubscriptionRecord) and record.topic_uid == topic_uid:
        subs = [s for s in subs if s.record.name != record.name]
        if not change.deleted:
            subs.append(SubscriptionEntry(record, pb.Subscription.FromString(record.body)))
    return topic, subs


def _subscription_retention_us(subscription: Any) -> int:
    if subscription.HasField("message_retention_duration"):
        return retention.duration_us(subscription.message_retention_duration)
    return DEFAULT_SUBSCRIPTION_RETENTION_US


def _time_pins(views: list[LogView], keep_us: int, now: int) -> dict[int, int]:
    return {i: retention.time_pin(log_, keep_us, now) for i, log_ in enumerate(views)}


def _topic_retention(topic: TopicEntry | None) -> tuple[int | None, int | None]:
    """A topic's own retention: (message_retention_duration in us, pubsubd-retention-bytes)."""
    if topic is None:
        return None, None
    keep_us = None
    if topic.topic.HasField("message_retention_duration"):
        keep_us = retention.duration_us(topic.topic.message_retention_duration)
    return keep_us, quotas.retention_bytes(topic.topic.labels)


def _topic_pins(
    views: list[LogView], keep_us: int | None, keep_bytes: int | None, now: int
) -> dict[int, int] | None:
    """The topic-retention pin per source (time and/or size, ``retention.topic_pin``)."""
    pins: dict[int, int] = {}
    for i, log_ in enumerate(views):
        pin = retention.topic_pin(log_, now, retention_us=keep_us, retention_bytes=keep_bytes)
        if pin is None:
            return None  # no topic retention
        pins[i] = pin
    return pins


def _oldest_unacked_us(
    publishing: PublishingForwarderApi, topic_uid: str, states: Mapping[int, CursorState]
) -> int | None:
    """Publish time of the oldest unacked message of an ack state (None: nothing unacked)."""
    oldest: int | None = None
    spans = publishing.ranges(topic_uid)
    for source, state in states.items():
        if source >= len(spans):
            continue
        offset = max(state.mark_delete, spans[source].start_offset)
        if offset >= spans[source].committed_offset:
            continue
        try:
            t = publishing.publish_time_us(topic_uid, source, offset)
        except (OffsetOutOfRange, DamagedEntries):
            continue
        oldest = t if oldest is None else min(oldest, t)
    return oldest


def _set_timestamp(ts: Any, us: int) -> None:
    seconds, micros = divmod(us, retention.US_PER_S)
    ts.seconds = seconds
    ts.nanos = micros * 1000
