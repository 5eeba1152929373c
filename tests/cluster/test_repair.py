"""Background repair in a real cluster (ZooKeeper, 4 storage nodes, ``serve --cluster`` whose
repair auditor runs every 0.5 s with a 12 s grace period): a storage node killed for good has
its closed ledgers copied to the fourth node; a stopped node whose ledger files were truncated
or corrupted gets correct copies back from the other nodes. Checked by the ledgers' digests on
every node, ``pubsubd cluster status`` and delivery of every acknowledged message."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.cluster.launcher import LocalCluster
from pubsubd.cluster.status import cluster_status
from pubsubd.coordination.errors import NoNode
from pubsubd.coordination.zk import Coordinator
from pubsubd.core.records import Entry
from pubsubd.storage.framing import decode_frames, encode_entry
from pubsubd.storage.ledgers.auditor import STATUS_NODE, Auditor
from pubsubd.storage.ledgers.meta import LedgerList, LedgerMeta, LedgerState, StoragePolicy
from pubsubd.storage.ledgers.repair import RepairSettings
from pubsubd.storage.node_client import LedgerSummary, StorageNodeClient, StorageNodePool
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import ClusterServer, environment, running_cluster, topic_uid
from tests.support.drain import drain
from tests.support.flood import Flood
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPAIR_ENV = {
    "PUBSUBD_REPAIR_INTERVAL_S": "0.5",
    # Long enough for a killed node's restart on a loaded machine (the in-place repair test:
    # 6 s was not, once, in a two-worker CI run), short enough for the replacement test.
    "PUBSUBD_REPAIR_GRACE_S": "12",
    # Small local segments: acknowledged messages are trimmed, and so are whole ledgers.
    "PUBSUBD_SEGMENT_BYTES": "8192",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with (
        environment(REPAIR_ENV),
        running_cluster(tmp_path_factory.mktemp("repair"), storage_nodes=4) as c,
    ):
        yield c


# -- what ZooKeeper and the storage nodes say -------------------------------------------------


def _lists(cluster: LocalCluster) -> dict[str, LedgerList]:
    """Every source's ledger list, by ``uid/source``."""

    async def collect() -> dict[str, LedgerList]:
        zk = Coordinator(cluster.zk, "/pubsubd", session_timeout=5.0)
        await zk.start()
        try:
            out = {}
            root = zk.layout.sources
            try:
                buckets = await zk.children(root)
            except NoNode:
                return {}
            for bucket in buckets:
                for uid in await zk.children(f"{root}/{bucket}"):
                    for source in await zk.children(f"{root}/{bucket}/{uid}"):
                        if source.isdigit():
                            data, stat = await zk.get(f"{root}/{bucket}/{uid}/{source}")
                            out[f"{uid}/{source}"] = LedgerList.decode(data, stat.version)
            return out
        finally:
            await zk.stop()

    return asyncio.run(collect())


def _copies(cluster: LocalCluster) -> dict[str, dict[int, LedgerSummary]]:
    """Every running storage node's copies, by node name and ledger ID."""

    async def collect() -> dict[str, dict[int, LedgerSummary]]:
        out = {}
        for p in cluster.processes:
            if p.role == "storage" and p.running(cluster.directory):
                client = StorageNodeClient(p.address)
                try:
                    out[p.name] = {s.ledger_id: s for s in await client.list_ledgers()}
                finally:
                    await client.close()
        return out

    return asyncio.run(collect())


def _closed(cluster: LocalCluster) -> list[tuple[str, LedgerMeta]]:
    return [
        (name, m)
        for name, lst in _lists(cluster).items()
        for m in lst.ledgers
        if m.state is LedgerState.CLOSED and m.end_offset != m.first_offset
    ]


def _problems(cluster: LocalCluster) -> list[str]:
    """What is not right with the closed ledgers' copies: a listed node without a copy of the
    whole range, or copies whose digests differ."""
    copies = _copies(cluster)
    out = []
    for name, m in _closed(cluster):
        seen = {}
        for node in m.nodes:
            copy = copies.get(node, {}).get(m.ledger_id)
            if copy is None or (copy.first_offset, copy.end_offset) != (
                m.first_offset,
                m.end_offset,
            ):
                out.append(f"{name} ledger {m.ledger_id} on {node}: {copy}")
            else:
                seen[node] = copy.digest
        if len(set(seen.values())) > 1:
            out.append(f"{name} ledger {m.ledger_id}: digests {seen}")
    return out


def _auditor(server: ClusterServer) -> dict[str, Any]:
    return server.status()["cluster"]["auditor"]  # type: ignore[no-any-return]


def _metric(server: ClusterServer, name: str) -> float:
    with urllib.request.urlopen(f"http://{server.cluster.http}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def _create(endpoint: str, names: Any, tag: str = "") -> tuple[str, str]:
    pub, sub = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic(f"t{tag}"), names.subscription(f"s{tag}")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    sub.close()
    return topic, subscription


def _new_sources(before: set[str], cluster: LocalCluster) -> dict[str, LedgerList]:
    return {
        k: v for k, v in _lists(cluster).items() if k not in before and not k.startswith("acks-")
    }


# -- the tests ---------------------------------------------------------------------------------


def test_a_node_gone_past_the_grace_period_has_its_ledgers_copied_to_another(
    cluster: LocalCluster, names: Any
) -> None:
    server = ClusterServer(cluster)
    # The only serve process is elected.
    wait_for(lambda: _auditor(server)["role"] == "auditor", 10, "the auditor elected")
    before = set(_lists(cluster))
    topic, subscription = _create(server.endpoint, names)
    flood = Flood(server.endpoint, topic).start()
    try:
        wait_for(lambda: flood.acked_count() >= 2000, 60, "2000 acknowledged publishes")
        ((key, ledgers),) = _new_sources(before, cluster).items()
        last = ledgers.last
        assert last is not None and last.state is LedgerState.OPEN
        victim = last.nodes[0]
        cluster.kill(victim)  # kill -9 while the flood goes on
        acked_then = flood.acked_count()
        wait_for(lambda: flood.acked_count() >= acked_then + 2000, 60, "publishing to go on")
    finally:
        acked = flood.stop()
    # Registered until its ZooKeeper session expires (10 s), then gone for the grace period:
    # the auditor copies its closed ledgers to the fourth node.
    wait_for(
        lambda: not any(victim in m.nodes for _, m in _closed(cluster)), 40, "the victim replaced"
    )
    wait_for(lambda: cluster_status(cluster.zk)["under_replicated"] == 0, 20, "0 under-replicated")
    assert not _problems(cluster)  # every copy of every closed ledger: same entries, same digest
    auditor = _auditor(server)
    assert auditor["ledgers_repaired"] >= 1 and auditor["bytes_copied"] > 0
    assert _metric(server, "pubsubd_repair_ledgers_repaired_total") >= 1
    assert _metric(server, "pubsubd_repair_bytes_copied_total") > 0
    repair = cluster_status(cluster.zk)["repair"]
    assert repair["auditor"]["pid"] == cluster.process("serve").pid and repair["passes"] >= 1
    # Every acknowledged message is delivered.
    received = drain(server.endpoint, subscription, acked)
    assert not acked - received, f"{len(acked - received)} acknowledged messages lost"
    assert not received - flood.sent, "messages nobody published"
    # The writer goes on after the auditor changed its ledger list: it trims the repaired
    # ledger (a compare-and-set of the list on the auditor's version), then appends.
    wait_for(
        lambda: last.ledger_id not in {m.ledger_id for m in _lists(cluster)[key].ledgers},
        20,
        "the repaired ledger trimmed by its writer",
    )
    pub = make_publisher(server.endpoint)
    after = {b"after-%d" % i for i in range(50)}
    for f in [pub.publish(topic, d) for d in sorted(after)]:
        f.result(60)
    assert after <= drain(server.endpoint, subscription, after)
    # The victim comes back: what it holds that its ledgers no longer give it is deleted
    # after the grace period.
    cluster.restart(victim)
    wait_for(lambda: victim in _copies(cluster), 10, "the victim to answer")
    held_before = set(_copies(cluster)[victim])

    def orphans() -> set[int]:
        listed = {
            m.ledger_id
            for lst in _lists(cluster).values()
            for m in lst.ledgers
            if victim in m.nodes
        }
        return set(_copies(cluster)[victim]) - listed

    wait_for(lambda: not orphans(), 20, "the victim's orphaned copies deleted")
    assert held_before, "the victim held ledgers when it came back"
    assert _auditor(server)["orphans_deleted"] >= 1


def test_closed_ledgers_move_out_of_a_zone_the_topic_no_longer_allows(
    cluster: LocalCluster, names: Any
) -> None:
    """The topic's message_storage_policy changes from zone-2 to zone-1: new messages go to
    zone-1 at once (the writer rolls), the closed ledgers' copies are made again in zone-1 and
    take the old copies' place, the old copies are deleted, and every message is delivered."""
    server = ClusterServer(cluster)
    wait_for(lambda: _auditor(server)["role"] == "auditor", 10, "the auditor elected")
    zone_of = {n["node_id"]: n["zone"] for n in cluster_status(cluster.zk)["nodes"]}
    assert {"zone-1", "zone-2"} <= set(zone_of.values())
    pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
    topic, subscription = names.topic("moved"), names.subscription("moved")
    pub.create_topic(
        request={
            "name": topic,
            "labels": {"pubsubd-storage-replicas": "1"},
            "message_storage_policy": {"allowed_persistence_regions": ["zone-2"]},
        }
    )
    sub.create_subscription(name=subscription, topic=topic)
    sub.close()
    before = {b"before-%03d" % i for i in range(100)}
    for f in [pub.publish(topic, d) for d in sorted(before)]:
        f.result(60)
    uid = topic_uid(cluster, topic)

    def ledgers() -> list[LedgerMeta]:
        return [m for k, lst in _lists(cluster).items() if k.startswith(uid) for m in lst.ledgers]

    old = [m for m in ledgers() if m.end_offset != m.first_offset]
    assert old and all(zone_of[n] == "zone-2" for m in old for n in m.nodes)
    pub.update_topic(
        request={
            "topic": {
                "name": topic,
                "message_storage_policy": {"allowed_persistence_regions": ["zone-1"]},
            },
            "update_mask": {"paths": ["message_storage_policy"]},
        }
    )
    after = {b"after-%03d" % i for i in range(20)}
    for f in [pub.publish(topic, d) for d in sorted(after)]:
        f.result(60)

    def outside_zone_1() -> list[str]:
        return [
            f"ledger {m.ledger_id} ({m.state.value}) on {n}"
            for m in ledgers()
            if m.end_offset != m.first_offset
            for n in m.nodes
            if zone_of[n] != "zone-1"
        ]

    wait_for(lambda: not outside_zone_1(), 30, "every ledger's copies in zone-1")
    assert not _problems(cluster)
    old_nodes = {(n, m.ledger_id) for m in old for n in m.nodes}
    wait_for(
        lambda: not {(n, i) for n, held in _copies(cluster).items() for i in held} & old_nodes,
        30,
        "the copies left in zone-2 deleted",
    )
    assert before | after <= drain(server.endpoint, subscription, before | after)


def test_a_fence_no_list_needs_is_deleted_after_the_grace_period(cluster: LocalCluster) -> None:
    """A node fenced for a ledger it never got an entry of (a takeover, a repair) holds a small
    fence record; once no ledger list gives that ledger to the node, the auditor deletes it
    like an orphaned copy (else such records would pile up for ever)."""
    server = ClusterServer(cluster)
    wait_for(lambda: _auditor(server)["role"] == "auditor", 10, "the auditor elected")
    node = next(
        p for p in cluster.processes if p.role == "storage" and p.running(cluster.directory)
    )
    ledger_id = 9_000_000_000 + uuid.uuid4().int % 1_000_000  # in no list

    async def fence() -> None:
        client = StorageNodeClient(node.address)
        try:
            assert (await client.fence(ledger_id, 7)).exists is False
        finally:
            await client.close()

    async def fenced_only() -> list[int]:
        client = StorageNodeClient(node.address)
        try:
            return (await client.list_held())[1]
        finally:
            await client.close()

    deleted = _auditor(server)["orphans_deleted"]
    asyncio.run(fence())
    assert ledger_id in asyncio.run(fenced_only())
    wait_for(lambda: ledger_id not in asyncio.run(fenced_only()), 30, "the unneeded fence deleted")
    assert _auditor(server)["orphans_deleted"] > deleted
    fence_file = f"{ledger_id:020d}.fence"
    assert not list((cluster.directory / node.name).glob(f"disk-*/ledgers/{fence_file}"))


def _ledger_file(cluster: LocalCluster, node: str, ledger_id: int) -> Path:
    return cluster.directory / node / "disk-1" / "ledgers" / f"{ledger_id:020d}.ledger"


def _rewrite_one_entry(path: Path) -> None:
    """Change one entry in the middle of a ledger file and give it a valid CRC: the node's own
    start-up scan cannot tell, only the digests differ (scrub)."""
    data = path.read_bytes()
    decoded, valid_end = decode_frames(data)
    assert valid_end == len(data) and len(decoded) >= 3
    entry, position, length = decoded[len(decoded) // 2]
    changed = Entry(entry.base_offset, entry.count, entry.publish_time_us, b"X" + entry.payload[1:])
    frame = encode_entry(changed)
    assert len(frame) == length and changed.payload != entry.payload
    path.write_bytes(data[:position] + frame + data[position + length :])


def test_truncated_and_corrupted_copies_on_a_stopped_node_are_repaired_from_the_others(
    cluster: LocalCluster, names: Any
) -> None:
    server = ClusterServer(cluster)
    before = set(_lists(cluster))
    pub = make_publisher(server.endpoint)
    topics = [_create(server.endpoint, names, str(i))[0] for i in range(3)]
    futures = [pub.publish(t, b"entry-%04d" % i) for i in range(300) for t in topics]
    for f in futures:
        f.result(60)
    sources = _new_sources(before, cluster)
    assert len(sources) == 3
    # Every ledger closed with its copies complete: the serving process restarts and takes
    # its sources over (fence, recover, close).
    cluster.kill("serve")
    cluster.restart("serve")
    wait_for(lambda: _auditor(server)["passes"] >= 1, 20, "an audit pass after the restart")
    ledgers = {}
    for key in sources:
        lst = _lists(cluster)[key]
        closed = [m for m in lst.ledgers if m.state is LedgerState.CLOSED and m.end_offset]
        ledgers[key] = closed[-1]
    # A node holding a copy of each of the three (4 nodes, 3 copies each: there is one).
    victim = sorted(set.intersection(*(set(m.nodes) for m in ledgers.values())))[0]
    assert not _problems(cluster)
    digests = {m.ledger_id: _copies(cluster)[victim][m.ledger_id].digest for m in ledgers.values()}
    truncated, flipped, rewritten = (m.ledger_id for m in ledgers.values())
    repaired_before = _auditor(server)["ledgers_repaired"]

    cluster.kill(victim)
    path = _ledger_file(cluster, victim, truncated)
    os.truncate(path, path.stat().st_size // 2)
    path = _ledger_file(cluster, victim, flipped)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    _rewrite_one_entry(_ledger_file(cluster, victim, rewritten))
    cluster.restart(victim)  # back well within the grace period: repaired in place

    # The node's own start-up scan cut the truncated and flipped copies short; the rewritten
    # one looks whole to it, with another digest.
    def victim_copy(ledger_id: int) -> LedgerSummary | None:
        return _copies(cluster).get(victim, {}).get(ledger_id)

    wait_for(lambda: not _problems(cluster), 30, "every copy repaired")
    listed = {m.ledger_id: m.nodes for _, m in _closed(cluster)}
    for ledger_id, digest in digests.items():
        # Replaced instead of repaired in place only if the restart outlasted the grace.
        assert victim in listed[ledger_id], (ledger_id, listed[ledger_id])
        copy = victim_copy(ledger_id)
        assert copy is not None and copy.digest == digest, (ledger_id, copy)
    auditor = _auditor(server)
    assert auditor["ledgers_repaired"] >= repaired_before + 3
    assert cluster_status(cluster.zk)["under_replicated"] == 0
    for key, m in ledgers.items():
        current = next(x for x in _lists(cluster)[key].ledgers if x.ledger_id == m.ledger_id)
        assert current.nodes == m.nodes, "repaired in place, not moved"


class _NoStorage:
    """What the auditor needs of ``ClusterStorage`` in a cluster without storage nodes."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.directory = self
        self.pool = StorageNodePool()
        self.policy = StoragePolicy()
        self.sources: dict[tuple[str, int], Any] = {}

    def nodes(self) -> list[Any]:
        return []

    def policy_for(self, _topic_uid: str) -> StoragePolicy:
        return self.policy

    def node(self, _node_id: str) -> None:
        return None


async def _until(condition: Any, within: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_one_auditor_is_elected_and_the_next_takes_over_when_it_goes(
    cluster: LocalCluster,
) -> None:
    root = f"/election-{uuid.uuid4().hex}"
    sessions = [Coordinator(cluster.zk, root, session_timeout=4.0) for _ in range(3)]
    auditors = []
    try:
        for zk in sessions:
            await zk.start()
            auditor = Auditor(_NoStorage(zk), RepairSettings(interval_s=0.05))  # type: ignore[arg-type]
            auditor.start()
            auditors.append(auditor)
            await _until(lambda a=auditor: a.role in ("auditor", "standby"))
        await _until(lambda: auditors[0].passes >= 2)
        assert [a.role for a in auditors] == ["auditor", "standby", "standby"]
        data, _ = await sessions[2].get(f"{root}/auditor/{STATUS_NODE}")
        assert json.loads(data)["auditor"]["pid"] == os.getpid()
        # A clean stop hands over at once, to the next in line.
        await auditors[0].close()
        await _until(lambda: auditors[1].role == "auditor")
        assert auditors[2].role == "standby"
        passes = auditors[1].passes
        await _until(lambda: auditors[1].passes > passes)
        # A session that ends (the process died) hands over too.
        await sessions[1].stop()
        await _until(lambda: auditors[2].role == "auditor")
        await _until(lambda: auditors[2].passes >= 1)
    finally:
        for auditor in auditors:
            await auditor.close()
        for zk in sessions:
            await zk.stop()
