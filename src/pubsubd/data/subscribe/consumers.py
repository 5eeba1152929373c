"""The consumers clients hold: StreamingPull streams and waiting Pull calls (asyncio: a queue
of responses, a future); their flow control is ``consumer.Consumer``'s."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, TypeAlias

from pubsubd.core.active_notices import ActiveNotice
from pubsubd.data.subscribe.consumer import (
    MAX_RESPONSE_BYTES,
    MAX_RESPONSE_MESSAGES,
    Consumer,
)

# What a stream's queue holds: a response (framed messages, positions), a raw stream's response
# (stored messages, positions, first generation, attempts or None, stamps: planner.Delivery), a
# notice, an ending error.
StreamItem: TypeAlias = (
    tuple[list[bytes], list[int]]
    | tuple[list[bytes], list[int], int, list[int] | None, list[bytes | None] | None]
    | ActiveNotice
    | BaseException
)

__all__ = [
    "MAX_RESPONSE_BYTES",
    "MAX_RESPONSE_MESSAGES",
    "Consumer",
    "PullWaiter",
    "Responses",
    "StreamConsumer",
    "StreamItem",
]


class Responses(asyncio.Queue[StreamItem]):
    """A stream's queue of items, which also hands over its leading responses at once
    (:meth:`take_responses`). Its storage is made by ``asyncio.Queue``'s own hook, as
    ``LifoQueue``'s (``Queue`` reads ``_queue`` for its size)."""

    def _init(self, maxsize: int) -> None:
        self._queue: deque[StreamItem] = deque()
        self._items = self._queue

    def take_responses(self) -> list[StreamItem]:
        """The responses at the head of the queue, up to the first item that is not one (a
        notice, the ending error: left for ``get``, so items keep their order)."""
        out: list[StreamItem] = []
        items = self._items
        while items and isinstance(items[0], tuple):
            out.append(self.get_nowait())
        return out


class StreamConsumer(Consumer):
    """One StreamingPull stream; responses queue up for the stream's writer."""

    is_stream = True

    def __init__(
        self, ack_deadline_s: float, max_messages: int, max_bytes: int, client_id: str = ""
    ) -> None:
        super().__init__(ack_deadline_s, max_messages, max_bytes)
        self.client_id = client_id  # stable across the client's reconnects
        # Responses (messages, positions; a raw stream's: stored messages, positions, first
        # lease generation, attempts, stamps) or notices not yet written to the stream, or the error
        # to end it
        self.queue = Responses()

    def deliver(self, messages: list[bytes], positions: list[int]) -> None:
        self.queue.put_nowait((messages, positions))

    def deliver_raw(self, delivery: Any) -> None:
        self.queue.put_nowait(
            (
                delivery.received,
                delivery.positions,
                delivery.first_generation,
                delivery.attempts,
                delivery.stamps,
            )
        )

    def notify_active(self, active: bool) -> None:
        self.queue.put_nowait(ActiveNotice(active))

    def unsent(self) -> list[int]:
        """Take the positions of every response still queued (the stream ended: none of them
        was written, so the client cannot have them)."""
        out: list[int] = []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if isinstance(item, tuple):
                out.extend(item[1])
        return out

    def end(self, error: BaseException) -> None:
        """Make the stream's writer end the RPC with ``error``."""
        self.closed = True
        self.queue.put_nowait(error)


class PullWaiter(Consumer):
    """One Pull call: takes one response's worth of messages, once."""

    is_pull = True

    def __init__(self, ack_deadline_s: float, max_messages: int) -> None:
        super().__init__(ack_deadline_s, max_messages, 0)
        self.future: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()
        self.positions: list[int] = []  # leased to this Pull (given back if never sent)

    def room(self) -> tuple[int, int]:
        if self.future.done():
            return 0, 0
        return super().room()

    def deliver(self, messages: list[bytes], positions: list[int]) -> None:
        if not self.future.done():
            self.future.set_result(messages)
            self.positions = positions
        self.closed = True
