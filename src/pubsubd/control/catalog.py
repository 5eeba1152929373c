"""Catalog: the control plane's record of topics and subscriptions, validated and persisted.

Create/get/update/delete/list for topics and subscriptions, following Google's semantics
(docs/GOOGLE_API.md §3-§6): defaults filled in on create, update masks, a deleted topic's
subscriptions showing ``_deleted-topic_``, paging by opaque tokens. Every change is written to the
metadata store before it is answered. Creating a subscription fixes its sync point (the end of
each source of the topic) and opens its dispatcher; deleting one drops its backlog.
"""

from __future__ import annotations

import base64
import bisect
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pubsubd.control import publish_sources, quotas
from pubsubd.core import damage_policy, names, pb, validation
from pubsubd.core.errors import (
    AlreadyExists,
    DataLoss,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SubscriptionNotFound,
    TopicNotFound,
)
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe import queue_settings
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.storage.metadata import MetadataStore, SubscriptionRecord, TopicRecord

if TYPE_CHECKING:
    from pubsubd.control.snapshots import Snapshots

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000

# Fields an update mask may name (snake_case, as Google requires).
TOPIC_UPDATABLE = frozenset(
    {
        "labels",
        "message_storage_policy",
        "kms_key_name",
        "schema_settings",
        "message_retention_duration",
        "ingestion_data_source_settings",
        "message_transforms",
    }
)
SUBSCRIPTION_UPDATABLE = frozenset(
    {
        "push_config",
        "bigquery_config",
        "cloud_storage_config",
        "bigtable_config",
        "ack_deadline_seconds",
        "retain_acked_messages",
        "message_retention_duration",
        "labels",
        "expiration_policy",
        "filter",
        "dead_letter_policy",
        "retry_policy",
        "enable_exactly_once_delivery",
        "message_transforms",
    }
)


@dataclass(slots=True)
class TopicEntry:
    record: TopicRecord
    topic: Any  # google.pubsub.v1.Topic
    quota: quotas.BacklogQuota | None = None  # from the topic's labels


@dataclass(slots=True)
class SubscriptionEntry:
    record: SubscriptionRecord
    subscription: Any  # google.pubsub.v1.Subscription


class _SortedNames:
    """Names kept sorted for paging; page tokens are the last name returned, base64-encoded."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def add(self, name: str) -> None:
        bisect.insort(self.names, name)

    def remove(self, name: str) -> None:
        i = bisect.bisect_left(self.names, name)
        if i < len(self.names) and self.names[i] == name:
            del self.names[i]

    def page(self, prefix: str, page_size: int, token: str) -> tuple[list[str], str]:
        if page_size < 0:
            raise InvalidArgument("page_size: must not be negative")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        after = prefix
        if token:
            try:
                after = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                raise InvalidArgument("page_token: not a token this server issued") from None
            if not after or not after.startswith(prefix):
                raise InvalidArgument("page_token: not a token for this listing")
        i = bisect.bisect_right(self.names, after)
        out: list[str] = []
        while i < len(self.names) and len(out) < size and self.names[i].startswith(prefix):
            out.append(self.names[i])
            i += 1
        more = i < len(self.names) and self.names[i].startswith(prefix)
        next_token = base64.urlsafe_b64encode(out[-1].encode()).decode() if more and out else ""
        return out, next_token


class Catalog:
    def __init__(
        self,
        store: MetadataStore,
        publishing: PublishingForwarder,
        subscribing: SubscribingForwarder,
    ) -> None:
        self.store = store
        self.publishing = publishing
        self.subscribing = subscribing
        self.topics: dict[str, TopicEntry] = {}
        self.subscriptions: dict[str, SubscriptionEntry] = {}
        self._topic_names = _SortedNames()
        self._sub_names = _SortedNames()
        # topic uid -> names of the subscriptions reading it (attached or not)
        self._subs_by_topic_uid: dict[str, set[str]] = {}
        self._live_topic_uids: set[str] = set()
        self.topics_by_uid: dict[str, TopicEntry] = {}  # live topics by storage uid
        subscribing.resolve_topic = self._topic_uid
        # Snapshots, Seek, detach and retention pins (imported here: that module imports this).
        from pubsubd.control.snapshots import Snapshots

        self.snapshots: Snapshots = Snapshots(self)
        # subscription name -> time.monotonic() of its last use (expiration_policy)
        self.activity: dict[str, float] = {}
        # Called with a deleted topic's storage uid (e.g. the replay API's cursors).
        self.topic_deleted_listeners: list[Callable[[str], None]] = []

    # --- backlog quotas -------------------------------------------------------------------------

    def _quotas_of(self, topic: TopicEntry) -> list[tuple[Any, quotas.BacklogQuota]]:
        """(dispatcher, effective quota) of the topic's subscriptions that have one."""
        out = []
        for name in self._subs_by_topic_uid.get(topic.record.uid, ()):
            d = self.subscribing.dispatchers.get(name)
            if d is None:
                continue
            quota = d.settings.quota or topic.quota
            if quota is not None:
                out.append((d, quota))
        return out

    def check_backlog_quota(self, topic: TopicEntry) -> None:
        """Before a publish: refuse it while a subscription is over a block_publishers quota."""
        now_us = time.time_ns() // 1000
        for d, quota in self._quotas_of(topic):
            if quota.policy is not quotas.Policy.BLOCK_PUBLISHERS:
                continue
            over = quotas.exceeded(quota, d.backlog_stats(now_us))
            if over is not None:
                raise ResourceExhausted(
                    f"backlog quota exceeded: subscription {d.name} has {over}; "
                    "publishing is blocked until it catches up"
                )

    def enforce_eviction(self) -> int:
        """evict_oldest quotas: ack the oldest messages of over-quota subscriptions."""
        evicted = 0
        now_us = time.time_ns() // 1000
        # Only topics with a quota on them or on a subscription (this runs every second: the
        # backlogs of every topic's subscriptions would cost O(names) each time).
        uids = {t.record.uid for t in self.topics.values() if t.quota is not None}
        uids.update(d.topic_uid for d in self.subscribing.dispatchers.values() if d.settings.quota)
        for uid in uids:
            topic = self.topics_by_uid.get(uid)
            if topic is None:
                continue
            for d, quota in self._quotas_of(topic):
                if quota.policy is not quotas.Policy.EVICT_OLDEST:
                    continue
                backlog = d.backlog_stats(now_us)
                average = backlog.bytes / backlog.messages if backlog.messages else 0.0
                count = quotas.excess_messages(quota, backlog, average)
                cutoff = now_us - quota.age_s * 1_000_000 if quota.age_s else None
                if count or (cutoff is not None and backlog.oldest_age_s > quota.age_s):
                    evicted += d.evict_oldest(count, cutoff)
        return evicted

    def _topic_uid(self, name: str) -> str | None:
        entry = self.topics.get(name)
        return entry.record.uid if entry is not None else None

    # --- start-up -----------------------------------------------------------------------------

    def load(self) -> None:
        """Restore topics, subscriptions and their ack state from the metadata store."""
        for t in self.store.load_topics():
            topic = pb.Topic.FromString(t.body)
            self._add_topic(TopicEntry(t, topic, quotas.parse(topic.labels)))
            try:
                counts = publish_sources.parse(topic.labels)
            except InvalidArgument as e:  # stored before the label was validated
                log.warning("topic %s: %s; opening the sources on disk", t.name, e)
                counts = publish_sources.SourceCounts()
            try:
                policy = damage_policy.parse(topic.labels)
            except InvalidArgument:
                policy = damage_policy.DamagePolicy.STOP
            try:
                self.publishing.configure_topic(t.uid, counts.sources, counts.key_sources, policy)
            except DataLoss:
                continue  # logged by the forwarder: this topic answers DATA_LOSS, others serve
        for s in self.store.load_subscriptions():
            entry = SubscriptionEntry(s, pb.Subscription.FromString(s.body))
            try:
                self._add_subscription(entry)
            except DataLoss as e:
                self.subscribing.unavailable[s.name] = str(e)
        self.publishing.remove_unreferenced(self._live_topic_uids | set(self._subs_by_topic_uid))
        self.snapshots.load()
        log.info(
            "catalog loaded: %d topics, %d subscriptions", len(self.topics), len(self.subscriptions)
        )

    def _add_topic(self, entry: TopicEntry) -> None:
        self.topics[entry.record.name] = entry
        self._topic_names.add(entry.record.name)
        self._live_topic_uids.add(entry.record.uid)
        self.topics_by_uid[entry.record.uid] = entry

    def subscriptions_of(self, topic_uid: str) -> list[SubscriptionEntry]:
        """The subscriptions reading a topic's storage (attached or not)."""
        found = (self.subscriptions.get(n) for n in self._subs_by_topic_uid.get(topic_uid, ()))
        return [s for s in found if s is not None]

    def _add_subscription(self, entry: SubscriptionEntry) -> None:
        rec = entry.record
        self.subscriptions[rec.name] = entry
        self._sub_names.add(rec.name)
        self._subs_by_topic_uid.setdefault(rec.topic_uid, set()).add(rec.name)
        if entry.subscription.detached:
            return  # DetachSubscription dropped its backlog: no ack state, no dispatcher
        journal = self.publishing.attach(rec.topic_uid, rec.uid, rec.start_offsets)
        self.subscribing.open(rec.name, entry.subscription, rec.uid, rec.topic_uid, journal)

    # --- topics -------------------------------------------------------------------------------

    def create_topic(self, topic: Any) -> Any:
        validation.topic(topic)
        quota = quotas.parse(topic.labels)
        quotas.retention_bytes(topic.labels)  # validate; control/snapshots.py reads it
        publish_sources.parse(topic.labels)  # validate
        policy = damage_policy.parse(topic.labels)
        if topic.name in self.topics:
            raise AlreadyExists("topic", topic.name)
        stored = pb.Topic()
        stored.CopyFrom(topic)
        stored.ClearField("tags")  # input only
        stored.state = pb.Topic.State.ACTIVE
        counts = publish_sources.on_create(stored.labels)  # may add the ordering-key label
        validation.labels("labels", stored.labels)
        record = TopicRecord(topic.name, uuid.uuid4().hex, stored.SerializeToString())
        self.store.put_topic(record)
        self._add_topic(TopicEntry(record, stored, quota))
        self.publishing.configure_topic(record.uid, counts.sources, counts.key_sources, policy)
        self.snapshots.refresh_pins(record.uid)
        return stored

    def topic(self, name: str) -> TopicEntry:
        names.topic(name)
        entry = self.topics.get(name)
        if entry is None:
            raise TopicNotFound(name)
        return entry

    def update_topic(self, topic: Any, mask: Any) -> Any:
        entry = self.topic(topic.name)
        paths = self._check_mask(mask, TOPIC_UPDATABLE, "topic")
        updated = pb.Topic()
        updated.CopyFrom(entry.topic)
        _apply_mask(paths, topic, updated)
        # Sources only grow; labels left out keep the server's values (put back here).
        counts = publish_sources.on_update(entry.topic.labels, updated.labels)
        validation.topic(updated)
        quota = quotas.parse(updated.labels)
        quotas.retention_bytes(updated.labels)
        policy = damage_policy.parse(updated.labels)
        entry.record.body = updated.SerializeToString()
        self.store.put_topic(entry.record)  # durable before any new source takes a message
        entry.topic = updated
        entry.quota = quota
        uid = entry.record.uid
        if self.publishing.configure_topic(uid, counts.sources, counts.key_sources, policy):
            self.snapshots.sources_added(uid)
        for sub_name in self._subs_by_topic_uid.get(uid, ()):
            dispatcher = self.subscribing.dispatchers.get(sub_name)
            if dispatcher is not None:
                dispatcher.schedule_pump()  # e.g. a damage policy now skips what stopped it
        self.snapshots.refresh_pins(entry.record.uid)
        return updated

    async def delete_topic(self, name: str) -> None:
        entry = self.topic(name)
        self.store.delete_topic(name)
        del self.topics[name]
        self._topic_names.remove(name)
        uid = entry.record.uid
        self._live_topic_uids.discard(uid)
        self.topics_by_uid.pop(uid, None)
        for listener in self.topic_deleted_listeners:
            listener(uid)
        for sub_name in self._subs_by_topic_uid.get(uid, set()):
            sub = self.subscriptions[sub_name]
            sub.subscription.topic = names.DELETED_TOPIC
            sub.record.body = sub.subscription.SerializeToString()
            self.store.put_subscription(sub.record)
        if not self._subs_by_topic_uid.get(uid):
            self._subs_by_topic_uid.pop(uid, None)
            await self.publishing.drop_topic(uid)

    def list_topics(self, project: str, page_size: int, token: str) -> tuple[list[Any], str]:
        names.project(project)
        page, next_token = self._topic_names.page(f"{project}/topics/", page_size, token)
        return [self.topics[n].topic for n in page], next_token

    def list_topic_subscriptions(
        self, topic: str, page_size: int, token: str
    ) -> tuple[list[str], str]:
        uid = self.topic(topic).record.uid
        attached = sorted(
            n
            for n in self._subs_by_topic_uid.get(uid, set())
            if not self.subscriptions[n].subscription.detached
        )
        pager = _SortedNames()
        pager.names = attached
        return pager.page("", page_size, token)

    # --- subscriptions ------------------------------------------------------------------------

    def create_subscription(self, subscription: Any) -> Any:
        stored = pb.Subscription()
        stored.CopyFrom(subscription)
        if not stored.name:
            raise InvalidArgument("name: a subscription name is required")
        validation.subscription(stored)
        queue_settings.parse(stored.labels)
        if not stored.topic:
            raise InvalidArgument("topic: a subscription must name its topic")
        names.topic(stored.topic)
        if stored.name in self.subscriptions:
            raise AlreadyExists("subscription", stored.name)
        topic = self.topics.get(stored.topic)
        if topic is None:
            raise NotFound("topic", stored.topic)
        if stored.dead_letter_policy.dead_letter_topic and (
            stored.dead_letter_policy.dead_letter_topic not in self.topics
        ):
            raise NotFound("topic", stored.dead_letter_policy.dead_letter_topic)
        stored.ClearField("tags")
        stored.state = pb.Subscription.State.ACTIVE
        if topic.topic.HasField("message_retention_duration"):
            stored.topic_message_retention_duration.CopyFrom(topic.topic.message_retention_duration)
        record = SubscriptionRecord(
            name=stored.name,
            uid=uuid.uuid4().hex,
            topic_uid=topic.record.uid,
            body=stored.SerializeToString(),
            start_offsets=self.publishing.end_offsets(topic.record.uid),
        )
        self.store.put_subscription(record)
        self._add_subscription(SubscriptionEntry(record, stored))
        self.snapshots.refresh_pins(record.topic_uid)
        return stored

    def subscription(self, name: str) -> SubscriptionEntry:
        names.subscription(name)
        entry = self.subscriptions.get(name)
        if entry is None:
            raise SubscriptionNotFound(name)
        self.activity[name] = time.monotonic()  # any use postpones expiration_policy
        return entry

    def update_subscription(self, subscription: Any, mask: Any) -> Any:
        entry = self.subscription(subscription.name)
        paths = self._check_mask(mask, SUBSCRIPTION_UPDATABLE, "subscription")
        updated = pb.Subscription()
        updated.CopyFrom(entry.subscription)
        _apply_mask(paths, subscription, updated)
        validation.subscription(updated)
        queue_settings.parse(updated.labels)
        if updated.dead_letter_policy.dead_letter_topic and (
            updated.dead_letter_policy.dead_letter_topic not in self.topics
        ):
            raise NotFound("topic", updated.dead_letter_policy.dead_letter_topic)
        entry.record.body = updated.SerializeToString()
        self.store.put_subscription(entry.record)
        # The dispatcher holds the same object: replace its contents in place.
        entry.subscription.CopyFrom(updated)
        dispatcher = self.subscribing.dispatchers.get(entry.record.name)
        if dispatcher is not None:
            dispatcher.refresh_settings()
        self.subscribing.sync_push(entry.record.name)
        self.snapshots.refresh_pins(entry.record.topic_uid)
        return entry.subscription

    def modify_push_config(self, name: str, push_config: Any) -> None:
        """Set the push config (push subscription) or clear it (pull); the backlog stays."""
        entry = self.subscription(name)
        updated = pb.Subscription()
        updated.CopyFrom(entry.subscription)
        updated.push_config.CopyFrom(push_config)
        if not updated.push_config.push_endpoint:
            updated.ClearField("push_config")  # an empty PushConfig means pull
        validation.subscription(updated)
        entry.record.body = updated.SerializeToString()
        self.store.put_subscription(entry.record)
        entry.subscription.CopyFrom(updated)
        self.subscribing.sync_push(name)

    async def delete_subscription(self, name: str) -> None:
        entry = self.subscription(name)
        rec = entry.record
        self.store.delete_subscription(name)
        del self.subscriptions[name]
        self._sub_names.remove(name)
        self.subscribing.close_subscription(name, SubscriptionNotFound(name))
        await self.publishing.detach(rec.topic_uid, rec.uid)
        self.activity.pop(name, None)
        self.snapshots.refresh_pins(rec.topic_uid)
        subs = self._subs_by_topic_uid.get(rec.topic_uid)
        if subs is not None:
            subs.discard(name)
            if not subs and rec.topic_uid not in self._live_topic_uids:
                del self._subs_by_topic_uid[rec.topic_uid]
                await self.publishing.drop_topic(rec.topic_uid)

    def list_subscriptions(self, project: str, page_size: int, token: str) -> tuple[list[Any], str]:
        names.project(project)
        page, next_token = self._sub_names.page(f"{project}/subscriptions/", page_size, token)
        return [self.subscriptions[n].subscription for n in page], next_token

    # --- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _check_mask(mask: Any, allowed: frozenset[str], kind: str) -> list[str]:
        paths = list(mask.paths)
        if not paths:
            raise InvalidArgument("update_mask: must name at least one field to update")
        for p in paths:
            if p.split(".")[0] not in allowed:
                raise InvalidArgument(f"update_mask: {p!r} is not a known updatable {kind} field")
        return paths


def _apply_mask(paths: list[str], source: Any, destination: Any) -> None:
    """Copy the masked fields; a masked field unset in ``source`` is cleared (Google's rule)."""
    mask = pb.FieldMask(paths=paths)
    try:
        mask.MergeMessage(
            source, destination, replace_message_field=True, replace_repeated_field=True
        )
    except ValueError as e:
        raise InvalidArgument(f"update_mask: {e}") from None
