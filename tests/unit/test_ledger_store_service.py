"""The storage node's gRPC servicer and ``storage/node_client.py`` in one process: every refusal
reaches the caller as its typed error with its numbers, answers as plain values."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.core.records import Entry
from pubsubd.storage import node_client as nc
from pubsubd.storage.append_link import AppendLink
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
from pubsubd.storagenode.append_port import AppendPort
from pubsubd.storagenode.ledger_store import LedgerStore
from pubsubd.storagenode.service import StorageNodeServicer, handlers

pytestmark = pytest.mark.unit


def frames(start: int, n: int, tag: bytes = b"m") -> bytes:
    return b"".join(encode_entry(Entry(i, 1, i, tag + b"%d" % i)) for i in range(start, start + n))


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[str, LedgerStore]]:
    async for found in _node(tmp_path):
        yield found[0], found[1]


@pytest.fixture
async def node_with_port(tmp_path: Path) -> AsyncIterator[tuple[str, LedgerStore, AppendPort]]:
    async for found in _node(tmp_path):
        yield found


async def _node(tmp_path: Path) -> AsyncIterator[tuple[str, LedgerStore, AppendPort]]:
    store = LedgerStore([tmp_path / f"d{i}" for i in range(3)], gap_wait_s=0.0)
    await store.open()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handlers(StorageNodeServicer(store, "n1", "z1"))])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    append_port = AppendPort(store, "127.0.0.1")
    await append_port.start()
    yield f"127.0.0.1:{port}", store, append_port
    await append_port.stop()
    await server.stop(None)
    await store.close()


@pytest.mark.parametrize("appends", ["AppendPort", "AppendStream", "Append"])
async def test_calls_and_typed_refusals(
    node_with_port: tuple[str, LedgerStore, AppendPort], appends: str
) -> None:
    address, _, append_port = node_with_port
    pool = StorageNodePool()
    client = pool.client(address)
    assert pool.client(address) is client
    if appends == "AppendPort":
        client = pool.client(address, f"127.0.0.1:{append_port.port}")
        assert client.append_address
    elif appends == "Append":
        client = StorageNodeClient(address, append_stream=False)
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
        # Ledger 6 was only fenced: not a copy, but listed so that it can be deleted.
        assert await client.list_held() == ([summary], [6])
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
        assert await client.delete_ledger(6) is True
        assert await client.list_held() == ([], [])
        assert client.streaming is (appends != "Append")
    finally:
        await client.close()
        await pool.close()


async def test_stream_pipelines_appends_in_order(node: tuple[str, LedgerStore]) -> None:
    """Appends sent one after another without waiting land in order, each answered with its
    answer; the node groups them (fewer fsyncs than appends)."""
    address, store = node
    client = StorageNodeClient(address)
    try:
        commits = store.group_commits
        ends = await asyncio.gather(*(client.append(7, 1, 0, frames(i * 2, 2)) for i in range(50)))
        # Each answer is the node's durable end: at least the append's own end, never falling.
        assert all(end >= 2 * (i + 1) for i, end in enumerate(ends)) and ends[-1] == 100
        assert ends == sorted(ends)
        assert (await client.read(7, 0, max_bytes=1 << 20)).frames == frames(0, 100)
        assert store.group_commits - commits < 50
        # A refusal answers only its own append; the stream goes on.
        results = await asyncio.gather(
            client.append(7, 1, 0, frames(100, 1)),
            client.append(7, 1, 0, frames(500, 1)),  # a gap
            client.append(7, 1, 0, frames(101, 1)),
            return_exceptions=True,
        )
        assert results[0] == 101 and results[2] == 102, results
        assert isinstance(results[1], AppendGap) and results[1].node_end_offset >= 101
    finally:
        await client.close()


async def test_stream_reopens_after_the_node_restarts(tmp_path: Path) -> None:
    store = LedgerStore([tmp_path / "d"], gap_wait_s=0.0)
    await store.open()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handlers(StorageNodeServicer(store, "n1", "z1"))])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = StorageNodeClient(f"127.0.0.1:{port}", timeout=3.0)
    try:
        assert await client.append(1, 1, 0, frames(0, 1)) == 1
        await server.stop(None)
        with pytest.raises(NodeUnavailable):
            await client.append(1, 1, 0, frames(1, 1))
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([handlers(StorageNodeServicer(store, "n1", "z1"))])
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        for _ in range(50):  # the channel reconnects with backoff
            try:
                assert await client.append(1, 1, 0, frames(1, 1)) == 2
                break
            except NodeUnavailable:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the append stream never came back")
        assert client.streaming
    finally:
        await client.close()
        await server.stop(None)
        await store.close()


async def test_node_without_append_stream_gets_unary_appends(tmp_path: Path) -> None:
    """A node of protocol version 1 (no AppendStream) answers UNIMPLEMENTED; the client moves
    to Append for good without failing the append."""
    store = LedgerStore([tmp_path / "d"], gap_wait_s=0.0)
    await store.open()
    servicer = StorageNodeServicer(store, "n1", "z1")
    full = handlers(servicer)
    old = grpc.method_handlers_generic_handler(
        nc.SERVICE,
        {"Append": full.service(_details(nc.APPEND))},  # type: ignore[arg-type,dict-item]
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([old])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        # grpc.aio can report the first write racing with UNIMPLEMENTED as INTERNAL: every
        # client still moves to Append for good (it asks the node what it speaks).
        for client_number in range(30):
            client = StorageNodeClient(f"127.0.0.1:{port}")
            try:
                end = 3 * client_number
                assert await client.append(1, 1, 0, frames(end, 2)) == end + 2
                assert not client.streaming, client_number
                assert await client.append(1, 1, 0, frames(end + 2, 1)) == end + 3
            finally:
                await client.close()
    finally:
        await server.stop(None)
        await store.close()


class _details:
    """What a server hands a generic handler to look a method up."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


async def test_stream_request_that_does_not_parse(node: tuple[str, LedgerStore]) -> None:
    address, _ = node
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(nc.APPEND_STREAM)()
        await call.write(b"\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    client = StorageNodeClient(address)  # the node is fine
    try:
        assert await client.append(3, 1, 0, frames(0, 1)) == 1
    finally:
        await client.close()


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


# -- the append port ---------------------------------------------------------------------------


async def test_append_port_pipelines_and_answers_refusals(
    node_with_port: tuple[str, LedgerStore, AppendPort],
) -> None:
    address, store, append_port = node_with_port
    client = StorageNodeClient(address, append_address=f"127.0.0.1:{append_port.port}")
    try:
        commits = store.group_commits
        ends = await asyncio.gather(*(client.append(9, 1, 0, frames(i * 2, 2)) for i in range(50)))
        assert all(end >= 2 * (i + 1) for i, end in enumerate(ends)) and ends[-1] == 100
        assert store.group_commits - commits < 50
        assert (await client.read(9, 0, max_bytes=1 << 20)).frames == frames(0, 100)
        await client.fence(9, 5)
        with pytest.raises(LedgerFenced) as e:
            await client.append(9, 1, 0, frames(100, 1))
        assert e.value.fenced_epoch == 5
    finally:
        await client.close()


async def test_append_port_answers_refusals_found_before_the_store_queues_the_append(
    node_with_port: tuple[str, LedgerStore, AppendPort],
) -> None:
    """A version the node does not speak, frames that do not parse, and a stale epoch are
    refused as the append is read (no group commit): each is answered on the connection, which
    goes on carrying appends."""
    _, store, append_port = node_with_port
    link = AppendLink("n1", f"127.0.0.1:{append_port.port}")
    try:
        assert await link.append(nc.encode_append(4, 2, 0, frames(0, 2), -1), 5.0) == 2
        newer = nc.encode_append(4, 2, 0, frames(2, 1), -1, nc.PROTOCOL_VERSION + 1)
        with pytest.raises(ProtocolMismatch):
            await link.append(newer, 5.0)
        with pytest.raises(InvalidFrames):
            await link.append(nc.encode_append(4, 2, 0, b"not frames", -1), 5.0)
        await store.fence(4, 3)
        with pytest.raises(LedgerFenced):
            await link.append(nc.encode_append(4, 2, 0, frames(2, 1), -1), 5.0)
        assert await link.append(nc.encode_append(4, 3, 0, frames(2, 1), -1), 5.0) == 3
        assert link.broken is None and append_port.refused_connections == 0
    finally:
        await link.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\n\r\n" + b"x" * 40,
        nc.APPEND_PORT_MAGIC + b"\xff\xff\xff\xff",
        nc.APPEND_PORT_MAGIC + b"\x00\x00\x00\x03\xff\xff\xff",
    ],
    ids=["no preamble", "oversized frame", "not a message"],
)
async def test_append_port_closes_a_connection_that_sends_garbage(
    node_with_port: tuple[str, LedgerStore, AppendPort], garbage: bytes
) -> None:
    address, _, append_port = node_with_port
    reader, writer = await asyncio.open_connection("127.0.0.1", append_port.port)
    writer.write(garbage)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing answered
    writer.close()
    assert append_port.refused_connections == 1
    client = StorageNodeClient(address, append_address=f"127.0.0.1:{append_port.port}")
    try:  # the port still serves everyone else
        assert await client.append(3, 1, 0, frames(0, 1)) == 1
    finally:
        await client.close()


async def test_append_port_gone_falls_back_to_grpc_and_reconnects(
    node_with_port: tuple[str, LedgerStore, AppendPort],
) -> None:
    """The port closes (the node restarts it, or it is cut): the append in flight and the next
    ones still get through (once more over gRPC); a port that comes back is used again."""
    address, store, append_port = node_with_port
    client = StorageNodeClient(address, append_address=f"127.0.0.1:{append_port.port}", timeout=3)
    try:
        assert await client.append(4, 1, 0, frames(0, 1)) == 1
        await append_port.stop()
        assert await client.append(4, 1, 0, frames(1, 1)) == 2  # over gRPC
        assert await client.append(4, 1, 0, frames(2, 1)) == 3
        again = AppendPort(store, "127.0.0.1")
        await again.start()
        client.append_address = f"127.0.0.1:{again.port}"  # as the node re-registers it
        try:
            assert await client.append(4, 1, 0, frames(3, 1)) == 4
            link = client._link
            assert link is not None and link.broken is None
        finally:
            await again.stop()
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("ledger_id", "epoch", "first", "lac"),
    [(1, 1, 0, -1), (2**63 + 5, 2**40, 123_456_789_012, 99), (7, 0, 0, 0), (3, 9, -2, -(2**63))],
)
def test_encoded_append_is_the_message_protobuf_would_make(
    ledger_id: int, epoch: int, first: int, lac: int
) -> None:
    data = frames(0, 3)
    encoded = nc.encode_append(ledger_id, epoch, first, data, lac)
    parsed = pb.AppendRequest.FromString(encoded.joined())
    assert parsed == pb.AppendRequest(
        protocol_version=nc.PROTOCOL_VERSION,
        ledger_id=ledger_id,
        epoch=epoch,
        first_offset=first,
        frames=data,
        last_add_confirmed=lac,
    )
    assert len(encoded) == len(encoded.joined()) and encoded.frames is data
    prefix, rest = nc.stream_request(2**35, encoded)
    wrapped = pb.AppendStreamRequest.FromString(prefix + rest)
    assert wrapped.request_id == 2**35 and wrapped.append == parsed
