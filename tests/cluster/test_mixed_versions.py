"""Mixed releases in one cluster (issue 11, part 1: a canary beside the fleet): a router and a
frontend of the previous release (the code at ``PREVIOUS_RELEASE``, taken from this
repository's history) run beside a serving process, a router and a frontend of this release.
Through both frontends the official client creates, publishes and receives; with this
release's router killed the previous release's router leads, and a topic it routes is served
through this release's frontend. The internal protos they share (forwarder registrations,
routing shards and summary, constraints, GiveBack) carry versions; this is the check that
they still agree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.cluster.launcher import LocalCluster
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import running_cluster
from tests.support.drain import drain
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# The last commit of the release before this one (routers, frontends; no forwarder processes).
PREVIOUS_RELEASE = "b324600"
REPO = Path(__file__).resolve().parents[2]
FRONTEND_READY = re.compile(r"pubsubd frontend ready grpc=(\S+) ")
ROUTER_READY = re.compile(r"pubsubd router ready router_id=(\S+) ")


def _previous_release(into: Path) -> Path:
    """The previous release's ``src`` under ``into`` (from git)."""
    try:
        known = subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
            capture_output=True,
        )
    except FileNotFoundError:
        pytest.skip("git is not installed: the previous release cannot be taken from history")
    if known.returncode != 0:
        pytest.skip(f"this checkout has no history back to {PREVIOUS_RELEASE} (a shallow clone)")
    archive = into / "previous.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "-o", str(archive), PREVIOUS_RELEASE, "src"],
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


class OldProcess:
    """A process of the previous release (its ``src`` first on the path), by PID."""

    def __init__(self, src: Path, args: list[str], ready: re.Pattern[str], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pubsubd", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=src.parent,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = ready.search(log.read_text(errors="replace"))
            if found:
                self.ready = found
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"{args[0]} of the previous release did not start:\n{log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _previous_release(tmp_path_factory.mktemp("previous"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("mixed"), routers=1, frontends=1) as c:
        yield c


def test_the_previous_releases_router_and_frontend_work_beside_this_one(
    cluster: LocalCluster, previous: Path, names: Any, tmp_path: Path
) -> None:
    common = ["--cluster", cluster.zk, "--zk-root", "/pubsubd", "--http-port", "0"]
    old_frontend = OldProcess(
        previous,
        ["frontend", *common, "--port", "0", "--frontend-id", "old-frontend", "--zone", "zone-1"],
        FRONTEND_READY,
        tmp_path / "old-frontend.log",
    )
    old_router = OldProcess(
        previous,
        ["router", *common, "--router-id", "old-router", "--zone", "zone-2"],
        ROUTER_READY,
        tmp_path / "old-router.log",
    )
    try:
        old_address, new_address = old_frontend.ready.group(1), cluster.frontends[0]
        # Both frontends, one client: what one creates the other serves.
        endpoint = f"ipv4:{old_address},{new_address}"
        for i, (through, other) in enumerate(
            ((old_address, new_address), (new_address, old_address))
        ):
            pub, sub = make_publisher(through), make_subscriber(other)
            topic, subscription = names.topic(f"mixed-{i}"), names.subscription(f"mixed-{i}")
            pub.create_topic(name=topic)
            sub.create_subscription(name=subscription, topic=topic)
            sent = {f"{through}-{i}".encode() for i in range(50)}
            for f in [pub.publish(topic, data) for data in sent]:
                f.result(timeout=60)
            assert drain(other, subscription, sent, timeout=60) >= sent
            sub.close()
        # This release's router goes; the previous release's leads and routes a new topic,
        # served through this release's frontend.
        cluster.kill("router-1")
        pub, sub = make_publisher(endpoint), make_subscriber(new_address)
        topic, subscription = names.topic("late"), names.subscription("late")
        pub.create_topic(name=topic)
        sub.create_subscription(name=subscription, topic=topic)
        wait_for(
            lambda: "pass" in old_router.log.read_text(errors="replace"), 30, "the old router leads"
        )
        sent = {f"late-{i}".encode() for i in range(50)}
        for f in [pub.publish(topic, data) for data in sent]:
            f.result(timeout=60)
        assert drain(new_address, subscription, sent, timeout=60) >= sent
        sub.close()
    finally:
        old_router.stop()
        old_frontend.stop()
