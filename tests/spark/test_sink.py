"""The pubsubd sink: dedup IDs make a replayed micro-batch or a re-run write publish once."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from pubsubd.spark.client import ReplayClient
from tests.spark.helpers import create_topics, publish, read_topic
from tests.support.server import ServerProcess

pytestmark = pytest.mark.spark


def pipeline(spark: Any, endpoint: str, source: str, target: str, checkpoint: Path) -> list[int]:
    """source topic -> upper-case data, keep attributes -> target topic, to the end of the backlog;
    returns the rows of each micro-batch."""
    df = (
        spark.readStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "200")
        .load()
        .select(F.upper(F.col("data").cast("string")).alias("data"), "attributes")
    )
    query = (
        df.writeStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", target)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def assert_exactly(endpoint: str, target: str, count: int) -> None:
    messages = read_topic(endpoint, target)
    data = sorted(m.data for m in messages)
    assert len(data) == count, f"{len(data)} messages in the target, {len(set(data))} distinct"
    assert data == sorted(f"M{i}".encode() for i in range(count))
    assert all(m.attributes["seq"] == m.data.decode()[1:] for m in messages)


def test_replayed_batches_publish_nothing_twice(
    spark: Any, shared_server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint = shared_server.endpoint
    source, target = names.topic("sink-src"), names.topic("sink-dst")
    create_topics(endpoint, source, target)
    publish(endpoint, source, 0, 600)
    checkpoint = tmp_path / "checkpoint"

    assert pipeline(spark, endpoint, source, target, checkpoint) == [200, 200, 200]
    assert_exactly(endpoint, target, 600)
    older = tmp_path / "older"
    shutil.copytree(checkpoint, older)

    publish(endpoint, source, 600, 400)
    assert pipeline(spark, endpoint, source, target, checkpoint) == [200, 200]
    assert_exactly(endpoint, target, 1000)

    # A crash after planning a batch and before committing it: drop the last commit, so the
    # restarted query replays that batch with the same query ID, batch ID and rows.
    (checkpoint / "commits" / "4").unlink()
    (checkpoint / "commits" / ".4.crc").unlink(missing_ok=True)
    assert pipeline(spark, endpoint, source, target, checkpoint) == [200]
    assert_exactly(endpoint, target, 1000)

    # The older checkpoint copy replays batches 3 and 4 again.
    assert pipeline(spark, endpoint, source, target, older) == [200, 200]
    assert_exactly(endpoint, target, 1000)


def test_batch_write_with_write_id_is_idempotent(
    spark: Any, shared_server: ServerProcess, names: Any
) -> None:
    endpoint, target = shared_server.endpoint, names.topic("batch-dst")
    create_topics(endpoint, target)
    rows = [(f"M{i}", {"seq": str(i)}, f"k{i % 3}") for i in range(300)]
    df = spark.createDataFrame(
        rows, "data string, attributes map<string,string>, ordering_key string"
    ).repartition(3)
    df = df.sortWithinPartitions("data")  # same rows in the same order on every run
    for _ in range(2):
        (
            df.write.format("pubsubd")
            .option("endpoint", endpoint)
            .option("topic", target)
            .option("writeId", "backfill-2024-01")
            .mode("append")
            .save()
        )
    assert_exactly(endpoint, target, 300)
    keys = {m.ordering_key for m in read_topic(endpoint, target)}
    assert keys == {"k0", "k1", "k2"}


def test_sink_rejects_frames_without_data(spark: Any, shared_server: ServerProcess) -> None:
    df = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(Exception, match="needs a column data"):
        (
            df.write.format("pubsubd")
            .option("endpoint", shared_server.endpoint)
            .option("topic", "projects/test-project/topics/never")
            .mode("append")
            .save()
        )


def test_subscription_cursor_follows_the_query(
    spark: Any, shared_server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint, topic = shared_server.endpoint, names.topic("cursor")
    create_topics(endpoint, topic)
    publish(endpoint, topic, 0, 100)
    query = (
        spark.readStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("subscription", "dashboard")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
        # commit(end) of the last batch runs when the next batch is planned: publish once more.
        publish(endpoint, topic, 100, 1)
        query.processAllAvailable()
        client = ReplayClient(endpoint)
        assert client.get_cursor(topic, "dashboard")[0] >= 100
    finally:
        query.stop()
