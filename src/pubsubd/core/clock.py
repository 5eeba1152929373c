"""Time as a dependency: the clock the roles read and arm timers with, and a manual twin.

Pure modules never read the clock: they take ``now`` as a parameter. The asyncio shells around
them (dispatcher, catalog, deduplicator, snapshots, delay tracker, expiry) read it from a
:class:`Clock` passed in at construction and arm their timers through it, so a test can drive
time with :class:`ManualClock` (``advance``) instead of sleeping, as etcd's raft drives its
state machine with ticks.

Two readings, for two jobs:

- ``monotonic()`` (seconds): deadlines and intervals (leases, backoffs, idle times); never
  jumps.
- ``time_us()`` (microseconds since the epoch): what is stored or shown (publish times,
  delivery times, retention, expiry); may jump with the system clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol


class Timer(Protocol):
    """A timer armed by :meth:`Clock.call_later`."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, intervals)."""
        ...

    def time_us(self) -> int:
        """Microseconds since the Unix epoch (what is stored and shown)."""
        ...

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> Timer:
        """Run ``callback(*args)`` on the event loop ``delay_s`` seconds from now."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic``, ``time.time_ns`` and the running loop's timers."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def time_us(self) -> int:
        return time.time_ns() // 1000

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(delay_s, callback, *args)


SYSTEM_CLOCK = SystemClock()


class _ManualTimer:
    __slots__ = ("args", "callback", "cancelled", "due")

    def __init__(self, due: float, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.due = due
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to: ``advance(seconds)`` moves both readings and runs
    every timer that falls due, in due order, synchronously (no event loop needed)."""

    def __init__(self, *, monotonic: float = 1000.0, time_us: int = 1_700_000_000_000_000) -> None:
        self._monotonic = monotonic
        self._epoch_offset_us = time_us - int(monotonic * 1_000_000)
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._monotonic

    def time_us(self) -> int:
        return self._epoch_offset_us + int(self._monotonic * 1_000_000)

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> Timer:
        timer = _ManualTimer(self._monotonic + max(0.0, delay_s), callback, args)
        heapq.heappush(self._timers, (timer.due, next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> int:
        """Move time forward, firing due timers (those they arm too, if due); returns how many
        fired."""
        if seconds < 0:
            raise ValueError(f"time only moves forward, not by {seconds}")
        target = self._monotonic + seconds
        fired = 0
        while self._timers and self._timers[0][0] <= target:
            due, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._monotonic = max(self._monotonic, due)
            timer.callback(*timer.args)
            fired += 1
        self._monotonic = target
        return fired

    def pending(self) -> int:
        """Timers armed and neither fired nor cancelled."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def next_due(self) -> float | None:
        """When the earliest armed timer falls due (monotonic seconds), if any."""
        live = [due for due, _, t in self._timers if not t.cancelled]
        return min(live) if live else None
