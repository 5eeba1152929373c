"""Subscribing forwarder: serves Pull, StreamingPull, Acknowledge and ModifyAckDeadline.

It keeps one ``SubscriptionDispatcher`` per subscription assigned to it. Pull waits (long-poll) for
messages; a StreamingPull stream becomes a ``StreamConsumer`` whose responses the API layer writes;
acks and deadline changes are routed to the dispatcher that issued the ack IDs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pubsubd.acks.journal import AckJournal
from pubsubd.core.errors import (
    AckIdsInvalid,
    DataLoss,
    InvalidAckId,
    SubscriptionNotFound,
    Unavailable,
)
from pubsubd.core.validation import modify_deadline
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe.consumers import PullWaiter, StreamConsumer
from pubsubd.data.subscribe.dispatcher import SubscriptionDispatcher
from pubsubd.data.subscribe.push import PushManager
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


class SubscribingForwarder:
    def __init__(self, publishing: PublishingForwarder) -> None:
        self.publishing = publishing
        self.dispatchers: dict[str, SubscriptionDispatcher] = {}  # by subscription name
        # Subscriptions whose topic's storage could not be opened: name -> DATA_LOSS message.
        self.unavailable: dict[str, str] = {}
        self.closing = False
        self.push = PushManager()  # pushers of push subscriptions (data/subscribe/push.py)
        # topic name -> storage uid, for dead-letter topics; the catalog installs its lookup
        self.resolve_topic: Callable[[str], str | None] = lambda _name: None

    # --- subscriptions ------------------------------------------------------------------------

    def open(
        self, name: str, subscription: Any, uid: str, topic_uid: str, journal: AckJournal
    ) -> SubscriptionDispatcher:
        dispatcher = SubscriptionDispatcher(
            subscription, uid, topic_uid, self.publishing, journal, self._resolve_topic
        )
        self.dispatchers[name] = dispatcher
        self.push.sync(name, dispatcher)
        return dispatcher

    def sync_push(self, name: str) -> None:
        """The subscription's push config changed: attach, replace or detach its pusher."""
        self.push.sync(name, self.dispatcher(name))

    def _resolve_topic(self, name: str) -> str | None:
        return self.resolve_topic(name)

    def close_subscription(self, name: str, error: BaseException) -> None:
        dispatcher = self.dispatchers.pop(name, None)
        self.push.detach(name, give_back=False)
        if dispatcher is not None:
            dispatcher.close(error)

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
            messages = await asyncio.wait_for(asyncio.shield(waiter.future), wait_s)
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
    ) -> tuple[SubscriptionDispatcher, StreamConsumer]:
        if self.closing:
            raise Unavailable("the server is shutting down")
        d = self.dispatcher(name)
        d.admit(client_id)
        consumer = StreamConsumer(ack_deadline_s, max_messages, max_bytes, client_id)
        d.add_consumer(consumer)
        return d, consumer

    # --- acks ---------------------------------------------------------------------------------

    def acknowledge(self, name: str, ack_ids: list[str]) -> None:
        d = self.dispatcher(name)
        decoded = [d.decode(a) for a in ack_ids]
        # Ack IDs issued before a Seek no longer ack anything (their deliveries were undone).
        floor = d.generation_floor
        d.acknowledge([pos for pos, generation in decoded if generation >= floor])

    def modify_ack_deadline(self, name: str, ack_ids: list[str], seconds: int) -> None:
        modify_deadline(seconds)
        d = self.dispatcher(name)
        d.modify_deadline([d.decode(a) for a in ack_ids], seconds)

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
        valid, failures = self._check(d, ack_ids)
        d.acknowledge([pos for pos, _ in valid])
        await self.publishing.flush_journal(d.journal)
        if failures:
            raise AckIdsInvalid(failures)

    async def modify_ack_deadline_checked(
        self, name: str, ack_ids: list[str], seconds: int
    ) -> None:
        modify_deadline(seconds)
        d = self.dispatcher(name)
        if not d.subscription.enable_exactly_once_delivery:
            d.modify_deadline([d.decode(a) for a in ack_ids], seconds)
            return
        valid, failures = self._check(d, ack_ids)
        d.modify_deadline(valid, seconds)
        if failures:
            raise AckIdsInvalid(failures)
