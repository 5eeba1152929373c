"""The routers in a running cluster (``pubsubd cluster up`` with routers): the serving process
registers as a forwarder, the leading router assigns it every publish message source and
subscription source, ``cluster status`` shows both, kill -9 of the leading router hands over to
the other (a topic created meanwhile is routed, no owner changes) and a restarted router
stands by again. The official client works throughout."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from pubsubd.cluster.launcher import LocalCluster
from pubsubd.cluster.status import cluster_status
from pubsubd.control.routing_table import publishing_unit
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import ClusterServer, running_cluster, topic_uid
from tests.support.cluster import routes as published_routes
from tests.support.drain import drain
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("routing"), routers=2) as c:
        yield c


def _router_status(cluster: LocalCluster, name: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{cluster.process(name).address}/status", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_the_serving_process_is_a_forwarder_routed_by_active_standby_routers(
    cluster: LocalCluster, names: Any
) -> None:
    server = ClusterServer(cluster)
    forwarder = server.status()["cluster"]["forwarder"]["id"]
    roles = {p.name: p.role for p in cluster.processes}
    assert sorted(n for n, r in roles.items() if r == "router") == ["router-1", "router-2"]
    pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(request={"name": topic, "labels": {"pubsubd-publish-sources": "2"}})
    sub.create_subscription(name=subscription, topic=topic)
    sub.close()
    uid = topic_uid(cluster, topic)
    units = {publishing_unit(uid, 0), publishing_unit(uid, 1)}
    wait_for(lambda: units <= set(published_routes(cluster)), 15, "the topic's sources routed")
    routes = published_routes(cluster)
    assert all(routes[u] == (forwarder,) for u in units)
    subscribing = [u for u in routes if u.startswith("s/")]
    assert subscribing and all(routes[u] == (forwarder,) for u in subscribing)
    for f in [pub.publish(topic, b"m-%d" % i) for i in range(20)]:
        f.result(60)
    assert drain(server.endpoint, subscription, {b"m-%d" % i for i in range(20)})

    status = cluster_status(cluster.zk)["routing"]
    assert [f["forwarder_id"] for f in status["forwarders"]] == [forwarder]
    assert status["router"]["publishing_units"] >= 2

    # kill -9 of the leading router: the other leads and routes a topic created meanwhile.
    leader = next(
        n for n in ("router-1", "router-2") if _router_status(cluster, n)["role"] == "leader"
    )
    other = "router-2" if leader == "router-1" else "router-1"
    cluster.kill(leader)
    second = names.topic("second")
    pub.create_topic(name=second)
    unit = publishing_unit(topic_uid(cluster, second), 0)
    wait_for(lambda: unit in published_routes(cluster), 30, "the standby routes the new topic")
    assert _router_status(cluster, other)["role"] == "leader"
    after = published_routes(cluster)
    assert all(after[u] == routes[u] for u in routes if u in after)
    # Restarted, the killed router stands by.
    cluster.restart(leader)
    wait_for(lambda: _router_status(cluster, leader)["role"] == "standby", 15, "standby again")


def test_the_dashboard_shows_the_forwarders_storage_nodes_and_routing(
    cluster: LocalCluster,
) -> None:
    """/api/cluster of the serving process says what ``cluster status`` and ``routing show``
    say, and the /ui/cluster page (headless Chromium, when installed) shows it."""
    from tests.support import browser

    server = ClusterServer(cluster)
    base = f"http://{cluster.http}"
    wait_for(lambda: cluster_status(cluster.zk)["routing"]["forwarders"], 15, "a forwarder")
    with urllib.request.urlopen(f"{base}/api/cluster", timeout=15) as r:
        shown = json.loads(r.read())
    expected = cluster_status(cluster.zk)
    forwarder = server.status()["cluster"]["forwarder"]["id"]
    assert "error" not in shown, shown
    assert shown["this_process"]["forwarder"]["id"] == forwarder
    assert shown["cluster"]["nodes"] == expected["nodes"]
    assert [f["forwarder_id"] for f in shown["routing"]["forwarders"]] == [forwarder]
    assert shown["routing"]["router"]["router_id"] == expected["routing"]["router"]["router_id"]
    browser.require()
    page = browser.read(browser.dump_dom(f"{base}/ui/cluster"))
    assert page.error == "" and int(page.body["data-loaded"]) >= 1
    assert set(page.rows["forwarders"]) == {forwarder}
    assert set(page.rows["nodes"]) == {n["node_id"] for n in expected["nodes"]}
    for node in expected["nodes"]:
        assert page.rows["nodes"][node["node_id"]]["address"] == node["address"]
    assert page.metrics["cluster.nodes.length"] == str(len(expected["nodes"]))
    assert page.metrics["this_process.forwarder.id"] == forwarder
