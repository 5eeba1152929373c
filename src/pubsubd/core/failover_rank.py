"""pubsubd's StreamingPull extension for Pulsar's failover choice, and the choice itself (pure).

A stream opened with the request header ``pubsubd-failover-rank: PRIORITY NAME TOPIC`` (name
and topic percent-encoded) ranks on a failover subscription as a Pulsar consumer does
(Pulsar's ``AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer``):

* consumers sort by priority level (0 first), then consumer name; only those at the first
  level count;
* a partition N goes to the consumer at ``N % count`` of that list;
* a non-partitioned topic goes to the consumer a hash ring names: each counted consumer puts
  100 points on it at ``murmur3_32(name + str(j)) & 0x7fffffff`` (a later consumer in the
  sorted list takes a colliding point), and the topic's full Pulsar name, hashed the same way,
  takes the first point at or after its hash (wrapping around). That is apache/pulsar's
  master; 2.10 still kept the first consumer to subscribe (PULSAR_FEATURES.md's rule).

A stream without the header ranks at priority 0 under its client_id, with no ring key.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

HEADER = "pubsubd-failover-rank"
RING_POINTS = 100  # Pulsar's CONSUMER_CONSISTENT_HASH_REPLICAS
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class FailoverRank:
    """How a failover consumer ranks: its priority level, its name, and the hash-ring key of a
    non-partitioned topic (its full Pulsar name; "" for none)."""

    priority: int
    name: str
    ring_key: str = ""


def encode(rank: FailoverRank) -> str:
    """The header value (ASCII: gRPC metadata values must be)."""
    return f"{rank.priority} {quote(rank.name, safe='')} {quote(rank.ring_key, safe='')}"


def decode(value: str | bytes) -> FailoverRank | None:
    """The rank a header value carries; None when it does not parse."""
    text = value.decode() if isinstance(value, bytes) else value
    parts = text.split(" ")
    if len(parts) != 3:
        return None
    try:
        priority = int(parts[0])
    except ValueError:
        return None
    return FailoverRank(priority, unquote(parts[1]), unquote(parts[2]))


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit, unsigned."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & _MASK32
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * c1) & _MASK32
        k = ((k << 15) | (k >> 17)) & _MASK32
        k = (k * c2) & _MASK32
        h ^= k
        h = ((h << 13) | (h >> 19)) & _MASK32
        h = (h * 5 + 0xE6546B64) & _MASK32
    k = 0
    for i, byte in enumerate(data[whole:]):
        k ^= byte << (8 * i)
    k = (k * c1) & _MASK32
    k = ((k << 15) | (k >> 17)) & _MASK32
    k = (k * c2) & _MASK32
    h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    h ^= h >> 16
    return h


def pulsar_hash(text: str) -> int:
    """Pulsar's ``Murmur3_32Hash.makeHash``: murmur3 of the UTF-8 bytes, sign bit cleared."""
    return murmur3_32(text.encode()) & 0x7FFFFFFF


def first_level(ranks: Sequence[FailoverRank]) -> int:
    """How many of ``ranks`` (sorted) share the first priority level."""
    count = 0
    for rank in ranks:
        if rank.priority != ranks[0].priority:
            break
        count += 1
    return count


@functools.lru_cache(maxsize=256)
def ring_choice(names: tuple[str, ...], key: str) -> int:
    """The index in ``names`` (the counted consumers, sorted) that the hash ring gives
    ``key`` (cached: the planner asks at every step, the ring changes with the consumers)."""
    ring: dict[int, int] = {}
    for index, name in enumerate(names):
        for j in range(RING_POINTS):
            ring[pulsar_hash(f"{name}{j}")] = index
    points = sorted(ring)
    at = bisect.bisect_left(points, pulsar_hash(key))
    return ring[points[at if at < len(points) else 0]]
