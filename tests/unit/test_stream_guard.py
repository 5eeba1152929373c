"""``core/stream_guard.py``: what ends a client's open stream before its client does (its
token's expiry, UNAVAILABLE; a refusal authorization hands it, PERMISSION_DENIED), at most
once, and nothing after the stream closed."""

from __future__ import annotations

import asyncio
import contextvars
import time

import pytest

from pubsubd.core import stream_guard
from pubsubd.core.errors import PermissionDenied, PubsubError, Unavailable
from pubsubd.core.principal import CALLER_UNTIL
from pubsubd.core.stream_guard import GUARD, StreamGuard, TokenExpired

pytestmark = pytest.mark.unit


def _denied() -> PermissionDenied:
    return PermissionDenied("pubsub.subscriptions.consume", "projects/p/subscriptions/s", "user:a")


async def test_a_stream_ends_unavailable_when_its_token_expires() -> None:
    ended: list[PubsubError] = []

    def opened() -> StreamGuard:
        CALLER_UNTIL.set(time.time() + 0.05)
        return stream_guard.watch(ended.append)

    guard = contextvars.copy_context().run(opened)
    await asyncio.sleep(0.01)
    assert ended == []
    await asyncio.sleep(0.2)
    assert len(ended) == 1 and isinstance(ended[0], TokenExpired)
    assert "expired" in str(ended[0])
    guard.close()


async def test_a_closed_stream_is_not_ended_again() -> None:
    ended: list[PubsubError] = []

    def opened() -> StreamGuard:
        CALLER_UNTIL.set(time.time() + 0.05)
        return stream_guard.watch(ended.append)

    contextvars.copy_context().run(opened).close()
    await asyncio.sleep(0.15)
    assert ended == []


async def test_without_authentication_nothing_ends_the_stream() -> None:
    ended: list[PubsubError] = []
    guard = stream_guard.watch(ended.append)  # CALLER_UNTIL: inf
    assert guard._timer is None
    guard.close()
    assert ended == []


async def test_the_guard_authorization_set_is_the_one_the_handler_binds() -> None:
    """A refusal before the handler bound the stream is kept until it does; the first refusal
    wins (the token's expiry after a revocation changes nothing)."""
    ended: list[PubsubError] = []
    guard = StreamGuard()
    guard.refuse(_denied())

    def handler() -> StreamGuard:
        GUARD.set(guard)
        CALLER_UNTIL.set(time.time() - 1)
        return stream_guard.watch(ended.append)

    assert contextvars.copy_context().run(handler) is guard
    assert len(ended) == 1 and isinstance(ended[0], PermissionDenied)
    guard.refuse(Unavailable("later"))
    await asyncio.sleep(0.01)
    assert len(ended) == 1
