"""The frontend's give-back of a Pull response its client never got, to a forwarder with
authentication on (a real gRPC server on loopback with the AuthInterceptor ``serve --auth-*``
runs): the GiveBack call carries the original caller's token, so it is accepted, not refused
UNAUTHENTICATED (before, it carried none and the messages waited for their ack deadline)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from pubsubd._gen.pubsubd.internal.v1.forwarder_pb2 import GiveBackRequest, GiveBackResponse
from pubsubd.api.grpc.authn import AuthInterceptor
from pubsubd.control.routing_table import Forwarder
from pubsubd.core.pb import PullRequest, PullResponse, ReceivedMessage
from pubsubd.core.principal import CALLER
from pubsubd.core.tokens import TokenSettings, TokenVerifier, create_token
from pubsubd.frontend.proxy import GIVE_BACK, PULL, Proxy

pytestmark = pytest.mark.unit

SECRET = b"s" * 32
SUBSCRIPTION = "projects/p/subscriptions/s"


class _Forwarder(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Answers Pull with one message; records each GiveBack and who made it."""

    def __init__(self) -> None:
        self.given_back: list[tuple[str, list[str]]] = []
        self.got_give_back = asyncio.Event()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method == PULL:

            async def pull(request: bytes, context: Any) -> AsyncIterator[bytes]:
                answer = PullResponse(received_messages=[ReceivedMessage(ack_id="a1")])
                yield answer.SerializeToString()

            return grpc.unary_stream_rpc_method_handler(pull)
        if details.method == GIVE_BACK:

            async def give_back(request: bytes, context: Any) -> bytes:
                asked = GiveBackRequest.FromString(request)
                self.given_back.append((CALLER.get().member, list(asked.ack_ids)))
                self.got_give_back.set()
                return GiveBackResponse().SerializeToString()

            return grpc.unary_unary_rpc_method_handler(give_back)
        return None


class _GoneClient:
    """The server side of a Pull whose client went away: writing the response fails."""

    def __init__(self, token: str) -> None:
        self.token = token

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.token}"), ("user-agent", "test")]

    def time_remaining(self) -> float | None:
        return 10.0

    async def write(self, message: bytes) -> None:
        raise RuntimeError("the client is gone")

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


async def test_an_unsent_pull_response_goes_back_with_the_callers_token() -> None:
    forwarder = _Forwarder()
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(TokenVerifier(TokenSettings(secret=SECRET)))]
    )
    server.add_generic_rpc_handlers((forwarder,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    proxy = Proxy(lambda method, request: [Forwarder("f", address)])
    token = create_token("alice@example.com", secret=SECRET, now=time.time())
    try:
        request = PullRequest(subscription=SUBSCRIPTION, max_messages=5).SerializeToString()
        with pytest.raises(asyncio.CancelledError):
            await proxy._pull(request, _GoneClient(token))  # type: ignore[arg-type]
        await asyncio.wait_for(forwarder.got_give_back.wait(), 5)
    finally:
        await proxy.close()
        await server.stop(None)
    assert forwarder.given_back == [("user:alice@example.com", ["a1"])]
    assert proxy.given_back == 1
