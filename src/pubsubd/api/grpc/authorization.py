"""Authorization of every call at the edge: a gRPC server interceptor that refuses a call its
caller may not make (PERMISSION_DENIED naming the permission), before the handler runs.

``pubsubd serve`` and ``pubsubd frontend`` (the edges clients call) install the same
:class:`Authorization` when ``--iam`` is on; REST calls reach it too, since the REST front sends
each of them to the process's own gRPC port. A ``pubsubd forwarder`` without authentication is
behind frontends, which checked each call: it only names the caller (``enforce=False``), for
TestIamPermissions, and its own calls to other forwarders (dead letters and SLI events published
to a topic another forwarder owns) are not refused as anonymous; its port must not be open to
clients. With authentication (``--auth-*``) a forwarder checks every call as ``serve`` does
(the frontends pass the client's token on), except those of ``trusted``: the principal of the
cluster's internal token (``core/internal_token.py``), which its peers' own calls carry.

What a call needs is decided by :mod:`pubsubd.core.iam_calls` from the request's bytes (a
StreamingPull by its first request), and whether the caller holds it by :mod:`pubsubd.core.iam`
over ``decide``'s policies. A stream it let open stays among its open streams
(``core/stream_guard.py``): :meth:`Authorization.recheck`, called on every policy change,
decides each again and ends one whose caller lost the permission PERMISSION_DENIED.

Who the caller is, is :func:`pubsubd.core.principal.caller`: authentication sets
``principal.CALLER``. The one seam is ``identify``, a function from a call's metadata to its
principal that runs in the handler's context before the check (None: keep what is set, else
anonymous). An authentication interceptor listed before this one may instead set ``CALLER`` in
its own ``intercept_service``: grpc.aio runs the interceptors and the handler in one task, so
the value reaches the handler (checked with grpcio 1.85). The only ``identify`` here is
:func:`trusted_caller_header`, for tests and development: it believes the ``x-pubsubd-caller``
header, so anyone who can reach the port can claim to be anyone (``--trust-caller-header``;
never in production, never together with authentication).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextvars import Token
from typing import Any

import grpc
from prometheus_client import Counter

from pubsubd.api.grpc.status import to_status
from pubsubd.core import iam_calls
from pubsubd.core.errors import PubsubError
from pubsubd.core.iam import Requirement
from pubsubd.core.internal_token import InternalIdentity
from pubsubd.core.principal import CALLER, Principal, caller
from pubsubd.core.stream_guard import GUARD, StreamGuard

__all__ = ["CALLER_HEADER", "Authorization", "trusted_caller_header"]

# Tests and development only (see the module docstring).
CALLER_HEADER = "x-pubsubd-caller"

Metadata = Sequence[tuple[str, str | bytes]]
Identify = Callable[[Metadata], Principal | None]
Decide = Callable[[Principal, Iterable[Requirement]], None]  # raises PermissionDenied

DENIED = Counter(
    "pubsubd_iam_denied",
    "Calls refused by authorization (PERMISSION_DENIED), by method",
    ["method"],
)


def trusted_caller_header(metadata: Metadata) -> Principal | None:
    """TESTS AND DEVELOPMENT ONLY: the principal the ``x-pubsubd-caller`` header names
    (``alice@example.com`` is ``user:alice@example.com``), believed without proof."""
    for key, value in metadata:
        if key == CALLER_HEADER:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            return Principal.from_subject(text) if text else None
    return None


class Authorization(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps the handler of every checked method (core/iam_calls.py) with the check."""

    def __init__(
        self,
        decide: Decide,
        identify: Identify | None = None,
        *,
        enforce: bool = True,
        trusted: InternalIdentity | None = None,
    ) -> None:
        """``enforce`` False: only name the caller (a forwarder behind frontends, which
        checked the call; its TestIamPermissions still answers for the caller). ``trusted``:
        principals every call of which passes (a forwarder's: the cluster's identity, the
        principal of its internal token now)."""
        self._decide = decide
        self._identify = identify
        self._enforce = enforce
        self._trusted = trusted
        # method -> (the handler served, its wrapped twin): a servicer's handlers are the same
        # objects call after call, so each is wrapped once (a proxy's, made per call, each time).
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        # The streams this interceptor let open, with who opened them and what they needed.
        self._open: dict[StreamGuard, tuple[Principal, list[Requirement]]] = {}

    def recheck(self) -> None:
        """A policy changed: end each open stream whose caller lost what it needed."""
        for guard, (principal, needs) in list(self._open.items()):
            try:
                self._decide(principal, needs)
            except PubsubError as e:
                DENIED.labels("StreamingPull").inc()
                guard.refuse(e)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or not iam_calls.checked(method):
            return handler
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self._wrap(method, handler)
        if method in iam_calls.RULES:  # a proxy serves any name: keep the known ones only
            self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(method, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # client streaming: no such method in the checked services

    # -- the check --------------------------------------------------------------------------

    def _enter(self, context: grpc.aio.ServicerContext[Any, Any]) -> Token[Principal | None] | None:
        if self._identify is None:
            return None
        principal = self._identify(context.invocation_metadata() or ())
        return CALLER.set(principal) if principal is not None else None

    async def _check(
        self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[Principal, list[Requirement]] | None:
        """Refuse the call, or let it pass: the caller and what it needed (None: not
        checked, a caller every call of which passes)."""
        if not self._enforce:
            return None
        principal = caller()
        if self._trusted is not None and self._trusted.allows(principal):
            return None
        raw = request if isinstance(request, bytes) else request.SerializeToString()
        try:
            needs = list(iam_calls.requirements(method, raw))
            self._decide(principal, needs)
        except PubsubError as e:
            code, _ = to_status(e)
            if code is grpc.StatusCode.PERMISSION_DENIED:
                DENIED.labels(method.rsplit("/", 1)[-1]).inc()
            await context.abort(code, str(e))
            raise  # unreachable: abort raises
        return principal, needs

    def _unary(self, method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(inner):

            async def streamed(request: Any, context: Any) -> AsyncIterator[Any]:
                token = self._enter(context)
                try:
                    await self._check(method, request, context)
                    async for response in inner(request, context):
                        yield response
                finally:
                    _reset(token)

            return streamed

        async def behavior(request: Any, context: Any) -> Any:
            token = self._enter(context)
            try:
                await self._check(method, request, context)
                return await inner(request, context)
            finally:
                _reset(token)

        return behavior

    def _stream(self, method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        async def behavior(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            token = self._enter(context)
            try:
                try:
                    first = await anext(requests)
                except StopAsyncIteration:
                    return
                checked = await self._check(method, first, context)

                async def replayed() -> AsyncIterator[Any]:
                    yield first
                    async for request in requests:
                        yield request

                # Held to its permission while it is open (recheck): the handler binds the
                # guard to its stream (core/stream_guard.py).
                guard = StreamGuard()
                if checked is not None:
                    GUARD.set(guard)
                    self._open[guard] = checked
                try:
                    async for response in inner(replayed(), context):
                        yield response
                finally:
                    self._open.pop(guard, None)
            finally:
                _reset(token)

        return behavior


def _reset(token: Token[Principal | None] | None) -> None:
    if token is not None:
        # An async generator closed from another context cannot reset: the call's task ends
        # with it anyway.
        with contextlib.suppress(ValueError):
            CALLER.reset(token)
