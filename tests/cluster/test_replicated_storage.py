"""Replicated storage in a real cluster (ZooKeeper, 3 storage nodes, ``pubsubd serve
--cluster``), driven by the official client: publishes are on a majority of nodes before they
are acknowledged, and nothing acknowledged is lost when a storage node or the serving process
is killed, when two of three nodes are down for a while, or when the serving machine's disk is
lost (its local copies are rebuilt from the storage nodes)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.pubsub_v1 import PublisherClient as GapicPublisher

from pubsubd.cluster.launcher import LocalCluster
from pubsubd.cluster.status import cluster_status
from pubsubd.storage.node_client import LedgerSummary, StorageNodeClient
from tests.conftest import emulator_host, make_publisher, make_subscriber
from tests.support.clients import pull_until
from tests.support.cluster import (
    ClusterServer,
    environment,
    ledger_nodes,
    running_cluster,
    topic_uid,
)
from tests.support.drain import drain
from tests.support.flood import Flood
from tests.support.server import wait_for
from tests.support.status import wait_trim_passes

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


def _ledgers(cluster: LocalCluster) -> dict[str, list[LedgerSummary]]:
    async def collect() -> dict[str, list[LedgerSummary]]:
        out = {}
        for p in cluster.processes:
            if p.role == "storage" and p.pid is not None:
                client = StorageNodeClient(p.address)
                try:
                    out[p.name] = await client.list_ledgers()
                finally:
                    await client.close()
        return out

    return asyncio.run(collect())


def _create(endpoint: str, names: Any) -> tuple[str, str]:
    pub, sub = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    sub.close()
    return topic, subscription


def test_publishes_are_on_every_node_of_their_ledger(cluster: LocalCluster, names: Any) -> None:
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    flood = Flood(server.endpoint, topic, limit=500).start()
    wait_for(lambda: flood.acked_count() >= 500, 60, "500 acknowledged publishes")
    acked = flood.stop()
    assert drain(server.endpoint, subscription, acked) >= acked
    status = cluster_status(cluster.zk)
    assert len(status["nodes"]) == 3 and status["zones"] == ["zone-1", "zone-2", "zone-3"]
    assert status["under_replicated"] == 0 and status["open_ledgers"] >= 1
    # Every node holds the ledgers with the same entries (digests), after a majority answered.
    by_node = _ledgers(cluster)
    wait_for(
        lambda: (
            len(
                {
                    tuple(sorted((s.ledger_id, s.digest) for s in v))
                    for v in _ledgers(cluster).values()
                }
            )
            == 1
        ),
        10,
        "every storage node to hold the same entries",
    )
    assert all(len(v) >= 1 for v in by_node.values())
    # The storage write SLI: each acknowledged append waited for its ack quorum.
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as r:
        metrics = r.read().decode()

    def sample(name: str) -> float:
        found = [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name)]
        assert found, f"{name} not on /metrics"
        return found[0]

    appends = sample("pubsubd_ledger_append_seconds_count ")
    assert appends >= 1
    # Replication lag: with three healthy nodes every append reaches all three, and nothing
    # acknowledged is left short of a copy once the flood is over.
    assert 1 <= sample("pubsubd_ledger_replication_seconds_count ") <= appends
    assert sample("pubsubd_ledger_replication_lag_entries ") == 0


def test_kill9_of_one_storage_node_mid_flood_loses_nothing(
    cluster: LocalCluster, names: Any
) -> None:
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    flood = Flood(server.endpoint, topic).start()
    try:
        wait_for(lambda: flood.acked_count() >= 2000, 60, "2000 acknowledged publishes")
        cluster.kill("storage-2")
        before = flood.acked_count()
        # Publishing goes on with two of three nodes: new ledgers go to the live ones.
        wait_for(lambda: flood.acked_count() >= before + 2000, 60, "publishing to go on")
    finally:
        acked = flood.stop()
    cluster.restart("storage-2")
    received = drain(server.endpoint, subscription, acked)
    assert not acked - received, f"{len(acked - received)} acknowledged messages lost"
    assert not received - flood.sent, "messages nobody published"


def test_two_of_three_nodes_down_refuses_publishes_until_one_returns(
    cluster: LocalCluster, names: Any
) -> None:
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    pub = make_publisher(server.endpoint)
    first = [pub.publish(topic, b"before-%d" % i).result(60) for i in range(50)]
    assert len(first) == 50
    cluster.kill("storage-1")
    cluster.kill("storage-3")
    with emulator_host(server.endpoint):
        raw = GapicPublisher()
    with pytest.raises(exceptions.ServiceUnavailable):
        # No retry: the answer itself must say UNAVAILABLE (the official client retries it).
        raw.publish(topic=topic, messages=[{"data": b"refused"}], retry=None, timeout=30)
    cluster.restart("storage-1")
    after = [pub.publish(topic, b"after-%d" % i).result(60) for i in range(50)]
    assert len(after) == 50
    cluster.restart("storage-3")
    expected = {b"before-%d" % i for i in range(50)} | {b"after-%d" % i for i in range(50)}
    received = drain(server.endpoint, subscription, expected)
    assert b"refused" not in received


def test_kill9_of_the_serving_process_mid_flood_recovers_its_ledgers(
    cluster: LocalCluster, names: Any
) -> None:
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    flood = Flood(server.endpoint, topic, limit=20_000).start()
    try:
        wait_for(lambda: flood.acked_count() >= 3000, 60, "3000 acknowledged publishes")
        cluster.kill("serve")  # the ledger's writer dies mid-append
        cluster.restart("serve")  # fences, recovers and closes its ledgers, then serves
    finally:
        acked = flood.stop()  # retried publishes may land after the restart: they count
    received = drain(server.endpoint, subscription, acked)
    assert not acked - received, f"{len(acked - received)} acknowledged messages lost"
    assert cluster_status(cluster.zk)["open_ledgers"] <= cluster_status(cluster.zk)["sources"]


def test_a_lost_disk_on_the_serving_machine_is_rebuilt_from_the_storage_nodes(
    cluster: LocalCluster, names: Any
) -> None:
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    pub = make_publisher(server.endpoint)
    payloads = {b"kept-%04d" % i for i in range(1000)}
    for f in [pub.publish(topic, p) for p in sorted(payloads)]:
        f.result(60)
    cluster.kill("serve")
    # The machine's disk is gone: local copies, ack journals, everything under its data dir.
    # (Subscriptions' ack state is not replicated yet: unacked-or-acked, all is redelivered.)
    topics = Path(server.data_dir) / "topics"
    shutil.rmtree(topics)
    cluster.restart("serve")
    received = drain(server.endpoint, subscription, payloads)
    assert payloads <= received


SEGMENT_FAULT_HOOK = Path(__file__).resolve().parent.parent / "support" / "segment_fault_hook"


def test_kill9_while_the_local_copy_is_retried_loses_no_acknowledged_publish(
    cluster: LocalCluster, names: Any, tmp_path: Path
) -> None:
    """The serving machine's disk fails its topic log writes (EIO, tests/support/
    segment_fault_hook) after the storage nodes' quorum took a group: the group is acknowledged
    and its local copy retried; kill -9 mid-retry, the disk replaced, a restart: every
    acknowledged publish is delivered (the local copy is filled from the ledgers)."""
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    uid = topic_uid(cluster, topic)
    before = [b"before-%04d" % i for i in range(200)]
    pub = make_publisher(server.endpoint)
    for f in [pub.publish(topic, p) for p in before]:
        f.result(60)
    flag = tmp_path / "segment-fault.flag"
    env = {
        "PUBSUBD_TEST_SEGMENT_FAULT": str(flag),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(SEGMENT_FAULT_HOOK), os.environ.get("PYTHONPATH")])
        ),
    }
    cluster.kill("serve")
    with environment(env):
        cluster.restart("serve")

    def retries() -> int:
        return sum(s.get("local_write_retries", 0) for s in server.status()["storage"].get(uid, []))

    flag.touch()  # the disk fails from here on
    pub = make_publisher(server.endpoint)
    during = [b"during-%04d" % i for i in range(300)]
    futures = {p: pub.publish(topic, p) for p in during}
    wait_for(lambda: retries() >= 2 and any(f.done() for f in futures.values()), 60, "retries")
    cluster.kill("serve")  # mid-retry: the acknowledged group is only on the storage nodes
    acked = set(before)
    for payload, future in futures.items():
        if future.done() and future.exception() is None:
            acked.add(payload)
    assert len(acked) > len(before), "no publish was acknowledged while the disk failed"
    flag.unlink()  # a new disk; the process starts without the hook
    cluster.restart("serve")
    received = drain(server.endpoint, subscription, acked)
    assert not acked - received, f"{len(acked - received)} acknowledged messages lost"


def test_acks_survive_the_loss_of_the_serving_machine(cluster: LocalCluster, names: Any) -> None:
    """The subscription's ack journal is on the storage nodes too: after the serving machine's
    whole data directory is lost, what was acknowledged (and flushed) is not redelivered."""
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    pub = make_publisher(server.endpoint)
    payloads = [b"p-%04d" % i for i in range(600)]
    for f in [pub.publish(topic, p) for p in payloads]:
        f.result(60)
    sub = make_subscriber(server.endpoint)
    got = pull_until(sub, subscription, 600)
    acked = {m.message.data for m in got if int(m.message.data[2:]) % 3 != 0}
    ack_ids = [m.ack_id for m in got if m.message.data in acked]
    for i in range(0, len(ack_ids), 500):
        sub.acknowledge(subscription=subscription, ack_ids=ack_ids[i : i + 500])
    sub.close()
    wait_trim_passes(server, 2)  # the acks are flushed (to the storage nodes first)
    cluster.kill("serve")
    shutil.rmtree(server.data_dir)  # local copies, ack journals: the machine is gone
    cluster.restart("serve")
    unacked = set(payloads) - acked
    received = drain(server.endpoint, subscription, unacked)
    assert not received & acked, f"{len(received & acked)} acknowledged messages redelivered"


def test_a_topic_storage_policy_places_its_ledgers(cluster: LocalCluster, names: Any) -> None:
    """message_storage_policy's regions are zones and pubsubd-storage-replicas the copies: the
    topic's ledgers go only there; a bad count is INVALID_ARGUMENT."""
    server = ClusterServer(cluster)
    pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
    topic, subscription = names.topic(), names.subscription()
    with pytest.raises(exceptions.InvalidArgument, match="pubsubd-storage-replicas"):
        pub.create_topic(request={"name": topic, "labels": {"pubsubd-storage-replicas": "0"}})
    created = pub.create_topic(
        request={
            "name": topic,
            "labels": {"pubsubd-storage-replicas": "1"},
            "message_storage_policy": {"allowed_persistence_regions": ["zone-2"]},
        }
    )
    assert list(created.message_storage_policy.allowed_persistence_regions) == ["zone-2"]
    sub.create_subscription(name=subscription, topic=topic)
    sub.close()
    for f in [pub.publish(topic, b"z-%d" % i) for i in range(20)]:
        f.result(60)
    zone_of = {n["node_id"]: n["zone"] for n in cluster_status(cluster.zk)["nodes"]}
    placed = ledger_nodes(cluster, topic_uid(cluster, topic))
    assert placed and all(len(nodes) == 1 and zone_of[nodes[0]] == "zone-2" for nodes in placed)
    assert drain(server.endpoint, subscription, {b"z-%d" % i for i in range(20)})


def test_delayed_messages_survive_the_loss_of_the_serving_machine(
    cluster: LocalCluster, names: Any
) -> None:
    """The delay index is rebuilt from the replicated log: a message published with a delay
    on a machine that is then lost is delivered when it falls due, not before."""
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    pub = make_publisher(server.endpoint)
    # The delay outlasts the restart by far: the restarted server first waits for its old
    # ZooKeeper session to expire, which took 8 s once on a loaded CI machine.
    delay_s = 20
    published = time.time()
    pub.publish(topic, b"later", **{"pubsubd.deliver_after": str(delay_s)}).result(60)
    pub.publish(topic, b"now").result(60)
    cluster.kill("serve")
    shutil.rmtree(server.data_dir)  # the delay index and every local copy with it
    cluster.restart("serve")
    sub = make_subscriber(server.endpoint)
    first = pull_until(sub, subscription, 1, ack=True)
    back_after = time.time() - published
    assert back_after < delay_s, f"the restart took {back_after:.1f} s: the test proves nothing"
    assert [m.message.data for m in first] == [b"now"], f"first pull {back_after:.1f} s after"
    later = pull_until(sub, subscription, 1, ack=True, timeout=delay_s + 30)
    assert [m.message.data for m in later] == [b"later"]
    assert time.time() - published >= delay_s - 0.5  # not before it fell due
    sub.close()


def test_a_damaged_local_copy_is_re_read_from_the_storage_nodes(
    cluster: LocalCluster, names: Any
) -> None:
    """Issue 8's "in a cluster the range is re-read from another copy": a flipped byte in the
    serving machine's local copy stops delivery only until the next trim pass re-reads the
    damaged entries from the storage nodes; every message is delivered."""
    server = ClusterServer(cluster)
    topic, subscription = _create(server.endpoint, names)
    pub = make_publisher(server.endpoint)
    payloads = {b"d-%03d" % i for i in range(300)}
    for f in [pub.publish(topic, p) for p in sorted(payloads)]:
        f.result(60)
    uid = topic_uid(cluster, topic)
    cluster.kill("serve")
    segment = sorted((server.data_dir / "topics" / uid / "source-0").glob("*.seg"))[-1]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    cluster.restart("serve")
    received = drain(server.endpoint, subscription, payloads, timeout=60)
    assert payloads <= received
    wait_for(lambda: not server.status()["damaged"], 30, "the damaged range to be gone")
