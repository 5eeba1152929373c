"""Unit tests for the SLI event emitter's buffering and batching (pubsubd.observability.events)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from pubsubd.core import pb
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
    dispatchers = {
        f"projects/p/subscriptions/s{i}": SimpleNamespace(
            subscription=SimpleNamespace(topic="projects/p/topics/t"),
            backlog_stats=lambda now_us: stats,
        )
        for i in range(5)
    }
    rotation = BacklogRotation(lambda: dispatchers, limit=2)
    seen = [b["subscription"] for _ in range(3) for b in rotation()]
    assert sorted(seen) == sorted(dispatchers)
    first = rotation()[0]
    assert first == {
        "subscription": "projects/p/subscriptions/s0",
        "topic": "projects/p/topics/t",
        "messages": 3,
        "oldest_unacked_age_s": 1.25,
    }
