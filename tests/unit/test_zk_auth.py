"""ZooKeeper digest authentication (coordination/credentials.py, zk.Coordinator's ``auth``):
every znode a coordinator with a credential creates is that identity's only, a plain kazoo
client can neither read nor create under them, and a coordinator without the credential or
with a wrong password is refused at ``start`` with an error naming the flag."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from pubsubd.coordination.credentials import DigestCredential, load_credential, write_credential
from pubsubd.coordination.ensemble import Ensemble
from pubsubd.coordination.errors import AccessDenied, CoordinationUnavailable, startup_failure
from pubsubd.coordination.zk import Coordinator, Create
from pubsubd.storage.metadata import TopicRecord
from pubsubd.storage.zk_metadata import ZooKeeperMetadataStore

pytest_plugins = ["tests.support.zookeeper"]
pytestmark = pytest.mark.unit

CREDENTIAL = DigestCredential("pubsubd", "s3cret")


# --- pure: the credential file ----------------------------------------------------------------


def test_a_refusal_at_start_up_is_named_a_refusal_not_unreachability() -> None:
    denied = AccessDenied("ZooKeeper refused access to /pubsubd (NoAuth): ... --zk-auth-file")
    wrapped = RuntimeError("registration failed")
    wrapped.__cause__ = denied
    for error in (denied, wrapped):
        assert startup_failure("reach ZooKeeper at h:1", error) == str(denied)
    down = CoordinationUnavailable("connection lost")
    assert startup_failure("reach ZooKeeper at h:1", down) == (
        "cannot reach ZooKeeper at h:1: connection lost"
    )


def test_credential_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "zk.credential"
    made = write_credential(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_credential(path) == made
    assert write_credential(path) == made  # kept, not replaced: the znodes' ACLs name it
    assert made.password not in repr(made)


@pytest.mark.parametrize("text", ["", "no-colon", ":password", "user:", "a:b\nc:d"])
def test_malformed_credential_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "zk.credential"
    path.write_text(text)
    with pytest.raises(ValueError, match="user:password"):
        load_credential(path)


def test_missing_credential_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="credential file"):
        load_credential(tmp_path / "missing")


# --- against ZooKeeper ------------------------------------------------------------------------


@pytest.fixture
def plain(zookeeper: Ensemble) -> Iterator[KazooClient]:
    """A kazoo client without any credential."""
    client = KazooClient(hosts=zookeeper.connect_string)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


async def test_znodes_created_with_a_credential_are_closed_to_others(
    zookeeper: Ensemble, zk_root: str, plain: KazooClient
) -> None:
    coordinator = Coordinator(zookeeper.connect_string, zk_root, auth=CREDENTIAL)
    await coordinator.start()
    try:
        await coordinator.create(f"{zk_root}/a/b", b"data")  # parents made on the way
        await coordinator.commit([Create(f"{zk_root}/t", b"in a transaction")])
        data, _ = await coordinator.get(f"{zk_root}/a/b")  # its own identity reads them
    finally:
        await coordinator.stop()
    assert data == b"data"
    admin = KazooClient(hosts=zookeeper.connect_string, auth_data=[("digest", CREDENTIAL.auth)])
    admin.start(timeout=15)
    try:
        for path in (zk_root, f"{zk_root}/a", f"{zk_root}/a/b", f"{zk_root}/t"):
            with pytest.raises(NoAuthError):
                plain.get(path)
            with pytest.raises(NoAuthError):
                plain.get_acls(path)
            acls, _ = admin.get_acls(path)
            assert [(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acls] == [
                ("digest", "pubsubd", 31)  # every right, for that identity only
            ], path
    finally:
        admin.stop()
        admin.close()
    with pytest.raises(NoAuthError):
        plain.get_children(zk_root)
    with pytest.raises(NoAuthError):
        plain.create(f"{zk_root}/intruder", b"x")
    with pytest.raises(NoAuthError):
        plain.set(f"{zk_root}/a/b", b"overwritten")


async def test_a_coordinator_without_the_credential_is_refused_at_start(
    zookeeper: Ensemble, zk_root: str
) -> None:
    owner = Coordinator(zookeeper.connect_string, zk_root, auth=CREDENTIAL)
    await owner.start()
    try:
        stranger = Coordinator(zookeeper.connect_string, zk_root, auth=None)
        with pytest.raises(AccessDenied, match="--zk-auth-file") as refused:
            await stranger.start()
        assert "does not have" in str(refused.value)
        await stranger.stop()
        wrong = Coordinator(
            zookeeper.connect_string, zk_root, auth=DigestCredential("pubsubd", "guess")
        )
        with pytest.raises(AccessDenied, match="wrong user or password") as refused:
            await wrong.start()
        assert "--zk-auth-file" in str(refused.value)
        await wrong.stop()
    finally:
        await owner.stop()


def test_blocking_start_is_refused_too(zookeeper: Ensemble, zk_root: str) -> None:
    store = ZooKeeperMetadataStore.connect(
        zookeeper.connect_string, zk_root, session_timeout=4.0, auth=CREDENTIAL
    )
    try:
        store.put_topic(TopicRecord(name="projects/p/topics/t", uid="u1", body=b""))
    finally:
        store.close()
    with pytest.raises(AccessDenied, match="wrong user or password"):
        ZooKeeperMetadataStore.connect(
            zookeeper.connect_string,
            zk_root,
            session_timeout=4.0,
            auth=DigestCredential("pubsubd", "guess"),
        )
    again = ZooKeeperMetadataStore.connect(
        zookeeper.connect_string, zk_root, session_timeout=4.0, auth=CREDENTIAL
    )
    try:
        assert [t.uid for t in again.load_topics()] == ["u1"]
    finally:
        again.close()


async def test_an_open_root_is_only_warned_about(
    zookeeper: Ensemble, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A root created without a credential stays open (ACLs are per znode); a process with
    one says so at start and protects what it creates."""
    first = Coordinator(zookeeper.connect_string, zk_root, auth=None)
    await first.start()
    await first.stop()
    coordinator = Coordinator(zookeeper.connect_string, zk_root, auth=CREDENTIAL)
    await coordinator.start()
    try:
        await coordinator.create(f"{zk_root}/new")
    finally:
        await coordinator.stop()
    assert "created without a credential" in caplog.text
