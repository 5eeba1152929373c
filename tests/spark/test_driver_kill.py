"""SIGKILL the driver mid-stream, restart from the checkpoints: no loss, no duplicates.

The job (tests/spark/pipeline_job.py) runs in its own process with its own SparkSession, writing
one source topic to Parquet and, through the pubsubd sink, to a target topic, while more messages
are published. It is killed (driver, JVM and Python workers) after a few batches, then the same
queries restart from their checkpoints in this test's session and drain the topic.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.helpers import create_topics, publish, read_topic
from tests.spark.pipeline_job import start_queries
from tests.support.server import ServerProcess, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.crash]

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 3000


def start_job(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.pipeline_job", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its JVM and Python workers share its process group
        )


def kill_job(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job's driver together with the JVM and workers it started (its group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def committed(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def test_driver_killed_mid_stream(
    spark: Any, server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint = server.endpoint
    source, target = names.topic("kill-src"), names.topic("kill-dst")
    create_topics(endpoint, source, target)
    publish(endpoint, source, 0, TOTAL // 2)
    out, checkpoints, log = tmp_path / "out", tmp_path / "checkpoints", tmp_path / "job.log"
    args = [endpoint, source, target, str(out), str(checkpoints)]

    def trickle() -> None:  # the second half arrives while the job runs
        for i in range(TOTAL // 2, TOTAL, 100):
            publish(endpoint, source, i, 100)
            time.sleep(0.1)

    began = time.monotonic()
    job = start_job(args, log)
    producer = threading.Thread(target=trickle)
    try:
        wait_for(lambda: log.exists() and "started" in log.read_text(), 90, "the job to start")
        print(f"job started after {time.monotonic() - began:.1f}s")
        producer.start()
        wait_for(
            lambda: committed(checkpoints / "files") >= 2 and committed(checkpoints / "topic") >= 1,
            90,
            "committed batches of both queries",
        )
        assert job.poll() is None, log.read_text()
    finally:
        kill_job(job)
        if producer.ident is not None:  # started
            producer.join(60)
    killed_at = len(read_topic(endpoint, target))
    print(f"killed after {time.monotonic() - began:.1f}s with {killed_at} in the target")
    assert 0 < killed_at < TOTAL

    # Restart both queries from their checkpoints in another driver (this test's session).
    for query in start_queries(spark, *args, available_now=True):
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
    print(f"restarted run done after {time.monotonic() - began:.1f}s")

    rows = spark.read.parquet(str(out)).select("offset", "data").collect()
    offsets = sorted(r["offset"] for r in rows)
    assert offsets == list(range(TOTAL)), f"{len(offsets)} rows, {len(set(offsets))} distinct"
    published = sorted(m.data for m in read_topic(endpoint, target))
    assert len(published) == TOTAL, f"{len(published)} published, {len(set(published))} distinct"
    assert published == sorted(f"M{i}".encode() for i in range(TOTAL))
