"""Unit tests for the SLI event emitter's buffering and batching (pubsubd.observability.events)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from pubsubd.core import ids, pb
from pubsubd.observability import events
from pubsubd.observability.events import EVENTS_TOPIC, BacklogRotation, EventEmitter

pytestmark = pytest.mark.unit


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.requests: list[Any] = []
        self.fail = fail

    async def __call__(self, raw: bytes, count: int) -> None:
        if self.fail:
            raise OSError("disk full")
        request = pb.PublishRequest.FromString(raw)
        assert len(request.messages) == count
        self.requests.append(request)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(m.data) for r in self.requests for m in r.messages]


async def test_one_publish_event_per_topic_per_interval() -> None:
    sink = Sink()
    emitter = EventEmitter(sink, 10, max_samples=5)
    for i in range(20):
        emitter.record_publish("projects/p/topics/a", float(i), ok=True)
    emitter.record_publish("projects/p/topics/a", 99.0, ok=False)
    emitter.record_publish("projects/p/topics/b", 1.5, ok=True)
    emitter.record_error("Publish", "NOT_FOUND")
    emitter.record_error("Publish", "NOT_FOUND")
    assert await emitter.flush(now=1000.0) == 3
    got = {(e["kind"], e.get("topic", e.get("method"))): e for e in sink.events()}
    a = got[("publish", "projects/p/topics/a")]
    assert (a["count"], a["failed"], a["ts"]) == (21, 1, 1000.0)
    assert len(a["latency_ms"]) == 5  # capped, a uniform sample of the 20
    assert set(a["latency_ms"]) <= {float(i) for i in range(20)}
    assert got[("publish", "projects/p/topics/b")]["latency_ms"] == [1.5]
    assert got[("error", "Publish")] == {
        "kind": "error",
        "ts": 1000.0,
        "method": "Publish",
        "code": "NOT_FOUND",
        "count": 2,
    }
    assert all(r.topic == EVENTS_TOPIC for r in sink.requests)
    # The buffers were reset: an idle interval publishes nothing.
    assert await emitter.flush() == 0
    assert len(sink.requests) == 1


async def test_batches_split_at_the_request_limits() -> None:
    emitter = EventEmitter(Sink(), 10)
    many = [
        {"kind": "error", "ts": 1, "method": "m", "code": str(i), "count": 1} for i in range(2500)
    ]
    batches = emitter.batches(many)
    assert [n for _, n in batches] == [1000, 1000, 500]
    big = [{"kind": "publish", "topic": "t", "latency_ms": [1.0] * 600_000}] * 3
    assert len(emitter.batches(big)) == 3  # 2.4 MB each: two do not fit one 4 MB request


async def test_own_topic_is_not_measured_and_failures_never_raise() -> None:
    sink = Sink(fail=True)
    emitter = EventEmitter(sink, 10)
    emitter.record_publish(EVENTS_TOPIC, 1.0, ok=True)
    assert emitter.drain() == []
    emitter.record_error("Pull", "INTERNAL")
    assert await emitter.flush() == 0
    assert emitter.dropped_batches == 1


async def test_module_hooks_follow_the_running_emitter() -> None:
    sink = Sink()
    emitter = EventEmitter(sink, 0.05)
    events.record_publish("projects/p/topics/x", 1.0)  # no emitter: ignored
    emitter.start()
    try:
        events.record_publish("projects/p/topics/x", 2.0)
        events.record_error("Publish", "NOT_FOUND")
        for _ in range(100):
            if sink.requests:
                break
            await asyncio.sleep(0.02)
    finally:
        await emitter.close()
    kinds = sorted(e["kind"] for e in sink.events())
    assert kinds == ["error", "publish"]
    events.record_publish("projects/p/topics/x", 3.0)  # closed: ignored again
    assert emitter.drain() == []


def test_backlog_rotation_caps_and_resumes() -> None:
    stats = SimpleNamespace(messages=3, bytes=30, oldest_age_s=1.25)
    served = [f"projects/p/subscriptions/s{i}" for i in range(5)]
    asked: list[tuple[str, int]] = []

    def backlog(name: str, now_us: int) -> tuple[str, Any]:
        asked.append((name, now_us))
        if name not in served:
            raise KeyError(name)  # gone since the names were listed: skipped
        return "projects/p/topics/t", stats

    rotation = BacklogRotation(lambda: list(served), backlog, limit=2)
    seen = [b["subscription"] for _ in range(3) for b in rotation()]
    assert sorted(seen) == sorted(served)
    assert len(asked) == 5 and all(now_us > 0 for _, now_us in asked)  # only those sampled
    first = rotation()[0]
    assert first == {
        "subscription": "projects/p/subscriptions/s0",
        "topic": "projects/p/topics/t",
        "messages": 3,
        "oldest_unacked_age_s": 1.25,
    }
    # A subscription gone between the listing and the question is skipped.
    everything = BacklogRotation(lambda: [*served, "projects/p/subscriptions/gone"], backlog)
    assert [b["subscription"] for b in everything()] == served


class _Log:
    """A source log's publish-time index: offset -> publish time (µs); others are trimmed."""

    def __init__(self, times: dict[int, int]) -> None:
        self.times = times
        self.lookups = 0

    def publish_time_us(self, offset: int) -> int:
        self.lookups += 1
        return self.times[offset]


def _index(*logs: _Log) -> Callable[[int], int]:
    """A topic's publish-time lookup by position (source, offset), over its logs' indexes."""
    return lambda pos: logs[ids.source_of(pos)].publish_time_us(ids.offset_of(pos))


def test_delivery_event_per_subscription_samples_publish_to_ack_latency() -> None:
    emitter = EventEmitter(Sink(), 10, max_samples=5)
    now = 1000.0
    log = _Log({i: int((now - 0.001 * (i + 1)) * 1e6) for i in range(100)})  # i+1 ms old
    sub, topic = "projects/p/subscriptions/s", "projects/p/topics/t"
    emitter.record_acks(sub, topic, _index(log), [0, 1], now=now)
    assert [round(x) for x in emitter._acks[sub].samples.samples] == [1, 2]
    emitter.record_acks(sub, topic, _index(log), list(range(2, 100)), now=now)
    emitter.record_acks(sub, topic, _index(log), [500], now=now)  # trimmed: counted, not measured
    emitter.record_acks("projects/p/subscriptions/other", topic, _index(log), [9], now=now)
    emitter.record_acks("projects/p/subscriptions/own", EVENTS_TOPIC, _index(log), [1], now=now)
    got = {e["subscription"]: e for e in emitter.drain(now) if e["kind"] == "delivery"}
    assert set(got) == {sub, "projects/p/subscriptions/other"}
    d = got[sub]
    assert (d["topic"], d["count"], d["ts"]) == (topic, 101, now)
    assert len(d["latency_ms"]) == 5
    assert all(1 <= x <= 100 for x in d["latency_ms"])
    assert got["projects/p/subscriptions/other"]["latency_ms"] == [10.0]
    assert emitter.drain(now) == []  # reset per interval


def test_ack_sampling_is_cheap_and_uniform() -> None:
    # Once the reservoir is full, big ack batches cost lookups only for the kept items.
    emitter = EventEmitter(Sink(), 10, max_samples=50)
    log = _Log({})
    log.times = dict.fromkeys(range(200_000), 0)
    for start in range(0, 200_000, 1000):
        emitter.record_acks("s", "t", _index(log), list(range(start, start + 1000)), now=1.0)
    assert emitter._acks["s"].count == 200_000
    # Algorithm L keeps about k * (1 + ln(n / k)) items: ~465 lookups for 200k acks.
    assert log.lookups < 1500
    # Uniformity: positions of kept items (latency = offset here) spread over the whole range.
    reservoir = events.Reservoir(1000, random.Random(7))
    for start in range(0, 100_000, 500):

        def value(i: int, s: int = start) -> float:
            return float(s + i)

        reservoir.offer(500, value)
    kept = reservoir.samples
    assert reservoir.seen == 100_000 and len(kept) == 1000 and len(set(kept)) == 1000
    quarters = [sum(1 for x in kept if q * 25_000 <= x < (q + 1) * 25_000) for q in range(4)]
    assert all(190 <= n <= 310 for n in quarters), quarters


def test_dispatcher_hook_reads_the_log_index() -> None:
    sink = Sink()
    emitter = EventEmitter(sink, 10)
    now_us = int(time.time() * 1e6)
    dispatcher = SimpleNamespace(
        name="projects/p/subscriptions/s",
        subscription=SimpleNamespace(topic="projects/p/topics/t"),
        publish_time_us=_index(_Log({}), _Log({7: now_us - 250_000})),
    )
    events.record_acks(dispatcher, [(1 << 48) | 7])  # no emitter: ignored
    assert emitter.drain() == []
    events._active = emitter
    try:
        events.record_acks(dispatcher, [(1 << 48) | 7])
        events.record_acks(dispatcher, [])
    finally:
        events._active = None
    (d,) = emitter.drain()
    assert d["kind"] == "delivery" and d["count"] == 1
    assert 250 <= d["latency_ms"][0] < 5_000
