"""Flow control: per-topic publish rate quotas and the process's memory bounds (pure).

**Publish rate quotas** are topic labels, so any official client can set them:

| label                            | value                                         |
|----------------------------------|-----------------------------------------------|
| pubsubd-publish-rate-messages    | messages per second the topic accepts         |
| pubsubd-publish-rate-bytes       | request bytes per second the topic accepts    |

Each is a token bucket holding one second of its rate: a burst of up to one second's worth
goes through at once, and a single request bigger than that goes through when the bucket is
full (it leaves the bucket in debt), so no size of request is refused for ever. Past the rate,
Publish answers RESOURCE_EXHAUSTED naming the label (the official client retries it with
backoff, which is what slows the publisher down).

**Memory bounds** (``MemoryBudget``): what the process holds for requests in flight, here the
bytes of Publish requests waiting for storage (``PUBSUBD_MAX_INFLIGHT_PUBLISH_BYTES``). A
request that would cross the bound is refused with RESOURCE_EXHAUSTED at once, before it is
stored; one request alone always fits (the bound must not refuse a lone 10 MB request).
Outstanding deliveries are bounded per stream and subscription by the caps the dispatcher
already applies (``data/subscribe/roster.py``).

Nothing here reads a clock: callers pass ``now`` (seconds, any monotonic origin).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pubsubd.core.quotas import positive_int

RATE_MESSAGES_LABEL = "pubsubd-publish-rate-messages"
RATE_BYTES_LABEL = "pubsubd-publish-rate-bytes"


@dataclass(frozen=True, slots=True)
class PublishRate:
    messages_per_s: int = 0  # 0 = no limit of this kind
    bytes_per_s: int = 0


def parse_rate(labels: Mapping[str, str]) -> PublishRate | None:
    """The topic's publish rate quota, None if it has none; InvalidArgument naming a bad label."""
    rate = PublishRate(
        positive_int(labels, RATE_MESSAGES_LABEL), positive_int(labels, RATE_BYTES_LABEL)
    )
    return rate if rate.messages_per_s or rate.bytes_per_s else None


@dataclass(slots=True)
class TokenBucket:
    """``rate`` tokens per second, holding at most ``rate`` (one second)."""

    rate: float
    tokens: float = 0.0
    at: float | None = None  # None: full at the first look

    def refill(self, now: float) -> None:
        if self.at is None:
            self.tokens, self.at = self.rate, now
        elif now > self.at:
            self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def allows(self, cost: float, now: float) -> bool:
        """Whether ``cost`` tokens may be taken now (a cost above the capacity: when full)."""
        self.refill(now)
        return self.tokens >= min(cost, self.rate)

    def take(self, cost: float) -> None:
        self.tokens -= cost


class RateLimiter:
    """The buckets of one topic's publish rate quota."""

    def __init__(self, rate: PublishRate) -> None:
        self.rate = rate
        self._messages = TokenBucket(rate.messages_per_s) if rate.messages_per_s else None
        self._bytes = TokenBucket(rate.bytes_per_s) if rate.bytes_per_s else None
        self.refused = 0

    def admit(self, messages: int, size: int, now: float) -> str | None:
        """Take a request of ``messages`` and ``size`` bytes; None if admitted, else which
        quota it is over, as a phrase for the error."""
        m, b = self._messages, self._bytes
        if m is not None and not m.allows(messages, now):
            self.refused += 1
            return f"{self.rate.messages_per_s} messages/s ({RATE_MESSAGES_LABEL})"
        if b is not None and not b.allows(size, now):
            self.refused += 1
            return f"{self.rate.bytes_per_s} bytes/s ({RATE_BYTES_LABEL})"
        if m is not None:
            m.take(messages)
        if b is not None:
            b.take(size)
        return None


class MemoryBudget:
    """Bytes held for requests in flight, up to ``limit`` (0 = no bound)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.refused = 0

    def acquire(self, size: int) -> bool:
        """Hold ``size`` bytes if they fit (a lone request always does); False if refused."""
        if self.limit and self.used and self.used + size > self.limit:
            self.refused += 1
            return False
        self.used += size
        self.peak = max(self.peak, self.used)
        return True

    def release(self, size: int) -> None:
        self.used -= size

    def status(self) -> dict[str, int]:
        return {"limit": self.limit, "used": self.used, "peak": self.peak, "refused": self.refused}
