"""Redelivery timing: the retry policy's exponential backoff and a queue of not-yet-due positions.

Pure: no clock reads; ``now`` is a parameter.

Rules (docs/GOOGLE_API.md §4, §7.5):
1. Without a retry policy a nacked or expired message is redelivered as soon as possible.
2. With one, the n-th failed delivery waits min(maximum_backoff, minimum_backoff * 2**(n-1));
   unset bounds default to 10 s and 600 s.
3. ``DelayQueue.due(now)`` returns each position once, in due-time order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MIN_BACKOFF_S = 10.0
DEFAULT_MAX_BACKOFF_S = 600.0


def _seconds(d: Any) -> float:
    return float(d.seconds) + float(d.nanos) / 1e9


def backoff_s(subscription: Any, failures: int) -> float:
    """Delay before redelivering a message that failed ``failures`` times (>= 1)."""
    if not subscription.HasField("retry_policy"):
        return 0.0
    policy = subscription.retry_policy
    low = _seconds(policy.minimum_backoff) if policy.HasField("minimum_backoff") else None
    high = _seconds(policy.maximum_backoff) if policy.HasField("maximum_backoff") else None
    low = DEFAULT_MIN_BACKOFF_S if low is None else low
    high = DEFAULT_MAX_BACKOFF_S if high is None else high
    if failures <= 0 or low <= 0:
        return max(0.0, min(low, high))
    return min(high, low * 2.0 ** min(failures - 1, 32))


@dataclass(slots=True)
class DelayQueue:
    """Positions that become deliverable at a time; ``due`` pops the ones whose time came."""

    _heap: list[tuple[float, int]] = field(default_factory=list)
    # Created by the first ``add``: every subscription has queues, most never use them.
    _members: set[int] | None = None

    def __len__(self) -> int:
        return 0 if self._members is None else len(self._members)

    def __contains__(self, pos: int) -> bool:
        return self._members is not None and pos in self._members

    def add(self, pos: int, at: float) -> None:
        if self._members is None:
            self._members = set()
        if pos not in self._members:
            self._members.add(pos)
            heapq.heappush(self._heap, (at, pos))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[int]:
        out: list[int] = []
        heap, members = self._heap, self._members
        if members is None:
            return out
        while heap and heap[0][0] <= now:
            _, pos = heapq.heappop(heap)
            members.discard(pos)
            out.append(pos)
        return out

    def clear(self) -> None:
        self._heap.clear()
        self._members = None
