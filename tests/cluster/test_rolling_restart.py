"""``pubsubd cluster restart --rolling`` under load (issue 11, part 7): every process of a full
local cluster (ZooKeeper x3, storage x3, the serving process, routers x2, frontends x2) is
restarted in turn while the official client publishes and a subscriber streams through the
frontends (``PUBSUB_EMULATOR_HOST=ipv4:A,B``). Counted: publishes that failed for good (none
may), acknowledged messages not delivered (none may), messages nobody published."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pubsubd.cluster.launcher import LocalCluster, reap
from tests.cluster.test_frontends import Receiver
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import running_cluster
from tests.support.flood import Flood
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_rolling_restart_under_load_loses_nothing(tmp_path: Path, names: Any) -> None:
    with running_cluster(tmp_path / "cluster", zk_nodes=3, routers=2, frontends=2) as cluster:
        endpoint = "ipv4:" + ",".join(cluster.frontends)
        pub, sub = make_publisher(endpoint), make_subscriber(endpoint)
        topic, subscription = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        sub.create_subscription(name=subscription, topic=topic)
        sub.close()
        receiver = Receiver(endpoint, subscription)
        flood = Flood(endpoint, topic, rate=500).start()
        try:
            wait_for(lambda: receiver.count() >= 200, 60, "delivery under way")
            restarted = _rolling_restart(cluster)
            before = flood.acked_count()
            wait_for(lambda: flood.acked_count() >= before + 500, 60, "publishing goes on after")
        finally:
            flood.stop()
        acked, sent = flood.snapshot(), flood.sent
        wait_for(lambda: receiver.has(acked), 90, "every acknowledged message delivered")
        receiver.close()
        assert not flood.errors, f"publishes that failed for good: {dict(flood.errors)}"
        assert not receiver.received - sent, "messages nobody published"
        roles = {p.name: p.role for p in cluster.processes}
        assert sorted(roles[n] for n in restarted) == sorted(roles.values())


def _rolling_restart(cluster: LocalCluster) -> list[str]:
    """Through the command line, as an operator runs it; returns the processes restarted."""
    out = subprocess.run(
        [sys.executable, "-m", "pubsubd", "cluster", "restart", "--rolling",
         "--data-dir", str(cluster.directory)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    reloaded = LocalCluster.load(cluster.directory)
    cluster.processes = reloaded.processes  # the new PIDs, for the cluster's clean stop
    reap()  # the processes this test started, stopped by the command: no zombies left
    return [line.split()[-1] for line in out.stdout.splitlines() if line.startswith("restarted")]
