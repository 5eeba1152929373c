"""The storage node's gRPC servicer and ``storage/node_client.py`` in one process: every refusal
reaches the caller as its typed error with its numbers, answers as plain values."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.core.records import Entry
from pubsubd.storage import node_client as nc
from pubsubd.storage.framing import encode_entry
from pubsubd.storage.node_client import (
    AppendGap,
    InvalidFrames,
    LedgerFenced,
    LedgerNotFound,
    NodeUnavailable,
    OverlapMismatch,
    ProtocolMismatch,
    StorageNodeClient,
    StorageNodePool,
)
from pubsubd.storagenode.ledger_store import LedgerStore
from pubsubd.storagenode.service import StorageNodeServicer, handlers

pytestmark = pytest.mark.unit


def frames(start: int, n: int, tag: bytes = b"m") -> bytes:
    return b"".join(encode_entry(Entry(i, 1, i, tag + b"%d" % i)) for i in range(start, start + n))


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[str, LedgerStore]]:
    store = LedgerStore([tmp_path / f"d{i}" for i in range(3)], gap_wait_s=0.0)
    await store.open()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handlers(StorageNodeServicer(store, "n1", "z1"))])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", store
    await server.stop(None)
    await store.close()


async def test_calls_and_typed_refusals(node: tuple[str, LedgerStore]) -> None:
    address, _ = node
    pool = StorageNodePool()
    client = pool.client(address)
    assert pool.client(address) is client
    try:
        assert await client.append(5, 2, 0, frames(0, 3), 1) == 3
        read = await client.read(5, 1)
        assert read.node_end_offset == 3 and read.frames == frames(0, 3)[len(frames(0, 1)) :]
        with pytest.raises(AppendGap) as gap:
            await client.append(5, 2, 0, frames(7, 1))
        assert (
            gap.value.node_end_offset == 3 and gap.value.code == grpc.StatusCode.FAILED_PRECONDITION
        )
        with pytest.raises(OverlapMismatch) as mismatch:
            await client.append(5, 2, 0, frames(2, 1, b"x"))
        assert mismatch.value.node_end_offset == 3
        with pytest.raises(InvalidFrames):
            await client.append(5, 2, 0, frames(3, 1)[:-1])
        fence = await client.fence(5, 9)
        assert fence == nc.FenceResult(True, 0, 3, 1, 9)
        with pytest.raises(LedgerFenced) as fenced:
            await client.append(5, 2, 0, frames(3, 1))
        assert fenced.value.fenced_epoch == 9 and fenced.value.address == address
        assert (await client.fence(6, 4)).exists is False
        with pytest.raises(LedgerNotFound):
            await client.read(6, 0)
        [summary] = await client.list_ledgers()
        assert (summary.ledger_id, summary.end_offset, summary.healthy_disks) == (5, 3, 3)
        health = await client.health()
        assert (health.node_id, health.zone, health.serving, len(health.disks)) == (
            "n1",
            "z1",
            True,
            3,
        )
        assert health.protocol_version == nc.PROTOCOL_VERSION and health.ledgers == 2
        assert await client.delete_ledger(5) is True
        assert await client.delete_ledger(5) is False
    finally:
        await pool.close()


async def test_bad_protocol_version_and_bad_request(node: tuple[str, LedgerStore]) -> None:
    address, _ = node
    client = StorageNodeClient(address, protocol_version=nc.PROTOCOL_VERSION + 1)
    try:
        with pytest.raises(ProtocolMismatch) as e:
            await client.health()
        assert (e.value.node_min, e.value.node_max) == (
            nc.MIN_PROTOCOL_VERSION,
            nc.PROTOCOL_VERSION,
        )
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await client.close()
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(nc.HEALTH)
        with pytest.raises(grpc.aio.AioRpcError) as raw:
            await call(b"\xff\xff\xff")
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ok = channel.unary_unary(
            nc.HEALTH,
            request_serializer=pb.HealthRequest.SerializeToString,
            response_deserializer=pb.HealthResponse.FromString,
        )
        assert (await ok(pb.HealthRequest(protocol_version=1))).node_id == "n1"


async def test_unreachable_node_is_unavailable() -> None:
    client = StorageNodeClient("127.0.0.1:1", timeout=2.0)
    try:
        with pytest.raises(NodeUnavailable) as e:
            await client.health()
        assert e.value.retriable
    finally:
        await client.close()
