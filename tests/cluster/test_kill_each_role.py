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
import time
import urllib.request
from typing import Any

import pytest

from pubsubd.cluster.launcher import LocalCluster
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import running_cluster, subscription_server, topic_owner
from tests.support.flood import KeyedFlood, OrderedReceiver
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

KEYS = [f"key-{k}" for k in range(4)]
ROUNDS_PER_S = 50  # one message per key a round: 200 msg/s


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
        flood = KeyedFlood(endpoint, topic, keys=KEYS, rounds_per_s=ROUNDS_PER_S).start()
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
