"""A Spark Connect client process for the Connect test (a classic session in the test's own
process would refuse a remote one: SESSION_ALREADY_EXIST).

    python -m tests.spark.connect_client URL pipeline ENDPOINT SOURCE TARGET CHECKPOINT
    python -m tests.spark.connect_client URL offsets ENDPOINT TOPIC STARTING_OFFSETS

Prints one JSON line: the rows of each micro-batch of the pipeline run with availableNow, or the
offsets a batch read returned.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.spark.cluster_job import pipeline


def client_session(url: str) -> Any:
    from pyspark.sql import SparkSession

    from pubsubd.spark import PubsubdDataSource

    spark = SparkSession.builder.remote(url).getOrCreate()
    if type(spark).__module__ != "pyspark.sql.connect.session":
        raise SystemExit(f"not a Spark Connect client session: {type(spark)}")
    spark.dataSource.register(PubsubdDataSource)  # from the client; runs on the server
    return spark


def run_pipeline(spark: Any, endpoint: str, source: str, target: str, checkpoint: str) -> Any:
    query = pipeline(spark, endpoint, source, target, checkpoint).trigger(availableNow=True)
    running = query.start()
    running.awaitTermination(180)
    if running.exception() is not None:
        raise SystemExit(f"query failed: {running.exception()}")
    return [p.numInputRows for p in running.recentProgress if p.numInputRows]


def read_offsets(spark: Any, endpoint: str, topic: str, starting: str) -> Any:
    frame = (
        spark.read.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("startingOffsets", starting)
        .load()
    )
    return sorted(r["offset"] for r in frame.select("offset").collect())


def main(argv: list[str]) -> None:
    url, command, *args = argv
    spark = client_session(url)
    try:
        if command == "pipeline":
            result = run_pipeline(spark, *args)
        elif command == "offsets":
            result = read_offsets(spark, *args)
        else:
            raise SystemExit(f"unknown command {command}")
    finally:
        spark.stop()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
