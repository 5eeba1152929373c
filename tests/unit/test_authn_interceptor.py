"""The authentication interceptor (api/grpc/authn.py) on an in-process grpc.aio server: the
servicer method sees ``core.principal.caller()`` as the token's principal, in unary and
streaming methods (async generators and ``context.write`` handlers), and a call without a
valid token ends UNAUTHENTICATED without reaching the handler."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from pubsubd.api.grpc.authn import AuthInterceptor
from pubsubd.core.principal import caller
from pubsubd.core.tokens import TokenSettings, TokenVerifier, create_token

pytestmark = pytest.mark.unit

SECRET = b"k" * 32
SERVICE = "test.Who"


class Who:
    """A servicer whose answers are the caller it runs as."""

    def __init__(self) -> None:
        self.calls = 0

    async def unary(self, request: bytes, context: Any) -> bytes:
        self.calls += 1
        return caller().member.encode()

    async def generator(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        self.calls += 1
        for _ in range(2):
            yield caller().member.encode()

    async def writer(self, requests: Any, context: Any) -> None:
        self.calls += 1
        async for _ in requests:
            await context.write(caller().member.encode())


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Who]]:
    who = Who()
    srv = grpc.aio.server(interceptors=[AuthInterceptor(TokenVerifier(TokenSettings(SECRET)))])
    srv.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(who.unary),
                    "Generator": grpc.unary_stream_rpc_method_handler(who.generator),
                    "Writer": grpc.stream_stream_rpc_method_handler(who.writer),
                },
            )
        ]
    )
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    yield f"127.0.0.1:{port}", who
    await srv.stop(None)


def _metadata(token: str | None) -> Iterator[tuple[str, str]]:
    if token is not None:
        yield ("authorization", f"Bearer {token}")


async def test_the_servicer_runs_as_the_tokens_principal(server: tuple[str, Who]) -> None:
    address, who = server
    token = create_token("alice@example.com", secret=SECRET, expires_in_s=60, now=time.time())
    md = tuple(_metadata(token))
    async with grpc.aio.insecure_channel(address) as channel:
        assert await channel.unary_unary(f"/{SERVICE}/Unary")(b"", metadata=md) == (
            b"user:alice@example.com"
        )
        got = [r async for r in channel.unary_stream(f"/{SERVICE}/Generator")(b"", metadata=md)]
        assert got == [b"user:alice@example.com"] * 2

        async def two() -> AsyncIterator[bytes]:
            yield b"a"
            yield b"b"

        call = channel.stream_stream(f"/{SERVICE}/Writer")(two(), metadata=md)
        assert [r async for r in call] == [b"user:alice@example.com"] * 2
    assert who.calls == 3


@pytest.mark.parametrize("token", [None, "garbage", "forged", "expired"])
async def test_without_a_valid_token_the_handler_is_never_reached(
    server: tuple[str, Who], token: str | None
) -> None:
    address, who = server
    if token == "forged":
        token = create_token("mallory", secret=b"x" * 32, now=time.time())
    elif token == "expired":
        token = create_token("alice", secret=SECRET, expires_in_s=1, now=time.time() - 60)
    md = tuple(_metadata(token))
    async with grpc.aio.insecure_channel(address) as channel:
        for method in ("Unary", "Generator"):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                if method == "Unary":
                    await channel.unary_unary(f"/{SERVICE}/{method}")(b"", metadata=md)
                else:
                    async for _ in channel.unary_stream(f"/{SERVICE}/{method}")(b"", metadata=md):
                        pass
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert who.calls == 0


async def test_handlers_made_per_call_by_a_proxy_do_not_grow_the_cache() -> None:
    """A proxy (the frontend) makes a handler per call for whatever method name a client
    sends: the interceptor's cache stays bounded, and a registered method stays cached."""
    interceptor = AuthInterceptor(TokenVerifier(TokenSettings(SECRET)))

    async def per_call(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(lambda request, context: request)

    for i in range(3000):
        details = SimpleNamespace(method=f"/x.Any/M{i % 1500}", invocation_metadata=())
        await interceptor.intercept_service(per_call, details)
    assert len(interceptor._wrapped) <= 1024
    fixed = grpc.unary_unary_rpc_method_handler(lambda request, context: request)

    async def registered(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return fixed

    details = SimpleNamespace(method="/x.Known/Call", invocation_metadata=())
    interceptor._wrapped.clear()
    first = await interceptor.intercept_service(registered, details)
    assert await interceptor.intercept_service(registered, details) is first
