"""Authentication of gRPC calls: a server interceptor that checks each call's bearer token and
runs the handler as its caller.

With authentication on (``--auth-*`` flags; ``ServerConfig.tokens``), every method except the
ones in :data:`OPEN_METHODS` needs ``authorization: Bearer T`` metadata (what
``grpc.access_token_call_credentials`` sends). A call without a valid token ends with
UNAUTHENTICATED before its handler runs; a valid one runs its handler with
``core.principal.CALLER`` set to the token's principal (and ``CALLER_UNTIL`` to its expiry),
in the handler's own task (the interceptor wraps the method handler's behavior, so the
variables are set in the context the servicer method runs in, for unary and streaming methods
alike).

With ``internal`` (the cluster's identity: ``core.internal_token.InternalIdentity``, the
principal of the internal token, following its file) a valid token of any other principal ends
the call PERMISSION_DENIED (``core.internal_token.require_internal``), as IAM refuses a caller
without the permission: on every method of a storage node, and on a forwarder's internal
methods (``core.internal_token.internal_only``: the ``pubsubd.internal.v1`` services but
Identify and GiveBack), so a client's or an admin's token cannot call them.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from pubsubd.api.grpc.status import to_status
from pubsubd.core.errors import NotInternalCaller, PermissionDenied, PubsubError, Unauthenticated
from pubsubd.core.internal_token import OPEN_METHODS, InternalIdentity, require_internal
from pubsubd.core.principal import CALLER, CALLER_UNTIL
from pubsubd.core.tokens import TokenVerifier, bearer_token

__all__ = ["OPEN_METHODS", "AuthInterceptor", "LongCall"]

# OPEN_METHODS, which any caller may make: a process of the cluster asking who serves at an
# address (api/grpc/liveness.py) learns only the answer's identity fields.
_BEHAVIORS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
MAX_CACHED_METHODS = 1024  # more than every service this process registers


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        verifier: TokenVerifier,
        internal: InternalIdentity | None = None,
        only: Callable[[str], bool] | None = None,
    ) -> None:
        """``internal``: only its principals may call the methods ``only`` names (None: every
        method); ``internal`` None: any valid token may call any method."""
        self.verifier = verifier
        self.internal = internal
        self.only = only
        # method -> (its handler, the handler wrapped): wrapped once per method, not per call.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        known = self._wrapped.get(details.method)
        if known is not None and known[0] is handler:
            return known[1]
        method = details.method
        internal = self.internal if self.only is None or self.only(method) else None
        wrapped = _as_caller(handler, _Gate(self.verifier, internal, method))
        # A registered method's handler is the same object on every call: cache it. A proxy
        # (the frontend) makes a handler per call for any name a client sends: caching those
        # would only grow without bound, so a method whose handler changed is not cached.
        if known is None and len(self._wrapped) < MAX_CACHED_METHODS:
            self._wrapped[details.method] = (handler, wrapped)
        elif known is not None:
            self._wrapped.pop(details.method, None)
        return wrapped


class _Gate:
    """What a method's calls must show: a token ``verifier`` accepts and, with ``internal``,
    one of those principals."""

    __slots__ = ("internal", "service", "verifier")

    def __init__(
        self, verifier: TokenVerifier, internal: InternalIdentity | None, method: str
    ) -> None:
        self.verifier = verifier
        self.internal = internal
        self.service = method.rsplit("/", 2)[-2] or method  # how a refusal names it


def _as_caller(handler: grpc.RpcMethodHandler, gate: _Gate) -> grpc.RpcMethodHandler:
    """``handler`` with its behavior run as the caller its call's token names."""
    for kind in _BEHAVIORS:
        behavior = getattr(handler, kind)
        if behavior is not None:
            return handler._replace(**{kind: _wrap(behavior, gate)})
    return handler


def _wrap(behavior: Any, gate: _Gate) -> Any:
    # Each call runs in its own task (a copy of the context), so the value set here is seen by
    # the handler and everything it awaits, and goes with the task: no reset is needed.
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await _enter(gate, context)
            async for response in behavior(request, context):
                yield response

        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _enter(gate, context)
        return await behavior(request, context)

    return call


async def _enter(gate: _Gate, context: grpc.aio.ServicerContext) -> None:
    """Set the caller of the call ``context`` is of, or end the call UNAUTHENTICATED (or
    PERMISSION_DENIED: a caller the gate does not let in)."""
    header = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            header = value if isinstance(value, str) else value.decode(errors="replace")
    try:
        principal, until = gate.verifier.verify_until(bearer_token(header))
        if gate.internal is not None:
            require_internal(principal, gate.internal.principals(), gate.service)
        CALLER.set(principal)
        CALLER_UNTIL.set(until)
    except (Unauthenticated, PermissionDenied) as e:
        await context.abort(to_status(e)[0], str(e))


class LongCall:
    """Whether a long call (a stream) may go on as the caller it started as: read in the
    handler's task when the call starts (the interceptor set ``CALLER`` and ``CALLER_UNTIL``
    there). A stream asks :meth:`refusal` as it goes and ends with it: its token expired
    (UNAUTHENTICATED), or its caller is no longer the cluster's identity (PERMISSION_DENIED:
    the internal token file changed subject). Authentication off: never refused."""

    def __init__(self, internal: InternalIdentity | None, service: str) -> None:
        self.caller = CALLER.get()
        self.until = CALLER_UNTIL.get()
        self.internal = internal
        self.service = service

    def refusal(self) -> PubsubError | None:
        if self.until != math.inf and time.time() >= self.until:
            return Unauthenticated("the call's token has expired")
        if (
            self.internal is not None
            and self.caller is not None
            and not self.internal.allows(self.caller)
        ):
            return NotInternalCaller(self.caller.member, self.service)
        return None
