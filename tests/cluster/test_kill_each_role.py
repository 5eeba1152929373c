"""kill -9 of each role in turn under steady load (issue 11, part 7): a full local cluster
(ZooKeeper x3, storage x3 over two zones, two publishing and two subscribing forwarders, routers
x2, frontends x2) while the official client publishes with ordering keys and a subscriber with
message ordering streams, both through the frontends (``PUBSUB_EMULATOR_HOST=ipv4:A,B``). One
process of each role is killed with SIGKILL, the load runs on for a few seconds, it is started
again and delivery is seen to go on, then the next role: a frontend, the leading router, the
publishing forwarder owning the topic, the subscribing forwarder serving the subscription (it
reads the topic from a copy), a storage node, a ZooKeeper node. Counted at the end: publishes
that failed for good (none may), acknowledged messages not delivered (none may), messages
nobody published (none may), keys whose messages arrived out of order for the first time (none
may), and duplicates (reported: delivery is at least once)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

import pytest
from google.cloud import pubsub_v1

from pubsubd.cluster.launcher import LocalCluster
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import running_cluster, subscription_server, topic_owner
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

KEYS = [f"key-{k}" for k in range(4)]
RATE = 200  # messages per second, over all keys


class OrderedFlood:
    """Publishes ``key-K:N`` with ordering key ``key-K``, N counting up per key."""

    def __init__(self, endpoint: str, topic: str) -> None:
        self.topic = topic
        self.publisher = make_publisher(
            endpoint,
            publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=10, max_latency=0.005),
        )
        self.sent: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.errors: Counter[str] = Counter()
        self._pending = 0
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> OrderedFlood:
        self._thread.start()
        return self

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set() and n < 100_000:
            for key in KEYS:
                data = f"{key}:{n}".encode()
                with self._lock:
                    self.sent.add(data)
                    self._pending += 1
                future = self.publisher.publish(self.topic, data, ordering_key=key)
                future.add_done_callback(self._done(data))
            n += 1
            self._stop.wait(len(KEYS) / RATE)

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


def _leading_router(cluster: LocalCluster) -> str:
    for p in cluster.processes:
        if p.role == "router" and p.pid is not None:
            with urllib.request.urlopen(f"http://{p.address}/status", timeout=5) as r:
                if json.loads(r.read())["role"] == "leader":
                    return p.name
    raise AssertionError("no router leads")


def test_kill_9_of_each_role_under_load_loses_nothing_and_keeps_key_order(
    tmp_path: Any, names: Any
) -> None:
    with running_cluster(
        tmp_path / "cluster",
        zk_nodes=3,
        zones=2,
        routers=2,
        frontends=2,
        forwarders=4,
        forwarder_args=[["--no-subscribing"]] * 2 + [["--no-publishing"]] * 2,
    ) as cluster:
        endpoint = "ipv4:" + ",".join(cluster.frontends)
        pub, sub = make_publisher(endpoint), make_subscriber(endpoint)
        topic, subscription = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        sub.create_subscription(
            request={"name": subscription, "topic": topic, "enable_message_ordering": True}
        )
        sub.close()
        receiver = OrderedReceiver(endpoint, subscription)
        flood = OrderedFlood(endpoint, topic).start()
        killed: list[str] = []
        try:
            wait_for(lambda: receiver.count() >= 200, 60, "delivery under way")
            for pick in (
                lambda: "frontend-1",
                lambda: _leading_router(cluster),
                lambda: topic_owner(cluster, topic),
                lambda: subscription_server(cluster, subscription),
                lambda: "storage-1",
                lambda: "zookeeper-1",
            ):
                name = pick()
                assert name, "a process to kill"
                cluster.kill(name)
                killed.append(name)
                time.sleep(3)  # the load runs on without it
                cluster.restart(name)
                before = receiver.count()
                wait_for(lambda b=before: receiver.count() >= b + 200, 90, f"delivery after {name}")
        finally:
            acked = flood.stop()
        try:
            wait_for(lambda: receiver.has(acked), 120, "every acknowledged message delivered")
        finally:
            receiver.close()
        roles = {p.name: p.role for p in cluster.processes}
        assert sorted(roles[n] for n in killed) == sorted(
            ["frontend", "router", "forwarder", "forwarder", "storage", "zookeeper"]
        )
        publishing, subscribing = killed[2], killed[3]
        assert publishing in ("forwarder-1", "forwarder-2"), publishing
        assert subscribing in ("forwarder-3", "forwarder-4"), subscribing
        assert not flood.errors, f"publishes that failed for good: {dict(flood.errors)}"
        assert not set(receiver.received) - flood.sent, "messages nobody published"
        assert not receiver.out_of_order, f"first deliveries out of order: {receiver.out_of_order}"
        duplicates = sum(c - 1 for c in receiver.received.values())
        print(f"{len(acked)} acknowledged, all delivered; {duplicates} duplicate deliveries")
