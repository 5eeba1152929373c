"""The pipeline on a Spark standalone cluster, through three kill -9s: still exactly once.

A master and two one-core workers on loopback (``pubsubd.spark.standalone``); the driver
(tests/spark/cluster_job.py) runs in its own process group, so its executors are separate JVMs
with their own Python workers. While a producer keeps publishing, one scenario kills, each time
in the middle of a micro-batch (planned in the checkpoint's offsets log, not yet committed, and
part of its output already in the target topic):

1. an executor JVM: its tasks run again on the other executor and the worker starts a new one;
2. a worker JVM (its executor exits with it): a replacement worker joins;
3. the driver with its JVM: a new driver restarts the query from the checkpoint and drains it.

Every message published must then be in the target topic exactly once, transformed, and the
server must have dropped replayed rows as duplicates (the kills were not between publishes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pubsubd.spark.client import get_client
from pubsubd.spark.standalone import Daemon, StandaloneCluster, children
from tests.spark.cluster_job import ROOT
from tests.spark.helpers import create_topics, publish, read_topic
from tests.support.server import ServerProcess, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.crash, pytest.mark.slow]

RATE_CHUNK = 20  # messages per publish round, every 0.5 s while the job runs


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), workers=2) as cluster:
        yield cluster


def start_driver(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.cluster_job", *args],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the driver's JVM and Python runner share its group
        )


def batch_files(checkpoint: Path, log: str) -> set[int]:
    folder = checkpoint / log
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()


def in_flight(checkpoint: Path) -> int | None:
    """The micro-batch planned but not committed yet, if there is one."""
    planned = batch_files(checkpoint, "offsets")
    if not planned:
        return None
    last = max(planned)
    return None if last in batch_files(checkpoint, "commits") else last


def committed(checkpoint: Path) -> int:
    return len(batch_files(checkpoint, "commits"))


def executors(worker: Daemon) -> list[int]:
    return [pid for pid in children(worker.pid) if b"CoarseGrainedExecutorBackend" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def wait_mid_batch(
    checkpoint: Path, job: subprocess.Popen[bytes], log: Path, endpoint: str, target: str
) -> int:
    """Until a micro-batch is in flight and part of its output is already in the target."""
    client = get_client(endpoint)
    seen: dict[int, int] = {}  # batch -> target size when first seen in flight
    found: list[int] = []

    def mid_batch() -> bool:
        assert job.poll() is None, log.read_text()
        batch = in_flight(checkpoint)
        if batch is None or batch == 0:
            return False
        size = sum(b.latest for b in client.topic_bounds(target).values())
        if size > seen.setdefault(batch, size) and in_flight(checkpoint) == batch:
            found.append(batch)
            return True
        return False

    wait_for(mid_batch, 90, "a micro-batch in flight with part of its output published")
    return found[-1]


def wait_progress(checkpoint: Path, job: subprocess.Popen[bytes], log: Path, batch: int) -> None:
    """Until ``batch`` (the one killed in flight) is committed."""

    def done() -> bool:
        assert job.poll() is None, log.read_text()
        return batch in batch_files(checkpoint, "commits")

    wait_for(done, 120, f"micro-batch {batch} committed")


def test_exactly_once_across_executor_worker_and_driver_kills(
    standalone: StandaloneCluster, server: ServerProcess, names: object, tmp_path: Path
) -> None:
    endpoint = server.endpoint
    source, target = names.topic("cl-src"), names.topic("cl-dst")  # type: ignore[attr-defined]
    create_topics(endpoint, source, target)
    publish(endpoint, source, 0, 400)
    published = [400]
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    args = [standalone.master_url, endpoint, source, target, str(checkpoint)]
    stop_producing = threading.Event()

    def produce() -> None:  # keeps the stream busy through all three kills
        while not stop_producing.wait(0.5):
            publish(endpoint, source, published[0], RATE_CHUNK)
            published[0] += RATE_CHUNK

    began = time.monotonic()
    steps: list[str] = []

    def step(what: str) -> None:
        steps.append(f"{time.monotonic() - began:5.1f}s {what}")
        print(steps[-1], flush=True)

    driver = start_driver(args, log)
    producer = threading.Thread(target=produce)
    try:
        wait_for(lambda: "started" in log.read_text(), 120, "the driver to start")
        producer.start()
        step("driver started")

        wait_for(
            lambda: all(executors(w) for w in standalone.live_workers()),
            90,
            "an executor on each worker",
        )

        # 1. kill -9 an executor JVM in the middle of a micro-batch.
        batch = wait_mid_batch(checkpoint, driver, log, endpoint, target)
        victims = executors(standalone.live_workers()[0])
        os.kill(victims[0], signal.SIGKILL)
        step(f"executor {victims[0]} killed in batch {batch}")
        wait_progress(checkpoint, driver, log, batch)
        step("recovered")

        # 2. kill -9 a worker JVM in the middle of a micro-batch; a new worker replaces it.
        batch = wait_mid_batch(checkpoint, driver, log, endpoint, target)
        worker = standalone.live_workers()[-1]  # not the one whose executor was killed
        wait_for(lambda: executors(worker), 60, f"an executor on {worker.name}")
        worker.kill()
        step(f"{worker.name} killed in batch {batch}")
        standalone.start_worker(wait=False)
        wait_progress(checkpoint, driver, log, batch)
        step("recovered")

        # 3. kill -9 the driver (with its JVM) in the middle of a micro-batch.
        batch = wait_mid_batch(checkpoint, driver, log, endpoint, target)
        os.killpg(driver.pid, signal.SIGKILL)
        step(f"driver killed in batch {batch}")
    finally:
        stop_producing.set()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(10)
        if producer.ident is not None:
            producer.join(60)
    total = published[0]
    before = len(read_topic(endpoint, target))
    assert 0 < before < total

    # A new driver resumes from the checkpoint and drains what is left.
    restart_log = tmp_path / "restart.log"
    restarted = start_driver([*args, "--available-now"], restart_log)
    try:
        wait_for(lambda: "started" in restart_log.read_text(), 120, "the new driver to start")
        step("new driver started")
        assert restarted.wait(240) == 0, restart_log.read_text()
    finally:
        if restarted.poll() is None:
            os.killpg(restarted.pid, signal.SIGKILL)
    step(f"restarted driver drained {total} messages ({committed(checkpoint)} batches)")

    # Each kill came after part of its micro-batch was published: the replayed rows came again
    # with the same dedup IDs (at least those of the batch the driver died in) and were dropped.
    metrics = httpx.get(f"http://{server.host}:{server.http_port}/metrics", timeout=10).text
    dropped = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("pubsubd_dedup_duplicates_total")
    )
    step(f"the server dropped {dropped:.0f} replayed rows")
    assert dropped > 0

    out = sorted(m.data for m in read_topic(endpoint, target))
    assert len(out) == total, f"{len(out)} in the target, {len(set(out))} distinct, of {total}"
    assert out == sorted(f"M{i}".encode() for i in range(total))
