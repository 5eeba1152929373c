"""An exactly-once subscription spread over two subscribing forwarders and gathered back while
the official client acks (issue 11): an ack that succeeds is never followed by the message
again; an ack that fails does so with the exactly-once errors (``AcknowledgeError``:
INVALID_ACK_ID for a lease the move ended, OTHER for an ID the failed request did not list).

One publishing-only and two subscribing-only forwarders, one router spreading by load with
small settings (a subscribing forwarder's worth is 60 msg/s: over 30 msg/s for 1 s spreads,
under 27 msg/s for 5 s gathers). A ~100 msg/s flood spreads the subscription; a trickle
(3 msg/s) keeps acks going while the load decays and the router gathers it back. The
thresholds leave room for a loaded machine: the client holds 200 messages at most and acks
each after 0.2-1 s plus the ack's own round trip, so its delivery rate can fall to ~50 msg/s
(one CI run never reached the 50 msg/s that spread it before); the 5 s gather window lets the
test see the spread before the load decays. The client
holds each message 0.2-1 s before its ack, so every move finds leases in flight. Every
delivery and ack result is recorded by message; after the stream a Pull for one lease deadline
collects what the server still has unacked.
"""

from __future__ import annotations

import contextlib
import heapq
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core.exceptions import DeadlineExceeded
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber import exceptions as sub_exceptions

from pubsubd.cluster.launcher import LocalCluster
from tests.cluster.test_spread_subscription import _served_sources, _status
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import spread_cluster
from tests.support.flood import Flood
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUBSCRIBING = ["forwarder-2", "forwarder-3"]
SOURCES = 4
ACK_DEADLINE_S = 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    router_args = [
        *("--spread-subscriptions", "--spread-capacity", "60"),
        *("--spread-after", "1", "--gather-after", "5", "--gather-ratio", "0.9"),
    ]
    env = {"PUBSUBD_LOAD_REPORT_S": "0.5"}
    with spread_cluster(tmp_path_factory.mktemp("spread-exactly-once"), env, router_args) as c:
        yield c


class ExactlyOnceReceiver:
    """Streams the subscription with the official client and acks each message with
    ``ack_with_response``; records deliveries and ack results per message, in order."""

    def __init__(self, endpoint: str, subscription: str) -> None:
        self.subscriber = make_subscriber(endpoint)
        self.events: dict[bytes, list[str]] = {}  # "delivered" / "acked" / "failed:<code>"
        self.failures: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._due: list[tuple[float, int, bytes]] = []
        self._held: dict[int, Any] = {}  # by delivery
        self._count = 0
        self._last_failure = time.monotonic()
        self._random = random.Random(11)
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._acker = threading.Thread(target=self._ack_when_due, daemon=True)
        self._acker.start()
        self.future = self.subscriber.subscribe(
            subscription,
            self._received,
            flow_control=pubsub_v1.types.FlowControl(max_messages=200),
        )

    def _received(self, message: Any) -> None:
        data = bytes(message.data)
        with self._lock:
            self.events.setdefault(data, []).append("delivered")
            # Held a while before the ack, so a move always finds leases in the client.
            self._count += 1
            due = time.monotonic() + self._random.uniform(0.2, 1.0)
            heapq.heappush(self._due, (due, self._count, data))
            self._held[self._count] = message
        self._wake.set()

    def _ack_when_due(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                due = []
                while self._due and self._due[0][0] <= time.monotonic():
                    _, count, data = heapq.heappop(self._due)
                    due.append((data, self._held.pop(count)))
            for data, message in due:
                message.ack_with_response().add_done_callback(self._acked(data))
            self._wake.wait(0.05)
            self._wake.clear()

    def _acked(self, data: bytes) -> Any:
        def done(future: Any) -> None:
            error = future.exception()
            with self._lock:
                if error is None:
                    self.events[data].append("acked")
                elif isinstance(error, sub_exceptions.AcknowledgeError):
                    code = error.error_code.name
                    self.events[data].append(f"failed:{code}")
                    self.failures[code] += 1
                    self._last_failure = time.monotonic()
                else:
                    self.events[data].append(f"failed:{type(error).__name__}")
                    self.failures[type(error).__name__] += 1
                    self._last_failure = time.monotonic()

        return done

    def acked(self) -> set[bytes]:
        with self._lock:
            return {d for d, e in self.events.items() if "acked" in e}

    def quiet_for(self) -> float:
        """Seconds since the last ack failure."""
        with self._lock:
            return time.monotonic() - self._last_failure

    def broken(self) -> dict[bytes, list[str]]:
        """Messages delivered again after an ack succeeded, or acked successfully twice."""
        with self._lock:
            out = {}
            for data, events in self.events.items():
                if "acked" in events:
                    after = events[events.index("acked") + 1 :]
                    if "delivered" in after or "acked" in after:
                        out[data] = list(events)
            return out

    def close(self) -> None:
        self._closed.set()
        self._acker.join(10)
        self.future.cancel()
        with contextlib.suppress(Exception):  # cancelled: its result is an error by design
            self.future.result(timeout=30)
        self.subscriber.close()


def test_an_exactly_once_subscription_spread_and_gathered_never_redelivers_an_acked_message(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = cluster.grpc
    admin, subscriber = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic("eo-spread"), names.subscription("eo-spread")
    admin.create_topic(request={"name": topic, "labels": {"pubsubd-publish-sources": str(SOURCES)}})
    subscriber.create_subscription(
        request={
            "name": subscription,
            "topic": topic,
            "enable_exactly_once_delivery": True,
            "ack_deadline_seconds": ACK_DEADLINE_S,
        }
    )
    subscriber.close()
    wait_for(
        lambda: any(subscription in _status(cluster, n)["subscriptions"] for n in SUBSCRIBING),
        30,
        "the subscription served",
    )
    receiver = ExactlyOnceReceiver(endpoint, subscription)
    # Closed even when the test fails: its stream left open outlives the cluster, and its
    # lease maintainer raises in whichever test runs next.
    try:
        flood = Flood(endpoint, topic, rate=100).start()  # unkeyed: over every source
        started = time.monotonic()
        spread_after = gathered_after = 0.0
        try:
            wait_for(lambda: _status(cluster, "router-1")["spread"], 30, "the router spreads it")
            flood.rate = 3.0  # a trickle: acks go on while it moves and the load decays

            def spread_over_both() -> bool:
                served = [_served_sources(cluster, n, subscription) for n in SUBSCRIBING]
                return all(served) and sorted(served[0] + served[1]) == list(range(SOURCES))

            wait_for(spread_over_both, 30, "the subscription spread over both forwarders")
            spread_after = time.monotonic() - started

            def gathered() -> bool:
                return not any(_served_sources(cluster, n, subscription) for n in SUBSCRIBING)

            wait_for(gathered, 60, "the subscription gathered back to one forwarder")
            gathered_after = time.monotonic() - started
            time.sleep(1.0)
        finally:
            published = flood.stop()
        # Every message delivered; the stream goes on until no ack has failed for a lease
        # deadline (a lease whose ack did not take is redelivered by then).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            published <= set(receiver.events) and receiver.quiet_for() > ACK_DEADLINE_S + 1
        ):
            time.sleep(0.1)
    finally:
        receiver.close()
    # What is left unacked on the server comes back to a Pull within a lease deadline.
    later = make_subscriber(endpoint)
    back: set[bytes] = set()
    end = time.monotonic() + ACK_DEADLINE_S + 1
    while time.monotonic() < end:
        with contextlib.suppress(DeadlineExceeded):  # nothing left
            response = later.pull(
                request={"subscription": subscription, "max_messages": 500}, timeout=5
            )
            back |= {bytes(m.message.data) for m in response.received_messages}
    later.close()
    acked = receiver.acked()
    failed_not_back = published - acked - back
    only_invalid = {d for d in failed_not_back if "failed:OTHER" not in receiver.events.get(d, [])}
    redelivered = sum(e.count("delivered") - 1 for e in receiver.events.values())
    print(
        f"spread after {spread_after:.1f} s, gathered after {gathered_after:.1f} s; "
        f"{len(published)} published, {redelivered} redelivered, ack failures "
        f"{dict(receiver.failures)}; never acked successfully: {len(published - acked)}, of "
        f"which {len(failed_not_back)} were acked on the server all the same (not back), "
        f"{len(only_invalid)} of them with INVALID_ACK_ID only"
    )
    assert not flood.errors, f"publishes that failed for good: {dict(flood.errors)}"
    assert not set(receiver.events) - published, "messages nobody published"
    assert published <= set(receiver.events), "published messages never delivered"
    broken = receiver.broken()
    assert not broken, f"acked, then delivered or acked again: {list(broken.items())[:5]}"
    assert not acked & back, "successfully acked messages delivered again after the stream"
    assert set(receiver.failures) <= {"INVALID_ACK_ID", "OTHER"}, receiver.failures
