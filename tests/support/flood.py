"""A publish flood through the official PublisherClient, recording what was acknowledged.

Fault tests start one, break something, and check afterwards that every acknowledged payload
is delivered (nothing lost) and nothing unexpected arrives."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from google.cloud import pubsub_v1

from tests.conftest import make_publisher


class Flood:
    """Publishes ``prefix-000001``, ``prefix-000002``, ... until stopped (bounded in count)."""

    def __init__(
        self, endpoint: str, topic: str, *, prefix: str = "m", limit: int = 200_000, rate: int = 0
    ) -> None:
        self.topic = topic
        self.prefix = prefix
        self.limit = limit
        self.rate = rate  # messages per second, 0 = as fast as the client goes
        self.publisher = make_publisher(
            endpoint,
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=100, max_latency=0.005),
        )
        self.acked: set[bytes] = set()
        self.sent: set[bytes] = set()
        self.errors: Counter[str] = Counter()
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
        pause = 1.0 / self.rate if self.rate else 0.0
        while not self._stop.is_set() and i < self.limit:
            data = f"{self.prefix}-{i:07d}".encode()
            with self._lock:
                self.sent.add(data)
            self.publisher.publish(self.topic, data).add_done_callback(self._done(data))
            i += 1
            if pause:
                self._stop.wait(pause)
            elif i % 500 == 0:
                self._stop.wait(0.002)

    def stop(self) -> set[bytes]:
        """Stop sending, wait for every publish in flight to settle; what was acknowledged."""
        self._stop.set()
        self._thread.join(30)
        self.publisher.stop()  # resolves (or fails) every pending future
        return self.snapshot()
