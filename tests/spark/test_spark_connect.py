"""The pipeline from a Spark Connect client: the data source registered from the client.

A Spark Connect server (``pubsubd.spark.connect_server``, local[2], its Python workers on this
interpreter) on an ephemeral port; the test is only a client (``SparkSession.builder.remote``).
It registers ``format("pubsubd")``, runs the streaming pipeline of tests/spark/cluster_job.py
(source -> Python UDF -> sink) to the end of the topic, then from a second client session, after
more messages, restarts it from the checkpoint: every message in the target exactly once. A batch
read through the same client checks the source side on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.spark.connect_server import ConnectServer
from tests.spark.cluster_job import ROOT, pipeline
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


def client_session(url: str) -> Any:
    from pyspark.sql import SparkSession

    from pubsubd.spark import PubsubdDataSource

    spark = SparkSession.builder.remote(url).getOrCreate()
    assert type(spark).__module__ == "pyspark.sql.connect.session"  # a client, not a JVM
    spark.dataSource.register(PubsubdDataSource)
    return spark


def run_to_end(url: str, endpoint: str, source: str, target: str, checkpoint: str) -> list[int]:
    """One client session: the pipeline with availableNow; rows per micro-batch."""
    spark = client_session(url)
    try:
        query = pipeline(spark, endpoint, source, target, checkpoint)
        query = query.trigger(availableNow=True).start()
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        return [p.numInputRows for p in query.recentProgress if p.numInputRows]
    finally:
        spark.stop()


def test_pipeline_from_a_connect_client(
    connect_server: ConnectServer, server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint = server.endpoint
    source, target = names.topic("sc-src"), names.topic("sc-dst")
    create_topics(endpoint, source, target)
    publish(endpoint, source, 0, 500)
    checkpoint = str(tmp_path / "checkpoint")

    first = run_to_end(connect_server.url, endpoint, source, target, checkpoint)
    assert first == [300, 200]  # maxOffsetsPerTrigger holds under availableNow
    publish(endpoint, source, 500, 250)
    second = run_to_end(connect_server.url, endpoint, source, target, checkpoint)
    assert second == [250]  # resumed from the checkpoint, nothing read twice

    out = sorted(m.data for m in read_topic(endpoint, target))
    assert out == sorted(f"M{i}".encode() for i in range(750)), f"{len(out)} in the target"

    spark = client_session(connect_server.url)
    try:
        backfill = (
            spark.read.format("pubsubd")
            .option("endpoint", endpoint)
            .option("topic", source)
            .option("startingOffsets", json.dumps({source: {"0": 100}}))
            .load()
        )
        offsets = sorted(r["offset"] for r in backfill.select("offset").collect())
        assert offsets == list(range(100, 750))
    finally:
        spark.stop()
