"""Push subscriptions: a consumer that POSTs each message it is given to the push endpoint.

A subscription whose ``push_config.push_endpoint`` is set gets one ``PushConsumer`` attached to its
dispatcher (``PushManager.sync``: on create, at start-up, and whenever the push config changes). To
the dispatcher it is a consumer like a stream: it takes what its ``room()`` allows, under leases,
and answers with acks and deadline changes through the dispatcher's public methods.

* One message per HTTP/1.1 POST (``push_wire.request``: JSON wrapper or raw data). 102/200/201/
  202/204 acknowledge it. Anything else, a transport error (connection refused, DNS failure, a
  garbage response) or no answer within the subscription's ``ack_deadline_seconds`` is a failure.
* A failed message is *held*: its lease is extended past an exponential backoff (100 ms ... 60 s
  by its delivery count), and at the end of the backoff it is nacked, so the dispatcher
  redelivers it (to us, or to a puller if the subscription became a pull subscription meanwhile).
  With a retry policy the failure is nacked at once: the dispatcher applies the policy's backoff
  (and the dead-letter policy) to every nack itself.
* With message ordering, the messages of one ordering key in a batch are pushed one after the
  other; a failure holds the rest of the chain with it, and the nack of the failed message (first)
  makes the dispatcher redeliver the later ones after it.
* Concurrency is an AIMD window (``push_wire.AimdWindow``): 4 pushes at first, growing on success
  up to 1000, halved on failure. Consecutive failures also pause the whole subscription with the
  same exponential backoff, so a dead endpoint sees one attempt per pause, not the backlog.
* Leases outlive the HTTP timeout by ``LEASE_MARGIN_S``, so a lease never expires under a push in
  flight. Held messages count against ``MAX_OUTSTANDING`` (leases held in all), not the window.
* ``stop`` (pull again, endpoint changed, subscription deleted, shutdown) cancels the pushes in
  flight and the holds, and nacks every lease the pusher held, so a Pull gets them at once.

Everything here runs on the event loop; HTTP requests are tasks, so a slow or dead endpoint never
blocks other subscriptions. Every error of a push is caught: it is a failed delivery, not a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any

import httpx

from pubsubd.core import pb
from pubsubd.data.subscribe import push_wire
from pubsubd.data.subscribe.consumers import MAX_RESPONSE_BYTES, MAX_RESPONSE_MESSAGES, Consumer
from pubsubd.data.subscribe.dispatcher import SubscriptionDispatcher

log = logging.getLogger(__name__)

INITIAL_WINDOW = 4
MAX_WINDOW = 1000
# Leases held by one pusher (pushes in flight + messages held under backoff).
MAX_OUTSTANDING = 10_000
# A push lease lasts the HTTP timeout plus this, so it cannot expire under a request in flight.
LEASE_MARGIN_S = 5
# A held lease lasts this much longer than its backoff; the nack at the end of the backoff ends it.
HOLD_MARGIN_S = 5
# Read at most this much of a response body (keeps the connection reusable for small answers).
MAX_RESPONSE_BODY = 64 * 1024
USER_AGENT = "pubsubd-push/0.1"


@dataclass(slots=True)
class _Push:
    pos: int
    generation: int
    seq: int  # in the AIMD window
    message: Any  # PubsubMessage
    attempt: int  # delivery_attempt (0 without a dead-letter policy)


class PushConsumer(Consumer):
    """Pushes one subscription's messages to its HTTP endpoint."""

    has_client = False

    def __init__(
        self,
        dispatcher: SubscriptionDispatcher,
        *,
        initial_window: int = INITIAL_WINDOW,
        max_window: int = MAX_WINDOW,
    ) -> None:
        super().__init__(_lease_s(dispatcher.subscription), 0, 0)
        self.dispatcher = dispatcher
        self.endpoint = str(dispatcher.subscription.push_config.push_endpoint)
        self.window = push_wire.AimdWindow(initial_window, 1, max_window)
        # Window slots taken by deliveries planned but not handed over yet (the planner
        # hands several responses out at the end of one pass).
        self._reserved = 0
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._holds: dict[int, asyncio.TimerHandle] = {}  # nacks due when backoffs end
        self._hold_ids = itertools.count()
        self._failures = 0  # consecutive failed pushes
        # Paused after a failure until the _resume timer fires (a flag, not a time comparison:
        # timers may fire a little before loop.time() reaches their due time, notably on uvloop).
        self._resume: asyncio.TimerHandle | None = None
        self._client: httpx.AsyncClient | None = None
        self.pushed = 0
        self.acked = 0
        self.failed = 0
        self.last_error = ""

    # --- what the dispatcher sees -------------------------------------------------------------

    def room(self) -> tuple[int, int]:
        if self.closed:
            return 0, 0
        # A pusher is never "stalled": it answers every lease itself.
        self.stalled = False
        if self._resume is not None:
            return 0, 0
        self.ack_deadline_s = _lease_s(self.dispatcher.subscription)
        n = min(
            self.window.available() - self._reserved,
            MAX_RESPONSE_MESSAGES,
            MAX_OUTSTANDING - self.outstanding,
        )
        if n <= 0:
            return 0, 0
        return n, MAX_RESPONSE_BYTES

    def taken(self, count: int, size: int) -> None:
        super().taken(count, size)
        self._reserved += count

    def deliver(self, messages: list[bytes], positions: list[int]) -> None:
        self._reserved = max(0, self._reserved - len(positions))
        if self.closed:  # cannot happen (room() is 0); the leases expire if it does
            return
        response = pb.PullResponse.FromString(b"".join(messages))
        ordered = bool(self.dispatcher.subscription.enable_message_ordering)
        # One chain per ordering key: its messages are pushed one after the other, in order.
        chains: dict[str, list[_Push]] = {}
        singles: list[list[_Push]] = []
        for received in response.received_messages:
            pos, generation = self.dispatcher.decode(received.ack_id)
            push = _Push(
                pos, generation, self.window.start(), received.message, received.delivery_attempt
            )
            key = received.message.ordering_key if ordered else ""
            if key:
                chains.setdefault(key, []).append(push)
            else:
                singles.append([push])
        for chain in [*singles, *chains.values()]:
            task = self._loop.create_task(
                self._push_chain(chain), name=f"push:{self.dispatcher.subscription.name}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.pushed += len(response.received_messages)

    def end(self, error: BaseException) -> None:
        """The dispatcher is closing (subscription deleted, shutdown): its leases go with it."""
        self.stop(give_back=False)

    # --- pushing ------------------------------------------------------------------------------

    async def _push_chain(self, chain: list[_Push]) -> None:
        """Push each message in turn; the first failure holds it and the rest of the chain."""
        for i, push in enumerate(chain):
            ok = False
            try:
                ok = await self._post(push.message, push.attempt)
            except asyncio.CancelledError:
                for p in chain[i:]:
                    self.window.cancel(p.seq)
                raise
            except Exception as e:  # refused, DNS, TLS, garbage, timeout, bad URL: failures
                self.last_error = f"{type(e).__name__}: {e}"
                log.debug("push to %s failed: %s", self.endpoint, self.last_error)
            self.window.end(push.seq, ok)
            if not ok:
                for p in chain[i + 1 :]:
                    self.window.cancel(p.seq)
            if self.closed:
                return
            try:
                if ok:
                    self._succeeded(push.pos)
                else:
                    self._failed([(p.pos, p.generation) for p in chain[i:]])
            except Exception:  # a bug here must not go unnoticed, nor take anything down
                log.exception("push bookkeeping failed for %s", self.dispatcher.subscription.name)
            if not ok:
                return

    async def _post(self, message: Any, attempt: int) -> bool:
        subscription = self.dispatcher.subscription
        body, headers = push_wire.request(
            subscription.push_config, subscription.name, message, attempt
        )
        client = self._http()
        async with (
            asyncio.timeout(float(subscription.ack_deadline_seconds or 10)),
            client.stream("POST", self.endpoint, content=body, headers=headers) as response,
        ):
            status = response.status_code
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read > MAX_RESPONSE_BODY:
                    break  # the connection is closed instead of reused
        if not push_wire.acknowledges(status):
            self.last_error = f"HTTP {status}"
            log.debug("push to %s answered %d", self.endpoint, status)
            return False
        return True

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                http1=True,
                http2=False,
                trust_env=False,  # no proxies from the environment: push where configured
                follow_redirects=False,  # a redirect is not an acknowledgement
                timeout=None,  # _post bounds the whole exchange
                limits=httpx.Limits(
                    max_connections=self.window.maximum,
                    max_keepalive_connections=min(self.window.maximum, 64),
                ),
                headers={"user-agent": USER_AGENT},
            )
        return self._client

    def _succeeded(self, pos: int) -> None:
        self.acked += 1
        self._failures = 0
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        self.dispatcher.acknowledge([pos])
        self.dispatcher.schedule_pump()  # the window may have grown

    def _failed(self, leases: list[tuple[int, int]]) -> None:
        """The push of ``leases[0]`` failed (the rest of its key's chain waits with it)."""
        self.failed += 1
        d = self.dispatcher
        self._failures += 1
        self._pause(
            push_wire.backoff_s(
                self._failures, push_wire.DEFAULT_MIN_BACKOFF_S, push_wire.DEFAULT_MAX_BACKOFF_S
            )
        )
        if d.subscription.HasField("retry_policy"):
            # The dispatcher applies the retry policy (and dead-lettering) to a nack itself.
            d.modify_deadline(leases, 0)
            return
        pos = leases[0][0]
        hold = push_wire.backoff_s(
            max(1, d.leases.attempts(pos)),
            push_wire.DEFAULT_MIN_BACKOFF_S,
            push_wire.DEFAULT_MAX_BACKOFF_S,
        )
        # Keep the leases past the backoff; the timer nacks them when the backoff ends.
        d.modify_deadline(leases, math.ceil(hold) + HOLD_MARGIN_S)
        hold_id = next(self._hold_ids)
        self._holds[hold_id] = self._loop.call_later(hold, self._release_hold, hold_id, leases)

    def _release_hold(self, hold_id: int, leases: list[tuple[int, int]]) -> None:
        self._holds.pop(hold_id, None)
        if not self.closed:
            # The failed message first: with ordering keys its nack releases the later ones.
            self.dispatcher.modify_deadline(leases, 0)

    def _pause(self, delay: float) -> None:
        if self._resume is not None:
            self._resume.cancel()
        self._resume = self._loop.call_later(delay, self._unpause)

    def _unpause(self) -> None:
        self._resume = None
        if not self.closed:
            self.dispatcher.schedule_pump()

    # --- stopping -----------------------------------------------------------------------------

    def stop(self, give_back: bool = True) -> asyncio.Task[None] | None:
        """Detach: cancel pushes and holds and, with ``give_back``, nack every lease we hold (the
        subscription lives on as a pull subscription). Returns the clean-up task."""
        if self.closed:
            return None
        self.closed = True
        for task in self._tasks:
            task.cancel()
        for handle in self._holds.values():
            handle.cancel()
        self._holds.clear()
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        d = self.dispatcher
        held = []
        if give_back:
            for pos in d.leases.held_by(self.id):
                lease = d.leases.get(pos)
                if lease is not None:
                    held.append((pos, lease.generation))
        d.remove_consumer(self)
        if held:
            d.modify_deadline(held, 0)  # redeliver now, to whoever consumes next
        return self._loop.create_task(self._finish(), name="push_stop")

    async def _finish(self) -> None:
        tasks = list(self._tasks)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None

    def stats(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "window": self.window.size,
            "in_flight": self.window.in_flight,
            "held": len(self._holds),
            "pushed": self.pushed,
            "acked": self.acked,
            "failed": self.failed,
            "last_error": self.last_error,
        }


class PushManager:
    """The pushers of one subscribing forwarder, by subscription name."""

    def __init__(self) -> None:
        self.consumers: dict[str, PushConsumer] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def sync(self, name: str, dispatcher: SubscriptionDispatcher) -> None:
        """Attach, replace or detach the pusher to match the subscription's push config."""
        subscription = dispatcher.subscription
        endpoint = str(subscription.push_config.push_endpoint)
        wanted = bool(endpoint) and not subscription.detached
        current = self.consumers.get(name)
        if current is not None and (
            not wanted
            or current.closed
            or current.dispatcher is not dispatcher
            or current.endpoint != endpoint
        ):
            self.detach(name)
            current = None
        if wanted and current is None:
            consumer = PushConsumer(dispatcher)
            self.consumers[name] = consumer
            log.info("push subscription %s -> %s", name, endpoint)
            dispatcher.add_consumer(consumer)

    def detach(self, name: str, give_back: bool = True) -> None:
        """Stop the pusher of ``name``; ``give_back=False`` when the subscription itself goes."""
        consumer = self.consumers.pop(name, None)
        if consumer is None:
            return
        task = consumer.stop(give_back)
        if task is not None:
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def stats(self, name: str) -> dict[str, Any]:
        """``{"push": {...}}`` for a push subscription's status, else ``{}``."""
        consumer = self.consumers.get(name)
        return {"push": consumer.stats()} if consumer is not None else {}

    async def close(self) -> None:
        """Stop every pusher and wait until their requests and connections are closed."""
        for name in list(self.consumers):
            self.detach(name, give_back=False)
        if self._stopping:
            await asyncio.gather(*list(self._stopping), return_exceptions=True)


def _lease_s(subscription: Any) -> int:
    return int(subscription.ack_deadline_seconds or 10) + LEASE_MARGIN_S
