"""The threads that do the storage's blocking file work (writes, fsyncs) for the event loop.

``asyncio.to_thread`` hands a call to the loop's default ``ThreadPoolExecutor``: a
``concurrent.futures.Future`` (with its ``Condition``), a work item, the executor's thread-count
check, a copied context, and an asyncio future chained to the first one. On this project's
2-vCPU VM that came to ~75 µs of wall time and ~85 µs of CPU per call for a call that does
nothing, paid on every log append and every ack journal write (an fsync costs ~250 µs).
:func:`run` hands the call to a thread through a ``SimpleQueue`` and answers through
``call_soon_threadsafe``: ~24 µs and ~25 µs (BENCHMARKS.md, "The storage's thread hop: disk
threads").

The threads are shared by every log and journal of the process, started as they are needed
(up to :data:`MAX_THREADS`, so several logs fsync at once) and left running, idle, on the queue.
They are daemon threads: a call still running at exit is one its caller stopped waiting for
(the logs and journals wait for their writes before they close).

A caller that stops waiting (cancelled) does not stop the call: it runs to the end, as with
``to_thread``, and its result is dropped. Callers that must not go on while it runs wait for
it anyway (``acks/journal.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

# As the default executor's size (min(32, CPUs + 4)): logs of several topics fsync at once.
MAX_THREADS = min(32, (os.cpu_count() or 1) + 4)

_Work = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]]


class _Pool:
    """The queue and its threads; one per process (a forked child starts its own).

    Every call put on the queue is counted against an idle thread, or starts a thread, or
    (all :data:`MAX_THREADS` busy) waits in ``backlog`` for the first thread to finish."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.threads = 0
        self.idle = 0  # threads waiting on the queue that no call has been counted against
        self.backlog = 0  # calls queued while every thread was busy

    def submit(self, work: _Work) -> None:
        start = False
        with self.lock:
            if self.idle:
                self.idle -= 1
            elif self.threads < MAX_THREADS:
                self.threads += 1
                start = True
            else:
                self.backlog += 1
        if start:
            # Started before the call is queued: a thread that cannot start fails the call
            # here, never to have it run later by another thread behind its caller's back.
            try:
                threading.Thread(target=self._serve, name="pubsubd-disk", daemon=True).start()
            except BaseException:
                with self.lock:
                    self.threads -= 1
                raise
        self.work.put(work)

    def _serve(self) -> None:
        work, lock = self.work, self.lock
        while True:
            loop, future, fn, args = work.get()
            result: Any = None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, whatever it is
                _answer(loop, future, None, exc)
            else:
                _answer(loop, future, result, None)
            del loop, future, fn, args, result  # nothing kept alive while idle
            with lock:
                if self.backlog:
                    self.backlog -= 1  # this thread takes a queued call next
                else:
                    self.idle += 1


def _answer(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    exc: BaseException | None,
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for the answer
        loop.call_soon_threadsafe(_settle, future, result, exc)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():  # the caller was cancelled
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


_pool: _Pool | None = None


def run(fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
    """Call ``fn(*args)`` in a disk thread; a future of the running loop for its result."""
    global _pool
    pool = _pool
    if pool is None or pool.pid != os.getpid():
        pool = _pool = _Pool()
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()
    pool.submit((loop, future, fn, args))
    return future
