"""SLI monitoring events: a small buffered emitter that publishes JSON events to an internal topic.

Every ``interval_s`` seconds (``PUBSUBD_SLI_EVENTS_S``, default 10, 0 = off) the emitter publishes
one batch of JSON events to ``projects/_pubsubd/topics/sli-events`` through the publishing
forwarder, where ``pubsubd sli-report`` (``pubsubd.spark.sli``) reads them with the Spark
connector. One message is one event; every event has ``kind`` and ``ts`` (epoch seconds):

* ``publish``: ``topic``, ``count`` (Publish calls in the interval), ``failed`` (of them, failed
  after validation), ``latency_ms`` (a uniform sample, at most ``MAX_SAMPLES`` per topic and
  interval, of the latencies of the successful ones).
* ``error``: ``method``, ``code`` (gRPC status name), ``count`` (in the interval).
* ``delivery``: ``subscription``, ``topic``, ``count`` (messages acknowledged by subscribers in
  the interval: Acknowledge, StreamingPull acks, push successes), ``latency_ms`` (a uniform sample,
  at most ``MAX_SAMPLES`` per subscription and interval, of the end-to-end latencies from the
  message's publish time to its ack).
* ``backlog``: ``subscription``, ``topic``, ``messages``, ``oldest_unacked_age_s``.

The hooks (:func:`record_publish`, :func:`record_error`, :func:`record_acks`) are O(1) per call
(``record_acks`` is O(1) per ack *batch* plus the few acks it samples, each looked up in the log's
in-memory index), never raise, and do nothing when no emitter runs. Flushing never raises
either: a failed batch is logged and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pubsubd.core import pb
from pubsubd.core.errors import DiskFull
from pubsubd.observability import background

log = logging.getLogger(__name__)

# Project IDs are only checked for being non-empty and slash-free (core/names.py), so the
# leading underscore keeps the internal project apart from any real one.
EVENTS_TOPIC = "projects/_pubsubd/topics/sli-events"
MAX_SAMPLES = 200  # latency samples per topic per interval (reservoir sampling beyond)
MAX_BACKLOG = 1000  # subscriptions sampled per interval (rotating through all of them)
MAX_BATCH_MESSAGES = 1000  # one PublishRequest: Google's per-request limit
MAX_BATCH_BYTES = 4 << 20  # one PublishRequest: well under the 10 MB limit

# (serialized PublishRequest, message count) -> awaited; raises on failure.
Sink = Callable[[bytes, int], Awaitable[Any]]
# () -> backlog events ({"subscription", "topic", "messages", "oldest_unacked_age_s"}).
BacklogSampler = Callable[[], Iterable[dict[str, Any]]]


@dataclass
class _TopicStats:
    count: int = 0
    failed: int = 0
    seen: int = 0  # successful publishes offered to the reservoir
    samples: list[float] = field(default_factory=list)


class Reservoir:
    """A uniform sample of at most ``size`` values of a stream offered in batches.

    Li's Algorithm L: once full, the index of the next kept item is drawn ahead, so a batch that
    holds no kept item costs O(1), whatever its length; ``value`` is called only for kept items.
    """

    __slots__ = ("_next", "_random", "_w", "samples", "seen", "size")

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size = size
        self.seen = 0
        self.samples: list[float] = []
        self._next = 0  # 0-based stream index of the next item to keep, once full
        self._w = 1.0
        self._random = rng

    def _uniform(self) -> float:
        return self._random.random() or 1e-300  # (0, 1): log() must not see 0

    def _advance(self) -> None:
        self._w *= math.exp(math.log(self._uniform()) / self.size)
        w = min(self._w, 1.0 - 1e-12)
        self._next += int(math.log(self._uniform()) / math.log1p(-w)) + 1

    def offer(self, n: int, value: Callable[[int], float | None]) -> None:
        """Offer ``n`` items; ``value(i)`` is the i-th item's value (None: not measurable)."""
        start = self.seen
        self.seen += n
        i = 0
        samples = self.samples
        while len(samples) < self.size and i < n:
            v = value(i)
            i += 1
            if v is not None:
                samples.append(v)
                if len(samples) == self.size:
                    self._next = start + i - 1
                    self._advance()
        if len(samples) < self.size or self.size <= 0:
            return
        while self._next < self.seen:
            v = value(self._next - start)
            if v is not None:
                samples[self._random.randrange(self.size)] = v
            self._advance()


@dataclass
class _AckStats:
    topic: str
    samples: Reservoir
    count: int = 0


class EventEmitter:
    """Buffers SLI observations and publishes them as one batch per interval."""

    def __init__(
        self,
        sink: Sink,
        interval_s: float,
        backlog: BacklogSampler | None = None,
        topic: str = EVENTS_TOPIC,
        max_samples: int = MAX_SAMPLES,
    ) -> None:
        self.sink = sink
        self.interval_s = interval_s
        self.backlog = backlog
        self.topic = topic
        self.max_samples = max_samples
        self.published_events = 0
        self.dropped_batches = 0
        self._publish: dict[str, _TopicStats] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._acks: dict[str, _AckStats] = {}
        self._random = random.Random()
        self._task: asyncio.Task[None] | None = None

    # --- hooks -----------------------------------------------------------------------------

    def record_publish(self, topic: str, latency_ms: float, ok: bool) -> None:
        if topic == self.topic:
            return
        stats = self._publish.get(topic)
        if stats is None:
            stats = self._publish[topic] = _TopicStats()
        stats.count += 1
        if not ok:
            stats.failed += 1
            return
        stats.seen += 1
        if len(stats.samples) < self.max_samples:
            stats.samples.append(round(latency_ms, 3))
        else:  # reservoir sampling: every latency of the interval equally likely to be kept
            j = self._random.randrange(stats.seen)
            if j < self.max_samples:
                stats.samples[j] = round(latency_ms, 3)

    def record_error(self, method: str, code: str) -> None:
        key = (method, code)
        self._errors[key] = self._errors.get(key, 0) + 1

    def record_acks(
        self,
        subscription: str,
        topic: str,
        publish_time_us: Callable[[int], int],
        positions: Sequence[int],
        now: float | None = None,
    ) -> None:
        """Subscribers acknowledged ``positions`` (``publish_time_us``: a position's publish
        time, from the log's index): count them and sample their publish-to-ack latency."""
        if topic == self.topic:
            return
        stats = self._acks.get(subscription)
        if stats is None:
            stats = self._acks[subscription] = _AckStats(
                topic, Reservoir(self.max_samples, self._random)
            )
        stats.count += len(positions)
        now_us = (time.time() if now is None else now) * 1e6

        def latency_ms(i: int) -> float | None:
            pos = positions[i]
            try:
                published = int(publish_time_us(pos))
            except Exception:  # trimmed, unknown source, closed log: not measurable
                return None
            return round(max(0.0, now_us - published) / 1e3, 3)

        stats.samples.offer(len(positions), latency_ms)

    # --- batching --------------------------------------------------------------------------

    def drain(self, now: float | None = None) -> list[dict[str, Any]]:
        """The events of the interval that just ended (buffers are reset)."""
        ts = round(time.time() if now is None else now, 3)
        publish, self._publish = self._publish, {}
        errors, self._errors = self._errors, {}
        acks, self._acks = self._acks, {}
        events: list[dict[str, Any]] = [
            {
                "kind": "publish",
                "ts": ts,
                "topic": topic,
                "count": s.count,
                "failed": s.failed,
                "latency_ms": s.samples,
            }
            for topic, s in publish.items()
        ]
        events.extend(
            {"kind": "error", "ts": ts, "method": m, "code": c, "count": n}
            for (m, c), n in errors.items()
        )
        events.extend(
            {
                "kind": "delivery",
                "ts": ts,
                "subscription": sub,
                "topic": a.topic,
                "count": a.count,
                "latency_ms": a.samples.samples,
            }
            for sub, a in acks.items()
        )
        if self.backlog is not None:
            try:
                events.extend({"kind": "backlog", "ts": ts, **b} for b in self.backlog())
            except Exception:
                log.exception("sampling backlogs for SLI events failed")
        return events

    def batches(self, events: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
        """Serialized PublishRequests (one message per event) within the request limits."""
        out: list[tuple[bytes, int]] = []
        request = pb.PublishRequest(topic=self.topic)
        size = 0
        for event in events:
            data = json.dumps(event, separators=(",", ":")).encode()
            if request.messages and (
                len(request.messages) >= MAX_BATCH_MESSAGES or size + len(data) > MAX_BATCH_BYTES
            ):
                out.append((request.SerializeToString(), len(request.messages)))
                request = pb.PublishRequest(topic=self.topic)
                size = 0
            request.messages.add(data=data)
            size += len(data) + 16
        if request.messages:
            out.append((request.SerializeToString(), len(request.messages)))
        return out

    async def flush(self, now: float | None = None) -> int:
        """Publish what was buffered; return the number of events published (never raises)."""
        try:
            events = self.drain(now)
            sent = 0
            for raw, count in self.batches(events):
                await self.sink(raw, count)
                sent += count
            self.published_events += sent
            return sent
        except DiskFull:
            self.dropped_batches += 1  # counted and logged once per episode by storage
            return 0
        except Exception as e:
            self.dropped_batches += 1
            background.report("SLI events", e)
            return 0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        global _active
        _active = self
        self._task = asyncio.create_task(self._loop(), name="sli_events")

    async def close(self) -> None:
        global _active
        if _active is self:
            _active = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()


_active: EventEmitter | None = None


def record_publish(topic: str, latency_ms: float, ok: bool = True) -> None:
    """Hook for the Publish RPC; a no-op when no emitter runs."""
    emitter = _active
    if emitter is not None:
        with contextlib.suppress(Exception):
            emitter.record_publish(topic, latency_ms, ok)


def record_error(method: str, code: str) -> None:
    """Hook for the RPC error path; a no-op when no emitter runs."""
    emitter = _active
    if emitter is not None:
        with contextlib.suppress(Exception):
            emitter.record_error(method, code)


def record_acks(dispatcher: Any, positions: Sequence[int]) -> None:
    """Hook for a subscription dispatcher's client acks; a no-op when no emitter runs."""
    emitter = _active
    if emitter is not None and positions:
        with contextlib.suppress(Exception):
            emitter.record_acks(
                dispatcher.name,
                str(dispatcher.subscription.topic),
                dispatcher.publish_time_us,
                positions,
            )


class BacklogRotation:
    """Samples the backlog of at most ``limit`` subscriptions per call, resuming where the last
    call stopped. ``names``: the subscriptions served; ``backlog(name, now_us)``: its topic
    and backlog (``core.quotas.Backlog``)."""

    def __init__(
        self,
        names: Callable[[], list[str]],
        backlog: Callable[[str, int], tuple[str, Any]],
        limit: int = MAX_BACKLOG,
    ):
        self.names = names
        self.backlog = backlog
        self.limit = limit
        self._start = 0

    def __call__(self) -> list[dict[str, Any]]:
        names = sorted(self.names())
        if not names:
            return []
        if self._start >= len(names):
            self._start = 0
        chosen = names[self._start : self._start + self.limit]
        self._start += len(chosen)
        now_us = time.time_ns() // 1000
        out: list[dict[str, Any]] = []
        for name in chosen:
            try:
                topic, stats = self.backlog(name, now_us)
            except Exception:
                log.debug("backlog of %s unavailable", name, exc_info=True)
                continue
            out.append(
                {
                    "subscription": name,
                    "topic": topic,
                    "messages": int(stats.messages),
                    "oldest_unacked_age_s": round(float(stats.oldest_age_s), 3),
                }
            )
        return out
