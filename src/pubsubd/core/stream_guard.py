"""A client's long stream (StreamingPull) held to what let it open: its caller's token and,
with IAM, its permission.

A stream is checked when it opens (authentication, then authorization of its first request);
this keeps holding it to both while it stays open:

1. **Token expiry.** Authentication sets ``core.principal.CALLER_UNTIL`` (the token's ``exp``).
   At that time the stream ends UNAVAILABLE: the official subscriber's streaming pull manager
   reopens a stream that ends UNAVAILABLE, calling its credentials again, so a client whose
   credentials refresh loses nothing (what it had in flight is redelivered as its leases say);
   one whose token is not refreshed is refused UNAUTHENTICATED when it reopens.
2. **Revoked permission.** The authorization interceptor (``api/grpc/authorization.py``) gives
   the call a :class:`StreamGuard` (:data:`GUARD`, in the call's context) and keeps it, with
   the caller and what the first request needed, among its open streams; when a policy changes
   (the policies' change feed: ``ResourcePolicies.on_change``) it decides each again, and a
   stream whose caller lost the permission ends PERMISSION_DENIED.

The stream's handler (the StreamingPull servicer, a frontend's proxy) calls :func:`watch` once
the stream is open, with how to end it, and :meth:`StreamGuard.close` when it ends.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from contextvars import ContextVar

from pubsubd.core.errors import PubsubError, Unavailable
from pubsubd.core.principal import CALLER_UNTIL

__all__ = ["GUARD", "StreamGuard", "TokenExpired", "watch"]


class TokenExpired(Unavailable):
    """The stream's token expired (UNAVAILABLE, so the client reopens it): the client's
    credentials, not a server fault (the SLIs do not count it as one)."""

    def __init__(self) -> None:
        super().__init__("the caller's token expired: reconnect with a fresh one")


End = Callable[[PubsubError], None]


class StreamGuard:
    """Why one stream must end before its client ends it, and how to end it: the first
    refusal wins; one that comes before the handler says how to end the stream is kept until
    it does."""

    __slots__ = ("_end", "_timer", "refusal")

    def __init__(self) -> None:
        self.refusal: PubsubError | None = None
        self._end: End | None = None
        self._timer: asyncio.TimerHandle | None = None

    def refuse(self, error: PubsubError) -> None:
        """End the stream with ``error`` (at most once)."""
        if self.refusal is not None:
            return
        self.refusal = error
        if self._end is not None:
            self._end(error)

    def bind(self, end: End, until: float = math.inf) -> None:
        """The stream is open: ``end`` ends it; at ``until`` (wall clock; inf: never) its
        token expires."""
        self._end = end
        if self.refusal is not None:
            end(self.refusal)
            return
        if until != math.inf:
            loop = asyncio.get_running_loop()
            delay = max(0.0, until - time.time())
            self._timer = loop.call_later(delay, self.refuse, TokenExpired())

    def close(self) -> None:
        """The stream ended: nothing ends it again."""
        self._end = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


GUARD: ContextVar[StreamGuard | None] = ContextVar("pubsubd_stream_guard", default=None)
"""The current call's guard, when authorization watches it (set for the handler)."""


def watch(end: End, expiry_grace_s: float = 0.0) -> StreamGuard:
    """Hold the current call's open stream to its token's expiry (plus ``expiry_grace_s``)
    and, when authorization watches it, to its permission: ``end`` ends it. The caller closes
    the guard it gets."""
    guard = GUARD.get() or StreamGuard()
    guard.bind(end, CALLER_UNTIL.get() + expiry_grace_s)
    return guard
