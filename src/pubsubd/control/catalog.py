"""Catalog: the control plane's record of topics and subscriptions, validated and persisted.

Create/get/update/delete/list for topics and subscriptions, following Google's semantics
(docs/GOOGLE_API.md §3-§6): defaults filled in on create, update masks, a deleted topic's
subscriptions showing ``_deleted-topic_``, paging by opaque tokens. Every change is written to the
metadata store before it is answered, and that is all the catalog does with it: the forwarders
follow the store's changes (``data/reconcile.py``). The one thing it asks a forwarder, through
the router, is a new subscription's sync point (the end of each source of its topic).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pubsubd.control.paging import SortedNames, apply_mask, check_mask
from pubsubd.control.router import Routes
from pubsubd.control.schemas import DELETED_SCHEMA, SchemaRegistry
from pubsubd.coordination.errors import CoordinationUnavailable
from pubsubd.core import (
    damage_policy,
    flow_control,
    names,
    pb,
    publish_sources,
    queue_settings,
    quotas,
    storage_policy,
    validation,
)
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    InvalidArgument,
    NotFound,
    SubscriptionNotFound,
    TopicNotFound,
)
from pubsubd.storage.metadata import (
    Change,
    MetadataStore,
    RecordChanged,
    SubscriptionRecord,
    TopicRecord,
    applied,
)

log = logging.getLogger(__name__)


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
    publish_rate: flow_control.PublishRate | None = None  # from the topic's labels too
    # The topic's google.pubsub.v1.SchemaSettings, None without a schema: Publish checks
    # every message against it (nothing else on the publish path looks at schemas).
    schema_settings: Any = None


@dataclass(slots=True)
class SubscriptionEntry:
    record: SubscriptionRecord
    subscription: Any  # google.pubsub.v1.Subscription


class Catalog:
    def __init__(self, store: MetadataStore, routes: Routes, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.routes = routes
        self.clock = clock
        self.topics: dict[str, TopicEntry] = {}
        self.subscriptions: dict[str, SubscriptionEntry] = {}
        self._topic_names = SortedNames()
        self._sub_names = SortedNames()
        # topic uid -> names of the subscriptions reading it (attached or not)
        self._subs_by_topic_uid: dict[str, set[str]] = {}
        self._live_topic_uids: set[str] = set()
        self.topics_by_uid: dict[str, TopicEntry] = {}  # live topics by storage uid
        self.subscription_topics: dict[str, str] = {}  # subscription uid -> topic uid
        # subscription name -> clock.monotonic() of its last use (expiration_policy)
        self.activity: dict[str, float] = {}
        # Called with a deleted topic's storage uid (e.g. the replay API's cursors).
        self.topic_deleted_listeners: list[Callable[[str], None]] = []
        # The schemas topics validate against (SchemaService, control/schemas.py).
        self.schemas = SchemaRegistry(store, clock)
        self.schemas.deleted_listeners.append(self._schema_deleted)

    def topic_uid(self, name: str) -> str | None:
        """The storage uid of a live topic (None if there is no such topic)."""
        entry = self.topics.get(name)
        return entry.record.uid if entry is not None else None

    # --- start-up -----------------------------------------------------------------------------

    def load(self) -> None:
        """Restore the catalog's view of topics and subscriptions from the metadata store (the
        forwarders restore theirs from the same store, data/reconcile.py)."""
        self.schemas.load()
        for t in self.store.load_topics():
            topic = pb.Topic.FromString(t.body)
            self._add_topic(TopicEntry(t, topic, _quota(topic), _rate(topic)))
        for s in self.store.load_subscriptions():
            self._add_subscription(SubscriptionEntry(s, pb.Subscription.FromString(s.body)))
        log.info(
            "catalog loaded: %d topics, %d subscriptions", len(self.topics), len(self.subscriptions)
        )

    def follow(self) -> None:
        """Apply other processes' writes too (a cluster's forwarders share one store): a
        topic created through one forwarder is known to every other one."""
        self.store.changes.watch(self._remote_change)
        self.schemas.follow()

    async def caught_up(self) -> None:
        """Apply what other processes changed before now (a cluster's shared store), so that
        a read answers as the store would: a client sees its own writes through whichever
        forwarder it reaches. ZooKeeper out of reach: the view as it is (a moment behind at
        worst), rather than no answer."""
        try:
            await self.store.caught_up()
        except CoordinationUnavailable as e:
            log.debug("answering from this process's view of the catalog: %s", e)

    def _remote_change(self, change: Change) -> None:
        if not change.remote:
            return  # our own write: the writing method updates the view itself
        record = change.record
        if isinstance(record, TopicRecord):
            old = self.topics.get(record.name)
            if old is not None and (change.deleted or old.record.uid != record.uid):
                self._forget_topic(old)
            if not change.deleted:
                topic = pb.Topic.FromString(record.body)
                entry = self.topics.get(record.name)
                if entry is None:
                    self._add_topic(TopicEntry(record, topic, _quota(topic), _rate(topic)))
                else:
                    entry.record, entry.topic, entry.quota = record, topic, _quota(topic)
                    entry.publish_rate = _rate(topic)
                    entry.schema_settings = _schema_settings(topic)
        elif isinstance(record, SubscriptionRecord):
            found = self.subscriptions.get(record.name)
            if found is not None and (change.deleted or found.record.uid != record.uid):
                self._forget_subscription(found.record)
                found = None
            if not change.deleted:
                subscription = pb.Subscription.FromString(record.body)
                if found is None:
                    self._add_subscription(SubscriptionEntry(record, subscription))
                else:
                    found.record, found.subscription = record, subscription

    def _look_further(self, kind: str, name: str) -> bool:
        """A name this view lacks may have been created through another process a moment
        ago (a cluster's shared store): read it from the store, and apply it if found."""
        if not getattr(self.store, "shared", False):
            return False
        find = getattr(self.store, f"find_{kind}")
        record = find(name)
        if record is None:
            return False
        self._remote_change(Change(record, remote=True))
        return True

    def _topic_entry(self, name: str) -> TopicEntry | None:
        entry = self.topics.get(name)
        if entry is None and self._look_further("topic", name):
            entry = self.topics.get(name)
        return entry

    def _add_topic(self, entry: TopicEntry) -> None:
        entry.schema_settings = _schema_settings(entry.topic)
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
        self.subscription_topics[rec.uid] = rec.topic_uid

    # --- topics -------------------------------------------------------------------------------

    def create_topic(self, topic: Any) -> Any:
        validation.topic(topic)
        quota = quotas.parse(topic.labels)
        rate = flow_control.parse_rate(topic.labels)
        quotas.retention_bytes(topic.labels)  # validate; control/snapshots.py reads it
        publish_sources.parse(topic.labels)  # validate
        damage_policy.parse(topic.labels)  # validate
        storage_policy.parse(topic)  # validate; a cluster's ledgers follow it
        if self._topic_entry(topic.name) is not None:
            raise AlreadyExists("topic", topic.name)
        if topic.HasField("schema_settings"):
            self.schemas.check_settings(topic.schema_settings)
        stored = pb.Topic()
        stored.CopyFrom(topic)
        stored.ClearField("tags")  # input only
        stored.state = pb.Topic.State.ACTIVE
        publish_sources.on_create(stored.labels)  # may add the ordering-key label
        validation.labels("labels", stored.labels)
        record = TopicRecord(topic.name, uuid.uuid4().hex, stored.SerializeToString())
        self.store.put_topic(record, create=True)  # the publishing forwarder opens its storage
        self._add_topic(TopicEntry(record, stored, quota, rate))
        return stored

    def topic(self, name: str) -> TopicEntry:
        names.topic(name)
        entry = self._topic_entry(name)
        if entry is None:
            raise TopicNotFound(name)
        return entry

    def update_topic(self, topic: Any, mask: Any) -> Any:
        entry = self.topic(topic.name)
        paths = check_mask(mask, TOPIC_UPDATABLE, "topic")
        updated = pb.Topic()
        updated.CopyFrom(entry.topic)
        apply_mask(paths, topic, updated)
        # Sources only grow; labels left out keep the server's values (put back here).
        publish_sources.on_update(entry.topic.labels, updated.labels)
        validation.topic(updated)
        quota = quotas.parse(updated.labels)
        rate = flow_control.parse_rate(updated.labels)
        quotas.retention_bytes(updated.labels)
        damage_policy.parse(updated.labels)
        storage_policy.parse(updated)
        if updated.HasField("schema_settings") and any(
            p.split(".")[0] == "schema_settings" for p in paths
        ):
            self.schemas.check_settings(updated.schema_settings)
        record = replace(entry.record, body=updated.SerializeToString())
        # Durable before any new source takes a message; the forwarders follow the record.
        # Only over the topic this update read: another process's update in between (a
        # client's, or source growth) is never undone.
        try:
            self.store.put_topic(record, expected=entry.record.body)
        except RecordChanged as e:
            raise ConcurrentUpdate("topic", entry.record.name) from e
        entry.record = record
        entry.topic = updated
        entry.quota = quota
        entry.publish_rate = rate
        entry.schema_settings = _schema_settings(updated)
        return updated

    def _schema_deleted(self, schema: str) -> None:
        """Topics that named a deleted schema show ``_deleted-schema_`` (Google's value) and
        refuse publishes from now on."""
        for entry in list(self.topics.values()):
            settings = entry.schema_settings
            if settings is None or settings.schema != schema:
                continue
            shown = pb.Topic()
            shown.CopyFrom(entry.topic)
            shown.schema_settings.schema = DELETED_SCHEMA
            record = replace(entry.record, body=shown.SerializeToString())
            self.store.put_topic(record)
            entry.record, entry.topic = record, shown
            entry.schema_settings = _schema_settings(shown)

    async def delete_topic(self, name: str) -> None:
        entry = self.topic(name)
        uid = entry.record.uid
        for sub_name in sorted(self._subs_by_topic_uid.get(uid, set())):
            sub = self.subscriptions[sub_name]
            shown = pb.Subscription()
            shown.CopyFrom(sub.subscription)
            shown.topic = names.DELETED_TOPIC
            record = replace(sub.record, body=shown.SerializeToString())
            self.store.put_subscription(record)
            sub.record, sub.subscription = record, shown
        pending = self.store.delete_topic(name)  # storage goes once nothing reads it
        self._forget_topic(entry)
        await applied(pending)

    def _forget_topic(self, entry: TopicEntry) -> None:
        name, uid = entry.record.name, entry.record.uid
        del self.topics[name]
        self._topic_names.remove(name)
        self._live_topic_uids.discard(uid)
        self.topics_by_uid.pop(uid, None)
        if not self._subs_by_topic_uid.get(uid):
            self._subs_by_topic_uid.pop(uid, None)
        for listener in self.topic_deleted_listeners:
            listener(uid)

    def topic_names(self) -> Sequence[str]:
        """Every live topic's name, sorted (the catalog's own list: read it, do not keep it)."""
        return self._topic_names.names

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
        return SortedNames(attached).page("", page_size, token)

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
        if stored.name in self.subscriptions or self._look_further("subscription", stored.name):
            raise AlreadyExists("subscription", stored.name)
        topic = self._topic_entry(stored.topic)
        if topic is None:
            raise NotFound("topic", stored.topic)
        if stored.dead_letter_policy.dead_letter_topic and (
            self._topic_entry(stored.dead_letter_policy.dead_letter_topic) is None
        ):
            raise NotFound("topic", stored.dead_letter_policy.dead_letter_topic)
        stored.ClearField("tags")
        stored.state = pb.Subscription.State.ACTIVE
        if topic.topic.HasField("message_retention_duration"):
            stored.topic_message_retention_duration.CopyFrom(topic.topic.message_retention_duration)
        topic_uid = topic.record.uid
        record = SubscriptionRecord(
            name=stored.name,
            uid=uuid.uuid4().hex,
            topic_uid=topic_uid,
            body=stored.SerializeToString(),
            # The sync point: every message published from now on is delivered to it.
            start_offsets=self.routes.publishing(topic_uid).end_offsets(topic_uid),
        )
        # Only if no other process created the name meanwhile; then the subscribing forwarder
        # starts serving it.
        self.store.put_subscription(record, create=True)
        self._add_subscription(SubscriptionEntry(record, stored))
        return stored

    def subscription(self, name: str) -> SubscriptionEntry:
        names.subscription(name)
        entry = self.subscriptions.get(name)
        if entry is None and self._look_further("subscription", name):
            entry = self.subscriptions.get(name)
        if entry is None:
            raise SubscriptionNotFound(name)
        self.activity[name] = self.clock.monotonic()  # any use postpones expiration_policy
        return entry

    def update_subscription(self, subscription: Any, mask: Any) -> Any:
        entry = self.subscription(subscription.name)
        paths = check_mask(mask, SUBSCRIPTION_UPDATABLE, "subscription")
        updated = pb.Subscription()
        updated.CopyFrom(entry.subscription)
        apply_mask(paths, subscription, updated)
        validation.subscription(updated)
        queue_settings.parse(updated.labels)
        if updated.dead_letter_policy.dead_letter_topic and (
            updated.dead_letter_policy.dead_letter_topic not in self.topics
        ):
            raise NotFound("topic", updated.dead_letter_policy.dead_letter_topic)
        self._put_subscription(entry, updated)
        return updated

    def modify_push_config(self, name: str, push_config: Any) -> None:
        """Set the push config (push subscription) or clear it (pull); the backlog stays."""
        entry = self.subscription(name)
        updated = pb.Subscription()
        updated.CopyFrom(entry.subscription)
        updated.push_config.CopyFrom(push_config)
        if not updated.push_config.push_endpoint:
            updated.ClearField("push_config")  # an empty PushConfig means pull
        validation.subscription(updated)
        self._put_subscription(entry, updated)

    def _put_subscription(self, entry: SubscriptionEntry, updated: Any) -> None:
        """Write a changed subscription over the one it was made from (ConcurrentUpdate if
        another request changed it in between); the entry changes only once the write
        succeeded."""
        record = replace(entry.record, body=updated.SerializeToString())
        try:  # the subscribing forwarder follows it
            self.store.put_subscription(record, expected=entry.record.body)
        except RecordChanged as e:
            raise ConcurrentUpdate("subscription", entry.record.name) from e
        entry.record = record
        entry.subscription = updated

    async def delete_subscription(self, name: str) -> None:
        entry = self.subscription(name)
        rec = entry.record
        pending = self.store.delete_subscription(name)  # its backlog goes with it
        self._forget_subscription(rec)
        await applied(pending)

    def _forget_subscription(self, rec: SubscriptionRecord) -> None:
        name = rec.name
        del self.subscriptions[name]
        self._sub_names.remove(name)
        self.activity.pop(name, None)
        self.subscription_topics.pop(rec.uid, None)
        subs = self._subs_by_topic_uid.get(rec.topic_uid)
        if subs is not None:
            subs.discard(name)
            if not subs and rec.topic_uid not in self._live_topic_uids:
                del self._subs_by_topic_uid[rec.topic_uid]

    def list_subscriptions(self, project: str, page_size: int, token: str) -> tuple[list[Any], str]:
        names.project(project)
        page, next_token = self._sub_names.page(f"{project}/subscriptions/", page_size, token)
        return [self.subscriptions[n].subscription for n in page], next_token


def _schema_settings(topic: Any) -> Any:
    return topic.schema_settings if topic.HasField("schema_settings") else None


def _rate(topic: Any) -> flow_control.PublishRate | None:
    try:
        return flow_control.parse_rate(topic.labels)
    except InvalidArgument:  # stored before the label was validated
        return None


def _quota(topic: Any) -> quotas.BacklogQuota | None:
    try:
        return quotas.parse(topic.labels)
    except InvalidArgument:  # stored before the label was validated
        return None
