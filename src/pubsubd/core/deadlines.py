"""Awaiting with a deadline without losing a cancellation.

``asyncio.wait_for`` of Python 3.11 returns a result that arrived in the same loop turn as a
cancellation of the awaiting task instead of raising ``CancelledError`` (CPython gh-86296, fixed
in 3.12 by building it on ``asyncio.timeout``): the cancelled task carries on, and a loop that
waits for it (a follow's ``wait_closed``, a worker's shutdown) waits forever. :func:`within` is
the 3.12 behaviour on 3.11; every deadline in pubsubd goes through it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable``; ``TimeoutError`` (having cancelled it) after ``seconds``."""
    async with asyncio.timeout(seconds):
        return await awaitable
