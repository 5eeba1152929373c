"""``core.deadlines.within``: a deadline that never swallows a cancellation (unlike 3.11's
``asyncio.wait_for``, which returns a result that arrives with the cancellation)."""

from __future__ import annotations

import asyncio

import pytest

from pubsubd.core.deadlines import within


async def test_a_cancellation_arriving_with_the_result_is_raised() -> None:
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(within(answer, 10))
    await asyncio.sleep(0)  # the task waits on the answer
    answer.set_result(1)
    waiting.cancel()  # in the same loop turn as the answer
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_the_result_within_the_deadline() -> None:
    assert await within(asyncio.sleep(0.01, "done"), 5) == "done"


async def test_past_the_deadline_the_awaited_is_cancelled_and_timeout_raised() -> None:
    slow = asyncio.create_task(asyncio.sleep(10))
    with pytest.raises(TimeoutError):
        await within(slow, 0.05)
    assert slow.cancelled()
