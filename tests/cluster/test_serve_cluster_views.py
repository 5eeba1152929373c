"""The operator's views of a one-process cluster (``pubsubd cluster up --forwarders 0``, issue
11): ``pubsubd serve --cluster`` writes a load report as a forwarder does, so the whole backlog
views built from load reports (``pubsubd cluster status --json``, ``pubsubd routing show``, the
leading router's ``/status``) show its subscriptions; ``cluster up --load-half-life`` reaches
the router, which publishes it, and the serving process reports with it.

Everything through the CLI a user types (``cluster up``, ``cluster status``, ``routing show``)
and the official client; one ZooKeeper, one storage node, a router."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.cluster.launcher import LocalCluster
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import CLUSTER_ENV
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

HALF_LIFE_S = 7.5  # not the default (10 s)


def _pubsubd(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "pubsubd", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("serve-views") / "c"
    env = {**os.environ, **CLUSTER_ENV, "PUBSUBD_LOAD_REPORT_S": "1"}
    try:
        _pubsubd(
            *("cluster", "up", "--data-dir", str(directory)),
            *("--zk-nodes", "1", "--storage-nodes", "1", "--replicas", "1"),
            *("--forwarders", "0", "--routers", "1", "--frontends", "0", "--probers", "0"),
            *("--load-half-life", str(HALF_LIFE_S)),
            env=env,
        )
        yield LocalCluster.load(directory)
    finally:
        if (directory / "cluster.json").exists():
            LocalCluster.load(directory).down()


def _http_json(address: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _whole(listed: list[dict[str, Any]], subscription: str) -> dict[str, Any]:
    return next((s for s in listed if s["subscription"] == subscription), {})


def test_cluster_status_and_routing_show_give_the_serving_process_s_whole_backlog(
    cluster: LocalCluster, names: Any
) -> None:
    serve = _http_json(cluster.http, "/status")["cluster"]
    forwarder = serve["forwarder"]["id"]
    publisher, subscriber = make_publisher(cluster.grpc), make_subscriber(cluster.grpc)
    topic, subscription = names.topic("views"), names.subscription("views")
    publisher.create_topic(request={"name": topic, "labels": {"pubsubd-publish-sources": "2"}})
    subscriber.create_subscription(name=subscription, topic=topic)
    sent = 30
    for f in [publisher.publish(topic, b"v-%d" % i) for i in range(sent)]:
        f.result(timeout=60)
    pulled = subscriber.pull(request={"subscription": subscription, "max_messages": 10})
    got = list(pulled.received_messages)
    assert got
    subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in got])
    expected = sent - len(got)

    found: list[dict[str, Any]] = []

    def status_whole() -> bool:
        described = _pubsubd("cluster", "status", "--data-dir", str(cluster.directory))
        found[:] = [_whole(described["storage"]["routing"]["subscriptions"], subscription)]
        if found[0].get("backlog_messages") != expected:
            time.sleep(0.3)  # a report every second
            return False
        return True

    wait_for(status_whole, 30, f"cluster status: a whole backlog of {expected}")
    whole = found[0]
    assert whole["complete"] and not whole["spread"], whole
    assert whole["forwarders"] == {
        forwarder: {
            "sources": [0, 1],
            "backlog_messages": expected,
            "backlog_bytes": whole["backlog_bytes"],
            "oldest_unacked_age_s": whole["forwarders"][forwarder]["oldest_unacked_age_s"],
        }
    }
    assert whole["backlog_bytes"] > 0
    assert _http_json(cluster.http, "/status")["subscriptions"][subscription]["backlog"] == (
        expected
    )
    # routing show adds up the same reports (the same code: control/cluster_view.py).
    shown = _whole(
        _pubsubd("routing", "show", "--cluster", cluster.zk)["subscriptions"], subscription
    )
    assert (shown["backlog_messages"], shown["forwarders"].keys()) == (expected, {forwarder})
    # And the leading router's /status, from the reports its pass read.
    router = cluster.process("router-1").address
    wait_for(
        lambda: (
            _http_json(router, "/status")["subscription_backlogs"]["subscriptions"]
            .get(subscription, {})
            .get("backlog_messages")
            == expected
        ),
        15,
        "the router's whole backlog",
    )
    subscriber.close()


def test_cluster_up_load_half_life_reaches_the_router_and_the_serving_process(
    cluster: LocalCluster,
) -> None:
    router = cluster.process("router-1")
    assert router.args[router.args.index("--load-half-life") + 1] == str(HALF_LIFE_S)
    assert _http_json(router.address, "/status")["load_half_life_s"] == HALF_LIFE_S
    wait_for(
        lambda: (
            _http_json(cluster.http, "/status")["cluster"]["load_report"]["half_life_s"]
            == HALF_LIFE_S
        ),
        15,
        "the serving process reporting with the router's half-life",
    )
    shown = _pubsubd("routing", "show", "--cluster", cluster.zk)
    assert shown["router"]["load_half_life_s"] == HALF_LIFE_S


def test_cluster_up_refuses_a_half_life_that_is_not_one(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pubsubd", "cluster", "up", "--data-dir", str(tmp_path / "c"),
         "--load-half-life", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "half-life" in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()  # refused before anything started
