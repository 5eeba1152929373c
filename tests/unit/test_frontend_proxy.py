"""The frontend's proxy against two stand-in forwarders (real gRPC servers on loopback): a
StreamingPull refused by the first ("not served here") is opened again on the second with every
request the client wrote, in order, however fast the client writes them.

grpc.aio reports a write that races with the server's end of the call as INTERNAL "Internal error
from Core", losing the real status; the proxy writes only the first request until a forwarder
accepts the stream, so a refusal always reads as itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from pubsubd.control.routing_table import Forwarder
from pubsubd.core.errors import NOT_SERVED_HERE, STREAM_ACCEPTED
from pubsubd.frontend.proxy import REQUESTS, Proxy

pytestmark = pytest.mark.unit

STREAMING_PULL = "/google.pubsub.v1.Subscriber/StreamingPull"
LATER = 40  # requests the client writes right after the first, without waiting


class _Refuses(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A forwarder that does not own the subscription: ends the stream at its first request."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            await anext(aiter(requests))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{NOT_SERVED_HERE}: subscription")
            yield b""  # unreachable: a generator, as a streaming handler is

        return grpc.stream_stream_rpc_method_handler(handle)


class _Owns(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The owner: accepts (the header), then answers with every request it read, once it has
    read them all."""

    def __init__(self, *, header: bool = True) -> None:
        self.header = header

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            if self.header:
                await context.send_initial_metadata((STREAM_ACCEPTED,))
            got: list[bytes] = []
            async for request in requests:
                got.append(request)
                if len(got) == 1 + LATER:
                    yield b",".join(got)

        return grpc.stream_stream_rpc_method_handler(handle)


async def _serve(handler: grpc.GenericRpcHandler) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("header", [True, False], ids=["accepting", "earlier-release"])
async def test_a_refused_stream_is_opened_on_the_owner_with_every_request(header: bool) -> None:
    refuses, refuses_at = await _serve(_Refuses())
    owns, owns_at = await _serve(_Owns(header=header))
    opened: list[str] = []

    def choose(method: str, request: bytes) -> list[Forwarder]:
        # The route is stale for the stream's first opening: the owner is known after it.
        address = refuses_at if not opened else owns_at
        opened.append(address)
        return [Forwarder(address, address)]

    proxy = Proxy(choose)
    frontend = grpc.aio.server()
    frontend.add_generic_rpc_handlers((proxy,))
    port = frontend.add_insecure_port("127.0.0.1:0")
    await frontend.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            # The race this guards against is lost now and then; a forwarder that sends no
            # header costs ACCEPT_WAIT_S a stream.
            for attempt in range(20 if header else 2):
                opened.clear()
                sent = [f"{attempt}-{i}".encode() for i in range(1 + LATER)]
                call = channel.stream_stream(STREAMING_PULL)(timeout=10)
                for request in sent:
                    await call.write(request)
                response = await asyncio.wait_for(call.read(), 10)
                assert response == b",".join(sent), attempt
                assert opened == [refuses_at, owns_at], attempt
                call.cancel()
    finally:
        await frontend.stop(None)
        await proxy.close()
        await refuses.stop(None)
        await owns.stop(None)


class _Echo(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A forwarder answering every unary call with its request, and NOT_FOUND to ``b"missing"``."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        async def handle(request: bytes, context: Any) -> bytes:
            if request == b"missing":
                await context.abort(grpc.StatusCode.NOT_FOUND, "no such topic")
            return request

        return grpc.unary_unary_rpc_method_handler(handle)


def _count(method: str, code: str) -> float:
    return REQUESTS.labels(method, code)._value.get()  # type: ignore[no-any-return]


async def test_every_call_is_counted_with_the_status_its_client_got() -> None:
    """Answered by a forwarder (OK, NOT_FOUND), and answered by the frontend itself because
    no forwarder could be reached: each counted once, by method and code; a method outside
    the API counts as _other (a client cannot grow the label set)."""
    echo, echo_at = await _serve(_Echo())
    reachable = [True]

    def choose(method: str, request: bytes) -> list[Forwarder]:
        address = echo_at if reachable[0] else "127.0.0.1:1"
        return [Forwarder("f", address), Forwarder("g", address)]

    proxy = Proxy(choose)
    frontend = grpc.aio.server()
    frontend.add_generic_rpc_handlers((proxy,))
    port = frontend.add_insecure_port("127.0.0.1:0")
    await frontend.start()
    before = {
        key: _count(*key)
        for key in [
            ("GetTopic", "OK"),
            ("GetTopic", "NOT_FOUND"),
            ("GetTopic", "UNAVAILABLE"),
            ("_other", "OK"),
        ]
    }
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            get_topic = channel.unary_unary("/google.pubsub.v1.Publisher/GetTopic")
            assert await get_topic(b"t", timeout=5) == b"t"
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await get_topic(b"missing", timeout=5)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            assert await channel.unary_unary("/x.Y/Whatever")(b"w", timeout=5) == b"w"
            reachable[0] = False
            with pytest.raises(grpc.aio.AioRpcError) as down:
                await get_topic(b"t", timeout=5)
            assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await frontend.stop(None)
        await proxy.close()
        await echo.stop(None)
    assert {key: _count(*key) - n for key, n in before.items()} == {
        ("GetTopic", "OK"): 1,
        ("GetTopic", "NOT_FOUND"): 1,
        ("GetTopic", "UNAVAILABLE"): 1,
        ("_other", "OK"): 1,
    }
