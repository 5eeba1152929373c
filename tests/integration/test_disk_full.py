"""A full disk (issue 8): every write answers RESOURCE_EXHAUSTED naming the data directory and the
free space, the server logs one line per episode (not one per request), /healthz, /status and
/metrics show it, and when space returns everything resumes by itself with nothing lost.

The data directory is a small tmpfs the test mounts and fills with a filler file; deleting the
filler frees the space. Where mounting is not allowed, the same test runs with an injected ENOSPC
(tests/support/disk_full_hook); it always runs that way too, so the fallback stays tested.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.api_core import exceptions
from google.api_core.retry import Retry
from google.cloud import pubsub_v1
from google.pubsub_v1 import SubscriberClient as GapicSubscriberClient

from tests.conftest import PROJECT, emulator_host, make_publisher
from tests.support.drain import drain
from tests.support.raw import gapic_publisher, http_get
from tests.support.replay_client import ReplayClient
from tests.support.server import ServerProcess, wait_for
from tests.support.status import wait_trim_passes

pytestmark = [pytest.mark.integration]

HOOK = Path(__file__).resolve().parent.parent / "support" / "disk_full_hook"
FULL_LINE = "pubsubd.storage.disk_space: disk full:"
BACK_LINE = "pubsubd.storage.disk_space: disk space back"
ACK_JOURNAL_FAILURES = 'pubsubd_disk_full_writes_total{what="ack journal"}'
PAGE = b"x" * 5000  # more than the file system's page: never fits in what a file has left


class SmallDisk:
    """A data directory whose file system the test can fill and free."""

    def __init__(self, root: Path, mode: str) -> None:
        self.data_dir = root / "data"
        self.data_dir.mkdir()
        self.mode = mode
        self.mounted = False
        self.flag = root / "disk-full.flag"  # injected mode: present = full
        if mode == "tmpfs":
            mount = ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(self.data_dir)]
            result = subprocess.run(mount, capture_output=True, check=False)
            self.mounted = result.returncode == 0
            if not self.mounted:  # not allowed here: fall back, never skip
                self.mode = "injected"
        self.filler = self.data_dir / "filler"

    @property
    def env(self) -> dict[str, str]:
        if self.mode != "injected":
            return {}
        path = os.environ.get("PYTHONPATH")
        return {
            "PUBSUBD_TEST_DISK_FULL": str(self.flag),
            "PYTHONPATH": str(HOOK) if not path else f"{HOOK}{os.pathsep}{path}",
        }

    def fill(self) -> None:
        if self.mode == "injected":
            self.flag.touch()
            return
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for chunk in (1 << 20, 4096, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * chunk)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)

    def free(self) -> None:
        if self.mode == "injected":
            self.flag.unlink()
        else:
            self.filler.unlink()

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.data_dir)], check=False)


@pytest.fixture(params=["tmpfs", "injected"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SmallDisk]:
    small = SmallDisk(tmp_path, request.param)
    try:
        yield small
    finally:
        small.close()


@pytest.fixture
def server_on(disk: SmallDisk) -> Iterator[ServerProcess]:
    with _environ(disk.env):
        srv = ServerProcess(disk.data_dir).start()
    try:
        yield srv
    finally:
        srv.kill()


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """Extra environment while a server is started (ServerProcess copies os.environ)."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _gapic_subscriber(endpoint: str) -> GapicSubscriberClient:
    with emulator_host(endpoint):
        return GapicSubscriberClient()


def _names(tag: str, n: int) -> list[str]:
    suffix = os.urandom(4).hex()
    return [f"projects/{PROJECT}/{tag}-{suffix}-{i}" for i in range(n)]


def _assert_disk_full(error: BaseException, data_dir: Path) -> None:
    """RESOURCE_EXHAUSTED naming the data directory and its free space (never INTERNAL)."""
    assert isinstance(error, exceptions.ResourceExhausted), repr(error)
    text = str(error.message)
    assert "Disk full" in text and str(data_dir) in text, text
    assert "bytes free" in text, text


def _assert_grpc_disk_full(error: grpc.RpcError, data_dir: Path) -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    text = error.details() or ""
    assert "Disk full" in text and str(data_dir) in text and "bytes free" in text, text


def _metrics(srv: ServerProcess) -> str:
    return http_get(srv, "/metrics")[1].decode()


def _metric(body: str, name: str) -> float:
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_full_disk_answers_resource_exhausted_and_recovers(
    server_on: ServerProcess, disk: SmallDisk
) -> None:
    srv = server_on
    gapic = gapic_publisher(srv.endpoint)
    subscriber = _gapic_subscriber(srv.endpoint)
    topic = f"projects/{PROJECT}/topics/full-{os.urandom(4).hex()}"
    sub = topic.replace("/topics/", "/subscriptions/")
    eod = sub + "-eod"
    gapic.create_topic(name=topic)
    subscriber.create_subscription(name=sub, topic=topic)
    subscriber.create_subscription(
        request={"name": eod, "topic": topic, "enable_exactly_once_delivery": True}
    )

    acknowledged: set[bytes] = set()  # every payload a publish was acknowledged for

    def publish_raw(payload: bytes) -> BaseException | None:
        try:
            gapic.publish(topic=topic, messages=[{"data": payload}], retry=None, timeout=5)
        except exceptions.GoogleAPICallError as e:
            return e
        acknowledged.add(payload)
        return None

    for i in range(20):
        assert publish_raw(b"before-%d" % i) is None
    # An exactly-once lease to ack while the disk is full (its journal is not on disk yet).
    leased = subscriber.pull(subscription=eod, max_messages=1, timeout=10).received_messages
    assert leased
    # Long enough for the client to retry the ack once space is back.
    subscriber.modify_ack_deadline(
        subscription=eod, ack_ids=[leased[0].ack_id], ack_deadline_seconds=600, timeout=10
    )

    disk.fill()

    # Raw gRPC: a small publish may still fit into the last, partly used page of a file, so
    # these are larger than a page; every one is refused, naming the data directory.
    errors: list[BaseException] = []
    for i in range(400):
        error = publish_raw(b"during-%d-" % i + PAGE)
        if error is not None:
            errors.append(error)
            if len(errors) >= 50:
                break
    assert len(errors) >= 50, "publishing never failed on a full disk"
    for error in errors:
        _assert_disk_full(error, disk.data_dir)

    # The official publisher, with a short retry: it retries RESOURCE_EXHAUSTED, then gives up
    # with the server's error (never INTERNAL).
    retry = Retry(initial=0.05, maximum=0.1, multiplier=1.5, timeout=1.0)
    publisher = make_publisher(
        srv.endpoint, publisher_options=pubsub_v1.types.PublisherOptions(retry=retry, timeout=1)
    )
    future = publisher.publish(topic, b"official-during" + PAGE)
    with pytest.raises(exceptions.GoogleAPIError) as official:
        future.result(timeout=15)
    final: BaseException = official.value
    if isinstance(final, exceptions.RetryError) and final.cause is not None:
        final = final.cause
    _assert_disk_full(final, disk.data_dir)

    # Admin writes: the metadata store is full too. (SQLite may fit a few rows into pages its
    # write-ahead log already has; every create is refused once those are used.)
    refused = None
    for name in _names("topics/full-admin", 20):
        try:
            gapic.create_topic(name=name, retry=None, timeout=5)
        except exceptions.GoogleAPICallError as e:
            refused = e
            break
    assert refused is not None, "CreateTopic never failed on a full disk"
    _assert_disk_full(refused, disk.data_dir)
    refused = None
    for name in _names("subscriptions/full-admin", 20):
        try:
            subscriber.create_subscription(name=name, topic=topic, retry=None, timeout=5)
        except exceptions.GoogleAPICallError as e:
            refused = e
            break
    assert refused is not None, "CreateSubscription never failed on a full disk"
    _assert_disk_full(refused, disk.data_dir)

    # The replay API's writes: deduplicated publishes and cursor commits.
    replay = ReplayClient(srv.endpoint)
    dedup_message = {"dedup_id": "during-1", "data": b"dedup-during" + PAGE}
    with pytest.raises(grpc.RpcError) as dedup:
        replay.PublishDeduplicated(topic=topic, messages=[dedup_message])
    _assert_grpc_disk_full(dedup.value, disk.data_dir)
    cursor_error = None
    for name in _names("cursor", 20):
        try:
            replay.CommitCursor(topic=topic, name=name.rsplit("/", 1)[1], offsets={0: 1})
        except grpc.RpcError as e:
            cursor_error = e
            break
    assert cursor_error is not None, "CommitCursor never failed on a full disk"
    _assert_grpc_disk_full(cursor_error, disk.data_dir)

    # Exactly-once acks are durable before they are answered: refused too, before they change
    # anything, so the same ack ID still works when the client retries later.
    with pytest.raises(exceptions.GoogleAPICallError) as eod_ack:
        subscriber.acknowledge(subscription=eod, ack_ids=[leased[0].ack_id], retry=None, timeout=5)
    _assert_disk_full(eod_ack.value, disk.data_dir)

    # Reads go on: pulling works and acks are taken; their journal's background flush fails
    # (counted) until space returns, then catches up by itself.
    pulled = subscriber.pull(subscription=sub, max_messages=5, timeout=10).received_messages
    assert pulled
    acked_during = {m.message.data for m in pulled}
    journal_failures = _metric(_metrics(srv), ACK_JOURNAL_FAILURES)
    subscriber.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in pulled], timeout=10)
    wait_for(
        lambda: _metric(_metrics(srv), ACK_JOURNAL_FAILURES) > journal_failures,
        10,
        "the ack journal's background flush failing",
    )

    # Probes and metrics name the condition; the process is not to be restarted for it.
    status, body = http_get(srv, "/healthz")
    assert status == 200
    assert b"disk full" in body and str(disk.data_dir).encode() in body, body
    assert http_get(srv, "/readyz")[0] == 200
    metrics = _metrics(srv)
    assert _metric(metrics, "pubsubd_disk_full ") == 1.0
    assert _metric(metrics, "pubsubd_disk_full_writes_total") >= len(errors) + 3
    report = json.loads(http_get(srv, "/status")[1])["disk"]
    assert report["full"] is True and report["data_dir"] == str(disk.data_dir)

    # One line for the whole episode, however many requests failed; no tracebacks.
    log = srv.log()
    assert log.count(FULL_LINE) == 1, log
    assert "Traceback" not in log and "INTERNAL" not in log, log

    disk.free()

    # Writes resume by themselves, without a restart.
    for i in range(20):
        assert publish_raw(b"after-%d" % i) is None
    assert publisher.publish(topic, b"official-after").result(timeout=30)
    acknowledged.add(b"official-after")
    gapic.create_topic(name=_names("topics/after", 1)[0], timeout=10)
    assert replay.PublishDeduplicated(topic=topic, messages=[dedup_message]).duplicates == 0
    acknowledged.add(dedup_message["data"])
    replay.CommitCursor(topic=topic, name="after", offsets={0: 1})
    replay.close()
    # The client's retry of the refused exactly-once ack succeeds: its lease was left alone.
    subscriber.acknowledge(subscription=eod, ack_ids=[leased[0].ack_id], retry=None, timeout=10)
    wait_for(lambda: http_get(srv, "/healthz")[1] == b"ok\n", 10, "/healthz ok again")
    assert _metric(_metrics(srv), "pubsubd_disk_full ") == 0.0
    log = srv.log()
    assert log.count(FULL_LINE) == 1 and log.count(BACK_LINE) == 1, log
    back = next(line for line in log.splitlines() if BACK_LINE in line)
    assert "failed writes" in back

    # The acks taken while the disk was full become durable by themselves (the journal is
    # flushed every 50 ms, and by every trim pass): after a kill -9 they stay acked. Two passes
    # at the default interval: a flush already under way has had 2 s to finish.
    wait_trim_passes(srv)
    srv.kill()
    with _environ(disk.env):
        srv.start()

    # Nothing acknowledged was lost: every publish answered OK (before, during, after) is
    # delivered, and nothing acked while the disk was full comes back.
    received = drain(srv.endpoint, sub, acknowledged - acked_during, timeout=30)
    assert acknowledged - acked_during <= received
    assert not (received & acked_during), "acks taken while the disk was full were lost"
    publisher.stop()
