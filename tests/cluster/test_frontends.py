"""Frontends in a running cluster (``pubsubd cluster up`` with two frontends and a router): the
official client, given both as ``PUBSUB_EMULATOR_HOST=ipv4:A,B``, publishes and subscribes
through them unchanged (statuses and errors included); kill -9 of a frontend under a publish
flood and a streaming subscriber loses nothing and the client goes on through the other; kill
-9 of the serving process (the forwarder) ends the proxied streams with UNAVAILABLE and the
client resumes by itself once it is back. Counted: lost, unexpected messages."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from pubsubd.cluster.launcher import LocalCluster
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import running_cluster
from tests.support.flood import Flood
from tests.support.rest import Rest, b64, unb64
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("frontends")
    with running_cluster(directory, routers=1, frontends=2, probers=1) as c:
        yield c


def test_the_clusters_prober_probes_through_every_frontend(cluster: LocalCluster) -> None:
    """``cluster up`` starts a prober through every frontend (issue 12): both planes, both
    frontends, successful, on its /status."""
    http = cluster.process("prober-1").address

    def probed() -> list[dict[str, Any]] | None:
        with urllib.request.urlopen(f"http://{http}/status", timeout=10) as r:
            probes: list[dict[str, Any]] = json.loads(r.read())["probes"]
        return probes if len(probes) == 4 else None

    wait_for(probed, 60, "a round through both frontends")
    probes = probed() or []
    assert {(p["endpoint"], p["probe"]) for p in probes} == {
        (e, p) for e in cluster.frontends for p in ("publish_receive", "control_plane")
    }
    assert all(p["ok"] for p in probes), probes


def _endpoint(cluster: LocalCluster) -> str:
    return "ipv4:" + ",".join(cluster.frontends)


def _frontend_status(cluster: LocalCluster, name: str) -> dict[str, Any]:
    http = cluster.process(name).args
    port = http[http.index("--http-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


class Receiver:
    """subscribe() through the frontends, acking everything, counting what arrived."""

    def __init__(self, endpoint: str, subscription: str) -> None:
        self.received: set[bytes] = set()
        self._lock = threading.Lock()
        self._sub = make_subscriber(endpoint)
        flow = pubsub_v1.types.FlowControl(max_messages=2000, max_duration_per_lease_extension=10)
        self._future = self._sub.subscribe(subscription, self._callback, flow_control=flow)

    def _callback(self, message: Any) -> None:
        with self._lock:
            self.received.add(message.data)
        message.ack()

    def count(self) -> int:
        with self._lock:
            return len(self.received)

    def has(self, expected: set[bytes]) -> bool:
        with self._lock:
            return expected <= self.received

    def close(self) -> None:
        self._future.cancel()
        self._sub.close()


def test_rest_through_the_frontends(cluster: LocalCluster) -> None:
    """REST v1 on a frontend's HTTP port goes through its proxy to the owning forwarder: made
    and published through one frontend, pulled and acked through the other (issue 13)."""
    rests = []
    for name in ("frontend-1", "frontend-2"):
        args = cluster.process(name).args
        rests.append(Rest("127.0.0.1", int(args[args.index("--http-port") + 1])))
    one, two = rests
    p = "/v1/projects/rest-p"
    try:
        one.ok("PUT", f"{p}/topics/rest-topic", {})
        one.ok("PUT", f"{p}/subscriptions/rest-sub", {"topic": "projects/rest-p/topics/rest-topic"})
        body = {"messages": [{"data": b64(b"via-frontend"), "attributes": {"k": "v"}}]}
        (sent,) = one.ok("POST", f"{p}/topics/rest-topic:publish", body)["messageIds"]
        got: list[Any] = []

        def pulled() -> bool:
            answer = two.ok(
                "POST",
                f"{p}/subscriptions/rest-sub:pull",
                {"maxMessages": 5, "returnImmediately": True},
            )
            got.extend(answer.get("receivedMessages", []))
            return bool(got)

        wait_for(pulled, 30, "the message through the other frontend")
        (m,) = got
        assert (m["message"]["messageId"], unb64(m["message"]["data"])) == (sent, b"via-frontend")
        two.ok("POST", f"{p}/subscriptions/rest-sub:acknowledge", {"ackIds": [m["ackId"]]})
        assert two.error("GET", f"{p}/topics/no-such-topic")[:2] == (404, "NOT_FOUND")
        one.ok("DELETE", f"{p}/subscriptions/rest-sub")
        one.ok("DELETE", f"{p}/topics/rest-topic")
    finally:
        for rest in rests:
            rest.close()


def test_clients_go_through_either_frontend_and_survive_losing_one(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = _endpoint(cluster)
    assert len(cluster.frontends) == 2 and cluster.grpc == cluster.frontends[0]
    pub, sub = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    with pytest.raises(exceptions.NotFound):  # a forwarder's status comes back unchanged
        pub.get_topic(topic=names.topic("missing"))
    assert list(pub.list_topic_subscriptions(topic=topic)) == [subscription]
    sub.close()

    receiver = Receiver(endpoint, subscription)
    flood = Flood(endpoint, topic, rate=2000).start()
    try:
        wait_for(lambda: receiver.count() >= 500, 60, "500 delivered through the frontends")
        cluster.kill("frontend-1")
        before = flood.acked_count()
        wait_for(lambda: flood.acked_count() >= before + 2000, 60, "publishing goes on")
        wait_for(lambda: receiver.count() >= before + 1000, 60, "delivery goes on")
    finally:
        flood.stop()
    acked, sent = flood.snapshot(), flood.sent
    wait_for(lambda: receiver.has(acked), 60, "every acknowledged message delivered")
    receiver.close()
    assert not receiver.received - sent, "messages nobody published"
    assert _frontend_status(cluster, "frontend-2")["calls"] > 0
    cluster.restart("frontend-1")


def test_streams_resume_after_the_forwarder_is_killed_and_restarted(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = _endpoint(cluster)
    pub, sub = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic("k"), names.subscription("k")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    sub.close()
    receiver = Receiver(endpoint, subscription)
    first = {b"before-%d" % i for i in range(200)}
    for f in [pub.publish(topic, d) for d in sorted(first)]:
        f.result(60)
    wait_for(lambda: receiver.has(first), 60, "delivered before the kill")
    cluster.kill("serve")
    cluster.restart("serve")
    second = {b"after-%d" % i for i in range(200)}
    for f in [pub.publish(topic, d) for d in sorted(second)]:
        f.result(120)  # the client retries UNAVAILABLE while the forwarder is down
    wait_for(lambda: receiver.has(second), 90, "the stream reopened by itself")
    receiver.close()
