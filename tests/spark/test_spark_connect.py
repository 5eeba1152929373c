"""The pipeline from a Spark Connect client: the data source registered from the client.

A Spark Connect server (``pubsubd.spark.connect_server``, local[2], its Python workers on this
interpreter) on an ephemeral port; the clients (``SparkSession.builder.remote``) are processes
of their own (tests/spark/connect_client.py), as a user's would be.
It registers ``format("pubsubd")``, runs the streaming pipeline of tests/spark/cluster_job.py
(source -> Python UDF -> sink) to the end of the topic, then from a second client session, after
more messages, restarts it from the checkpoint: every message in the target exactly once. A batch
read through the same client checks the source side on its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.spark.connect_server import ConnectServer
from tests.spark.cluster_job import ROOT
from tests.spark.helpers import create_topics, publish, read_topic
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    # The server imports what clients register by reference: pubsubd (installed here) and the
    # UDF's module (tests.spark.cluster_job, from the repository root).
    server = ConnectServer(tmp_path_factory.mktemp("spark-connect"), env={"PYTHONPATH": str(ROOT)})
    with server:
        yield server


def client(url: str, *args: str) -> Any:
    """Run tests/spark/connect_client.py (a Connect client in its own process); its JSON line."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_client", url, *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        timeout=240,
    )
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, out + done.stderr.decode(errors="replace")[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def test_pipeline_from_a_connect_client(
    connect_server: ConnectServer, server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint = server.endpoint
    source, target = names.topic("sc-src"), names.topic("sc-dst")
    create_topics(endpoint, source, target)
    publish(endpoint, source, 0, 500)
    checkpoint = str(tmp_path / "checkpoint")

    url = connect_server.url
    first = client(url, "pipeline", endpoint, source, target, checkpoint)
    assert first == [300, 200]  # maxOffsetsPerTrigger holds under availableNow
    publish(endpoint, source, 500, 250)
    second = client(url, "pipeline", endpoint, source, target, checkpoint)
    assert second == [250]  # a new client session resumed from the checkpoint

    out = sorted(m.data for m in read_topic(endpoint, target))
    assert out == sorted(f"M{i}".encode() for i in range(750)), f"{len(out)} in the target"

    offsets = client(url, "offsets", endpoint, source, json.dumps({source: {"0": 100}}))
    assert offsets == list(range(100, 750))
