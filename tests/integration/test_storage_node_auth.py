"""A storage node with authentication on (``pubsubd storage --auth-secret-file``), as a real
process: every gRPC call and every append-port connection without a valid bearer token is
refused UNAUTHENTICATED and nothing reaches its ledgers; with the writers' internal token
(``core/internal_token.py``, sent by ``storage/node_client.py`` and ``append_link.py``) every
path works."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pubsubd.core.internal_token import INTERNAL_TOKEN
from pubsubd.core.records import Entry
from pubsubd.core.tokens import create_token
from pubsubd.storage.framing import encode_entry
from pubsubd.storage.node_client import StorageNodeClient, StorageNodeError
from tests.support.storage_node import StorageNodeProcess

pytestmark = pytest.mark.integration

SECRET = b"storage-node-test-secret-0123456789abcdef"
PATHS = {"append port": "port", "AppendStream": "stream", "Append": "unary"}


def frames(start: int, n: int) -> bytes:
    return b"".join(encode_entry(Entry(o, 1, o, b"x%d" % o)) for o in range(start, start + n))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageNodeProcess]:
    root = tmp_path_factory.mktemp("auth-node")
    secret = root / "secret"
    secret.write_bytes(SECRET)
    node = StorageNodeProcess(
        root / "node", disks=1, http=True, args=["--auth-secret-file", str(secret)]
    ).start()
    yield node
    node.stop()


@pytest.fixture
def tokens(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Token files: one the node's secret signed, one another secret did; the process
    setting (INTERNAL_TOKEN) is cleared after the test."""
    valid, forged = tmp_path / "internal.token", tmp_path / "forged.token"
    valid.write_text(create_token("writer", secret=SECRET, now=time.time()))
    forged.write_text(
        create_token("intruder", secret=b"another-secret-0123456789abcdef!", now=time.time())
    )
    yield valid, forged
    INTERNAL_TOKEN.configure(None)


def _client(node: StorageNodeProcess, path: str) -> StorageNodeClient:
    return StorageNodeClient(
        node.address,
        timeout=5.0,
        append_address=node.append_address if path == "port" else "",
        append_stream=path == "stream",
    )


def _status(node: StorageNodeProcess) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{node.http_address}/status", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
async def test_appends_without_a_valid_token_are_refused(
    node: StorageNodeProcess, tokens: tuple[Path, Path], path: str
) -> None:
    valid, forged = tokens
    for token in (None, forged):  # none, then one the node's secret did not sign
        INTERNAL_TOKEN.configure(token)
        client = _client(node, path)
        try:
            with pytest.raises(StorageNodeError) as refused:
                await client.append(1, 1, 0, frames(0, 2))
        finally:
            await client.close()
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED, refused.value
    INTERNAL_TOKEN.configure(valid)
    admin = _client(node, "unary")
    try:
        assert 1 not in {s.ledger_id for s in await admin.list_ledgers()}  # nothing stored
    finally:
        await admin.close()
    if path == "port":
        append_port = _status(node)["append_port"]
        assert isinstance(append_port, dict) and append_port["unauthenticated_connections"] >= 2


async def test_every_call_without_a_token_is_refused(node: StorageNodeProcess) -> None:
    client = StorageNodeClient(node.address, timeout=5.0)
    try:
        for call in (
            client.fence(7, 1),
            client.read(7, 0),
            client.list_ledgers(),
            client.delete_ledger(7),
            client.health(),
        ):
            with pytest.raises(StorageNodeError) as refused:
                await call
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await client.close()


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
async def test_the_writers_token_passes_on_every_path(
    node: StorageNodeProcess, tokens: tuple[Path, Path], path: str
) -> None:
    INTERNAL_TOKEN.configure(tokens[0])
    ledger = 100 + list(PATHS.values()).index(path)
    client = _client(node, path)
    try:
        assert await client.append(ledger, 1, 0, frames(0, 3)) == 3
        assert await client.append(ledger, 1, 0, frames(3, 2), 2) == 5
        fenced = await client.fence(ledger, 2)
        assert fenced.end_offset == 5
        assert (await client.read(ledger, 0)).frames.startswith(frames(0, 1))
        assert (await client.health()).protocol_version >= 2
    finally:
        await client.close()
