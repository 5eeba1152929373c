"""A local 3-node ZooKeeper ensemble (coordination/ensemble.py), as ``pubsubd cluster up``
starts it: it forms a quorum, a write acknowledged through the Coordinator survives kill -9 of
the leader while another node is elected, the killed node rejoins, and stopping it (also from
another process's view, through the state file, as ``cluster down`` does) leaves no process. A
metadata store following changes catches up with what it missed while its ZooKeeper node was
down."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from pubsubd.coordination.ensemble import STATE_FILE, Ensemble, require_zookeeper
from pubsubd.coordination.errors import CoordinationUnavailable
from pubsubd.coordination.zk import Coordinator, SessionState
from pubsubd.storage.metadata import Change, TopicRecord
from pubsubd.storage.zk_metadata import TOPICS, ZooKeeperMetadataStore
from tests.support.process import pid_alive

pytestmark = pytest.mark.integration


async def _until_leader(ensemble: Ensemble, within: float = 10.0) -> int:
    deadline = time.monotonic() + within
    while (leader := ensemble.leader()) is None:
        assert time.monotonic() < deadline, "no leader elected in time"
        await asyncio.sleep(0.02)
    return leader


@pytest.fixture
def ensemble(tmp_path: Path) -> Ensemble:
    return Ensemble(tmp_path / "zk", nodes=3, install=require_zookeeper())


async def test_a_write_survives_kill_9_of_the_leader(ensemble: Ensemble) -> None:
    started = time.monotonic()
    ensemble.start()
    try:
        pids = ensemble.pids
        assert all(pid is not None and pid_alive(pid) for pid in pids)
        modes = sorted(str(ensemble.mode(i)) for i in range(3))
        assert modes == ["follower", "follower", "leader"], modes
        assert time.monotonic() - started < 15
        addresses = ensemble.connect_string.split(",")
        assert len(addresses) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
        assert all(ensemble.log_path(i).stat().st_size > 0 for i in range(3))

        client = Coordinator(ensemble.connect_string, "/cluster", session_timeout=6.0)
        states: list[SessionState] = []
        client.on_state(states.append)
        await client.start()
        try:
            await client.create("/cluster/acknowledged", b"kept")

            old_leader = await _until_leader(ensemble)
            killed_at = time.monotonic()
            ensemble.kill(old_leader)
            assert ensemble.pids[old_leader] is None and not pid_alive(pids[old_leader] or 0)
            new_leader = await _until_leader(ensemble)
            elected_in = time.monotonic() - killed_at
            assert new_leader != old_leader
            assert elected_in < 10, elected_in

            await client.wait_connected(within=10)
            assert (await client.get("/cluster/acknowledged"))[0] == b"kept"
            await client.create("/cluster/after", b"written under the new leader")
            assert not client.session_lost  # the session moved to another node, alive

            ensemble.start_node(old_leader)  # rejoins with its data, as a follower
            assert ensemble.mode(old_leader) == "follower"
            assert await _until_leader(ensemble) == new_leader
        finally:
            await client.stop()
        assert states[0] is SessionState.CONNECTED and states[-1] is SessionState.LOST
    finally:
        ensemble.stop()
    assert ensemble.pids == [None, None, None]
    assert not any(pid_alive(pid or 0) for pid in pids)


def test_stop_through_the_state_file_leaves_no_process(ensemble: Ensemble) -> None:
    """What ``cluster down`` does: another process reads the recorded PIDs and stops them."""
    ensemble.start()
    try:
        state = json.loads((ensemble.directory / STATE_FILE).read_text())
        recorded = [node["pid"] for node in state["nodes"]]
        assert recorded == ensemble.pids and all(pid_alive(pid) for pid in recorded)
        assert state["connect_string"] == ensemble.connect_string

        attached = Ensemble.attach(ensemble.directory)
        assert attached.connect_string == ensemble.connect_string
        assert attached.leader() is not None
        attached.stop()
        assert not any(pid_alive(pid) for pid in recorded)
        assert attached.pids == [None, None, None]
        saved = json.loads((ensemble.directory / STATE_FILE).read_text())
        assert [node["pid"] for node in saved["nodes"]] == [None, None, None]
    finally:
        ensemble.stop()  # nothing left: a no-op
    assert ensemble.pids == [None, None, None]


def test_a_reused_pid_is_never_signalled(ensemble: Ensemble, tmp_path: Path) -> None:
    """A state file whose PID now belongs to another process (here: this test) is not obeyed."""
    ensemble.directory.mkdir(parents=True)
    (ensemble.directory / STATE_FILE).write_text(
        json.dumps(
            {
                "connect_string": "127.0.0.1:1",
                "nodes": [
                    {
                        "id": 1,
                        "pid": os.getpid(),
                        "client_port": 1,
                        "peer_port": 2,
                        "election_port": 3,
                    }
                ],
            }
        )
    )
    attached = Ensemble.attach(ensemble.directory)
    assert attached.pids == [None]
    attached.stop()  # would SIGTERM pytest itself if it trusted the PID
    assert pid_alive(os.getpid())


def _put(store: ZooKeeperMetadataStore, record: TopicRecord) -> None:
    """A put, retried while the ensemble elects a leader (a retried put is the same put)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            store.put_topic(record)
            return
        except CoordinationUnavailable:
            assert time.monotonic() < deadline, "the ensemble never took the write"
            time.sleep(0.1)


async def test_a_follower_catches_up_after_its_node_returns(ensemble: Ensemble) -> None:
    """The follower's only ZooKeeper node dies; others change records meanwhile; when the node
    returns (within the session timeout), the follower re-reads what its dropped watches
    covered and publishes exactly what changed."""
    ensemble.start()
    hosts = ensemble.connect_string.split(",")
    reader = ZooKeeperMetadataStore.connect(hosts[0], "/m", session_timeout=8.0)
    writer = ZooKeeperMetadataStore.connect(",".join(hosts[1:]), "/m", session_timeout=8.0)
    try:
        kept = TopicRecord("projects/p/topics/kept", "u1", b"v1")
        gone = TopicRecord("projects/p/topics/gone", "u2", b"")
        _put(writer, kept)
        _put(writer, gone)
        await reader.follow()
        heard: list[tuple[object, bool]] = []

        def listener(change: Change) -> None:
            heard.append((change.record, change.deleted))

        reader.changes.watch(listener)

        ensemble.kill(0)  # the reader's node
        changed = TopicRecord(kept.name, kept.uid, b"v2")
        added = TopicRecord("projects/p/topics/added", "u3", b"")
        _put(writer, changed)
        _put(writer, added)
        writer.delete_topic(gone.name)
        assert heard == []  # disconnected: nothing can arrive yet
        ensemble.start_node(0)

        deadline = time.monotonic() + 20
        while len(heard) < 3:
            assert time.monotonic() < deadline, (heard, _follower_state(reader, gone))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # negative check: nothing heard twice
        assert sorted(heard, key=repr) == sorted(
            [(changed, False), (added, False), (gone, True)], key=repr
        )
        assert not reader.coordinator.session_lost
    finally:
        reader.close()
        writer.close()
        ensemble.stop()


def _follower_state(store: ZooKeeperMetadataStore, record: TopicRecord) -> dict[str, object]:
    """What a follower knows of one record, for a failure's message (CI once saw a deletion
    made while the follower's node was down go unheard)."""
    follower = store._follower
    assert follower is not None
    path = store.layout.record(TOPICS, record)
    bucket = path.rpartition("/")[0]
    return {
        "path": path,
        "seen": path in follower.seen,
        "listed": path.rpartition("/")[2] in follower.listed.get(bucket, ()),
        "queued": list(follower._queue),
        "inflight": sorted(follower._inflight),
        "again": sorted(follower._again),
        "dropped": sorted(follower._dropped),
        "unsure": sorted(follower._unsure),
        "waiting": sorted(follower._waiting),
        "later": sorted(follower._later),
        "resyncing": follower._resync is not None,
        "connected": store.coordinator.connected,
        "session_lost": store.coordinator.session_lost,
        "on_server": store.coordinator._client.exists(path) is not None,
    }
