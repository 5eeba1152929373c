"""A steady publisher for the fault benchmarks (``kill_each_role``, ``forwarder_moves``): the
official client at ``rate`` messages per second to one topic, one message per request, from a
thread, recording for each message when it was sent and its latency to the acknowledgement, or
the error it failed with for good. Create it once ``PUBSUB_EMULATOR_HOST`` names the cluster."""

from __future__ import annotations

import math
import threading
import time
from typing import Any


class SteadyPublisher:
    def __init__(self, topic: str, rate: int) -> None:
        from google.cloud import pubsub_v1

        self.topic = topic
        self.pause = 1.0 / rate
        self.publisher = pubsub_v1.PublisherClient(
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=1)
        )
        self._acked: list[tuple[float, float]] = []  # (sent, latency)
        self._failed: list[tuple[float, str]] = []  # (sent, error type)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="steady-publisher")

    def start(self) -> SteadyPublisher:
        """Create the topic, then publish until :meth:`stop`."""
        self.publisher.create_topic(name=self.topic)
        self._thread.start()
        return self

    def _done(self, sent: float) -> Any:
        def done(future: Any) -> None:
            error = future.exception()
            with self._lock:
                if error is None:
                    self._acked.append((sent, time.monotonic() - sent))
                else:
                    self._failed.append((sent, type(error).__name__))

        return done

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            self.publisher.publish(self.topic, b"x" * 100).add_done_callback(self._done(sent))
            self._stop.wait(self.pause)

    def latencies(self, since: float, until: float = math.inf) -> list[float]:
        """Latencies (s) of the acknowledged messages sent in ``[since, until]`` (monotonic)."""
        with self._lock:
            return [lat for sent, lat in self._acked if since <= sent <= until]

    def failures(self, since: float = -math.inf) -> list[str]:
        """Error types of the messages sent from ``since`` that failed for good."""
        with self._lock:
            return [error for sent, error in self._failed if sent >= since]

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.publisher.stop()
