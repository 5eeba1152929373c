"""Pulsar's failover choice (core/failover_rank.py) and the roster applying it."""

from __future__ import annotations

import pytest

from pubsubd.core import failover_rank
from pubsubd.core.failover_rank import FailoverRank
from pubsubd.data.subscribe.consumers import StreamConsumer
from tests.support.planner import MemoryTopic, planner, subscription

pytestmark = pytest.mark.unit

FAILOVER = {"pubsubd-subscription-type": "failover"}
TOPIC = "persistent://public/default/orders"


def test_murmur3_matches_the_reference_vectors() -> None:
    # MurmurHash3_x86_32 published test values (seed 0 unless given).
    assert failover_rank.murmur3_32(b"") == 0
    assert failover_rank.murmur3_32(b"", 1) == 0x514E28B7
    assert failover_rank.murmur3_32(b"hello") == 0x248BFA47
    assert failover_rank.murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert failover_rank.pulsar_hash("hello") == 0x248BFA47 & 0x7FFFFFFF


def test_the_header_round_trips_any_name() -> None:
    rank = FailoverRank(3, "naïve consumer/1 %", TOPIC)
    value = failover_rank.encode(rank)
    assert value.isascii() and failover_rank.decode(value) == rank
    assert failover_rank.decode(value.encode()) == rank
    assert failover_rank.decode("x y z") is None
    assert failover_rank.decode("1 only-two") is None


def test_the_ring_picks_the_first_point_at_or_after_the_topic_hash() -> None:
    names = ("alpha", "beta", "gamma")
    points = sorted(
        (failover_rank.pulsar_hash(f"{n}{j}"), i)
        for i, n in enumerate(names)
        for j in range(failover_rank.RING_POINTS)
    )
    for key in (TOPIC, "persistent://t/n/x", "persistent://t/n/y"):
        h = failover_rank.pulsar_hash(key)
        expected = next((i for p, i in points if p >= h), points[0][1])
        assert failover_rank.ring_choice(names, key) == expected
    # Stable under the consumers' arrival order: the caller sorts by name.
    assert failover_rank.ring_choice(names, TOPIC) == failover_rank.ring_choice(names, TOPIC)


def _stream(name: str, priority: int = 0, source: int | None = None, key: str = TOPIC):
    stream = StreamConsumer(10, 0, 0, f"client-{name}-{source}")
    stream.failover_rank = FailoverRank(priority, name, key if source is None else "")
    if source is not None:
        stream.sources = frozenset({source})
    return stream


def _receivers(p) -> set[str]:
    chosen = p.roster.receivers(p.settings) or frozenset()
    return {c.failover_rank.name for c in p.roster.consumers.values() if c.id in chosen}


def test_a_whole_topic_goes_where_the_ring_says_among_the_first_priority_level() -> None:
    p = planner(MemoryTopic(), subscription(labels=FAILOVER))
    names = ["carol", "alice", "bob"]
    streams = {n: _stream(n) for n in names}
    for n in names:
        p.add_consumer(streams[n])
    ordered = sorted(names)
    expected = ordered[failover_rank.ring_choice(tuple(ordered), TOPIC)]
    assert _receivers(p) == {expected}
    # A consumer at a better priority level (lower number) takes over alone.
    zed = _stream("zed", priority=-1)
    p.add_consumer(zed)
    assert _receivers(p) == {"zed"}
    p.remove_consumer(zed)
    assert _receivers(p) == {expected}
    # The active one leaving: the ring of those left decides.
    p.remove_consumer(streams[expected])
    left = sorted(n for n in names if n != expected)
    assert _receivers(p) == {left[failover_rank.ring_choice(tuple(left), TOPIC)]}


def test_without_a_ring_key_the_first_by_priority_then_name_is_active() -> None:
    p = planner(MemoryTopic(), subscription(labels=FAILOVER))
    for name, priority in (("b", 0), ("a", 1), ("c", 0)):
        p.add_consumer(_stream(name, priority, key=""))
    assert _receivers(p) == {"b"}


def test_partitions_go_round_the_first_priority_level_by_name() -> None:
    topic = MemoryTopic(sources=[[], [], [], []])
    p = planner(topic, subscription(labels=FAILOVER))
    streams = {}
    for name, priority in (("y", 0), ("x", 0), ("low", 5)):
        for source in range(4):
            streams[name, source] = _stream(name, priority, source)
            p.add_consumer(streams[name, source])
    chosen = p.roster.receivers(p.settings) or frozenset()
    got = {k for k, s in streams.items() if s.id in chosen}
    # [x, y] at level 0 ("low" stands by): 0 -> x, 1 -> y, 2 -> x, 3 -> y.
    assert got == {("x", 0), ("y", 1), ("x", 2), ("y", 3)}
    for source in range(4):
        p.remove_consumer(streams["x", source])
    chosen = p.roster.receivers(p.settings) or frozenset()
    assert {k for k, s in streams.items() if s.id in chosen} == {("y", s) for s in range(4)}
