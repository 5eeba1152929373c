"""Subscribing forwarder: serves Pull, StreamingPull, Acknowledge and ModifyAckDeadline.

It keeps one ``SubscriptionDispatcher`` per subscription assigned to it. Pull waits (long-poll) for
messages; a StreamingPull stream becomes a ``StreamConsumer`` whose responses the API layer writes;
acks and deadline changes are routed to the dispatcher that issued the ack IDs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pubsubd.acks.journal import AckJournal
from pubsubd.core.errors import SubscriptionNotFound, Unavailable
from pubsubd.core.validation import modify_deadline
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe.consumers import PullWaiter, StreamConsumer
from pubsubd.data.subscribe.dispatcher import SubscriptionDispatcher

log = logging.getLogger(__name__)


class SubscribingForwarder:
    def __init__(self, publishing: PublishingForwarder) -> None:
        self.publishing = publishing
        self.dispatchers: dict[str, SubscriptionDispatcher] = {}  # by subscription name
        self.closing = False

    # --- subscriptions ------------------------------------------------------------------------

    def open(
        self, name: str, subscription: Any, uid: str, topic_uid: str, journal: AckJournal
    ) -> SubscriptionDispatcher:
        dispatcher = SubscriptionDispatcher(subscription, uid, topic_uid, self.publishing, journal)
        self.dispatchers[name] = dispatcher
        return dispatcher

    def close_subscription(self, name: str, error: BaseException) -> None:
        dispatcher = self.dispatchers.pop(name, None)
        if dispatcher is not None:
            dispatcher.close(error)

    def dispatcher(self, name: str) -> SubscriptionDispatcher:
        d = self.dispatchers.get(name)
        if d is None:
            raise SubscriptionNotFound(name)
        return d

    async def close(self) -> None:
        """End every stream with UNAVAILABLE so clients reconnect (to us after restart)."""
        self.closing = True
        for name in list(self.dispatchers):
            self.close_subscription(name, Unavailable("the server is shutting down"))

    # --- pull ---------------------------------------------------------------------------------

    async def pull(self, name: str, max_messages: int, wait_s: float) -> list[bytes]:
        """Up to max_messages framed ReceivedMessages; waits up to wait_s for the first one."""
        if self.closing:
            raise Unavailable("the server is shutting down")
        d = self.dispatcher(name)
        waiter = PullWaiter(d.ack_deadline_s, max_messages)
        d.add_consumer(waiter)
        if waiter.future.done() or wait_s <= 0:
            d.remove_consumer(waiter)
            return waiter.future.result() if waiter.future.done() else []
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), wait_s)
        except TimeoutError:
            waiter.closed = True
            d.remove_consumer(waiter)
            if waiter.future.done():  # filled in the same loop turn as the timeout
                return waiter.future.result()
            waiter.future.cancel()
            return []

    # --- streaming pull -----------------------------------------------------------------------

    def open_stream(
        self, name: str, ack_deadline_s: int, max_messages: int, max_bytes: int
    ) -> tuple[SubscriptionDispatcher, StreamConsumer]:
        if self.closing:
            raise Unavailable("the server is shutting down")
        d = self.dispatcher(name)
        consumer = StreamConsumer(ack_deadline_s, max_messages, max_bytes)
        d.add_consumer(consumer)
        return d, consumer

    # --- acks ---------------------------------------------------------------------------------

    def acknowledge(self, name: str, ack_ids: list[str]) -> None:
        d = self.dispatcher(name)
        positions = [d.decode(a)[0] for a in ack_ids]
        d.acknowledge(positions)

    def modify_ack_deadline(self, name: str, ack_ids: list[str], seconds: int) -> None:
        modify_deadline(seconds)
        d = self.dispatcher(name)
        d.modify_deadline([d.decode(a) for a in ack_ids], seconds)
