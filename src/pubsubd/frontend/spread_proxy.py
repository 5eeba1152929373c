"""The frontend's proxy for spread subscriptions: one client's calls fanned out over the
subscribing forwarders that each serve some of the subscription's sources (``fanout.py``).

* **StreamingPull**: one stream (a *leg*) on every owner, each with the client's first request
  (its acks split by source) and a ``pubsubd-sources`` header naming the leg's sources. Only
  once every leg accepted (STREAM_ACCEPTED) is the client told so and are its later requests
  written, each to every leg with that leg's acks and deadline changes, and a client that
  moves its message window (the Pulsar front) has it split over the legs
  (``leg_windows.py``), so they lease it once in all, not once each. The legs' responses are
  passed on as they come. When any leg ends, the client's stream ends: with that leg's status,
  or UNAVAILABLE if it ended cleanly; the official subscriber opens it again, on the legs the
  routes name then. While a leg answers "not served here" (a source moving), every leg is opened
  again every 50 ms within the client's deadline, as for one forwarder. A response read from a
  leg that never reached the client goes back to that leg's forwarder (GiveBack).
* **The caller's token and permission** hold the client's stream (``core/stream_guard.py``):
  it ends UNAVAILABLE when the token expires (the official subscriber reopens it with fresh
  credentials) and PERMISSION_DENIED when a policy change revokes its consume permission (this
  frontend's ``Authorization.recheck``), whatever its forwarders check.
* **Routes that change** under an open stream (a source moved, a forwarder left, the
  subscription became spread or whole again) end the client's stream with UNAVAILABLE within
  ``ROUTES_POLL_S``, so no source stays unserved behind a stale fan-out.
* **Pull** first asks every leg for what it holds now (``return_immediately``, the client's
  ``max_messages`` shared among them) and answers with all of it. If every leg was empty,
  it waits on all of them: the first response with messages is answered, and what the other
  Pulls return later is handed back to their forwarders at once (they are not cancelled: a
  response in flight would be lost to its ack deadline).
* **Acknowledge, ModifyAckDeadline**: split by the source in each ack ID, one call per leg.
  **Seek, SeekOffsets**: sent to every leg (each resets its own dispatcher). The first error
  is the client's (exactly-once's per-ack-ID failures of one leg only).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from pubsubd.api.grpc.status import to_status
from pubsubd.core import stream_guard
from pubsubd.core.errors import STREAM_ACCEPTED, InvalidArgument, PubsubError
from pubsubd.core.pb import (
    AcknowledgeRequest,
    ModifyAckDeadlineRequest,
    PullRequest,
    PullResponse,
    StreamingPullRequest,
    StreamingPullResponse,
)
from pubsubd.core.publish_sources import STREAM_SOURCES_HEADER, stream_sources
from pubsubd.frontend.fanout import (
    Leg,
    by_source,
    only_sources,
    sources_header,
    split_ack_ids,
    split_streaming_request,
)
from pubsubd.frontend.leg_windows import LegWindows, received_count, settled_count
from pubsubd.frontend.proxy import (
    OWNER_POLL_S,
    PULL,
    WAIT_FOR_OWNER_S,
    Choose,
    Proxy,
    _abort_with,
    _counted,
    _metadata,
    _not_served,
    _read_client,
    _timeout,
)
from pubsubd.frontend.proxy import (
    _give_back as _give_back_to,
)

__all__ = ["SPREAD_METHODS", "Spread", "SpreadingProxy"]

SUBSCRIBER = "/google.pubsub.v1.Subscriber/"
STREAMING_PULL = SUBSCRIBER + "StreamingPull"
ACKNOWLEDGE = SUBSCRIBER + "Acknowledge"
MODIFY_ACK_DEADLINE = SUBSCRIBER + "ModifyAckDeadline"
# Unary calls sent to every leg.
TO_EVERY_LEG = frozenset({SUBSCRIBER + "Seek", "/pubsubd.v1.Replay/SeekOffsets"})
SPREAD_METHODS = frozenset({STREAMING_PULL, PULL, ACKNOWLEDGE, MODIFY_ACK_DEADLINE, *TO_EVERY_LEG})
# How often an open stream's legs are compared with the routes.
ROUTES_POLL_S = 0.5
# After the client's token expires, how long the frontend lets its forwarders end the stream
# before it ends the stream itself (see ``_stream_first``).
EXPIRY_GRACE_S = 2.0

# (method, first request) -> the legs of a spread subscription, None if it is not spread.
Spread = Callable[[str, bytes], Sequence[Leg] | None]


def _key(legs: Sequence[Leg] | None) -> object:
    return None if legs is None else tuple((g.forwarder.address, g.sources) for g in legs)


class SpreadingProxy(Proxy):
    """``Proxy``, with a spread subscription's calls fanned out (see the module)."""

    def __init__(
        self,
        choose: Choose,
        forwarder_registered: Callable[[float], Awaitable[bool]] | None = None,
        spread: Spread = lambda _method, _request: None,
    ) -> None:
        super().__init__(choose, forwarder_registered)
        self._spread = spread
        self.spread_streams = 0  # client streams fanned out
        self.spread_calls = 0  # unary calls fanned out or split
        self.routes_changed = 0  # client streams ended because their legs changed

    # -- StreamingPull ---------------------------------------------------------------------

    async def _stream_first(
        self,
        method: str,
        first: bytes,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncGenerator[bytes, None]:
        spread = self._spread(method, first) if method == STREAMING_PULL else None
        if method != STREAMING_PULL:
            async for response in super()._stream_first(method, first, requests, context):
                yield response
            return
        inner: AsyncGenerator[bytes, None] = (
            super()._stream_first(method, first, requests, context)
            if spread is None
            else self._stream_spread(method, first, requests, context, spread)
        )
        loop = asyncio.get_running_loop()
        changed = loop.create_task(self._legs_change(method, first, _key(spread)))
        refused: asyncio.Future[PubsubError] = loop.create_future()

        def refuse(error: PubsubError) -> None:
            if not refused.done():
                refused.set_result(error)

        # Its token's expiry, its permission. A forwarder that checks tokens ends its leg at
        # the same expiry, and that end loses nothing: what it sent before comes through to
        # the client first. Ending the client's stream here first would drop what is on its
        # way from the forwarder (leased, so redelivered only when the lease runs out): the
        # frontend ends it itself only a moment later, for forwarders that check nothing.
        guard = stream_guard.watch(refuse, expiry_grace_s=EXPIRY_GRACE_S)
        step: asyncio.Future[bytes] | None = None
        try:
            while True:
                step = asyncio.ensure_future(inner.__anext__())
                waits: set[asyncio.Future[Any]] = {step, changed, refused}
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if step in done:
                    try:
                        response = step.result()
                    except StopAsyncIteration:
                        return
                    yield response
                    continue
                if refused in done:
                    code, _ = to_status(refused.result())
                    await context.abort(code, str(refused.result()))
                self.routes_changed += 1
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    "the subscription's forwarders changed: open the stream again",
                )
        finally:
            guard.close()
            for task in (changed, step):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            await inner.aclose()

    async def _legs_change(self, method: str, first: bytes, key: object) -> None:
        """Return once the routes give the stream other legs than ``key``."""
        while True:
            await asyncio.sleep(ROUTES_POLL_S)
            if _key(self._spread(method, first)) != key:
                return

    async def _stream_spread(
        self,
        method: str,
        first: bytes,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext[Any, Any],
        legs: Sequence[Leg],
    ) -> AsyncGenerator[bytes, None]:
        loop = asyncio.get_running_loop()
        remaining = _timeout(context)
        deadline = loop.time() + min(WAIT_FOR_OWNER_S, remaining or WAIT_FOR_OWNER_S)
        try:
            first_request = StreamingPullRequest.FromString(first)
        except DecodeError:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "request: not a valid StreamingPullRequest"
            )
            return
        try:
            wanted = _wanted_sources(context)
        except InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            return
        legs = only_sources(legs, wanted)
        self.spread_streams += 1
        incoming: asyncio.Queue[bytes | None] = asyncio.Queue()
        reading = loop.create_task(_read_client(requests, incoming))
        calls: list[Any] = []
        try:
            while True:
                opened = await self._open_legs(method, first_request, legs, context)
                if isinstance(opened, list):
                    calls = opened
                    break
                if opened is not None and not _not_served(opened):
                    await _abort_with(context, opened)
                if loop.time() >= deadline:
                    if opened is not None:
                        await _abort_with(context, opened)
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE, "no forwarder serves the subscription"
                    )
                self.waits_for_owner += 1
                await asyncio.sleep(OWNER_POLL_S)
                again = self._spread(method, first)
                if again is None:  # whole again: the client opens it again, on its owner
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        "the subscription's forwarders changed: open the stream again",
                    )
                    return
                legs = only_sources(again, wanted)
            await context.send_initial_metadata((STREAM_ACCEPTED,))
            async for response in self._merge(first, calls, legs, incoming, context):
                yield response
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading
            for call in calls:
                call.cancel()

    async def _open_legs(
        self,
        method: str,
        first: Any,
        legs: Sequence[Leg],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[Any] | grpc.aio.AioRpcError | None:
        """Every leg's stream, once each accepted it; else the first refusal (one that is
        not "not served here" first), every leg cancelled (None: no leg to open)."""
        if not legs:
            return None
        # Each leg is told its own sources (the client's header is replaced: only_sources).
        metadata = [(k, v) for k, v in _metadata(context) if k != STREAM_SOURCES_HEADER]
        parts = split_streaming_request(first, by_source(legs), len(legs))
        calls = [
            self.channel(leg.forwarder.address).stream_stream(method)(
                metadata=[*metadata, (STREAM_SOURCES_HEADER, sources_header(leg))],
                timeout=_timeout(context),
            )
            for leg in legs
        ]
        refusals = await asyncio.gather(
            *(
                _accepted(call, part.SerializeToString())
                for call, part in zip(calls, parts, strict=True)
            )
        )
        failed = [r for r in refusals if r is not None]
        if not failed:
            return calls
        for call in calls:
            call.cancel()
        return next((e for e in failed if not _not_served(e)), failed[0])

    async def _merge(
        self,
        first: bytes,
        calls: list[Any],
        legs: Sequence[Leg],
        incoming: asyncio.Queue[bytes | None],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[bytes]:
        """The legs' responses to the client, the client's requests to the legs, until a leg
        ends (see the module)."""
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[tuple[int, bytes | grpc.aio.AioRpcError | None]] = asyncio.Queue()
        readers = [loop.create_task(_read_leg(i, call, out)) for i, call in enumerate(calls)]
        half_closed = asyncio.Event()
        windows = LegWindows(len(calls))
        pump = loop.create_task(_pump_legs(calls, incoming, by_source(legs), half_closed, windows))
        leg, response = 0, b""
        try:
            while True:
                leg, item = await out.get()
                if isinstance(item, bytes):
                    response = item
                    yield item
                    if windows.active:
                        windows.delivered(leg, received_count(item))
                    response = b""
                    continue
                if isinstance(item, grpc.aio.AioRpcError):
                    await _abort_with(context, item)
                if half_closed.is_set():
                    return  # the client is done: so is the stream
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"forwarder {legs[leg].forwarder.forwarder_id} ended its part of the stream",
                )
        except BaseException:
            if response:  # read from a leg, never written to the client
                self._give_back(
                    legs[leg].forwarder, first, response, StreamingPullResponse, context
                )
            raise
        finally:
            pump.cancel()
            for task in readers:
                task.cancel()
            for call in calls:
                call.cancel()
            for task in [pump, *readers]:
                with contextlib.suppress(BaseException):
                    await task
            while not out.empty():  # read, never passed on
                i, item = out.get_nowait()
                if isinstance(item, bytes) and item:
                    self._give_back(legs[i].forwarder, first, item, StreamingPullResponse, context)

    # -- Pull ------------------------------------------------------------------------------

    async def _pull_once(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        legs = self._spread(PULL, request)
        if legs is None:
            await super()._pull_once(request, context)
            return
        self.spread_calls += 1
        try:
            parsed = PullRequest.FromString(request)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request: not a PullRequest")
            return
        if not legs:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no forwarder serves the subscription")
        got = await self._pull_at_once(parsed, legs, context)
        if not got and not parsed.return_immediately:
            got = await self._pull_race(request, legs, context)
        try:
            await context.write(b"".join(response for _, response in got))
        except BaseException:
            for leg, response in got:  # never reached the client
                self._give_back(leg.forwarder, request, response, PullResponse, context)
            raise

    async def _pull_at_once(
        self, request: Any, legs: Sequence[Leg], context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[tuple[Leg, bytes]]:
        """What every leg holds now (``return_immediately``), ``max_messages`` shared among
        them: the responses with messages (their concatenation is one PullResponse)."""
        metadata, within = _metadata(context), _timeout(context)
        count = len(legs)
        parts = []
        for i, leg in enumerate(legs):
            share = request.max_messages // count + (i < request.max_messages % count)
            if share:
                part = PullRequest()
                part.CopyFrom(request)
                part.max_messages, part.return_immediately = share, True
                parts.append((leg, part.SerializeToString()))
        results = await asyncio.gather(
            *(self._call_at(leg, PULL, body, metadata, within) for leg, body in parts),
            return_exceptions=True,
        )
        got = [(leg, r) for (leg, _), r in zip(parts, results, strict=True) if isinstance(r, bytes)]
        errors = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        if errors and len(errors) == len(results):
            await _abort_with(context, errors[0])
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, grpc.aio.AioRpcError):
                raise result
        return [(leg, r) for leg, r in got if r]

    async def _pull_race(
        self, request: bytes, legs: Sequence[Leg], context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[tuple[Leg, bytes]]:
        """Every leg was empty: wait on all of them and answer the first with messages. The
        others are left to end by themselves (messages or their wait's end), and what they
        return is handed back at once: cancelling them could lose a response in flight to its
        ack deadline. A client that goes away cancels them all (their forwarders give back)."""
        metadata, within = _metadata(context), _timeout(context)
        calls = {
            self.channel(leg.forwarder.address).unary_unary(PULL)(
                request, metadata=metadata, timeout=within
            ): leg
            for leg in legs
        }
        tasks = {asyncio.ensure_future(_result(call)): call for call in calls}
        got: list[tuple[Leg, bytes]] = []
        errors: list[grpc.aio.AioRpcError] = []
        pending = set(tasks)
        try:
            while pending and not got:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    try:
                        response = task.result()
                    except grpc.aio.AioRpcError as e:
                        errors.append(e)
                        continue
                    leg = calls[tasks[task]]
                    if response and not got:
                        got.append((leg, response))
                    elif response:
                        self._give_back(leg.forwarder, request, response, PullResponse, context)
        except BaseException:
            for task in pending:
                tasks[task].cancel()  # the calls: their forwarders give back what they leased
            raise
        if pending:
            later = asyncio.get_running_loop().create_task(
                self._hand_back_later({t: calls[tasks[t]] for t in pending}, request, metadata)
            )
            self._tasks.add(later)
            later.add_done_callback(self._tasks.discard)
        if not got and errors and len(errors) == len(tasks):
            await _abort_with(context, errors[0])
        return got

    async def _hand_back_later(
        self,
        pending: dict[asyncio.Future[bytes], Leg],
        request: bytes,
        metadata: list[tuple[str, str | bytes]],
    ) -> None:
        """Hand back what the Pulls that lost a race return, as they return it."""
        subscription = PullRequest.FromString(request).subscription

        async def hand_back(task: asyncio.Future[bytes], leg: Leg) -> None:
            try:
                response = await task
            except grpc.aio.AioRpcError:
                return  # nothing was leased to it
            ack_ids = [m.ack_id for m in PullResponse.FromString(response).received_messages]
            if ack_ids:
                self.given_back += len(ack_ids)
                channel = self.channel(leg.forwarder.address)
                await _give_back_to(channel, subscription, ack_ids, metadata)

        try:
            await asyncio.gather(*(hand_back(task, leg) for task, leg in pending.items()))
        except asyncio.CancelledError:
            for task in pending:
                task.cancel()
            raise

    async def _call_at(
        self,
        leg: Leg,
        method: str,
        request: bytes,
        metadata: list[tuple[str, str | bytes]],
        within: float | None,
    ) -> bytes:
        call = self.channel(leg.forwarder.address).unary_unary(method)
        response: bytes = await call(request, metadata=metadata, timeout=within)
        return response

    # -- Acknowledge, ModifyAckDeadline, Seek ----------------------------------------------

    def _unary(self, method: str) -> Callable[..., Any]:
        whole = super()._unary(method)
        if method not in SPREAD_METHODS:
            return whole

        async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            legs = self._spread(method, request)
            if legs is None:
                return await whole(request, context)  # type: ignore[no-any-return]
            self.calls += 1
            self.spread_calls += 1
            try:
                response = await self._unary_spread(method, request, context, legs)
            except BaseException as e:
                _counted(method, context, e)
                raise
            _counted(method, context, None)
            return response

        return handle

    async def _unary_spread(
        self,
        method: str,
        request: bytes,
        context: grpc.aio.ServicerContext[Any, Any],
        legs: Sequence[Leg],
    ) -> bytes:
        if not legs:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no forwarder serves the subscription")
        parts = _split_unary(method, request, legs)
        metadata, timeout = _metadata(context), _timeout(context)
        results = await asyncio.gather(
            *(self._call_at(leg, method, body, metadata, timeout) for leg, body in parts),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, grpc.aio.AioRpcError):
                await _abort_with(context, result)
            if isinstance(result, BaseException):
                raise result
        return results[0] if isinstance(results[0], bytes) else b""


def _split_unary(method: str, request: bytes, legs: Sequence[Leg]) -> list[tuple[Leg, bytes]]:
    """Each leg's part of a unary call: its ack IDs' share of Acknowledge and
    ModifyAckDeadline (the whole request to the first leg if it has none or is unreadable),
    the whole of any other call."""
    if method not in (ACKNOWLEDGE, MODIFY_ACK_DEADLINE):
        return [(leg, request) for leg in legs]
    kind = AcknowledgeRequest if method == ACKNOWLEDGE else ModifyAckDeadlineRequest
    try:
        parsed = kind.FromString(request)
    except DecodeError:
        return [(legs[0], request)]
    if not parsed.ack_ids:
        return [(legs[0], request)]
    parts = []
    for i, ack_ids in sorted(split_ack_ids(list(parsed.ack_ids), by_source(legs)).items()):
        part = kind()
        part.CopyFrom(parsed)
        del part.ack_ids[:]
        part.ack_ids.extend(ack_ids)
        parts.append((legs[i], part.SerializeToString()))
    return parts


def _wanted_sources(context: grpc.aio.ServicerContext[Any, Any]) -> frozenset[int] | None:
    """The client's own ``pubsubd-sources`` header (None: every source)."""
    for key, value in context.invocation_metadata() or ():
        if key == STREAM_SOURCES_HEADER:
            return stream_sources(value if isinstance(value, str) else value.decode())
    return None


async def _result(call: Any) -> bytes:
    response: bytes = await call
    return response


async def _accepted(call: Any, first: bytes) -> grpc.aio.AioRpcError | None:
    """Write a leg's first request and wait until its forwarder accepts the stream; None if
    it did, else the refusal."""
    try:
        await call.write(first)
        headers = await call.initial_metadata()
        if STREAM_ACCEPTED in tuple(headers or ()):
            return None
        async for _ in call:  # refused: the call ends with its status
            break  # answered without accepting: a forwarder of an earlier release
    except grpc.aio.AioRpcError as e:
        return e
    except asyncio.InvalidStateError:
        pass
    call.cancel()
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        "the forwarder did not accept the stream (a release without spread subscriptions?)",
    )


async def _read_leg(
    i: int,
    call: Any,
    into: asyncio.Queue[tuple[int, bytes | grpc.aio.AioRpcError | None]],
) -> None:
    try:
        async for response in call:
            into.put_nowait((i, response))
    except grpc.aio.AioRpcError as e:
        into.put_nowait((i, e))
        return
    into.put_nowait((i, None))


async def _pump_legs(
    calls: list[Any],
    incoming: asyncio.Queue[bytes | None],
    sources: dict[int, int],
    half_closed: asyncio.Event,
    windows: LegWindows,
) -> None:
    """The client's requests after the first to every leg, each with its share of the acks
    and, once the client moves its message window, of the window (``leg_windows.py``)."""
    try:
        while (raw := await incoming.get()) is not None:
            try:
                request = StreamingPullRequest.FromString(raw)
                parts = split_streaming_request(request, sources, len(calls))
                for i, part in enumerate(parts):
                    windows.settled(i, settled_count(part.ack_ids, part.modify_deadline_seconds))
                if request.max_outstanding_messages > 0 and len(parts) > 1:
                    split = windows.split(request.max_outstanding_messages)
                    for part, window in zip(parts, split, strict=True):
                        part.max_outstanding_messages = window
                bodies = [part.SerializeToString() for part in parts]
            except DecodeError:
                bodies = [raw] * len(calls)  # every forwarder refuses it
            for call, body in zip(calls, bodies, strict=True):
                await call.write(body)
        half_closed.set()
        for call in calls:
            await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # a leg ended: its status reaches the client through the reads
