"""A frontend ends its client's open StreamingPull itself (frontend/spread_proxy.py with
core/stream_guard.py), whatever its forwarders check: UNAVAILABLE when the client's token
expires, PERMISSION_DENIED when a policy change (``Authorization.recheck``) revokes the
caller's consume permission; the forwarder's leg is cancelled with it. Real grpc.aio servers
on loopback: the frontend's interceptors (authentication, then authorization) over its proxy,
and a forwarder that checks nothing and holds the stream open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
import pytest

from pubsubd.api.grpc.authn import AuthInterceptor
from pubsubd.api.grpc.authorization import Authorization
from pubsubd.control.routing_table import Forwarder
from pubsubd.core.errors import STREAM_ACCEPTED, PermissionDenied
from pubsubd.core.iam import Requirement
from pubsubd.core.pb import StreamingPullRequest
from pubsubd.core.principal import Principal
from pubsubd.core.tokens import TokenSettings, TokenVerifier, create_token
from pubsubd.frontend.spread_proxy import SpreadingProxy

pytestmark = pytest.mark.unit

SECRET = b"f" * 32
SUBSCRIPTION = "projects/p/subscriptions/s"
STREAMING_PULL = "/google.pubsub.v1.Subscriber/StreamingPull"
ALICE = Principal("user:alice@example.com")


class _Forwarder(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Accepts every StreamingPull and holds it open, sending nothing; notes its end."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method != STREAMING_PULL:
            return None

        async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            await context.send_initial_metadata((STREAM_ACCEPTED,))
            try:
                await asyncio.Event().wait()
            finally:
                self.ended.set()
            yield b""  # unreachable: makes this an async generator

        return grpc.stream_stream_rpc_method_handler(stream)


class _Policies:
    """Who holds consume on the subscription: a set the test changes."""

    def __init__(self) -> None:
        self.consumers = {ALICE}

    def decide(self, principal: Principal, needs: Iterable[Requirement]) -> None:
        for need in needs:
            if principal not in self.consumers:
                raise PermissionDenied(need.permission, need.resource, principal.member)


@pytest.fixture
async def frontend() -> AsyncIterator[tuple[str, _Forwarder, _Policies, Authorization]]:
    forwarder = _Forwarder()
    backend = grpc.aio.server()
    backend.add_generic_rpc_handlers((forwarder,))
    backend_port = backend.add_insecure_port("127.0.0.1:0")
    await backend.start()
    policies = _Policies()
    checking = Authorization(policies.decide)
    proxy = SpreadingProxy(lambda _m, _r: [Forwarder("f", f"127.0.0.1:{backend_port}")])
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(TokenVerifier(TokenSettings(secret=SECRET))), checking]
    )
    server.add_generic_rpc_handlers((proxy,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", forwarder, policies, checking
    await server.stop(None)
    await proxy.close()
    await backend.stop(None)


def _open(channel: grpc.aio.Channel, token: str) -> Any:
    call = channel.stream_stream(STREAMING_PULL)(metadata=(("authorization", f"Bearer {token}"),))
    return call


async def _ended(call: Any, within: float) -> grpc.aio.AioRpcError:
    first = StreamingPullRequest(subscription=SUBSCRIPTION, stream_ack_deadline_seconds=10)
    await call.write(first.SerializeToString())
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async with asyncio.timeout(within):
            await call.read()
    return ended.value


async def test_the_frontend_ends_the_stream_unavailable_when_the_token_expires(
    frontend: tuple[str, _Forwarder, _Policies, Authorization],
) -> None:
    address, forwarder, _, _ = frontend
    token = create_token("alice@example.com", secret=SECRET, expires_in_s=2, now=time.time())
    expires = TokenVerifier(TokenSettings(secret=SECRET)).verify_until(token)[1]
    async with grpc.aio.insecure_channel(address) as channel:
        error = await _ended(_open(channel, token), within=8)  # expiry + EXPIRY_GRACE_S
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert "expired" in (error.details() or "")
    assert time.time() >= expires - 0.05  # not before the expiry
    await asyncio.wait_for(forwarder.ended.wait(), 5)  # the leg went with it


async def test_the_frontend_ends_the_stream_when_a_policy_change_revokes_consume(
    frontend: tuple[str, _Forwarder, _Policies, Authorization],
) -> None:
    address, forwarder, policies, checking = frontend
    token = create_token("alice@example.com", secret=SECRET, expires_in_s=600, now=time.time())
    async with grpc.aio.insecure_channel(address) as channel:
        call = _open(channel, token)
        first = StreamingPullRequest(subscription=SUBSCRIPTION, stream_ack_deadline_seconds=10)
        await call.write(first.SerializeToString())
        assert STREAM_ACCEPTED in tuple(await call.initial_metadata())
        checking.recheck()  # a policy change that leaves alice her permission
        await asyncio.sleep(0.2)
        assert not forwarder.ended.is_set()
        policies.consumers.clear()
        checking.recheck()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async with asyncio.timeout(2):
                await call.read()
    assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED, ended.value
    assert "pubsub.subscriptions.consume" in (ended.value.details() or "")
    await asyncio.wait_for(forwarder.ended.wait(), 5)
