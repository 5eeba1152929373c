"""A cluster with ZooKeeper digest authentication and storage nodes that check tokens
(``cluster up --zk-auth --tokens``, issue 14): the official client works through it, every
znode under the cluster's root is its credential's only (a plain kazoo client can neither read
nor create), a process given a wrong password or none exits with an error naming
``--zk-auth-file``, and a storage node refuses a call without a token.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.pubsub_v1 import PublisherClient, SubscriberClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from pubsubd.cluster.launcher import ADMIN_TOKEN_FILE, LocalCluster
from pubsubd.cluster.status import cluster_status
from pubsubd.core.internal_token import INTERNAL_TOKEN
from pubsubd.storage.node_client import StorageNodeClient, StorageNodeError
from tests.conftest import PROJECT
from tests.support.cluster import running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

ROOT = "/pubsubd"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("zk-auth") / "c",
        storage_nodes=2,
        replicas=2,
        zones=2,
        tokens=True,
        zk_auth=True,
    ) as c:
        yield c


def _kazoo(cluster: LocalCluster, *, authenticated: bool) -> KazooClient:
    credential = cluster.zk_credential
    assert credential is not None
    auth = [("digest", credential.auth)] if authenticated else None
    client = KazooClient(hosts=cluster.zk, auth_data=auth)
    client.start(timeout=15)
    return client


def _tree(client: KazooClient, path: str) -> list[str]:
    return [path] + [p for c in client.get_children(path) for p in _tree(client, f"{path}/{c}")]


def test_the_official_client_works_through_the_secured_cluster(cluster: LocalCluster) -> None:
    admin = [("authorization", f"Bearer {cluster.admin_token}")]
    channel = grpc.insecure_channel(cluster.grpc)
    publisher = PublisherClient(transport=PublisherGrpcTransport(channel=channel))
    subscriber = SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
    suffix = uuid.uuid4().hex[:8]
    topic = f"projects/{PROJECT}/topics/t-{suffix}"
    sub = f"projects/{PROJECT}/subscriptions/s-{suffix}"
    publisher.create_topic(name=topic, metadata=admin)
    subscriber.create_subscription(name=sub, topic=topic, metadata=admin)
    sent = [f"m{i}".encode() for i in range(20)]
    for data in sent:
        publisher.publish(topic=topic, messages=[{"data": data}], metadata=admin, timeout=30)
    got: dict[bytes, str] = {}
    for _ in range(20):
        response = subscriber.pull(subscription=sub, max_messages=100, metadata=admin, timeout=10)
        got.update({m.message.data: m.ack_id for m in response.received_messages})
        if len(got) == len(sent):
            break
    assert sorted(got) == sorted(sent)
    subscriber.acknowledge(subscription=sub, ack_ids=list(got.values()), metadata=admin)
    channel.close()
    # The cluster's tools read ZooKeeper with the recorded credential.
    status = cluster_status(cluster.zk, auth=cluster.zk_credential)
    assert len(status["nodes"]) == 2, status


def test_up_makes_a_private_credential_and_gives_it_to_every_zookeeper_client(
    cluster: LocalCluster,
) -> None:
    path = Path(cluster.described()["zk_auth_file"])
    assert path == cluster.directory / "zookeeper.credential"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for p in cluster.processes:
        if p.role != "zookeeper":
            assert p.args[p.args.index("--zk-auth-file") + 1] == str(path), p.name
    assert LocalCluster.load(cluster.directory).zk_credential == cluster.zk_credential


def test_every_znode_is_closed_to_a_client_without_the_credential(cluster: LocalCluster) -> None:
    owner, stranger = _kazoo(cluster, authenticated=True), _kazoo(cluster, authenticated=False)
    try:
        znodes = _tree(owner, ROOT)
        assert len(znodes) > 20, znodes  # metadata, ledgers, registry, ownership, routing
        for path in znodes:
            acls, _ = owner.get_acls(path)
            assert [(a.id.scheme, a.perms) for a in acls] == [("digest", 31)], path
            with pytest.raises(NoAuthError):
                stranger.get(path)
        with pytest.raises(NoAuthError):
            stranger.get_children(ROOT)
        with pytest.raises(NoAuthError):
            stranger.create(f"{ROOT}/intruder", b"x")
        with pytest.raises(NoAuthError):
            stranger.set(znodes[-1], b"overwritten")
    finally:
        for client in (owner, stranger):
            client.stop()
            client.close()


def _run_all(commands: list[list[str]]) -> list[tuple[int, str]]:
    """Run pubsubd ``commands`` at once; each one's exit status and stderr."""
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "pubsubd", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    out = []
    for process in started:
        try:
            _, stderr = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        out.append((process.returncode, stderr))
    return out


@pytest.mark.parametrize("credential", ["wrong", "none"])
def test_a_process_without_the_credential_exits_naming_the_flag(
    cluster: LocalCluster, tmp_path: Path, credential: str
) -> None:
    auth: list[str] = []
    if credential == "wrong":
        (tmp_path / "wrong").write_text("pubsubd:not-the-password\n")
        auth = ["--zk-auth-file", str(tmp_path / "wrong")]
    serve_dir = str(tmp_path / "serve")
    done = _run_all(
        [
            ["storage", "--data-dir", str(tmp_path / "disk"), "--zk", cluster.zk, *auth],
            ["serve", "--cluster", cluster.zk, "--data-dir", serve_dir, "--port", "0", *auth],
            ["router", "--cluster", cluster.zk, "--http-port", "-1", *auth],
            ["frontend", "--cluster", cluster.zk, "--port", "0", *auth],
            ["routing", *auth, "show", "--cluster", cluster.zk],
        ]
    )
    why = "wrong user or password" if credential == "wrong" else "does not have"
    for status, stderr in done:
        assert status == 1, stderr[-2000:]
        assert "--zk-auth-file" in stderr and "NoAuth" in stderr, stderr[-2000:]
        assert why in stderr, stderr[-2000:]
        # A refusal, said as one in every role: not "cannot reach" or "cannot register".
        assert "cannot " not in stderr, stderr[-2000:]
        assert stderr.count("error:") == 1, stderr[-2000:]  # said once, no traceback
        assert "Traceback" not in stderr


async def test_a_storage_node_refuses_a_call_without_a_token(cluster: LocalCluster) -> None:
    node = next(p for p in cluster.processes if p.role == "storage")
    assert "--auth-secret-file" in node.args and "--internal-token-file" in node.args
    client = StorageNodeClient(node.address, timeout=5.0)
    try:
        with pytest.raises(StorageNodeError) as refused:
            await client.list_ledgers()
    finally:
        await client.close()
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_a_storage_node_denies_the_admin_token(cluster: LocalCluster) -> None:
    """The admin token ``up --tokens`` hands clients is valid, but not the cluster's own
    identity: a storage node denies it (the writers' internal token passes: the official client
    test above published through them)."""
    assert cluster.auth_dir is not None
    node = next(p for p in cluster.processes if p.role == "storage")
    INTERNAL_TOKEN.configure(cluster.auth_dir / ADMIN_TOKEN_FILE)
    client = StorageNodeClient(node.address, timeout=5.0)
    try:
        with pytest.raises(StorageNodeError) as refused:
            await client.list_ledgers()
    finally:
        await client.close()
        INTERNAL_TOKEN.configure(None)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED, refused.value
