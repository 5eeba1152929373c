"""The streaming pipeline against a pubsubd cluster, through kill -9 of a frontend: exactly once.

``pubsubd cluster up`` with two frontends (tests.support.cluster); the connector's ``endpoint``
lists both (``A,B``, which it turns into gRPC's ``ipv4:A,B`` and spreads its calls over). The
query runs on ``local[2]``, where a failed task is not retried, so a call lost with the frontend
would fail the query: source -> upper-cased data, with the source message ID as an attribute ->
the pubsubd sink. Small pages and small publish requests keep calls in flight through both
frontends all the time. While a producer keeps publishing through both frontends, frontend-1 is
killed while a micro-batch is being published. The same query goes on through the other
frontend, and at the end the target topic holds every message of the source topic once (by
message ID) with its data transformed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.cluster.launcher import LocalCluster
from pubsubd.spark.client import ReplayClient
from tests.spark.helpers import create_topics, publish, read_topic
from tests.support.cluster import running_cluster
from tests.support.server import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.crash, pytest.mark.slow]

FIRST = 600  # messages published before the query starts
CHUNK = 40  # then this many every 0.2 s while it runs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("spark-cluster"), routers=1, frontends=2) as c:
        yield c


def batches(checkpoint: Path, log: str) -> set[int]:
    folder = checkpoint / log
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()


def in_flight(checkpoint: Path) -> int | None:
    """The micro-batch planned (in the offsets log) and not committed yet, if any."""
    planned = batches(checkpoint, "offsets")
    last = max(planned, default=None)
    return None if last is None or last in batches(checkpoint, "commits") else last


def start_query(spark: Any, endpoint: str, source: str, target: str, checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .option("minPartitions", "2")
        .option("fetchSize", "20")
        .load()
        .select(
            F.upper(F.col("data").cast("string")).alias("data"),
            F.create_map(F.lit("source_id"), F.col("message_id")).alias("attributes"),
        )
        .writeStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", target)
        .option("publishBatchSize", "10")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def test_pipeline_survives_a_frontend_killed_mid_stream(
    spark: Any, cluster: LocalCluster, names: Any, tmp_path: Path
) -> None:
    assert len(cluster.frontends) == 2
    endpoint = ",".join(cluster.frontends)  # the connector's plain-list form
    client_endpoint = "ipv4:" + endpoint  # the official client's
    source, target = names.topic("cp-src"), names.topic("cp-dst")
    create_topics(client_endpoint, source, target)
    publish(client_endpoint, source, 0, FIRST)
    published = [FIRST]
    checkpoint = tmp_path / "checkpoint"
    stop_producing = threading.Event()

    def produce() -> None:
        while not stop_producing.wait(0.2):
            publish(client_endpoint, source, published[0], CHUNK)
            published[0] += CHUNK

    def target_size() -> int:
        return sum(b.latest for b in probe.topic_bounds(target).values())

    probe = ReplayClient(cluster.frontends[1])
    began = time.monotonic()
    query = start_query(spark, endpoint, source, target, checkpoint)
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: batches(checkpoint, "commits"), 60, "a committed batch")
        print(f"{time.monotonic() - began:.1f}s first batch committed")
        seen: dict[int, int] = {}  # batch -> target size when first seen in flight

        def publishing() -> bool:
            assert query.exception() is None, query.exception()
            batch, size = in_flight(checkpoint), target_size()
            return batch is not None and size > seen.setdefault(batch, size)

        wait_for(publishing, 30, "a micro-batch in flight with part of its output published")
        done_before = len(batches(checkpoint, "commits"))
        cluster.kill("frontend-1")
        print(f"{time.monotonic() - began:.1f}s frontend-1 killed after {done_before} batches")

        def went_on() -> bool:  # the same query, through frontend-2
            assert query.exception() is None, query.exception()
            return len(batches(checkpoint, "commits")) >= done_before + 2

        wait_for(went_on, 60, "two more batches after the kill")
    finally:
        stop_producing.set()
        producer.join(60)
    assert query.isActive and query.exception() is None, query.exception()
    query.processAllAvailable()
    query.stop()
    probe.close()
    print(f"{time.monotonic() - began:.1f}s drained {published[0]} published messages")

    # Exactly once against what the source topic holds (the official client may have stored a
    # publish twice when its frontend died under it; the pipeline must carry both, once each).
    messages = read_topic(cluster.frontends[1], source)
    assert {m.data for m in messages} >= {f"m{i}".encode() for i in range(published[0])}
    out = read_topic(cluster.frontends[1], target)
    carried = Counter(m.attributes["source_id"] for m in out)
    assert sorted(carried.elements()) == sorted(m.message_id for m in messages), (
        f"{len(out)} in the target, {len(carried)} distinct, {len(messages)} in the source, "
        f"repeated: {[k for k, n in carried.items() if n > 1][:5]}"
    )
    data = {m.message_id: m.data for m in messages}
    assert all(m.data == data[m.attributes["source_id"]].upper() for m in out)
