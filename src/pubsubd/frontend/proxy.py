"""The frontend's gRPC proxy: every call passes through as bytes to a forwarder, with its
metadata and deadline, and comes back with the forwarder's status, details and trailing
metadata (a client cannot tell it from talking to the forwarder itself).

Any method is proxied, so every API the forwarders serve (google.pubsub.v1, IAM, the replay
and admin APIs) is served here too. ``choose(method, first_request)`` names the forwarders to
try, best first. A unary call whose forwarder cannot be reached (UNAVAILABLE) is sent to the
next one; the official clients retry UNAVAILABLE themselves, so a retry here adds no duplicate
they would not make anyway. The last one is waited for within the client's deadline, and so is
a forwarder to register while none is: a forwarder that restarts answers the moment it is back,
instead of the client retrying after backoffs that grow to seconds. A stream is opened on the
first forwarder that answers; when that forwarder goes away the stream ends with UNAVAILABLE,
which the official subscriber reopens (SCALE_OUT.md §5), landing on the new owner.

Messages a client never got go back at once, as when a client talks to the forwarder itself:
Pull is served as server-streaming with one response (as the forwarder serves it) so the write
tells whether it reached the client, and a Pull response, or the StreamingPull response in
hand, that did not is handed back to its forwarder (``pubsubd.internal.v1.Forwarder/GiveBack``:
no delivery attempt counted), with the original call's metadata (its token, with
authentication on). What a cancelled call had not received yet, the forwarder gives
back itself when the proxied call is cancelled.

The forwarders' internal API (``pubsubd.internal.v1``, but GiveBack and Identify:
``core.internal_token.internal_only``) is not passed through: only the cluster's own processes
call it, on the forwarders' ports, so a call of it here is refused PERMISSION_DENIED (a
forwarder with authentication refuses a client's token there too).

Every call is counted as its client saw it (``pubsubd_frontend_requests_total{method,code}``):
the forwarders' own counts (``observability/sli.py``) are what the SLO rules sum, so nothing is
counted twice there; the frontend's show what clients got, including calls that reached no
forwarder (none registered, none reachable, the owner not serving within the deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from prometheus_client import Counter

from pubsubd._gen.pubsubd.internal.v1.forwarder_pb2 import GiveBackRequest, GiveBackResponse
from pubsubd.control.routing_table import Forwarder
from pubsubd.core.deadlines import within
from pubsubd.core.errors import NOT_SERVED_HERE, STREAM_ACCEPTED
from pubsubd.core.internal_token import internal_only
from pubsubd.core.pb import PullResponse, StreamingPullResponse
from pubsubd.frontend.targets import resource_name
from pubsubd.observability.sli import CONTROL_PLANE_METHODS, PUBLISH_METHODS, PULL_METHODS
from pubsubd.storage.node_client import new_channel

log = logging.getLogger(__name__)

__all__ = ["STREAMING_METHODS", "Proxy"]

# The forwarder's internal API (proto/pubsubd/internal/v1/forwarder.proto).
GIVE_BACK = "/pubsubd.internal.v1.Forwarder/GiveBack"
FORWARDER_PROTOCOL_VERSION = 1

Choose = Callable[[str, bytes], Sequence[Forwarder]]

# Bidirectional streaming methods; every other method is unary-unary, but Pull.
STREAMING_METHODS = frozenset({"/google.pubsub.v1.Subscriber/StreamingPull"})
# Served as server-streaming with one response (the same on the wire as a unary answer), as the
# forwarder serves it: the handler then learns whether the response reached the client.
PULL = "/google.pubsub.v1.Subscriber/Pull"

# Headers gRPC sets itself; the rest of the client's metadata goes through.
_OWN_HEADERS = frozenset({"user-agent", "grpc-accept-encoding", "grpc-encoding", "te"})

# How long a call waits for a forwarder to register when none is (at most; the client's
# deadline first).
WAIT_FOR_FORWARDER_S = 30.0
# How long a call waits for a moving topic's new owner to serve it (at most; the client's
# deadline first), asking again every OWNER_POLL_S.
WAIT_FOR_OWNER_S = 30.0
OWNER_POLL_S = 0.05
# How long a stream's later requests wait for a forwarder that sends no STREAM_ACCEPTED header
# (an earlier release) to refuse it before they are written anyway.
ACCEPT_WAIT_S = 1.0

REQUESTS = Counter(
    "pubsubd_frontend_requests",
    "Calls a frontend finished, by the status its client got (other methods count as _other)",
    ["method", "code"],
)
_COUNTED_METHODS = PUBLISH_METHODS | PULL_METHODS | CONTROL_PLANE_METHODS


def _counted(method: str, context: grpc.aio.ServicerContext[Any, Any], error: object) -> None:
    """Count a finished call: OK, CANCELLED, or the status the call was aborted with."""
    name = method.rsplit("/", 1)[-1]
    if error is None:
        code = "OK"
    elif isinstance(error, asyncio.CancelledError):
        code = "CANCELLED"
    else:
        status = context.code()
        code = status.name if isinstance(status, grpc.StatusCode) else "UNKNOWN"
    REQUESTS.labels(name if name in _COUNTED_METHODS else "_other", code).inc()


CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A forwarder that restarts is back in a second or two: reconnect within a fraction of a
    # second of it (gRPC's default backoff grows to minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> list[tuple[str, str | bytes]]:
    return [
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if key not in _OWN_HEADERS and not key.startswith(":")
    ]


def _timeout(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None or remaining > 1e9 else max(0.0, remaining)


def _refuse_internal(method: str) -> Callable[..., Awaitable[bytes]]:
    async def refuse(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        REQUESTS.labels("_other", grpc.StatusCode.PERMISSION_DENIED.name).inc()
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method.rsplit('/', 2)[-2]} is internal to the cluster: not served to clients",
        )
        raise AssertionError("unreachable")

    return refuse


class Proxy(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler: every method goes to the forwarders ``choose`` names."""

    def __init__(
        self,
        choose: Choose,
        forwarder_registered: Callable[[float], Awaitable[bool]] | None = None,
    ) -> None:
        """``forwarder_registered(within)``: wait until some forwarder is registered (False if
        none is within ``within`` seconds)."""
        self._choose = choose
        self._forwarder_registered = forwarder_registered
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.calls = 0
        self.failovers = 0
        self.waits_for_owner = 0  # rounds a call waited for a moving resource's new owner
        self.given_back = 0  # messages a client never got, handed back to their forwarder
        self._tasks: set[asyncio.Task[None]] = set()

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = new_channel(address, CHANNEL_OPTIONS)  # TLS when the cluster speaks it
            self._channels[address] = channel
        return channel

    async def close(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await within(task, 2.0)
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if internal_only(method):
            return grpc.unary_unary_rpc_method_handler(_refuse_internal(method))
        if method in STREAMING_METHODS:
            return grpc.stream_stream_rpc_method_handler(self._stream(method))
        if method == PULL:
            return grpc.unary_stream_rpc_method_handler(self._pull)
        return grpc.unary_unary_rpc_method_handler(self._unary(method))

    async def _candidates(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Sequence[Forwarder]:
        """The forwarders to try. While none is registered (the only one is restarting), the
        call waits for one, within the client's deadline (at most ``WAIT_FOR_FORWARDER_S``):
        answering UNAVAILABLE at once would make the client retry with backoffs that grow to
        seconds, long after the forwarder is back."""
        candidates = self._choose(method, request)
        if not candidates and self._forwarder_registered is not None:
            remaining = _timeout(context)
            within = min(WAIT_FOR_FORWARDER_S, remaining or WAIT_FOR_FORWARDER_S)
            if await self._forwarder_registered(within):
                candidates = self._choose(method, request)
        if not candidates:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no forwarder is registered")
        return candidates

    async def _call(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[bytes, Forwarder]:
        """One unary call, to the first forwarder that can be reached; aborts the client's
        call with the forwarder's status otherwise. While the resource moves between
        forwarders (every one answers "not served here"), the call is tried again until the
        new owner serves it, within the client's deadline (at most ``WAIT_FOR_OWNER_S``)."""
        loop = asyncio.get_running_loop()
        remaining = _timeout(context)
        deadline = loop.time() + min(WAIT_FOR_OWNER_S, remaining or WAIT_FOR_OWNER_S)
        metadata = _metadata(context)
        while True:
            candidates = await self._candidates(method, request, context)
            last = None
            for i, forwarder in enumerate(candidates):
                call = self.channel(forwarder.address).unary_unary(method)
                try:
                    # A lone forwarder is waited for (within the client's deadline): one that
                    # restarts then answers the moment it is back, instead of the client
                    # retrying after backoffs that grow to seconds.
                    response: bytes = await call(
                        request,
                        metadata=metadata,
                        timeout=_timeout(context),
                        wait_for_ready=len(candidates) == 1,
                    )
                    return response, forwarder
                except grpc.aio.AioRpcError as e:
                    last = e
                    if e.code() != grpc.StatusCode.UNAVAILABLE or i == len(candidates) - 1:
                        break
                    self.failovers += 1
            assert last is not None
            if not _not_served(last) or loop.time() >= deadline:
                break
            self.waits_for_owner += 1
            await asyncio.sleep(OWNER_POLL_S)
        await _abort_with(context, last)
        raise AssertionError("unreachable")

    async def _pull(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.calls += 1
        try:
            await self._pull_once(request, context)
        except BaseException as e:
            _counted(PULL, context, e)
            raise
        _counted(PULL, context, None)

    async def _pull_once(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        response, forwarder = await self._call(PULL, request, context)
        try:
            await context.write(response)
        except asyncio.CancelledError:
            self._give_back(forwarder, request, response, PullResponse, context)
            raise
        except Exception:
            # Never reached the client: the forwarder gives the messages to others at once.
            self._give_back(forwarder, request, response, PullResponse, context)
            log.debug("Pull response not sent: the client is gone", exc_info=True)
            raise asyncio.CancelledError() from None

    def _give_back(
        self,
        forwarder: Forwarder,
        request: bytes,
        response: bytes,
        kind: Any,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        """Hand ``response``'s messages back, as the caller of ``context`` (its metadata, so its
        token: a forwarder with authentication on refuses a call without one)."""
        ack_ids = [m.ack_id for m in kind.FromString(response).received_messages]
        subscription = _subscription_of(request)
        if not ack_ids or not subscription:
            return
        self.given_back += len(ack_ids)
        task = asyncio.get_running_loop().create_task(
            _give_back(self.channel(forwarder.address), subscription, ack_ids, _metadata(context))
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _unary(self, method: str) -> Callable[..., Any]:
        async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            self.calls += 1
            try:
                response = (await self._call(method, request, context))[0]
            except BaseException as e:
                _counted(method, context, e)
                raise
            _counted(method, context, None)
            return response

        return handle

    def _stream(self, method: str) -> Callable[..., Any]:
        async def handle(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            self.calls += 1
            error: BaseException | None = None
            try:
                async for response in self._stream_once(method, requests, context):
                    yield response
            except BaseException as e:
                error = e
                raise
            finally:
                _counted(method, context, error)

        return handle

    async def _stream_once(
        self,
        method: str,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[bytes]:
        """One proxied stream (see :meth:`_stream`)."""
        try:
            first = await requests.__anext__()
        except StopAsyncIteration:
            return
        async for response in self._stream_first(method, first, requests, context):
            yield response

    async def _stream_first(
        self,
        method: str,
        first: bytes,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncGenerator[bytes, None]:
        """The stream whose first request was ``first``, on one forwarder."""
        loop = asyncio.get_running_loop()
        remaining = _timeout(context)
        deadline = loop.time() + min(WAIT_FOR_OWNER_S, remaining or WAIT_FOR_OWNER_S)
        # The client's requests, read by one task for the stream's life: a stream opened
        # again (its first forwarder did not serve the subscription) goes on from them.
        incoming: asyncio.Queue[bytes | None] = asyncio.Queue()
        reading = loop.create_task(_read_client(requests, incoming))
        try:
            async for response in self._stream_to_owner(method, first, incoming, context, deadline):
                yield response
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading

    async def _stream_to_owner(
        self,
        method: str,
        first: bytes,
        incoming: asyncio.Queue[bytes | None],
        context: grpc.aio.ServicerContext[Any, Any],
        deadline: float,
    ) -> AsyncIterator[bytes]:
        """The stream on the subscription's forwarder, opened again while none serves it."""
        loop = asyncio.get_running_loop()
        # The client's requests after the first, as sent so far: kept only until the stream
        # answers (after that it is never opened again).
        taken = _Taken()
        accepted = False  # the client was told (STREAM_ACCEPTED): at most once
        while True:
            candidates = await self._candidates(method, first, context)
            call = self.channel(candidates[0].address).stream_stream(method)(
                metadata=_metadata(context), timeout=_timeout(context)
            )
            # A stream opened again gets every request the client sent so far, in order.
            answered = asyncio.Event()
            pump = loop.create_task(
                _pump([first, *taken.requests], incoming, call, taken, answered)
            )
            response, started = b"", False
            try:
                if not accepted:
                    # Pass the forwarder's acceptance on at once, as a serving process sends
                    # it, not with the first message: a client may wait for it (the Pulsar
                    # front's consumers answer SUBSCRIBE on it). A refusal has no such header.
                    headers = await call.initial_metadata()
                    if STREAM_ACCEPTED in tuple(headers or ()):
                        await context.send_initial_metadata((STREAM_ACCEPTED,))
                        accepted = True
                async for response in call:
                    if not started:
                        started, taken.keep = True, False
                        taken.requests.clear()
                        answered.set()
                    yield response
                    response = b""
            except grpc.aio.AioRpcError as e:
                if not started and _not_served(e) and loop.time() < deadline:
                    # The subscription is moving (or not routed yet): open the stream
                    # on its owner once it serves, as a unary call waits for it.
                    self.waits_for_owner += 1
                    await asyncio.sleep(OWNER_POLL_S)
                    continue
                await _abort_with(context, e)
            except BaseException:
                if response:  # read from the forwarder, never written to the client
                    self._give_back(candidates[0], first, response, StreamingPullResponse, context)
                raise
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await pump
                call.cancel()
            return


def _not_served(error: grpc.aio.AioRpcError) -> bool:
    """The forwarder does not own the resource (core.errors.NotServedHere)."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and (error.details() or "").startswith(
        NOT_SERVED_HERE
    )


def _subscription_of(request: bytes) -> str:
    found = resource_name(PULL, request)
    return found[1] if found is not None else ""


async def _give_back(
    channel: grpc.aio.Channel,
    subscription: str,
    ack_ids: list[str],
    metadata: list[tuple[str, str | bytes]],
) -> None:
    request = GiveBackRequest(
        protocol_version=FORWARDER_PROTOCOL_VERSION, subscription=subscription, ack_ids=ack_ids
    )
    try:
        await channel.unary_unary(
            GIVE_BACK,
            request_serializer=GiveBackRequest.SerializeToString,
            response_deserializer=GiveBackResponse.FromString,
        )(request, timeout=5.0, metadata=metadata)
    except grpc.aio.AioRpcError as e:  # their leases expire instead: redelivered later
        log.info("giving back %d messages of %s failed: %s", len(ack_ids), subscription, e)


async def _read_client(requests: AsyncIterator[bytes], into: asyncio.Queue[bytes | None]) -> None:
    """The client's requests into a queue; None once the client is done writing."""
    try:
        async for request in requests:
            into.put_nowait(request)
    finally:
        into.put_nowait(None)


class _Taken:
    """A stream's requests taken from the client, while it may still be opened again."""

    __slots__ = ("keep", "requests")

    def __init__(self) -> None:
        self.keep = True
        self.requests: list[bytes] = []


async def _pump(
    sent: list[bytes],
    requests: asyncio.Queue[bytes | None],
    call: Any,
    taken: _Taken,
    answered: asyncio.Event,
) -> None:
    """Client -> forwarder: the first request; once the forwarder accepts the stream, the
    requests ``sent`` after it before, then the rest as they come (kept in ``taken`` while it
    keeps them).

    Nothing but the first request is written before the forwarder accepts (its headers carry
    STREAM_ACCEPTED): a forwarder that refuses ends the call at once, and grpc.aio reports a
    write racing with that end as INTERNAL "Internal error from Core" instead of the
    forwarder's status. That would hide "not served here", and the stream would not be opened
    again on the owner. A forwarder of an earlier release sends its headers with its first
    response (``answered``); one that has not ended the call within ``ACCEPT_WAIT_S`` has
    accepted it too."""
    first, *later = sent
    try:
        await call.write(first)
        # Not cancelled on a timeout (it ends with the call at the latest): grpc.aio's
        # waiters are left to it.
        headers = asyncio.ensure_future(call.initial_metadata())
        with contextlib.suppress(TimeoutError):
            await within(asyncio.shield(headers), ACCEPT_WAIT_S)
            if STREAM_ACCEPTED not in tuple(headers.result() or ()):
                # Refused (this task is cancelled once the call's end is read), or
                # accepted by a forwarder of an earlier release.
                await within(answered.wait(), ACCEPT_WAIT_S)
        for earlier in later:
            await call.write(earlier)
        while (request := await requests.get()) is not None:
            if taken.keep:
                taken.requests.append(request)
            await call.write(request)
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # the forwarder's side ended: its status reaches the client through the reads


async def _abort_with(
    context: grpc.aio.ServicerContext[Any, Any], error: grpc.aio.AioRpcError
) -> None:
    trailing = error.trailing_metadata()
    if trailing:
        # Rich error details (google.rpc.Status, e.g. exactly-once's per-ack-ID failures) ride
        # in grpc-status-details-bin; gRPC's other own keys are set by gRPC itself.
        context.set_trailing_metadata(
            tuple(
                (key, value)
                for key, value in trailing
                if not key.startswith("grpc-") or key == "grpc-status-details-bin"
            )
        )
    await context.abort(error.code(), error.details() or "")
