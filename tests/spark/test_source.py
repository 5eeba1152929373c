"""Streaming and batch reads of pubsubd topics through the pubsubd Spark format (local[2])."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest

from pubsubd.spark import offsets as off
from pubsubd.spark.client import ReplayClient
from tests.spark.helpers import create_topics, publish
from tests.support.clients import instant_between_publishes
from tests.support.server import ServerProcess

pytestmark = pytest.mark.spark


def stream(spark: Any, endpoint: str, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("pubsubd").option("endpoint", endpoint).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(df: Any, out: Path, checkpoint: Path) -> list[int]:
    """Run to the end of the backlog into Parquet; the rows of each micro-batch."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_stream_exactly_once_across_restart(
    spark: Any, shared_server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint, topic = shared_server.endpoint, names.topic("src")
    create_topics(endpoint, topic)
    publish(endpoint, topic, 0, 1000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "300",
        "subscription": "etl",
    }

    batches = run_available_now(stream(spark, endpoint, topic, **options), out, checkpoint)
    assert batches == [300, 300, 300, 100]  # admission control under availableNow
    offsets = json.loads((checkpoint / "offsets" / "3").read_text().splitlines()[-1])
    assert offsets[topic] == {"0": 1000}  # Kafka's JSON form, in Spark's checkpoint
    assert offsets[off.SPLIT_KEY] == {"minPartitions": 0, "maxOffsetsPerPartition": 0}

    publish(endpoint, topic, 1000, 500)
    batches = run_available_now(stream(spark, endpoint, topic, **options), out, checkpoint)
    assert batches == [300, 200]

    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 1500
    assert sorted(r["offset"] for r in rows) == list(range(1500))
    assert sorted(r["data"] for r in rows) == sorted(f"m{i}".encode() for i in range(1500))
    first = min(rows, key=lambda r: r["offset"])
    assert first["topic"] == topic and first["partition"] == 0 and first["message_id"] == "0"
    # The official publisher sends batches concurrently: m0 need not be at offset 0, but every
    # row carries its own message's attributes.
    assert all(r["attributes"] == {"seq": r["data"].decode()[1:]} for r in rows)
    assert first["ordering_key"] is None
    assert isinstance(first["publish_time"], dt.datetime)
    # The cursor lags Spark by one batch (commit runs when the next batch is planned), so after
    # the second run it is at the end of the first run, never ahead of the checkpoint.
    cursor = ReplayClient(endpoint).get_cursor(topic, "etl")
    assert 1000 <= cursor[0] <= 1500


def test_stream_starts_at_latest_by_default(
    spark: Any, shared_server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint, topic = shared_server.endpoint, names.topic("latest")
    create_topics(endpoint, topic)
    publish(endpoint, topic, 0, 50)
    query = (
        stream(spark, endpoint, topic)
        .writeStream.format("memory")
        .queryName("latest_default")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
        publish(endpoint, topic, 50, 20)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            query.processAllAvailable()
            if spark.sql("select count(*) from latest_default").first()[0] >= 20:
                break
            time.sleep(0.2)
        offsets = sorted(r[0] for r in spark.sql("select offset from latest_default").collect())
        assert offsets == list(range(50, 70))
    finally:
        query.stop()


def batch(spark: Any, endpoint: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("pubsubd").option("endpoint", endpoint).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_by_offsets_and_time(
    spark: Any, shared_server: ServerProcess, names: Any
) -> None:
    endpoint, topic = shared_server.endpoint, names.topic("batch")
    create_topics(endpoint, topic)
    publish(endpoint, topic, 0, 100)
    middle = instant_between_publishes()
    publish(endpoint, topic, 100, 100)
    after = instant_between_publishes()
    publish(endpoint, topic, 200, 50)

    everything = batch(spark, endpoint, topic)
    assert everything.count() == 250

    short = topic.rsplit("/", 1)[1]
    by_offsets = batch(
        spark,
        endpoint,
        topic,
        startingOffsets=json.dumps({short: {"0": 10}}),
        endingOffsets=json.dumps({short: {"0": 20}}),
    )
    assert sorted(r["offset"] for r in by_offsets.collect()) == list(range(10, 20))

    by_time = batch(
        spark,
        endpoint,
        topic,
        startingTimestamp=str(int(middle * 1000)),
        endingTimestamp=dt.datetime.fromtimestamp(after, dt.UTC).isoformat(),
    )
    rows = by_time.collect()
    assert sorted(r["offset"] for r in rows) == list(range(100, 200))
    assert {r["data"] for r in rows} == {f"m{i}".encode() for i in range(100, 200)}

    split = batch(spark, endpoint, topic, minPartitions="4")
    assert split.rdd.getNumPartitions() == 4
    assert split.select("offset").distinct().count() == 250


def test_user_schema_reads_only_its_columns(
    spark: Any, shared_server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint, topic = shared_server.endpoint, names.topic("columns")
    create_topics(endpoint, topic)
    publish(endpoint, topic, 0, 120)
    reader = spark.read.format("pubsubd").option("endpoint", endpoint).option("topic", topic)
    full = {r["offset"]: r for r in reader.load().collect()}
    assert len(full) == 120

    picked = reader.schema("data binary, offset long, attributes map<string,string>")
    df = picked.option("minPartitions", "2").load()
    assert df.columns == ["data", "offset", "attributes"]
    rows = df.collect()
    assert sorted(r["offset"] for r in rows) == list(range(120))
    for r in rows:
        assert (r["data"], r["attributes"]) == (
            full[r["offset"]]["data"],
            full[r["offset"]]["attributes"],
        )

    # The same selection from a stream, with a checkpoint: same rows, exactly once.
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    streamed = (
        spark.readStream.format("pubsubd")
        .schema("offset long, message_id string")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "50")
        .load()
    )
    assert run_available_now(streamed, out, checkpoint) == [50, 50, 20]
    got = spark.read.parquet(str(out)).collect()
    assert sorted((r["offset"], r["message_id"]) for r in got) == sorted(
        (o, full[o]["message_id"]) for o in full
    )

    with pytest.raises(Exception, match="no column 'value'"):
        reader.schema("value binary").load().collect()


def test_fail_on_data_loss(spark: Any, shared_server: ServerProcess, names: Any) -> None:
    endpoint, topic = shared_server.endpoint, names.topic("loss")
    create_topics(endpoint, topic)
    publish(endpoint, topic, 0, 10)
    beyond = json.dumps({topic: {"0": 50}})
    with pytest.raises(Exception, match="beyond the latest"):
        stream_query = (
            stream(spark, endpoint, topic, startingOffsets=beyond)
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .start()
        )
        stream_query.awaitTermination(60)


def test_max_bytes_per_trigger_bounds_batches(
    spark: Any, shared_server: ServerProcess, names: Any, tmp_path: Path
) -> None:
    endpoint, topic = shared_server.endpoint, names.topic("bytes")
    create_topics(endpoint, topic)
    publish(endpoint, topic, 0, 300)  # about 10 bytes each (data + the seq attribute)
    df = stream(spark, endpoint, topic, startingOffsets="earliest", maxBytesPerTrigger="1200")
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(batches) == 300
    assert len(batches) >= 2 and max(batches) <= 200, batches
