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

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

from pubsubd.acks.replicated import cursor_source, restore_journal
from pubsubd.core.errors import NotServedHere
from pubsubd.data.publish.forwarder import SUBSCRIPTIONS_DIR, TOPICS_DIR, PublishingForwarder
from pubsubd.data.reconcile import PublishingReconciler, SubscribingReconciler
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.observability import background
from pubsubd.storage.ledgers.cluster import ClusterStorage
from pubsubd.storage.metadata import Change

log = logging.getLogger(__name__)

__all__ = ["TopicOwnership"]

# A gain that failed is tried again after this long (the assignment may have changed by then).
RETRY_S = 1.0


class TopicOwnership:
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
    ) -> None:
        """``assigned()``: the topic uids the published assignment gives this forwarder;
        ``records_of(uid)``: the topic's records as changes (topic, subscriptions, snapshots,
        named cursors); ``subscriptions_of(uid)``: the uids of its subscriptions; ``owned``:
        the set the forwarders' predicates read (kept current here)."""
        self._assigned = assigned
        self._records_of = records_of
        self._subscriptions_of = subscriptions_of
        self._storage = storage
        self._data_dir = data_dir
        self._publishing = publishing
        self._subscribing = subscribing
        self._publishing_reconciler = publishing_reconciler
        self._subscribing_reconciler = subscribing_reconciler
        self.owned = owned
        self._moving: dict[str, asyncio.Task[None]] = {}
        self._scheduled = False
        self._closed = False
        self.gained = 0
        self.released = 0
        self.failed_gains = 0

    def owns(self, topic_uid: str) -> bool:
        return topic_uid in self.owned

    def changed(self) -> None:
        """The assignment (may have) changed: bring ownership to it (once per loop turn)."""
        if self._scheduled or self._closed:
            return
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._reconcile)

    def _reconcile(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        wanted = self._assigned()
        for uid in sorted(self.owned - wanted):
            if uid not in self._moving:
                self._start(uid, self._release(uid))
        for uid in sorted(wanted - self.owned):
            if uid not in self._moving:
                self._start(uid, self._gain(uid))

    def _start(self, uid: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work, name=f"move {uid}")
        self._moving[uid] = task
        task.add_done_callback(lambda t: self._moved(uid, t))

    def _moved(self, uid: str, task: asyncio.Task[None]) -> None:
        self._moving.pop(uid, None)
        if task.cancelled() or self._closed:
            return
        error = task.exception()
        if error is not None:
            self.failed_gains += 1
            log.warning("topic storage %s: taking it over failed, retrying: %s", uid, error)
            asyncio.get_running_loop().call_later(RETRY_S, self.changed)
            return
        self.changed()  # the assignment may have moved on meanwhile

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
        log.info("topic storage %s: now served here (%d subscriptions)", uid, len(subscriptions))

    async def _release(self, uid: str) -> None:
        self.owned.discard(uid)
        for name in self._subscribing.subscriptions_of_topic(uid):
            self._subscribing.close_subscription(name, NotServedHere(f"subscription {name}"))
        self._publishing_reconciler.forget(uid)
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
