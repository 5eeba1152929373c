"""A storage node registers itself in ZooKeeper: an ephemeral znode with its address, zone,
disks and free bytes; replaced after a kill -9 and restart, removed by a clean stop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pubsubd.coordination.ensemble import Ensemble
from pubsubd.coordination.paths import Layout
from pubsubd.coordination.zk import Coordinator
from pubsubd.storage.node_client import PROTOCOL_VERSION
from tests.support.storage_node import StorageNodeProcess

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.zookeeper"]


async def test_registration(tmp_path: Path, zookeeper: Ensemble, zk_root: str) -> None:
    node = StorageNodeProcess(
        tmp_path / "node",
        zone="zone-c",
        node_id="storage-7",
        zk=zookeeper.connect_string,
        zk_root=zk_root,
    ).start()
    zk = Coordinator(zookeeper.connect_string, zk_root)
    await zk.start()
    path = Layout(zk_root).storage_node("storage-7")
    try:
        data, stat = await zk.get(path)
        info = json.loads(data)
        assert stat.ephemeral
        assert info["node_id"] == "storage-7" and info["address"] == node.address
        assert info["zone"] == "zone-c" and info["disks"] == 3 and info["healthy_disks"] == 3
        assert info["free_bytes"] > 0 and info["protocol_version"] == PROTOCOL_VERSION
        assert info["append_address"] == node.append_address and node.append_address
        assert "version" in info
        # kill -9: the old session's znode outlives the process until it expires; the
        # restarted node replaces it at once with its own session's.
        node.kill()
        node.start()
        _, restarted = await zk.get(path)
        assert restarted.ephemeral_owner != stat.ephemeral_owner
        assert node.stop() == 0
        assert await zk.exists(path) is None
    finally:
        node.stop()
        await zk.stop()


async def test_a_vanished_node_leaves_after_its_session_timeout(
    tmp_path: Path, zookeeper: Ensemble, zk_root: str
) -> None:
    """PUBSUBD_ZK_SESSION_TIMEOUT_S sets how long a node killed with -9 stays registered (the
    default is 10 s; the cluster notices a dead node no sooner)."""
    node = StorageNodeProcess(
        tmp_path / "node",
        node_id="storage-8",
        zk=zookeeper.connect_string,
        zk_root=zk_root,
        env={"PUBSUBD_ZK_SESSION_TIMEOUT_S": "2"},
    ).start()
    zk = Coordinator(zookeeper.connect_string, zk_root)
    await zk.start()
    path = Layout(zk_root).storage_node("storage-8")
    try:
        assert await zk.exists(path) is not None
        node.kill()
        loop = asyncio.get_running_loop()
        killed = loop.time()
        for _ in range(160):
            if await zk.exists(path) is None:
                break
            await asyncio.sleep(0.05)
        gone_after = loop.time() - killed
        assert await zk.exists(path) is None and gone_after < 7.0, gone_after
    finally:
        node.stop()
        await zk.stop()
