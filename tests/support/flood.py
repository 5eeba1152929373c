"""A publish flood through the official PublisherClient, recording what was acknowledged.

Fault tests start one, break something, and check afterwards that every acknowledged payload
is delivered (nothing lost) and nothing unexpected arrives. :class:`KeyedFlood` publishes with
ordering keys (and optionally unkeyed messages beside them); :class:`OrderedReceiver` checks
that each key's first deliveries come in publish order."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter
from typing import Any

from google.cloud import pubsub_v1

from tests.conftest import make_publisher, make_subscriber


class Flood:
    """Publishes ``prefix-000001``, ``prefix-000002``, ... until stopped (bounded in count)."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        *,
        prefix: str = "m",
        limit: int = 200_000,
        rate: float = 0,
    ) -> None:
        self.topic = topic
        self.prefix = prefix
        self.limit = limit
        # Messages per second, 0 = as fast as the client goes; a test may change it mid-flood.
        self.rate = rate
        self.publisher = make_publisher(
            endpoint,
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=100, max_latency=0.005),
        )
        self.acked: set[bytes] = set()
        self.sent: set[bytes] = set()
        self.errors: Counter[str] = Counter()
        self._futures: list[tuple[bytes, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Flood:
        self._thread.start()
        return self

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def snapshot(self) -> set[bytes]:
        with self._lock:
            return set(self.acked)

    def _done(self, data: bytes) -> Any:
        def done(future: Any) -> None:
            error = future.exception()
            with self._lock:
                if error is None:
                    self.acked.add(data)
                else:
                    self.errors[type(error).__name__] += 1

        return done

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set() and i < self.limit:
            data = f"{self.prefix}-{i:07d}".encode()
            with self._lock:
                self.sent.add(data)
            future = self.publisher.publish(self.topic, data)
            future.add_done_callback(self._done(data))
            self._futures.append((data, future))
            i += 1
            if self.rate:
                self._stop.wait(1.0 / self.rate)
            elif i % 500 == 0:
                self._stop.wait(0.002)

    def stop(self) -> set[bytes]:
        """Stop sending, wait for every publish in flight to settle; what was acknowledged."""
        self._stop.set()
        self._thread.join(30)
        self.publisher.stop()  # sends what is batched; its futures settle after
        # The futures are the record (a done callback may still be running when a waiter
        # wakes): what was acknowledged, and the errors of what failed for good.
        acked: set[bytes] = set()
        errors: Counter[str] = Counter()
        deadline = time.monotonic() + 60
        for data, future in self._futures:
            try:
                error = future.exception(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                errors["unsettled after 60 s"] += 1  # neither acknowledged nor failed
                continue
            if error is None:
                acked.add(data)
            else:
                errors[type(error).__name__] += 1
        with self._lock:
            self.acked, self.errors = acked, errors
        return set(acked)


class KeyedFlood:
    """Publishes ``K:N`` with ordering key ``K`` for each of ``keys`` (N counting up per key)
    and ``unkeyed`` messages ``u:M`` without a key per round, ``rounds_per_s`` rounds a second
    (paced by the clock, so the rate holds while the machine is busy), through one publisher
    with message ordering on."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        *,
        keys: list[str],
        rounds_per_s: float,
        unkeyed: int = 0,
        batch_messages: int = 10,
        rounds: int = 100_000,
    ) -> None:
        self.topic = topic
        self.keys = keys
        self.rounds_per_s = rounds_per_s
        self.unkeyed = unkeyed
        self.rounds = rounds
        self.publisher = make_publisher(
            endpoint,
            publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
            batch_settings=pubsub_v1.types.BatchSettings(
                max_messages=batch_messages, max_latency=0.005
            ),
        )
        self.sent: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.errors: Counter[str] = Counter()
        self._pending = 0
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> KeyedFlood:
        self._thread.start()
        return self

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def _publish(self, data: bytes, key: str) -> None:
        with self._lock:
            self.sent.add(data)
            self._pending += 1
        self.publisher.publish(self.topic, data, ordering_key=key).add_done_callback(
            self._done(data)
        )

    def _run(self) -> None:
        n = 0
        started = time.monotonic()
        while not self._stop.is_set() and n < self.rounds:
            for key in self.keys:
                self._publish(f"{key}:{n}".encode(), key)
            for u in range(self.unkeyed):
                self._publish(f"u:{n * self.unkeyed + u}".encode(), "")
            n += 1
            self._stop.wait(max(0.0, started + n / self.rounds_per_s - time.monotonic()))

    def _done(self, data: bytes) -> Any:
        def done(future: Any) -> None:
            error = future.exception()
            with self._lock:
                self._pending -= 1
                if error is None:
                    self.acked.add(data)
                else:
                    self.errors[type(error).__name__] += 1
                self._settled.notify_all()

        return done

    def stop(self) -> set[bytes]:
        """Stop sending and let every publish in flight settle first: an ordered publisher's
        ``stop()`` cancels each key's queued batches but the first (``CLIENT_STOPPED``), which
        would count as failures the server never saw."""
        self._stop.set()
        self._thread.join(30)
        with self._settled:
            self._settled.wait_for(lambda: self._pending == 0, timeout=120)
        self.publisher.stop()
        with self._lock:
            return set(self.acked)


class OrderedReceiver:
    """subscribe() with ordering, acking everything, checking each key's first deliveries
    come in publish order."""

    def __init__(self, endpoint: str, subscription: str) -> None:
        self.received: Counter[bytes] = Counter()
        self.out_of_order: list[str] = []
        self._highest: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sub = make_subscriber(endpoint)
        flow = pubsub_v1.types.FlowControl(max_messages=1000, max_duration_per_lease_extension=10)
        self._future = self._sub.subscribe(subscription, self._callback, flow_control=flow)

    def _callback(self, message: Any) -> None:
        key, n = message.data.decode().split(":")
        with self._lock:
            first = message.data not in self.received
            self.received[message.data] += 1
            if first:
                # The first delivery of N must follow the first of N-1 (redeliveries may
                # repeat earlier ones, never skip ahead).
                if int(n) > 0 and f"{key}:{int(n) - 1}".encode() not in self.received:
                    self.out_of_order.append(message.data.decode())
                self._highest[key] = max(self._highest.get(key, -1), int(n))
        message.ack()

    def count(self) -> int:
        with self._lock:
            return len(self.received)

    def has(self, expected: set[bytes]) -> bool:
        with self._lock:
            return all(data in self.received for data in expected)

    def close(self) -> None:
        self._future.cancel()
        self._sub.close()
