"""``pubsubd storage`` as a real process with three data directories, through
``storage/node_client.py``: kill -9 mid-flood loses no answered append, fencing survives a
restart and counts refused appends, versions, deletes, health, clean stops."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pubsubd.core.records import Entry
from pubsubd.core.release import version
from pubsubd.storage import node_client as nc
from pubsubd.storage.framing import decode_frames, encode_entry
from pubsubd.storage.node_client import (
    LedgerFenced,
    LedgerNotFound,
    ProtocolMismatch,
    StorageNodeClient,
    StorageNodeError,
)
from tests.support.storage_node import StorageNodeProcess

pytestmark = pytest.mark.integration


def frames(ledger_id: int, start: int, n: int) -> bytes:
    return b"".join(
        encode_entry(Entry(o, 1, o, b"ledger-%d-offset-%d" % (ledger_id, o)))
        for o in range(start, start + n)
    )


async def read_all(client: StorageNodeClient, ledger_id: int) -> bytes:
    out = b""
    start = 0
    while True:
        page = await client.read(ledger_id, start, max_bytes=64 << 10)
        if not page.frames:
            return out
        out += page.frames
        decoded, _ = decode_frames(page.frames)
        start = decoded[-1][0].next_offset


def metric(node: StorageNodeProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://{node.http_address}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize("port", [True, False], ids=["append port", "AppendStream"])
async def test_answered_appends_survive_kill_9(tmp_path: Path, port: bool) -> None:
    node = StorageNodeProcess(tmp_path / "node").start()
    append_address = node.append_address if port else ""
    client = StorageNodeClient(node.address, timeout=5.0, append_address=append_address)
    answered = dict.fromkeys(range(4), 0)  # ledger -> end offset the node answered
    enough = asyncio.Event()

    async def writer(ledger_id: int) -> None:
        offset = 0
        while True:
            try:
                end = await client.append(ledger_id, 1, 0, frames(ledger_id, offset, 3), offset - 1)
            except StorageNodeError:
                return  # the node died under this append
            assert end == offset + 3
            answered[ledger_id] = offset = end
            if sum(answered.values()) >= 600:
                enough.set()

    try:
        tasks = [asyncio.create_task(writer(i)) for i in range(4)]
        await asyncio.wait_for(enough.wait(), 30)
        node.kill()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        await client.close()
    node.start()
    client = StorageNodeClient(node.address, timeout=5.0)
    try:
        summaries = {s.ledger_id: s for s in await client.list_ledgers()}
        for ledger_id, end in answered.items():
            held = summaries[ledger_id].end_offset
            assert held >= end  # an unanswered append may have made it too
            assert summaries[ledger_id].healthy_disks == 3
            assert await read_all(client, ledger_id) == frames(ledger_id, 0, held)
            # The writer's retry of what it never heard back about is accepted.
            retry = frames(ledger_id, end, 3)
            assert await client.append(ledger_id, 1, 0, retry) == max(held, end + 3)
    finally:
        await client.close()
        node.stop()


async def test_fencing_survives_restart_and_is_counted(tmp_path: Path) -> None:
    node = StorageNodeProcess(tmp_path / "node", http=True).start()
    client = StorageNodeClient(node.address)
    try:
        await client.append(1, 10, 0, frames(1, 0, 4), 3)
        fence = await client.fence(1, 11)
        assert fence == nc.FenceResult(True, 0, 4, 3, 11)
        with pytest.raises(LedgerFenced) as e:
            await client.append(1, 10, 0, frames(1, 4, 1))
        assert e.value.fenced_epoch == 11
        assert metric(node, "pubsubd_storage_fenced_appends_total") == 1
        info = f'pubsubd_process_info{{id="{node.node_id}",role="storage",'
        assert metric(node, info + f'version="{version()}",zone="{node.zone}"}}') == 1
        assert node.stop() == 0
        node.start()
        with pytest.raises(LedgerFenced):
            await client.append(1, 10, 0, frames(1, 4, 1))
        assert await client.append(1, 11, 0, frames(1, 4, 1)) == 5
        [summary] = await client.list_ledgers()
        assert (summary.fenced_epoch, summary.last_add_confirmed, summary.end_offset) == (11, 3, 5)
    finally:
        await client.close()
        node.stop()


async def test_versions_delete_health(tmp_path: Path) -> None:
    node = StorageNodeProcess(tmp_path / "node", zone="zone-b").start()
    assert node.node_id  # chosen by the node, kept in its first data dir
    client = StorageNodeClient(node.address)
    future = StorageNodeClient(node.address, protocol_version=nc.PROTOCOL_VERSION + 1)
    try:
        with pytest.raises(ProtocolMismatch) as e:
            await future.append(2, 1, 0, frames(2, 0, 1))
        assert e.value.node_max == nc.PROTOCOL_VERSION
        health = await client.health()
        assert (health.node_id, health.zone, health.serving) == (node.node_id, "zone-b", True)
        assert [d.path for d in health.disks] == [str(d) for d in node.data_dirs]
        assert all(d.healthy and d.free_bytes > 0 for d in health.disks)
        assert health.free_bytes > 0 and health.ledgers == 0
        await client.append(2, 1, 0, frames(2, 0, 2))
        assert await client.delete_ledger(2) is True
        with pytest.raises(LedgerNotFound):
            await client.read(2, 0)
        assert await client.delete_ledger(2) is False
        for d in node.data_dirs:
            assert list((d / "ledgers").iterdir()) == []
        first_id = node.node_id
        node.stop()
        node.start()
        assert node.node_id == first_id
    finally:
        await future.close()
        await client.close()
        node.stop()


async def test_append_port_is_registered_used_and_can_be_turned_off(tmp_path: Path) -> None:
    node = StorageNodeProcess(tmp_path / "node", http=True).start()
    client = StorageNodeClient(node.address, append_address=node.append_address)
    try:
        assert node.append_address.startswith("127.0.0.1:")
        assert await client.append(1, 1, 0, frames(1, 0, 3)) == 3
        port = status(node)["append_port"]
        assert port["address"] == node.append_address and port["connections"] == 1
    finally:
        await client.close()
        node.stop()
    off = StorageNodeProcess(tmp_path / "off", http=True, args=["--append-port", "-1"]).start()
    try:
        assert off.append_address == "" and status(off)["append_port"] is None
    finally:
        off.stop()


def status(node: StorageNodeProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{node.http_address}/status", timeout=5) as r:
        found: dict[str, Any] = json.loads(r.read())
        return found
