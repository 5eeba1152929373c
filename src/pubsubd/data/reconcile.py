"""Forwarders follow the metadata store: every durable change is applied by the forwarder that
owns the resource (DESIGN: "state flows one way").

The catalog, snapshots and named cursors only write records to the metadata store; its change
feed (in-process now, ZooKeeper watches in a cluster) calls these reconcilers, which bring their
forwarder to what the records say. At start-up each replays the whole store. Whether a record
is this forwarder's is the router's decision (``owns``, by the record's storage uid).

- :class:`PublishingReconciler`: a topic's storage settings (sources, ordering-key sources,
  damage policy, from its labels), its and its subscriptions' backlog quotas (block_publishers
  ones evaluated at the owner in a cluster, ``data/publish/owner_quotas.py``); the pins of
  snapshots and named cursors; the storage of a topic dropped once the topic is deleted and no
  subscription reads it any more; a deleted or detached subscription's ack journal dropped.
- :class:`SubscribingReconciler`: subscriptions served (opened from their sync point,
  reconfigured, closed when deleted or detached), their topics' backlog quotas.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pubsubd.core import damage_policy, pb, publish_sources, quotas, retention
from pubsubd.core.errors import DataLoss, FailedPrecondition, InvalidArgument, SubscriptionNotFound
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.storage.metadata import (
    Change,
    CursorRecord,
    MetadataStore,
    PolicyRecord,
    SchemaRecord,
    SnapshotRecord,
    SubscriptionRecord,
    TopicRecord,
)

log = logging.getLogger(__name__)

# Owner names of the pins this reconciler installs (``TopicSources.pins``).
CURSOR_PIN_PREFIX = "cursor:"


def cursor_pin(name: str) -> str:
    """The pin owner name of a replay API named cursor."""
    return f"{CURSOR_PIN_PREFIX}{name}"


def replay(store: MetadataStore) -> Iterable[Change]:
    """The whole store as changes, in the order a forwarder needs them at start-up: topics,
    subscriptions, snapshots, named cursors."""
    for record in store.load_topics():
        yield Change(record)
    for sub in store.load_subscriptions():
        yield Change(sub)
    for snap in store.load_snapshots():
        yield Change(snap)
    for cursor in store.load_cursors():
        yield Change(cursor)


def _storage_settings(
    record: TopicRecord,
) -> tuple[publish_sources.SourceCounts, damage_policy.DamagePolicy]:
    labels = pb.Topic.FromString(record.body).labels
    try:
        counts = publish_sources.parse(labels)
    except InvalidArgument as e:  # stored before the label was validated
        log.warning("topic %s: %s; opening the sources on disk", record.name, e)
        counts = publish_sources.SourceCounts()
    try:
        policy = damage_policy.parse(labels)
    except InvalidArgument:
        policy = damage_policy.DamagePolicy.STOP
    return counts, policy


class PublishingReconciler:
    """Keeps one publishing forwarder's topics as the metadata store says."""

    def __init__(self, forwarder: PublishingForwarder, owns: Callable[[str], bool]) -> None:
        self.forwarder = forwarder
        self.owns = owns  # topic uid -> whether this forwarder holds its sources
        self._live: set[str] = set()  # uids of topics not deleted
        self._readers: dict[str, set[str]] = {}  # topic uid -> uids of its subscriptions
        self._snapshots: dict[str, dict[str, SnapshotRecord]] = {}  # topic uid -> name -> rec

    def __call__(self, change: Change) -> Awaitable[None] | None:
        record = change.record
        if isinstance(record, SchemaRecord):
            return None  # schemas are the control plane's (control/schemas.py)
        if isinstance(record, PolicyRecord):
            return None  # access control: nothing a forwarder stores
        uid = record.topic_uid if not isinstance(record, TopicRecord) else record.uid
        if not self.owns(uid):
            return None
        if isinstance(record, TopicRecord):
            return self._topic(record, change.deleted)
        if isinstance(record, SubscriptionRecord):
            return self._subscription(record, change.deleted)
        if isinstance(record, SnapshotRecord):
            self._snapshot(record, change.deleted)
        elif isinstance(record, CursorRecord):
            offsets = None if change.deleted or not record.offsets else record.offsets
            self.forwarder.set_pins(record.topic_uid, cursor_pin(record.name), offsets)
        return None

    def forget(self, topic_uid: str) -> None:
        """The topic moved to another forwarder: what was known of it goes (a later gain
        replays its records)."""
        self._live.discard(topic_uid)
        self._readers.pop(topic_uid, None)
        self._snapshots.pop(topic_uid, None)

    def _topic(self, record: TopicRecord, deleted: bool) -> Awaitable[None] | None:
        uid = record.uid
        if deleted:
            self._live.discard(uid)
            self.forwarder.set_topic_quota(uid, None)
            return self._drop_if_unread(uid)
        self._live.add(uid)
        self.forwarder.set_topic_quota(uid, _topic_quota(record))
        counts, policy = _storage_settings(record)
        try:
            added = self.forwarder.configure_topic(
                uid, counts.sources, counts.key_sources, policy, counts.active
            )
        except DataLoss:
            return None  # logged by the forwarder: this topic answers DATA_LOSS, others serve
        if added:
            for snap in self._snapshots.get(uid, {}).values():
                self._snapshot(snap, False)  # they pin the new sources whole
        return None

    def _subscription(self, record: SubscriptionRecord, deleted: bool) -> Awaitable[None] | None:
        body = None if deleted else pb.Subscription.FromString(record.body)
        detached = body is not None and body.detached
        readers = self._readers.setdefault(record.topic_uid, set())
        if body is None or detached:
            self.forwarder.set_subscription_quota(
                record.topic_uid, record.uid, record.name, gone=True
            )
        else:
            own, has_own = _own_quota(body)
            self.forwarder.set_subscription_quota(
                record.topic_uid, record.uid, record.name, own, has_own
            )
        if deleted or detached:
            was_reading = record.uid in readers
            readers.discard(record.uid)
            if not deleted and not was_reading:
                return None  # detached before (start-up replay): no journal to drop
            return self._detach(record)
        readers.add(record.uid)
        # Counted at once against a block_publishers quota evaluated here (a cluster).
        self.forwarder.count_subscription(record.topic_uid, record.uid, record.start_offsets)
        return None

    async def _detach(self, record: SubscriptionRecord) -> None:
        await self.forwarder.detach(record.topic_uid, record.uid)
        dropped = self._drop_if_unread(record.topic_uid)
        if dropped is not None:
            await dropped

    def _drop_if_unread(self, topic_uid: str) -> Awaitable[None] | None:
        """A deleted topic's storage goes once no subscription reads it."""
        if topic_uid in self._live or self._readers.get(topic_uid):
            return None
        self._readers.pop(topic_uid, None)
        return self.forwarder.drop_topic(topic_uid)

    def _snapshot(self, record: SnapshotRecord, deleted: bool) -> None:
        by_name = self._snapshots.setdefault(record.topic_uid, {})
        owner = retention.snapshot_pin(record.name)
        if deleted:
            by_name.pop(record.name, None)
            self.forwarder.set_pins(record.topic_uid, owner, None)
            return
        by_name[record.name] = record
        if record.topic_uid in self.forwarder.failed_topics:
            return
        # Per captured source its mark-delete; a source added to the topic after the snapshot
        # was taken is kept whole (a Seek to it makes all of it unacked).
        pin = dict.fromkeys(range(self.forwarder.source_count(record.topic_uid)), 0)
        pin.update((s, md) for s, (md, _) in record.cursors.items())
        self.forwarder.set_pins(record.topic_uid, owner, pin)

    def start(self, store: MetadataStore) -> None:
        """Replay the store, then delete the storage of topics nothing refers to any more."""
        for change in replay(store):
            pending = self(change)
            if pending is not None:  # cannot happen at start-up: nothing is deleted
                close = getattr(pending, "close", None)
                if close is not None:
                    close()
        self.forwarder.remove_unreferenced(self._live | set(self._readers))
        store.changes.watch(self)


class SubscribingReconciler:
    """Keeps one subscribing forwarder's subscriptions as the metadata store says."""

    def __init__(
        self, forwarder: SubscribingForwarder, owns: Callable[[SubscriptionRecord], bool]
    ) -> None:
        self.forwarder = forwarder
        self.owns = owns  # whether this forwarder serves the subscription
        self._topic_quotas: dict[str, quotas.BacklogQuota | None] = {}

    def __call__(self, change: Change) -> None:
        record = change.record
        if isinstance(record, TopicRecord):
            quota = None if change.deleted else _topic_quota(record)
            self._topic_quotas[record.uid] = quota
            self.forwarder.set_topic_quota(record.uid, quota)
            self.forwarder.topic_changed(record.uid)
        elif isinstance(record, SubscriptionRecord) and self.owns(record):
            self._subscription(record, change.deleted)

    def _subscription(self, record: SubscriptionRecord, deleted: bool) -> None:
        name = record.name
        if deleted:
            self.forwarder.close_subscription(name, SubscriptionNotFound(name), record.uid)
            return
        subscription: Any = pb.Subscription.FromString(record.body)
        if subscription.detached:
            self.forwarder.close_subscription(
                name, FailedPrecondition(f"subscription {name} is detached"), record.uid
            )
            return
        served = self.forwarder.served_uid(name)
        if served == record.uid:
            self.forwarder.configure(name, subscription)
            return
        if served is not None:  # the name's earlier subscription, deleted since
            self.forwarder.close_subscription(name, SubscriptionNotFound(name), served)
        try:
            self.forwarder.open(
                name,
                subscription,
                record.uid,
                record.topic_uid,
                record.start_offsets,
                self._topic_quotas.get(record.topic_uid),
            )
        except DataLoss as e:
            self.forwarder.mark_unavailable(name, str(e))

    def start(self, store: MetadataStore) -> None:
        for change in replay(store):
            self(change)
        store.changes.watch(self)


def _topic_quota(record: TopicRecord) -> quotas.BacklogQuota | None:
    try:
        return quotas.parse(pb.Topic.FromString(record.body).labels)
    except InvalidArgument:
        return None


def _own_quota(subscription: Any) -> tuple[quotas.BacklogQuota | None, bool]:
    """A subscription's own backlog quota, from its labels, and whether it has one (labels
    that do not parse, stored before labels were checked, count as one: None, nothing)."""
    try:
        quota = quotas.parse(subscription.labels)
    except InvalidArgument:
        return None, True
    return quota, quota is not None
