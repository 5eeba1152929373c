"""Ownership of sources in a cluster: a writer that lost its ZooKeeper session while it was
stopped (the zombie) cannot write once another process took over, and losing ZooKeeper's
leader under load costs no acknowledged message."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.pubsub_v1 import PublisherClient as GapicPublisher

from pubsubd.cluster.status import cluster_status
from pubsubd.coordination.ensemble import Ensemble
from tests.conftest import emulator_host, make_publisher, make_subscriber
from tests.support.cluster import CLUSTER_ENV, ClusterServer, running_cluster
from tests.support.drain import drain
from tests.support.flood import Flood
from tests.support.server import ServerProcess, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _status(http: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_a_zombie_writer_is_fenced_and_never_writes_again(tmp_path: Path, names: Any) -> None:
    with running_cluster(tmp_path / "cluster") as cluster:
        a = ClusterServer(cluster)
        pub, sub = make_publisher(a.endpoint), make_subscriber(a.endpoint)
        topic, subscription = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        sub.create_subscription(name=subscription, topic=topic)
        sub.close()
        from_a = {b"a-%d" % i for i in range(100)}
        for f in [pub.publish(topic, d) for d in sorted(from_a)]:
            f.result(60)
        pid = cluster.process("serve").pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        b = ServerProcess(
            tmp_path / "b",
            args=["--cluster", cluster.zk, "--replicas", "3"],
            env=dict(CLUSTER_ENV),
        )
        try:
            try:
                # Negative wait: A's session (4 s) must expire while it is stopped; B waits
                # for A's ownership to expire before it takes the sources over.
                time.sleep(5)
                b.start(timeout=90)
                pub_b = make_publisher(b.endpoint)
                from_b = {b"b-%d" % i for i in range(100)}
                for f in [pub_b.publish(topic, d) for d in sorted(from_b)]:
                    f.result(60)
            finally:
                os.kill(pid, signal.SIGCONT)
            with emulator_host(a.endpoint):
                raw = GapicPublisher()
            with pytest.raises(exceptions.GoogleAPICallError) as refused:
                raw.publish(topic=topic, messages=[{"data": b"zombie"}], retry=None, timeout=20)
            # UNAVAILABLE whichever comes first, the fence or the expired session: the client
            # may go to another server.
            assert refused.value.code == 503, refused.value
            assert _status(cluster.http)["cluster"]["appends_refused"] >= 1
            storage = cluster_status(cluster.zk)
            assert storage["open_ledgers"] <= storage["sources"]  # never two open per source
            received = drain(b.endpoint, subscription, from_a | from_b)
            assert b"zombie" not in received
        finally:
            b.kill()


def test_killing_the_zookeeper_leader_under_load_loses_nothing(tmp_path: Path, names: Any) -> None:
    with running_cluster(tmp_path / "cluster", zk_nodes=3) as cluster:
        server = ClusterServer(cluster)
        pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
        topic, subscription = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        sub.create_subscription(name=subscription, topic=topic)
        sub.close()
        flood = Flood(server.endpoint, topic).start()
        try:
            wait_for(lambda: flood.acked_count() >= 1000, 60, "1000 acknowledged publishes")
            leader = Ensemble.attach(cluster.directory / "zookeeper").leader()
            assert leader is not None
            cluster.kill(f"zookeeper-{leader + 1}")
            before = flood.acked_count()
            wait_for(lambda: flood.acked_count() >= before + 2000, 60, "publishing to go on")
        finally:
            acked = flood.stop()
        received = drain(server.endpoint, subscription, acked)
        assert not acked - received, f"{len(acked - received)} acknowledged messages lost"
        cluster.restart(f"zookeeper-{leader + 1}")
