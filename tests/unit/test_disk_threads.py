"""The storage's disk threads (storage/disk_threads.py): results and errors come back to the
caller's loop, calls run concurrently up to the pool's size, a cancelled caller's call still
runs to its end, and an answer for a loop that has closed is dropped."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pubsubd.storage import disk_threads

pytestmark = pytest.mark.unit


async def test_a_call_s_result_comes_back_on_the_caller_s_loop_from_another_thread() -> None:
    caller = threading.get_ident()
    ran_in = await disk_threads.run(threading.get_ident)
    assert ran_in != caller
    assert await disk_threads.run(lambda a, b: a + b, 2, 3) == 5


async def test_a_call_s_exception_is_raised_to_the_caller() -> None:
    def fails() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        await disk_threads.run(fails)
    assert await disk_threads.run(lambda: "still serving") == "still serving"


async def test_calls_run_at_once_on_several_threads_after_one_failed() -> None:
    """Logs of several topics fsync at once: four calls that each wait for the others all
    finish (one thread would never get past the barrier), also after a failed call (the
    thread that ran it serves on)."""
    assert disk_threads.MAX_THREADS >= 4
    with pytest.raises(ZeroDivisionError):
        await disk_threads.run(lambda: 1 // 0)
    barrier = threading.Barrier(4, timeout=10)
    results = await asyncio.gather(*(disk_threads.run(barrier.wait) for _ in range(4)))
    assert sorted(results) == [0, 1, 2, 3]


async def test_a_cancelled_caller_s_call_still_runs_to_its_end() -> None:
    started, finish, finished = threading.Event(), threading.Event(), threading.Event()

    def write() -> str:
        started.set()
        finish.wait(10)
        finished.set()
        return "written"

    future = disk_threads.run(write)
    waiter = asyncio.ensure_future(future)
    await asyncio.to_thread(started.wait, 10)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not finished.is_set()
    finish.set()
    await asyncio.to_thread(finished.wait, 10)
    assert finished.is_set()
    await asyncio.sleep(0.05)  # the answer reaches the cancelled future and is dropped
    assert future.cancelled()


def test_an_answer_for_a_loop_that_has_closed_is_dropped() -> None:
    release = threading.Event()
    done = threading.Event()

    def slow() -> int:
        release.wait(10)
        return 1

    async def start() -> None:
        disk_threads.run(slow)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(start())
    loop.close()
    release.set()
    # The pool keeps serving: a later call on a new loop is answered.
    assert asyncio.run(_after(done)) == 2
    assert done.is_set()


async def _after(done: threading.Event) -> int:
    result = await disk_threads.run(lambda: 2)
    done.set()
    return result


async def test_many_calls_are_each_answered_once_in_any_order() -> None:
    def slow_or_fast(i: int) -> int:
        if i % 7 == 0:
            time.sleep(0.002)
        return i

    results = await asyncio.gather(*(disk_threads.run(slow_or_fast, i) for i in range(300)))
    assert results == list(range(300))


async def test_a_thread_that_cannot_start_fails_its_call_which_never_runs_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The log takes a failed append as not written (its offsets handed out again): the
    call must not be left queued for a thread started later."""
    monkeypatch.setattr(disk_threads, "_pool", None)  # a pool of no threads yet
    ran: list[int] = []

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as m:
        m.setattr(threading.Thread, "start", refuse)
        with pytest.raises(RuntimeError, match="can't start"):
            disk_threads.run(ran.append, 1)
    await disk_threads.run(ran.append, 2)
    await asyncio.sleep(0.05)
    assert ran == [2]
