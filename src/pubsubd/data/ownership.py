"""Which topics a forwarder of a cluster owns, and moving them (issue 11).

In a cluster of forwarders (``pubsubd forwarder``) the leading router assigns every topic's
publish message sources to one forwarder (``control/routing_table.py``); a forwarder serves a
topic and its subscriptions while the published assignment names it the owner, and refuses
everything else with ``NotServedHere`` (UNAVAILABLE: the frontend tries the next forwarder).

A move is a hand-over, never two writers:

* **Losing** a topic: it stops being served at once (new calls are refused), its
  subscriptions' streams end with UNAVAILABLE (the official subscriber reopens them, through a
  frontend, on the new owner), every ack recorded so far is flushed to the subscriptions' cursor
  ledgers, and the topic's ledgers are closed at their confirmed end and released (the owner
  znode is deleted).
* **Gaining** one: every source with ledgers is taken over (``SourceLedgers.take_over`` waits
  for the old owner to release its owner znode, or for its session to expire after a kill -9,
  and fences and recovers a ledger it left open), the local copy is brought up to the
  ledgers, each subscription's ack journal is restored from its cursor ledgers, and only then
  does the topic become this forwarder's: the reconcilers replay its records and serve it.

So the new owner is named (by the router) before the old one lets go, and takes over only once
it has: a publish meanwhile is refused by both and retried by the frontend until the new owner
serves, a move costs clients no error (SCALE_OUT.md §3, against Pulsar's unload). Each topic
moves in its own task; a gain that fails (the old owner did not let go in time) is tried again.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any

from pubsubd.acks.replicated import cursor_source, restore_journal
from pubsubd.core.errors import NotServedHere
from pubsubd.data.publish.forwarder import SUBSCRIPTIONS_DIR, TOPICS_DIR, PublishingForwarder
from pubsubd.data.reconcile import PublishingReconciler, SubscribingReconciler
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.data.subscribe.remote_sources import RemoteSources
from pubsubd.observability import background
from pubsubd.storage.ledgers.cluster import ClusterStorage
from pubsubd.storage.metadata import Change, SubscriptionRecord

log = logging.getLogger(__name__)

__all__ = ["SubscriptionOwnership", "TopicOwnership"]

# A gain that failed is tried again after this long (the assignment may have changed by then).
RETRY_S = 1.0
# A subscription routed here whose record this process has not read yet is looked for again
# this soon (its change also calls changed()).
RECORD_RETRY_S = 0.2
# A spread subscription's units live in several shards, read one by one: the sources assigned
# here are read again after this long before they are acted on, so a pass seen shard by shard
# costs one change of sources, not one per shard.
SOURCES_SETTLE_S = 0.2


class _Rounds:
    """Runs ``work`` for many callers at once: each caller waits for a round that starts after
    its call (so a ZooKeeper sync, asked by every subscription gained at start-up, costs a
    few rounds, not one each)."""

    def __init__(self, work: Callable[[], Awaitable[None]]) -> None:
        self._work = work
        self._next: asyncio.Future[None] | None = None
        self._running = False

    async def __call__(self) -> None:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._next.add_done_callback(lambda f: f.cancelled() or f.exception())
            if not self._running:
                self._running = True
                asyncio.get_running_loop().create_task(self._run(), name="catch-up rounds")
        await asyncio.shield(self._next)

    async def _run(self) -> None:
        try:
            while self._next is not None:
                round_, self._next = self._next, None
                try:
                    await self._work()
                except Exception as e:
                    round_.set_exception(e)
                else:
                    round_.set_result(None)
        finally:
            self._running = False


async def _nothing() -> None:
    return None


class _Moves(abc.ABC):
    """What a forwarder holds (topics or subscriptions, by uid: ``held``) brought to what the
    published assignment gives it (``assigned()``): one task per move, at most one per uid at
    a time; a move that fails is tried again after ``RETRY_S``."""

    _what = "unit"  # for the log

    def __init__(self, assigned: Callable[[], set[str]], held: set[str]) -> None:
        self._assigned = assigned
        self._held = held
        self._moving: dict[str, asyncio.Task[None]] = {}
        self._scheduled = False
        self._closed = False
        self.gained = 0
        self.released = 0
        self.failed_gains = 0

    def changed(self) -> None:
        """The assignment (may have) changed: bring what is held to it (once per loop turn)."""
        if self._scheduled or self._closed:
            return
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._reconcile)

    def _reconcile(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        wanted = self._assigned()
        for uid in sorted(self._held - wanted):
            if uid not in self._moving:
                self._start(uid, self._release(uid))
        for uid in sorted(wanted - self._held):
            if uid not in self._moving:
                self._start(uid, self._gain(uid))

    def _start(self, uid: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work, name=f"{self._what} {uid}")
        self._moving[uid] = task
        task.add_done_callback(lambda t: self._moved(uid, t))

    def _moved(self, uid: str, task: asyncio.Task[None]) -> None:
        self._moving.pop(uid, None)
        if task.cancelled() or self._closed:
            return
        error = task.exception()
        if error is not None:
            self.failed_gains += 1
            log.warning("%s %s: taking it over failed, retrying: %s", self._what, uid, error)
            asyncio.get_running_loop().call_later(RETRY_S, self.changed)
            return
        self.changed()  # the assignment may have moved on meanwhile

    @abc.abstractmethod
    async def _gain(self, uid: str) -> None:
        """Take ``uid`` over (each kind says how)."""

    @abc.abstractmethod
    async def _release(self, uid: str) -> None:
        """Let ``uid`` go (each kind says how)."""


class TopicOwnership(_Moves):
    """The topics this forwarder serves (``owned``), brought to what the assignment says."""

    def __init__(
        self,
        *,
        assigned: Callable[[], set[str]],
        records_of: Callable[[str], list[Change]],
        subscriptions_of: Callable[[str], list[str]],
        storage: ClusterStorage,
        data_dir: Path,
        publishing: PublishingForwarder,
        subscribing: SubscribingForwarder,
        publishing_reconciler: PublishingReconciler,
        subscribing_reconciler: SubscribingReconciler,
        owned: set[str],
        on_moved: Callable[[str, bool], None] = lambda _uid, _gained: None,
    ) -> None:
        """``assigned()``: the topic uids the published assignment gives this forwarder;
        ``records_of(uid)``: the topic's records as changes (topic, subscriptions, snapshots,
        named cursors); ``subscriptions_of(uid)``: the uids of its subscriptions; ``owned``:
        the set the forwarders' predicates read (kept current here); ``on_moved(uid,
        gained)``: called once a topic is served here, or no longer."""
        super().__init__(assigned, owned)
        self._what = "topic storage"
        self._records_of = records_of
        self._subscriptions_of = subscriptions_of
        self._storage = storage
        self._data_dir = data_dir
        self._publishing = publishing
        self._subscribing = subscribing
        self._publishing_reconciler = publishing_reconciler
        self._subscribing_reconciler = subscribing_reconciler
        self.owned = owned
        self._on_moved = on_moved

    def owns(self, topic_uid: str) -> bool:
        return topic_uid in self.owned

    async def _gain(self, uid: str) -> None:
        subscriptions = self._subscriptions_of(uid)
        try:
            await self._storage.prepare(self._data_dir / TOPICS_DIR, [uid])
            for sub_uid in subscriptions:
                source = cursor_source(sub_uid)
                if await self._storage.directory.sources(source):  # it flushed acks before
                    ledgers = self._storage.remote_log(source, 0)
                    await ledgers.take_over()
                    await restore_journal(self._data_dir / SUBSCRIPTIONS_DIR / sub_uid, ledgers)
        except BaseException:
            await self._let_go(uid, subscriptions)
            raise
        if uid not in self._assigned() or self._closed:
            await self._let_go(uid, subscriptions)  # moved on while we took it over
            return
        self.owned.add(uid)
        for change in self._records_of(uid):
            self._publishing_reconciler(change)
            self._subscribing_reconciler(change)
        self._publishing.dedup.recover([uid])
        self.gained += 1
        self._on_moved(uid, True)
        log.info("topic storage %s: now served here (%d subscriptions)", uid, len(subscriptions))

    async def _release(self, uid: str) -> None:
        self.owned.discard(uid)
        for name in self._subscribing.subscriptions_of_topic(uid):
            self._subscribing.close_subscription(name, NotServedHere(f"subscription {name}"))
        self._publishing_reconciler.forget(uid)
        self._on_moved(uid, False)
        journals = await self._publishing.release_topic(uid)
        await self._let_go(uid, journals)
        self.released += 1
        log.info("topic storage %s: handed over to its new owner", uid)

    async def _let_go(self, uid: str, subscriptions: Iterable[str]) -> None:
        keys = [*self._storage.source_keys(uid), *((cursor_source(s), 0) for s in subscriptions)]
        try:
            await self._storage.release(keys)
        except Exception as e:
            background.report("ownership release", e)

    def status(self) -> dict[str, object]:
        return {
            "owned_topics": len(self.owned),
            "moving": len(self._moving),
            "gained": self.gained,
            "released": self.released,
            "failed_gains": self.failed_gains,
        }

    async def close(self) -> None:
        """Stop moving and hand every topic over (the process is stopping): the new owners,
        named as soon as this forwarder's registration went, take over the moment each is
        released instead of when the process has closed everything."""
        self._closed = True
        moving = list(self._moving.values())
        for task in moving:
            task.cancel()
        released = await asyncio.gather(
            *(self._release(uid) for uid in sorted(self.owned)), return_exceptions=True
        )
        for error in released:
            if isinstance(error, BaseException):
                log.warning("handing a topic over at stop failed: %s", error)
        for task in moving:
            with contextlib.suppress(BaseException):  # cancelled or failed: stopping anyway
                await task


class SubscriptionOwnership(_Moves):
    """The subscriptions this forwarder serves (``ready``), brought to what the assignment says.

    A subscription's unit ``s/{uid}/0`` names the forwarder that serves it (Pull, StreamingPull,
    acks, leases). Its ack state stays with its topic's owner: a subscription whose topic is
    served here opens on the local publish message sources; one whose topic another forwarder
    owns opens on a copy of the topic (``RemoteSources``: its ack state attached there first,
    the copy caught up). A subscription whose topic is assigned here but not taken over yet
    waits for that (co-located, it always opens locally). Losing one ends its streams with
    UNAVAILABLE and sends its recorded acks to the topic's owner.

    A spread subscription (a set of sources in ``sources_assigned()``, not None) is served here for
    those sources only (``SubscribingForwarder.served_sources``: the dispatcher's consumers
    take nothing else). When the sources assigned here change, the subscription is let go and
    gained again with the new ones: its streams end with UNAVAILABLE (clients reopen), its acks
    are flushed to the topic's owner, and its ack state is attached afresh there, so a source
    taken over from a dead forwarder starts from what that one had acknowledged.
    """

    def __init__(
        self,
        *,
        assigned: Callable[[], set[str]],
        topic_assigned: Callable[[str], bool],
        record_of: Callable[[str], SubscriptionRecord | None],
        subscribing: SubscribingForwarder,
        subscribing_reconciler: SubscribingReconciler,
        owned_topics: set[str],
        remote: RemoteSources,
        ready: set[str],
        sources_assigned: Callable[[], Mapping[str, frozenset[int] | None]] = dict,
        caught_up: Callable[[], Awaitable[None]] = _nothing,
    ) -> None:
        """``assigned()``: the subscription uids the published assignment gives this
        forwarder; ``topic_assigned(uid)``: whether it gives it the topic; ``record_of(uid)``:
        the subscription's record (None: not known here yet); ``ready``: the set
        the predicates read, kept current here; ``sources_assigned()``: by subscription uid,
        the sources of a spread subscription assigned here (None or absent: served whole);
        ``caught_up()``: once this process applied every metadata write completed before
        the call (``Catalog.caught_up``): a subscription gained is served only after it."""
        super().__init__(assigned, ready)
        self._caught_up = _Rounds(caught_up)
        self._sources_assigned = sources_assigned
        self.serving_sources: dict[str, frozenset[int] | None] = {}  # of those served here
        self.regained = 0
        self._what = "subscription storage"
        self._topic_assigned = topic_assigned
        self._record_of = record_of
        self._subscribing = subscribing
        self._reconciler = subscribing_reconciler
        self._owned_topics = owned_topics
        self.remote = remote
        self.ready = ready
        self._remote_topic: dict[str, str] = {}  # subscription uid -> topic uid, read remotely
        self._names: dict[str, str] = {}  # subscription uid -> name, of those served here

    def serves(self, subscription_uid: str) -> bool:
        return subscription_uid in self.ready

    def _reconcile(self) -> None:
        super()._reconcile()
        if self._closed:
            return
        assigned = self._sources_assigned()
        for uid in sorted(self.ready):
            if uid in self._moving or uid not in self.serving_sources:
                continue
            if assigned.get(uid) != self.serving_sources[uid]:
                self._start(uid, self._regain(uid))

    async def _regain(self, uid: str) -> None:
        """The sources of ``uid`` assigned here changed: serve it again with the new ones
        (on a copy, the copy stays: its acks are flushed and its ack state attached again)."""
        await asyncio.sleep(SOURCES_SETTLE_S)
        if uid not in self.ready or self._sources_assigned().get(uid) == self.serving_sources.get(
            uid
        ):
            return  # changed back meanwhile
        self.ready.discard(uid)
        self.serving_sources.pop(uid, None)
        self._subscribing.served_sources.pop(uid, None)
        name = self._names.pop(uid, None)
        if name is not None and self._subscribing.serves(name):
            self._subscribing.close_subscription(name, NotServedHere(f"subscription {name}"), uid)
        topic_uid = self._remote_topic.get(uid)
        if topic_uid is not None:
            try:
                await self.remote.flush_acks(topic_uid, uid)
            except Exception as e:  # the owner redelivers at most what was not flushed
                log.warning("subscription storage %s: acks not flushed at regain: %s", uid, e)
        self.regained += 1
        await self._gain(uid)

    def topic_moved(self, topic_uid: str, gained: bool) -> None:
        """A topic came here or went: subscriptions read on its local sources were closed
        with it (and open again on a copy), those waiting for it open now."""
        if not gained:
            for sub_uid in [u for u in self.ready if u not in self._remote_topic]:
                record = self._record_of(sub_uid)
                if record is None or record.topic_uid == topic_uid:
                    self.ready.discard(sub_uid)
                    self._names.pop(sub_uid, None)
        self.changed()

    async def _gain(self, uid: str) -> None:
        record = self._record_of(uid)
        if record is None:  # not in this process's catalog yet: its change calls changed()
            asyncio.get_running_loop().call_later(RECORD_RETRY_S, self.changed)
            return
        if self._sources_assigned().get(uid) is not None:
            await asyncio.sleep(SOURCES_SETTLE_S)  # its other shards' routes arrive meanwhile
        topic_uid = record.topic_uid
        if topic_uid not in self._owned_topics:
            if self._topic_assigned(topic_uid):
                return  # being taken over here: topic_moved() calls us again
            await self.remote.prepare(topic_uid, uid, record.start_offsets)
            self._remote_topic[uid] = topic_uid
        # Served only once every write completed before now is applied here: a subscription
        # deleted or changed through another forwarder before this one gained it is not
        # served as it was (api/grpc/serving_catch_up.py asks the forwarders serving it
        # already; this covers the ones that gain it after).
        await self._caught_up()
        record = self._record_of(uid)
        if record is None or uid not in self._assigned() or self._closed:
            await self._forget_remote(uid)
            return
        sources = self._sources_assigned().get(uid)
        self.serving_sources[uid] = sources
        if sources is None:
            self._subscribing.served_sources.pop(uid, None)
        else:
            self._subscribing.served_sources[uid] = sources
        self.ready.add(uid)
        self._names[uid] = record.name
        self._reconciler(Change(record))
        self.gained += 1
        where = "a copy of its topic" if uid in self._remote_topic else "its topic here"
        which = "" if sources is None else f" (sources {sorted(sources)})"
        log.info("subscription %s: now served here%s, on %s", record.name, which, where)

    async def _release(self, uid: str) -> None:
        self.ready.discard(uid)
        self.serving_sources.pop(uid, None)
        self._subscribing.served_sources.pop(uid, None)
        name = self._names.pop(uid, None)
        if name is not None and self._subscribing.serves(name):
            self._subscribing.close_subscription(name, NotServedHere(f"subscription {name}"), uid)
        await self._forget_remote(uid)
        self.released += 1

    async def _forget_remote(self, uid: str) -> None:
        topic_uid = self._remote_topic.pop(uid, None)
        if topic_uid is None:
            return
        try:
            await self.remote.flush_acks(topic_uid, uid)
        except Exception as e:  # the owner redelivers at most what was not flushed
            log.warning("subscription storage %s: acks not flushed at release: %s", uid, e)
        self.remote.forget(topic_uid, uid)

    def status(self) -> dict[str, object]:
        return {
            "served_subscriptions": len(self.ready),
            "spread_subscriptions": {
                self._names.get(uid, uid): sorted(sources)
                for uid, sources in self.serving_sources.items()
                if sources is not None
            },
            "regained": self.regained,
            "on_copies": len(self._remote_topic),
            "moving": len(self._moving),
            "gained": self.gained,
            "released": self.released,
            "failed_gains": self.failed_gains,
            "copies": self.remote.status(),
        }

    async def close(self) -> None:
        self._closed = True
        for task in list(self._moving.values()):
            task.cancel()
        for uid in sorted(self.ready):
            with contextlib.suppress(Exception):
                await self._release(uid)
        await self.remote.close()
