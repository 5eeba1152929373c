"""The pipeline the cluster tests run: pubsubd topic -> Python UDF -> pubsubd topic.

    python -m tests.spark.cluster_job MASTER ENDPOINT SOURCE TARGET CHECKPOINT [--available-now]

A driver of its own on ``MASTER`` (a standalone cluster's ``spark://`` URL): executors in their
own JVMs on the workers, each with its own Python workers. The source is split into two Spark
partitions per micro-batch (``minPartitions``) so that both executors work on every batch, and the
transform is a Python UDF that takes a little time per row, so that a micro-batch lasts long enough
to be killed in the middle. It runs until killed, or with ``--available-now`` drains the source
and exits 0. ``pipeline`` is also what the Spark Connect test starts from its client session.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from tests.spark.session import spark_env

ROOT = Path(__file__).resolve().parents[2]
BATCH = 300  # maxOffsetsPerTrigger
ROW_DELAY_S = 0.002  # per row in the UDF: 150 rows per task, about 0.3 s


def shout(value: bytes | None) -> str:
    """The transform (runs in the executors' Python workers)."""
    time.sleep(ROW_DELAY_S)
    return (value or b"").decode().upper()


def pipeline(spark: Any, endpoint: str, source: str, target: str, checkpoint: str) -> Any:
    """The streaming query's writer, ready for ``.trigger(...)`` and ``.start()``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    to_upper = F.udf(shout, StringType(), useArrow=True)  # explicit: no type-hint inference
    # Rows reach the UDF and the sink in Arrow batches of 10, and the sink publishes every 10
    # rows, so a task's output trickles into the target while it runs: a kill in the middle of
    # a task leaves part of its rows published, and the replay must not publish them again.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    return (
        spark.readStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(BATCH))
        .option("minPartitions", "2")
        .load()
        .select(to_upper("data").alias("data"), "attributes")
        .writeStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", target)
        .option("publishBatchSize", "10")
        .option("checkpointLocation", checkpoint)
    )


def cluster_session(master: str) -> Any:
    """A driver on a standalone cluster: one one-core executor per worker, small memory."""
    spark_env()
    from pyspark.sql import SparkSession

    from pubsubd.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName("pubsubd-cluster-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.executor.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # The executors' Python workers import the UDF's module (tests.spark.cluster_job).
        .config("spark.executorEnv.PYTHONPATH", str(ROOT))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main(argv: list[str]) -> None:
    master, endpoint, source, target, checkpoint = argv[:5]
    spark = cluster_session(master)
    writer = pipeline(spark, endpoint, source, target, checkpoint)
    if "--available-now" in argv:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    print("drained", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
