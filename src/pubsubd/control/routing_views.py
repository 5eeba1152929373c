"""What routers and frontends follow in ZooKeeper, kept in memory and current through watches.

* :class:`NamesView`: every topic (name -> uid and publish message sources) and subscription
  (name -> uid, topic uid, whether it may be spread), from the metadata store
  (``storage/zk_metadata.py``).
* :class:`RoutingView`: the registered forwarders, the routing constraints and the
  assignment's routes, as the leading router published them (``control/routing_store.py``). A
  frontend sends each call by it.

Both call ``on_change()`` (on the event loop) after what they hold changed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from pubsubd._gen.pubsubd.internal.v1 import routing_pb2 as pb
from pubsubd.control.routing_store import RoutingStore, decode_constraints
from pubsubd.control.routing_table import Constraints, Forwarder, SubscriptionUnits, TopicUnits
from pubsubd.coordination.errors import CoordinationError
from pubsubd.coordination.paths import bucket
from pubsubd.coordination.zk import Coordinator, Follow, ZnodeStat
from pubsubd.core import pb as api_pb
from pubsubd.core import publish_sources, queue_settings, quotas
from pubsubd.core.queue_settings import SubscriptionType
from pubsubd.storage.metadata import Change, SubscriptionRecord, TopicRecord
from pubsubd.storage.zk_metadata import ZooKeeperMetadataStore

log = logging.getLogger(__name__)

__all__ = ["NamesView", "RoutingView"]


def _nothing() -> None:
    pass


def spreadable(record: SubscriptionRecord) -> bool:
    """Whether the subscription may be served by several subscribing forwarders by source:
    shared or key_shared (exclusive and failover rank one client over the whole subscription)
    and without a backlog quota of its own (each forwarder sees its own sources' acks). Its
    topic may forbid it too (``evicts_oldest``, applied by :class:`NamesView`)."""
    try:
        settings = queue_settings.parse(api_pb.Subscription.FromString(record.body).labels)
    except Exception:  # unreadable or invalid labels: served whole, as before
        return False
    shared = settings.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)
    return shared and settings.quota is None


def evicts_oldest(topic: TopicRecord) -> bool:
    """Whether the topic's backlog quota (for its subscriptions without one of their own)
    evicts the oldest messages. Such a subscription is served whole: eviction is the
    dispatcher's (it acks), and a dispatcher serving some sources counts the others' acks as
    of its attach, so it would evict early, losing messages under the quota."""
    try:
        quota = quotas.parse(api_pb.Topic.FromString(topic.body).labels)
    except Exception:  # unreadable or invalid labels: no quota applies
        return False
    return quota is not None and quota.policy is quotas.Policy.EVICT_OLDEST


class NamesView:
    """Topics and subscriptions by name, followed from the cluster's metadata store."""

    def __init__(self, zk: Coordinator, on_change: Callable[[], None] = _nothing) -> None:
        self._zk = zk
        self._store: ZooKeeperMetadataStore | None = None
        self._on_change = on_change
        self.topics: dict[str, TopicUnits] = {}
        self.subscriptions: dict[str, SubscriptionUnits] = {}
        self._evicting: set[str] = set()  # uids of topics with an evict_oldest quota
        self._own_spreadable: dict[str, bool] = {}  # by subscription name: spreadable()

    async def start(self) -> None:
        """Follow the store (the coordinator must be started)."""
        store = self._store = await asyncio.to_thread(ZooKeeperMetadataStore, self._zk)
        await store.follow()  # before the loads: nothing changed after them is missed
        store.changes.watch(self._changed)
        for topic in await asyncio.to_thread(lambda: list(store.load_topics())):
            self._put_topic(topic)
        for sub in await asyncio.to_thread(lambda: list(store.load_subscriptions())):
            self._put_subscription(sub)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def routed_topics(self) -> list[TopicUnits]:
        """Every topic, and the storage of every deleted one a subscription still reads (as
        Google keeps delivering a deleted topic's backlog; one source: a forwarder serves all
        of a topic's sources with the first)."""
        live = list(self.topics.values())
        uids = {t.uid for t in live}
        orphans = {s.topic_uid for s in self.subscriptions.values()} - uids
        return live + [TopicUnits("", uid, 1) for uid in sorted(orphans)]

    def topic_uids(self) -> dict[str, str]:
        return {name: t.uid for name, t in self.topics.items()}

    def subscription_uids(self) -> dict[str, str]:
        return {name: s.uid for name, s in self.subscriptions.items()}

    def _put_topic(self, record: TopicRecord) -> None:
        topic = api_pb.Topic.FromString(record.body)
        sources = publish_sources.parse(topic.labels).sources
        self.topics[record.name] = TopicUnits(record.name, record.uid, sources)
        self._set_evicting(record.uid, evicts_oldest(record))

    def _set_evicting(self, topic_uid: str, evicting: bool) -> None:
        if evicting == (topic_uid in self._evicting):
            return
        if evicting:
            self._evicting.add(topic_uid)
        else:
            self._evicting.discard(topic_uid)
        for name, units in list(self.subscriptions.items()):  # its subscriptions: spreadable?
            if units.topic_uid == topic_uid:
                self.subscriptions[name] = self._units(name, units.uid, topic_uid)

    def _put_subscription(self, record: SubscriptionRecord) -> None:
        self._own_spreadable[record.name] = spreadable(record)
        self.subscriptions[record.name] = self._units(record.name, record.uid, record.topic_uid)

    def _units(self, name: str, uid: str, topic_uid: str) -> SubscriptionUnits:
        own = self._own_spreadable.get(name, False)
        return SubscriptionUnits(uid, topic_uid, own and topic_uid not in self._evicting)

    def _changed(self, change: Change) -> None:
        record = change.record
        if isinstance(record, TopicRecord):
            if change.deleted:
                self.topics.pop(record.name, None)
                self._set_evicting(record.uid, False)  # its quota went with it
            else:
                self._put_topic(record)
        elif isinstance(record, SubscriptionRecord):
            if change.deleted:
                self.subscriptions.pop(record.name, None)
                self._own_spreadable.pop(record.name, None)
            else:
                self._put_subscription(record)
        else:
            return
        self._on_change()


class RoutingView:
    """The registered forwarders and the published routes, followed through watches."""

    def __init__(self, zk: Coordinator, on_change: Callable[[], None] = _nothing) -> None:
        self._zk = zk
        self._store = RoutingStore(zk)
        self._on_change = on_change
        self.forwarders: dict[str, Forwarder] = {}
        self.constraints = Constraints()
        self._shards: dict[str, dict[str, tuple[str, ...]]] = {}
        # Per shard: owner -> the uids of the topics whose first source it owns, and of the
        # subscriptions whose first unit it owns (so a change of one shard costs that shard,
        # not every route).
        self._topic_owners: dict[str, dict[str, set[str]]] = {}
        self._subscription_owners: dict[str, dict[str, set[str]]] = {}
        # Per shard: owner -> subscription uid -> the sources it owns of a spread subscription;
        # and the spread units of the shard.
        self._source_owners: dict[str, dict[str, dict[str, set[int]]]] = {}
        self._spread: dict[str, set[str]] = {}
        self._shard_follows: dict[str, Follow[Any]] = {}
        self._follows: list[Follow[Any]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        layout = self._zk.layout
        self._follows = [
            self._zk.watch_children(layout.forwarders, self._forwarders_changed),
            self._zk.watch_children(layout.routing_shards, self._shards_listed),
            self._zk.watch_data(layout.routing_constraints, self._constraints_read),
        ]

    def close(self) -> None:
        for follow in [*self._follows, *self._shard_follows.values()]:
            follow.cancel()
        for task in self._tasks:
            task.cancel()

    def _constraints_read(self, got: tuple[bytes, ZnodeStat] | None) -> None:
        try:
            self.constraints = decode_constraints(got[0]) if got is not None else Constraints()
        except Exception as e:  # unreadable: keep the last ones
            log.warning("routing constraints unreadable: %s", e)
            return
        self._on_change()

    def route(self, unit: str) -> tuple[str, ...]:
        """The unit's ordered forwarder IDs as last published (empty: not routed yet)."""
        return self._shards.get(bucket(unit), {}).get(unit, ())

    def owned_topics(self, forwarder_id: str) -> set[str]:
        """The uids of the topics whose first publish message source the published
        assignment gives ``forwarder_id`` (a forwarder serves the whole topic then)."""
        owned: set[str] = set()
        for owners in self._topic_owners.values():
            owned |= owners.get(forwarder_id, set())
        return owned

    def owned_subscriptions(self, forwarder_id: str) -> set[str]:
        """The uids of the subscriptions whose first unit ``s/{uid}/0`` the published
        assignment gives ``forwarder_id`` (it serves the whole subscription then; co-located,
        those of its topics)."""
        owned: set[str] = set()
        for owners in self._subscription_owners.values():
            owned |= owners.get(forwarder_id, set())
        return owned

    def owned_subscription_sources(self, forwarder_id: str) -> dict[str, frozenset[int] | None]:
        """The subscriptions ``forwarder_id`` serves, by uid: None for those served whole
        (it owns ``s/{uid}/0`` of a subscription that is not spread), else the sources it
        owns of a spread subscription (``Route.spread``)."""
        out: dict[str, frozenset[int] | None] = dict.fromkeys(
            self.owned_subscriptions(forwarder_id)
        )
        spread: dict[str, set[int]] = {}
        for owners in self._source_owners.values():
            for uid, sources in owners.get(forwarder_id, {}).items():
                spread.setdefault(uid, set()).update(sources)
        for uid, sources in spread.items():
            out[uid] = frozenset(sources)
        return out

    def spread(self, unit: str) -> bool:
        """Whether ``unit`` is a spread subscription's, placed on its own."""
        return unit in self._spread.get(bucket(unit), ())

    def owner_address(self, unit: str) -> str | None:
        """The address of the unit's owner as last published (None: unknown)."""
        route = self.route(unit)
        owner = self.forwarders.get(route[0]) if route else None
        return owner.address if owner is not None else None

    def _forwarders_changed(self, _names: list[str] | None) -> None:
        task = asyncio.get_running_loop().create_task(self._read_forwarders())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_forwarders(self) -> None:
        try:
            found = await self._store.forwarders()
        except CoordinationError as e:
            log.warning("reading the forwarders failed: %s", e)
            return
        self.forwarders = {f.forwarder_id: f for f in found}
        self._on_change()

    def _shards_listed(self, names: list[str] | None) -> None:
        present = set(names or ())
        for gone in set(self._shard_follows) - present:
            self._shard_follows.pop(gone).cancel()
            self._set_shard(gone, None)
        for name in present - set(self._shard_follows):
            path = self._zk.layout.routing_shard(name)
            self._shard_follows[name] = self._zk.watch_data(
                path, functools.partial(self._shard_read, name)
            )
        self._on_change()

    def _shard_read(self, name: str, got: tuple[bytes, ZnodeStat] | None) -> None:
        if got is None:
            self._set_shard(name, None)
        else:
            try:
                shard = pb.AssignmentShard.FromString(got[0])
            except Exception as e:  # a shard we cannot read keeps its last routes
                log.warning("routing shard %s unreadable: %s", name, e)
                return
            self._set_shard(
                name,
                {r.unit: tuple(r.forwarders) for r in shard.routes},
                {r.unit for r in shard.routes if r.spread},
            )
        self._on_change()

    def _set_shard(
        self,
        name: str,
        routes: dict[str, tuple[str, ...]] | None,
        spread: set[str] | None = None,
    ) -> None:
        if routes is None:
            self._shards.pop(name, None)
            self._topic_owners.pop(name, None)
            self._subscription_owners.pop(name, None)
            self._source_owners.pop(name, None)
            self._spread.pop(name, None)
            return
        self._shards[name] = routes
        spread = spread or set()
        topics: dict[str, set[str]] = {}
        subscriptions: dict[str, set[str]] = {}
        sources: dict[str, dict[str, set[int]]] = {}
        for unit, route in routes.items():
            if not route:
                continue
            if unit in spread:
                _, uid, source = unit.split("/")
                sources.setdefault(route[0], {}).setdefault(uid, set()).add(int(source))
            elif unit.endswith("/0"):
                if unit.startswith("p/"):
                    topics.setdefault(route[0], set()).add(unit.split("/")[1])
                elif unit.startswith("s/"):
                    subscriptions.setdefault(route[0], set()).add(unit.split("/")[1])
        self._topic_owners[name] = topics
        self._subscription_owners[name] = subscriptions
        self._source_owners[name] = sources
        self._spread[name] = spread
