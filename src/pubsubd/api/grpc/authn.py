"""Authentication of gRPC calls: a server interceptor that checks each call's bearer token and
runs the handler as its caller.

With authentication on (``--auth-*`` flags; ``config.AuthConfig``), every method except the
ones in :data:`OPEN_METHODS` needs ``authorization: Bearer T`` metadata (what
``grpc.access_token_call_credentials`` sends). A call without a valid token ends with
UNAUTHENTICATED before its handler reads a request; a valid one runs its handler with
``core.principal.CALLER`` set to the token's principal, in the handler's own task (the
interceptor wraps the method handler's behavior, so the variable is set in the context the
servicer method runs in, for unary and streaming methods alike).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from pubsubd.api.grpc.status import to_status
from pubsubd.core.errors import Unauthenticated
from pubsubd.core.principal import CALLER, Principal
from pubsubd.core.tokens import TokenVerifier

__all__ = ["OPEN_METHODS", "AuthInterceptor"]

# Methods any caller may make: a process of the cluster asking who serves at an address
# (api/grpc/liveness.py) learns only the answer's identity fields.
OPEN_METHODS = frozenset({"/pubsubd.internal.v1.Forwarder/Identify"})
_BEHAVIORS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, verifier: TokenVerifier) -> None:
        self.verifier = verifier

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        header = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode(errors="replace")
        try:
            principal: Principal | Unauthenticated = self.verifier.principal(header)
        except Unauthenticated as e:
            principal = e
        return _as_caller(handler, principal)


def _as_caller(
    handler: grpc.RpcMethodHandler, caller: Principal | Unauthenticated
) -> grpc.RpcMethodHandler:
    """``handler`` with its behavior run as ``caller`` (or refused with its error)."""
    for kind in _BEHAVIORS:
        behavior = getattr(handler, kind)
        if behavior is not None:
            return handler._replace(**{kind: _wrap(behavior, caller)})
    return handler


def _wrap(behavior: Any, caller: Principal | Unauthenticated) -> Any:
    # Each call runs in its own task (a copy of the context), so the value set here is seen by
    # the handler and everything it awaits, and goes with the task: no reset is needed.
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await _enter(caller, context)
            async for response in behavior(request, context):
                yield response

        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _enter(caller, context)
        return await behavior(request, context)

    return call


async def _enter(caller: Principal | Unauthenticated, context: grpc.aio.ServicerContext) -> None:
    if isinstance(caller, Unauthenticated):
        await context.abort(to_status(caller)[0], str(caller))
    else:
        CALLER.set(caller)
