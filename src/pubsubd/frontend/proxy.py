"""The frontend's gRPC proxy: every call passes through as bytes to a forwarder, with its
metadata and deadline, and comes back with the forwarder's status, details and trailing
metadata (a client cannot tell it from talking to the forwarder itself).

Any method is proxied, so every API the forwarders serve (google.pubsub.v1, IAM, the replay
and admin APIs) is served here too. ``choose(method, first_request)`` names the forwarders to
try, best first. A unary call whose forwarder cannot be reached (UNAVAILABLE) is sent to the
next one; the official clients retry UNAVAILABLE themselves, so a retry here adds no duplicate
they would not make anyway. A stream is opened on the first forwarder that answers; when that
forwarder goes away the stream ends with UNAVAILABLE, which the official subscriber reopens
(SCALE_OUT.md §5), landing on the new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from pubsubd.control.routing_table import Forwarder

log = logging.getLogger(__name__)

__all__ = ["STREAMING_METHODS", "Proxy"]

Choose = Callable[[str, bytes], Sequence[Forwarder]]

# Bidirectional streaming methods; every other method is unary-unary.
STREAMING_METHODS = frozenset({"/google.pubsub.v1.Subscriber/StreamingPull"})

# Headers gRPC sets itself; the rest of the client's metadata goes through.
_OWN_HEADERS = frozenset({"user-agent", "grpc-accept-encoding", "grpc-encoding", "te"})

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> list[tuple[str, str | bytes]]:
    return [
        (m.key, m.value)
        for m in context.invocation_metadata() or ()
        if m.key not in _OWN_HEADERS and not m.key.startswith(":")
    ]


def _timeout(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None or remaining > 1e9 else max(0.0, remaining)


class Proxy(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler: every method goes to the forwarders ``choose`` names."""

    def __init__(self, choose: Choose) -> None:
        self._choose = choose
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.calls = 0
        self.failovers = 0

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method in STREAMING_METHODS:
            return grpc.stream_stream_rpc_method_handler(self._stream(method))
        return grpc.unary_unary_rpc_method_handler(self._unary(method))

    def _unary(self, method: str) -> Callable[..., Any]:
        async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            self.calls += 1
            candidates = self._choose(method, request)
            if not candidates:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "no forwarder is registered")
            metadata, last = _metadata(context), None
            for i, forwarder in enumerate(candidates):
                call = self.channel(forwarder.address).unary_unary(method)
                try:
                    response: bytes = await call(
                        request, metadata=metadata, timeout=_timeout(context)
                    )
                    return response
                except grpc.aio.AioRpcError as e:
                    last = e
                    if e.code() != grpc.StatusCode.UNAVAILABLE or i == len(candidates) - 1:
                        break
                    self.failovers += 1
            assert last is not None
            await _abort_with(context, last)
            raise AssertionError("unreachable")

        return handle

    def _stream(self, method: str) -> Callable[..., Any]:
        async def handle(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            self.calls += 1
            try:
                first = await requests.__anext__()
            except StopAsyncIteration:
                return
            candidates = self._choose(method, first)
            if not candidates:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "no forwarder is registered")
            call = self.channel(candidates[0].address).stream_stream(method)(
                metadata=_metadata(context), timeout=_timeout(context)
            )
            pump = asyncio.get_running_loop().create_task(_pump(first, requests, call))
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as e:
                await _abort_with(context, e)
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await pump
                call.cancel()

        return handle


async def _pump(first: bytes, requests: AsyncIterator[bytes], call: Any) -> None:
    """Client -> forwarder: the first request, then the rest as they come."""
    try:
        await call.write(first)
        async for request in requests:
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
                (m.key, m.value)
                for m in trailing
                if not m.key.startswith("grpc-") or m.key == "grpc-status-details-bin"
            )
        )
    await context.abort(error.code(), error.details() or "")
