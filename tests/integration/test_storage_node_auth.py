"""A storage node with authentication on (``pubsubd storage --auth-secret-file
--internal-token-file``), as a real process: every gRPC call and every append-port connection
without a valid bearer token is refused UNAUTHENTICATED, with a valid token of another subject
(a client's, the admin's) PERMISSION_DENIED, and nothing reaches its ledgers; with the writers'
internal token (``core/internal_token.py``, sent by ``storage/node_client.py`` and
``append_link.py``) every path works. An append-port connection ends when its token expires and
the writer reconnects with the token its file holds then."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pubsubd.core.internal_token import INTERNAL_TOKEN
from pubsubd.core.records import Entry
from pubsubd.core.tokens import TokenSettings, TokenVerifier, create_token
from pubsubd.storage.framing import encode_entry
from pubsubd.storage.node_client import StorageNodeClient, StorageNodeError
from tests.support.storage_node import StorageNodeProcess

pytestmark = pytest.mark.integration

SECRET = b"storage-node-test-secret-0123456789abcdef"
WRITER = "writer"  # the subject of the cluster's internal token here
PATHS = {"append port": "port", "AppendStream": "stream", "Append": "unary"}


def frames(start: int, n: int) -> bytes:
    return b"".join(encode_entry(Entry(o, 1, o, b"x%d" % o)) for o in range(start, start + n))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageNodeProcess]:
    root = tmp_path_factory.mktemp("auth-node")
    secret = root / "secret"
    secret.write_bytes(SECRET)
    internal = root / "internal.token"
    internal.write_text(create_token(WRITER, secret=SECRET, now=time.time()))
    args = ["--auth-secret-file", str(secret), "--internal-token-file", str(internal)]
    node = StorageNodeProcess(root / "node", disks=1, http=True, args=args).start()
    yield node
    node.stop()


@pytest.fixture
def tokens(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Token files: one the node's secret signed, one another secret did; the process
    setting (INTERNAL_TOKEN) is cleared after the test."""
    valid, forged = tmp_path / "internal.token", tmp_path / "forged.token"
    valid.write_text(create_token(WRITER, secret=SECRET, now=time.time()))
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
        stored = {s.ledger_id for s in await admin.list_ledgers()}
        assert stored.isdisjoint({1}), stored  # nothing stored
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


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
async def test_a_valid_token_of_another_subject_is_denied(
    node: StorageNodeProcess, tmp_path: Path, tokens: tuple[Path, Path], path: str
) -> None:
    """A client's token (the admin's of ``cluster up --tokens``), signed with the node's own
    secret, is not the cluster's identity: PERMISSION_DENIED, nothing stored."""
    admin = tmp_path / "admin.token"
    admin.write_text(create_token("admin@pubsubd.local", secret=SECRET, now=time.time()))
    INTERNAL_TOKEN.configure(admin)
    ledger = 200 + list(PATHS.values()).index(path)
    client = _client(node, path)
    try:
        with pytest.raises(StorageNodeError) as refused:
            await client.append(ledger, 1, 0, frames(0, 2))
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED, refused.value
        assert "user:admin@pubsubd.local" in str(refused.value)
        with pytest.raises(StorageNodeError) as listing:
            await client.list_ledgers()
        assert listing.value.code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await client.close()
    INTERNAL_TOKEN.configure(tokens[0])
    writer = _client(node, "unary")
    try:
        assert ledger not in {s.ledger_id for s in await writer.list_ledgers()}
    finally:
        await writer.close()
    if path == "port":
        append_port = _status(node)["append_port"]
        assert isinstance(append_port, dict) and append_port["denied_connections"] >= 1


async def test_an_append_connection_ends_when_its_token_expires(
    node: StorageNodeProcess, tmp_path: Path
) -> None:
    """A token expiring in a second or two: the node closes the connection at its ``exp``;
    the writer's next append, with the same token still in its file, is refused; once the
    file holds a fresh token the writer reconnects with it and appends over the port."""
    token_file = tmp_path / "internal.token"
    token_file.write_text(create_token(WRITER, secret=SECRET, now=time.time(), expires_in_s=2))
    INTERNAL_TOKEN.configure(token_file)
    expired_before = _port_status(node)["expired_connections"]
    client = _client(node, "port")
    try:
        assert await client.append(300, 1, 0, frames(0, 2)) == 2
        deadline = time.monotonic() + 10
        while _port_status(node)["expired_connections"] == expired_before:
            assert time.monotonic() < deadline, "the node kept the connection past exp"
            await asyncio.sleep(0.1)
        with pytest.raises(StorageNodeError) as refused:  # the same token: expired now
            await client.append(300, 1, 0, frames(2, 1), 1)
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED, refused.value
        assert "expired" in str(refused.value)
        token_file.write_text(create_token(WRITER, secret=SECRET, now=time.time()))
        assert await client.append(300, 1, 0, frames(2, 1), 1) == 3
        link = client._link
        assert link is not None and link.broken is None  # the port, on a new connection
    finally:
        await client.close()
        INTERNAL_TOKEN.configure(None)


async def test_an_append_stream_ends_when_its_token_expires(
    node: StorageNodeProcess, tmp_path: Path
) -> None:
    """AppendStream: a request that arrives after the call's token expired is not taken (the
    stream ends); the writer sends it again with the token in its file (refused while that is
    the expired one), then on a new stream with a fresh token."""
    token_file = tmp_path / "internal.token"
    token = create_token(WRITER, secret=SECRET, now=time.time(), expires_in_s=2)
    token_file.write_text(token)
    INTERNAL_TOKEN.configure(token_file)
    expires = TokenVerifier(TokenSettings(secret=SECRET)).verify_until(token)[1]
    client = _client(node, "stream")
    try:
        assert await client.append(310, 1, 0, frames(0, 2)) == 2
        first = client._stream
        await asyncio.sleep(max(0.0, expires - time.time()) + 0.2)  # the token's exp passes
        with pytest.raises(StorageNodeError) as refused:
            await client.append(310, 1, 0, frames(2, 1), 1)
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED, refused.value
        assert first is not None and first.broken is not None  # the node ended the stream
        token_file.write_text(create_token(WRITER, secret=SECRET, now=time.time()))
        assert await client.append(310, 1, 0, frames(2, 1), 1) == 3
        assert await client.append(310, 1, 0, frames(3, 1), 2) == 4
        stream = client._stream
        assert stream is not None and stream is not first and stream.broken is None
    finally:
        await client.close()
        INTERNAL_TOKEN.configure(None)


def _port_status(node: StorageNodeProcess) -> dict[str, int]:
    append_port = _status(node)["append_port"]
    assert isinstance(append_port, dict)
    return append_port


def test_authentication_without_the_internal_token_does_not_start(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pubsubd", "storage", "--data-dir", str(tmp_path / "d")),
            *("--auth-secret-file", str(secret)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "needs --internal-token-file" in done.stderr, done.stderr
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


GRACE_S = 6.0  # the rotation test's --internal-token-grace


def _replace(path: Path, token: str) -> None:
    """Replace a token file as an operator rotating it would (a new file renamed over it)."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(token)
    fresh.replace(path)


async def test_the_node_follows_its_internal_token_file_to_another_subject(
    tmp_path: Path,
) -> None:
    """Rotation: the node's internal token file is replaced by a token of another subject.
    The old subject stays accepted for the grace (``--internal-token-grace 3``: a writer whose
    file has not changed yet goes on); after it the old subject is refused (PERMISSION_DENIED)
    on gRPC, on the open append-port connection (closed: ``revoked_connections``) and on the
    open AppendStream (ended), nothing stored; once the writer's own file holds the new token,
    every path works again, without a restart of the node."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    node_file, writer_file = tmp_path / "node-internal.token", tmp_path / "writer.token"
    old = create_token(WRITER, secret=SECRET, now=time.time())
    new = create_token("writer-2", secret=SECRET, now=time.time())
    node_file.write_text(old)
    writer_file.write_text(old)
    args = [
        *("--auth-secret-file", str(secret), "--internal-token-file", str(node_file)),
        *("--internal-token-grace", str(GRACE_S)),
    ]
    node = StorageNodeProcess(tmp_path / "node", disks=1, http=True, args=args).start()
    INTERNAL_TOKEN.configure(writer_file)
    clients = {path: _client(node, path) for path in PATHS.values()}
    try:
        for i, client in enumerate(clients.values()):
            assert await client.append(400 + i, 1, 0, frames(0, 2)) == 2
        _replace(node_file, new)
        rotated = time.monotonic()
        await asyncio.sleep(0.5)  # the node has looked at its file again (every 0.25 s)
        # In the grace: the old subject still calls, on every path.
        for i, client in enumerate(clients.values()):
            assert await client.append(400 + i, 1, 0, frames(2, 1), 1) == 3
        assert time.monotonic() - rotated < GRACE_S, "too slow to check within the grace"
        assert _port_status(node)["revoked_connections"] == 0
        deadline = time.monotonic() + 10
        while True:  # refused once the grace is over
            try:
                await clients["unary"].list_ledgers()
            except StorageNodeError as e:
                assert e.code == grpc.StatusCode.PERMISSION_DENIED, e
                assert "user:writer" in str(e)
                break
            assert time.monotonic() < deadline, "the node kept the old subject"
            await asyncio.sleep(0.1)
        assert time.monotonic() - rotated >= GRACE_S - 0.3  # not before the grace ends
        for i, (path, client) in enumerate(clients.items()):
            with pytest.raises(StorageNodeError) as refused:
                await client.append(400 + i, 1, 0, frames(3, 1), 2)
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED, (path, refused.value)
        assert _port_status(node)["revoked_connections"] == 1
        _replace(writer_file, new)  # the writer's file rotates too
        for i, client in enumerate(clients.values()):
            assert await client.append(400 + i, 1, 0, frames(3, 1), 2) == 4
            assert await client.append(400 + i, 1, 0, frames(4, 1), 3) == 5
        assert {400, 401, 402} <= {s.ledger_id for s in await clients["unary"].list_ledgers()}
        assert (await clients["unary"].read(400, 0)).frames.startswith(frames(0, 1))
    finally:
        for client in clients.values():
            await client.close()
        INTERNAL_TOKEN.configure(None)
        node.stop()
