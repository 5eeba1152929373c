"""Subscribing forwarder: serves Pull, StreamingPull, Acknowledge and ModifyAckDeadline.

It keeps one ``SubscriptionDispatcher`` per subscription assigned to it, each reading its topic
from the topic's publishing forwarder through ``core.roles.PublishingForwarderApi`` (found with
the ``route`` it is given: by address, through the router), decoding entries on this side in a
cache per topic. Pull waits (long-poll) for messages; a StreamingPull stream becomes a
``StreamConsumer`` whose responses the API layer writes through a :class:`Stream` handle; acks
and deadline changes are routed to the dispatcher that issued the ack IDs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.deadlines import within
from pubsubd.core.errors import (
    AckIdsInvalid,
    DataLoss,
    InvalidAckId,
    PubsubError,
    SubscriptionNotFound,
    Unavailable,
)
from pubsubd.core.failover_rank import FailoverRank
from pubsubd.core.quotas import Backlog, BacklogQuota, Policy, excess_messages
from pubsubd.core.records import CursorState
from pubsubd.core.roles import PublishingForwarderApi
from pubsubd.core.validation import modify_deadline
from pubsubd.data.decoding import DecodeCache
from pubsubd.data.subscribe.budget import DeliveryBudget
from pubsubd.data.subscribe.consumers import PullWaiter, StreamConsumer, StreamItem
from pubsubd.data.subscribe.dispatcher import DeadLetterPublish, SubscriptionDispatcher
from pubsubd.data.subscribe.push import PushManager
from pubsubd.data.subscribe.reader import TopicReader
from pubsubd.storage.damage import DamagedRange

log = logging.getLogger(__name__)

# Google's reason for an ack ID that is expired, superseded or malformed (exactly-once).
PERMANENT_INVALID = "PERMANENT_FAILURE_INVALID_ACK_ID"


class Pulled:
    """A Pull's response: framed ReceivedMessages leased to one Pull."""

    __slots__ = ("_dispatcher", "_waiter", "messages")

    def __init__(
        self, dispatcher: SubscriptionDispatcher, waiter: PullWaiter, messages: list[bytes]
    ) -> None:
        self._dispatcher = dispatcher
        self._waiter = waiter
        self.messages = messages

    def give_back(self) -> int:
        """The response never reached the client: its messages go to other consumers now,
        and this delivery does not count as an attempt. Returns how many went back."""
        if not self.messages:
            return 0
        return self._dispatcher.give_back(self._waiter.id, self._waiter.positions)


class Stream:
    """What the API layer holds for one StreamingPull (``core.roles.StreamHandle``): the
    responses to write and the calls that concern the stream; not the dispatcher."""

    __slots__ = ("_consumer", "_dispatcher")

    def __init__(self, dispatcher: SubscriptionDispatcher, consumer: StreamConsumer) -> None:
        self._dispatcher = dispatcher
        self._consumer = consumer

    @property
    def id(self) -> int:
        return self._consumer.id

    @property
    def outstanding(self) -> int:
        return self._consumer.outstanding

    @property
    def incarnation(self) -> str:
        """The subscription incarnation its deliveries belong to (their ack IDs' first part)."""
        return self._dispatcher.planner.incarnation

    async def next_response(self) -> StreamItem:
        """The next response to write (framed ReceivedMessages, their positions; a raw
        stream's unframed form, ``StreamConsumer.deliver_raw``), a failover notice, or the
        error that ends the stream."""
        return await self._consumer.queue.get()

    def end(self, error: BaseException) -> None:
        """End the stream with ``error`` (its writer answers it after what is queued)."""
        self._consumer.end(error)

    def set_ack_deadline(self, seconds: int) -> None:
        """stream_ack_deadline_seconds changed: leases granted from now on last this long."""
        self._consumer.ack_deadline_s = seconds

    def set_max_messages(self, count: int) -> None:
        """A later request moved the stream's message window (pubsubd's extension, used by
        the Pulsar front to follow its client's permits): a wider one receives at once."""
        wider = count > self._consumer.max_messages
        self._consumer.max_messages = count
        if wider:
            self._dispatcher.schedule_pump()

    def take_ready(self) -> list[StreamItem]:
        """Deliver now (the dispatcher's pump in this step, not at the loop's next turn) and
        take this stream's queued responses, up to the first item that is not one (a notice or
        the ending error stays for :meth:`next_response`). The in-process Pulsar front calls it
        when its client's FLOW widens the window, so the MESSAGE answering it is written in
        the FLOW's own step (BENCHMARKS.md, PC4)."""
        self._dispatcher.pump_now()
        return self._consumer.queue.take_responses()

    def alive(self) -> None:
        """A request arrived on the stream: a stalled stream receives again."""
        if self._consumer.stalled:
            self._dispatcher.revive(self._consumer)

    def close(self) -> None:
        """The stream ended: the consumer is removed, and responses never written go back
        (no delivery attempt counted)."""
        self._dispatcher.remove_consumer(self._consumer)
        # What was written may be in the client's hands: it keeps its lease, and the official
        # client may still ack it.
        self._consumer.closed = True
        self._dispatcher.give_back(self._consumer.id, self._consumer.unsent())


async def _no_dead_letters(topic: str, payload: bytes) -> None:
    raise SubscriptionNotFound(f"(no dead-letter publishing wired for {topic})")


class SubscribingForwarder:
    def __init__(
        self,
        route: Callable[[str], PublishingForwarderApi],
        *,
        clock: Clock = SYSTEM_CLOCK,
        dead_letter_publish: DeadLetterPublish = _no_dead_letters,
        budget: DeliveryBudget | None = None,
        block_quotas_at_owner: bool = False,
    ) -> None:
        # A cluster of forwarders: block_publishers backlog quotas are evaluated at the
        # topic's owner, over every source (data/publish/owner_quotas.py), not here.
        self.block_quotas_at_owner = block_quotas_at_owner
        # Outstanding deliveries of every subscription served here (data/subscribe/budget.py).
        self.budget = budget or DeliveryBudget()
        # topic uid -> the publishing forwarder holding its sources (the router's choice)
        self.route = route
        self.clock = clock
        self.dead_letter_publish = dead_letter_publish
        self.dispatchers: dict[str, SubscriptionDispatcher] = {}  # by subscription name
        # Decoded entries per topic, shared by this forwarder's dispatchers of the topic.
        self._readers: dict[str, TopicReader] = {}
        # Subscriptions whose topic's storage could not be opened: name -> DATA_LOSS message.
        self.unavailable: dict[str, str] = {}
        self.closing = False
        self.push = PushManager()  # pushers of push subscriptions (data/subscribe/push.py)
        # Spread subscriptions (by uid): the sources served here, set before they open
        # (data/ownership.py); any other subscription is served whole.
        self.served_sources: dict[str, frozenset[int]] = {}

    # --- subscriptions ------------------------------------------------------------------------

    def open(
        self,
        name: str,
        subscription: Any,
        uid: str,
        topic_uid: str,
        start_offsets: dict[int, int],
        topic_quota: BacklogQuota | None = None,
    ) -> None:
        """Serve a subscription: attach its ack state on its topic's publishing forwarder
        (from its sync point) and start its dispatcher."""
        publishing = self.route(topic_uid)
        cursors: dict[int, CursorState] = publishing.attach(topic_uid, uid, start_offsets)
        reader = self._readers.get(topic_uid)
        if reader is None:
            reader = self._readers[topic_uid] = TopicReader(publishing, topic_uid, DecodeCache())
        dispatcher = SubscriptionDispatcher(
            subscription,
            uid,
            topic_uid,
            publishing,
            reader,
            cursors,
            clock=self.clock,
            dead_letter_publish=self.dead_letter_publish,
            topic_quota=topic_quota,
            budget=self.budget,
            blocks_at_owner=self.block_quotas_at_owner,
            served_sources=self.served_sources.get(uid),
        )
        self.dispatchers[name] = dispatcher
        self.unavailable.pop(name, None)
        self.push.sync(name, dispatcher)

    def configure(self, name: str, subscription: Any) -> None:
        """The subscription was updated: its dispatcher and pusher follow."""
        dispatcher = self.dispatchers.get(name)
        if dispatcher is not None:
            dispatcher.configure(subscription)
            self.push.sync(name, dispatcher)

    def set_topic_quota(self, topic_uid: str, quota: BacklogQuota | None) -> None:
        for d in self.dispatchers.values():
            if d.topic_uid == topic_uid:
                d.set_topic_quota(quota)

    def mark_unavailable(self, name: str, why: str) -> None:
        self.unavailable[name] = why

    def serves(self, name: str) -> bool:
        return name in self.dispatchers

    def served_uid(self, name: str) -> str | None:
        """The uid of the subscription served under ``name`` (None: not served here)."""
        d = self.dispatchers.get(name)
        return None if d is None else d.uid

    def subscription_names(self) -> list[str]:
        return list(self.dispatchers)

    def subscriptions_of_topic(self, topic_uid: str) -> list[str]:
        """The names of the subscriptions served here that read ``topic_uid``."""
        named = [n for n, d in self.dispatchers.items() if d.topic_uid == topic_uid]
        return named + [n for n in self.unavailable if n not in self.dispatchers]

    def topic_changed(self, topic_uid: str) -> None:
        """The topic's storage settings changed (e.g. its damage policy): deliver again."""
        for d in self.dispatchers.values():
            if d.topic_uid == topic_uid:
                d.schedule_pump()

    def close_subscription(self, name: str, error: PubsubError, uid: str | None = None) -> None:
        """Stop serving ``name`` (its streams end with ``error``). Given ``uid``, only if the
        name is served as that subscription: a name deleted and created again is served under
        its new uid, which the old uid's leaving (a later change of the assignment) must not end."""
        if uid is not None and self.served_uid(name) not in (None, uid):
            return
        dispatcher = self.dispatchers.pop(name, None)
        self.push.detach(name, give_back=False)
        if dispatcher is not None:
            dispatcher.close(error)
            topic = dispatcher.topic_uid
            if not any(d.topic_uid == topic for d in self.dispatchers.values()):
                self._readers.pop(topic, None)

    def dispatcher(self, name: str) -> SubscriptionDispatcher:
        d = self.dispatchers.get(name)
        if d is None:
            why = self.unavailable.get(name)
            if why is not None:
                raise DataLoss(f"subscription {name} cannot be served: {why}")
            raise SubscriptionNotFound(name)
        return d

    def skip_damaged(self, topic_uid: str, damaged: list[tuple[int, DamagedRange]]) -> int:
        """Every subscription of the topic acknowledges the messages of these damaged ranges as
        lost (the operator's ``pubsubd topics skip-damaged``); returns how many in all."""
        return sum(
            d.skip_damaged(damaged) for d in self.dispatchers.values() if d.topic_uid == topic_uid
        )

    async def close(self) -> None:
        """End every stream with UNAVAILABLE so clients reconnect (to us after restart)."""
        self.closing = True
        for name in list(self.dispatchers):
            self.close_subscription(name, Unavailable("the server is shutting down"))
        await self.push.close()

    # --- ack state ----------------------------------------------------------------------------

    def cursor_states(self, name: str) -> dict[int, CursorState]:
        return self.dispatcher(name).cursor_states()

    async def reset(self, name: str, states: dict[int, CursorState]) -> None:
        """Seek: replace the ack state; durable before returning."""
        d = self.dispatcher(name)
        d.reset(states)
        await d.flush_acks()

    def ack_below(self, name: str, source: int, cut: int) -> bool:
        return self.dispatcher(name).ack_below(source, cut)

    # --- state and quotas ---------------------------------------------------------------------

    def in_use(self, name: str) -> bool:
        d = self.dispatchers.get(name)
        return d is not None and bool(d.consumers)

    def backlog_stats(self, name: str, now_us: int) -> Backlog:
        """The backlog reported (dashboard, metrics, SLIs): of the sources served here."""
        return self.dispatcher(name).backlog_stats(now_us, served_only=True)

    def status(self, name: str) -> dict[str, Any]:
        d = self.dispatcher(name)
        return {
            "backlog": d.backlog(),
            "outstanding": len(d.leases),
            "consumers": len(d.consumers),
            "delivered": d.delivered,
            "acked": d.acked,
            # A spread subscription's sources served here (None: all of them).
            "served_sources": (
                None if d.planner.served_sources is None else sorted(d.planner.served_sources)
            ),
            "lost": d.lost,
            **d.damage_status(),
            **self.push.stats(name),
        }

    def enforce_eviction(self) -> int:
        """evict_oldest backlog quotas: ack the oldest messages of over-quota subscriptions
        (every ``quota_check_s``); returns how many were evicted."""
        evicted = 0
        now_us = self.clock.time_us()
        for d in list(self.dispatchers.values()):
            quota = d.quota
            if quota is None or quota.policy is not Policy.EVICT_OLDEST:
                continue
            backlog = d.backlog_stats(now_us)
            average = backlog.bytes / backlog.messages if backlog.messages else 0.0
            count = excess_messages(quota, backlog, average)
            cutoff = now_us - quota.age_s * 1_000_000 if quota.age_s else None
            if count or (cutoff is not None and backlog.oldest_age_s > quota.age_s):
                evicted += d.evict_oldest(count, cutoff)
        return evicted

    def refresh_blocks(self) -> None:
        """Re-evaluate block_publishers quotas (the periodic check beside acks and commits)."""
        for d in list(self.dispatchers.values()):
            if d.quota is not None:
                d.refresh_block()

    # --- pull ---------------------------------------------------------------------------------

    async def pull(self, name: str, max_messages: int, wait_s: float) -> Pulled:
        """Up to max_messages framed ReceivedMessages; waits up to wait_s for the first one.

        Cancelled (the client cancelled or vanished), the Pull is unregistered at once and
        whatever was leased to it in the meantime is given back. The caller calls
        ``Pulled.give_back`` if the response then cannot be sent."""
        if self.closing:
            raise Unavailable("the server is shutting down")
        d = self.dispatcher(name)
        d.admit_pull()  # exclusive: FAILED_PRECONDITION while a stream holds the subscription
        waiter = PullWaiter(d.ack_deadline_s, max_messages)
        d.add_consumer(waiter)
        if waiter.future.done() or wait_s <= 0:
            d.remove_consumer(waiter)
            return Pulled(d, waiter, waiter.future.result() if waiter.future.done() else [])
        try:
            messages = await within(asyncio.shield(waiter.future), wait_s)
        except TimeoutError:
            waiter.closed = True
            d.remove_consumer(waiter)
            if waiter.future.done():  # filled in the same loop turn as the timeout
                return Pulled(d, waiter, waiter.future.result())
            waiter.future.cancel()
            return Pulled(d, waiter, [])
        except asyncio.CancelledError:
            self._abandon(d, waiter)
            raise
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Cancelled in the loop turn the messages arrived in: Python 3.11's wait_for then
            # returns the result instead of raising.
            self._abandon(d, waiter)
            raise asyncio.CancelledError
        return Pulled(d, waiter, messages)

    @staticmethod
    def _abandon(d: SubscriptionDispatcher, waiter: PullWaiter) -> None:
        """The Pull was cancelled: unregister it, and give back what it was handed."""
        waiter.closed = True
        d.remove_consumer(waiter)
        f = waiter.future
        if f.done() and not f.cancelled() and f.exception() is None:
            d.give_back(waiter.id, waiter.positions)  # filled, but nobody will send it
        f.cancel()

    # --- streaming pull -----------------------------------------------------------------------

    def open_stream(
        self,
        name: str,
        ack_deadline_s: int,
        max_messages: int,
        max_bytes: int,
        client_id: str = "",
        sources: frozenset[int] | None = None,
        active_notices: bool = False,
        failover_rank: FailoverRank | None = None,
        raw: bool = False,
    ) -> Stream:
        if self.closing:
            raise Unavailable("the server is shutting down")
        d = self.dispatcher(name)
        d.admit(client_id)
        consumer = StreamConsumer(ack_deadline_s, max_messages, max_bytes, client_id)
        consumer.raw = raw
        consumer.sources = sources
        consumer.active_notices = active_notices
        consumer.failover_rank = failover_rank
        d.add_consumer(consumer)
        return Stream(d, consumer)

    # --- acks ---------------------------------------------------------------------------------

    def acknowledge(self, name: str, ack_ids: list[str]) -> None:
        d = self.dispatcher(name)
        self._acknowledge(d, d.decode_all(ack_ids))

    def acknowledge_runs(
        self, name: str, incarnation: str, runs: list[tuple[int, int, int]]
    ) -> None:
        """:meth:`acknowledge` of the ack IDs ``incarnation``-(position + k, generation + k)
        for k below count of each run, without building or parsing them (a raw stream's)."""
        d = self._dispatcher_of(name, incarnation)
        # Ack IDs issued before a Seek no longer ack anything (their deliveries were undone).
        floor = d.generation_floor
        positions: list[int] = []
        spans: list[tuple[int, int]] = []
        for pos, generation, count in runs:
            skip = max(0, floor - generation)  # its first deliveries may be from before it
            if skip < count:
                positions += range(pos + skip, pos + count)
                spans.append((pos + skip, count - skip))
        d.acknowledge(positions, spans)

    @staticmethod
    def _acknowledge(d: SubscriptionDispatcher, deliveries: list[tuple[int, int]]) -> None:
        # Ack IDs issued before a Seek no longer ack anything (their deliveries were undone).
        floor = d.generation_floor
        d.acknowledge([pos for pos, generation in deliveries if generation >= floor])

    def _dispatcher_of(self, name: str, incarnation: str) -> SubscriptionDispatcher:
        """The subscription's dispatcher if it is still ``incarnation``; else InvalidAckId, as
        for an ack ID of a deleted subscription of the same name."""
        d = self.dispatcher(name)
        if d.planner.incarnation != incarnation:
            raise InvalidAckId(f"{incarnation}-... (subscription {name} was recreated)")
        return d

    def give_back(self, name: str, ack_ids: list[str]) -> int:
        d = self.dispatcher(name)
        deliveries = []
        for ack_id in ack_ids:
            with contextlib.suppress(InvalidAckId):  # nothing to give back for it
                deliveries.append(d.decode(ack_id))
        return d.give_back_deliveries(deliveries)

    def give_back_deliveries(
        self, name: str, incarnation: str, deliveries: list[tuple[int, int]]
    ) -> int:
        """:meth:`give_back` of the ack IDs ``incarnation``-(position, generation) names,
        without building or parsing them (a raw stream's)."""
        return self._dispatcher_of(name, incarnation).give_back_deliveries(deliveries)

    def modify_ack_deadline(self, name: str, ack_ids: list[str], seconds: int) -> None:
        modify_deadline(seconds)
        d = self.dispatcher(name)
        d.modify_deadline(d.decode_all(ack_ids), seconds)

    def modify_deadline_deliveries(
        self, name: str, incarnation: str, deliveries: list[tuple[int, int]], seconds: int
    ) -> None:
        """:meth:`modify_ack_deadline` of the ack IDs ``incarnation``-(position, generation)
        names, without building or parsing them (a raw stream's)."""
        modify_deadline(seconds)
        self._dispatcher_of(name, incarnation).modify_deadline(deliveries, seconds)

    # --- exactly-once -------------------------------------------------------------------------

    def _check(
        self, d: SubscriptionDispatcher, ack_ids: list[str]
    ) -> tuple[list[tuple[int, int]], dict[str, str]]:
        """Split ack IDs into live leases and failures (reason per ack ID, Google's codes)."""
        valid: list[tuple[int, int]] = []
        failures: dict[str, str] = {}
        for ack_id in ack_ids:
            try:
                pos, generation = d.decode(ack_id)
            except InvalidAckId:
                failures[ack_id] = PERMANENT_INVALID
                continue
            if d.current(pos, generation):
                valid.append((pos, generation))
            else:
                failures[ack_id] = PERMANENT_INVALID
        return valid, failures

    async def acknowledge_checked(self, name: str, ack_ids: list[str]) -> None:
        """Acknowledge; under exactly-once, only live leases count, the acks are durable
        before this returns, and stale or malformed IDs are reported per ID."""
        d = self.dispatcher(name)
        if not d.subscription.enable_exactly_once_delivery:
            self.acknowledge(name, ack_ids)
            return
        d.publishing.ensure_writable()  # a full disk: refused before anything is acked
        valid, failures = self._check(d, ack_ids)
        d.acknowledge([pos for pos, _ in valid])
        await d.flush_acks()
        if failures:
            raise AckIdsInvalid(failures)

    async def modify_ack_deadline_checked(
        self, name: str, ack_ids: list[str], seconds: int
    ) -> None:
        modify_deadline(seconds)
        d = self.dispatcher(name)
        if not d.subscription.enable_exactly_once_delivery:
            d.modify_deadline(d.decode_all(ack_ids), seconds)
            return
        valid, failures = self._check(d, ack_ids)
        d.modify_deadline(valid, seconds)
        if failures:
            raise AckIdsInvalid(failures)
