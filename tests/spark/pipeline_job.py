"""A streaming job in its own driver process, for the driver-kill test.

    python -m tests.spark.pipeline_job ENDPOINT SOURCE TARGET OUT CHECKPOINTS

Two queries on one source topic: source -> Parquet (OUT) and source -> upper-cased data -> TARGET
topic (the pubsubd sink). They run until the process is killed. ``start_queries`` is also used by
the test to restart the same queries from their checkpoints.
"""

from __future__ import annotations

import sys
from typing import Any

from tests.spark.session import local_session


def start_queries(
    spark: Any,
    endpoint: str,
    source: str,
    target: str,
    out: str,
    checkpoints: str,
    available_now: bool = False,
) -> list[Any]:
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .load()
    )
    to_files = (
        df.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", f"{checkpoints}/files")
    )
    to_topic = (
        df.select(F.upper(F.col("data").cast("string")).alias("data"), "attributes")
        .writeStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", target)
        .option("checkpointLocation", f"{checkpoints}/topic")
    )
    if available_now:
        # Run to completion one after the other: two queries starting at once in one session
        # can race on the shared local properties while tasks are serialized
        # (java.io.OptionalDataException in task deserialization, seen under load).
        first = to_files.trigger(availableNow=True).start()
        first.awaitTermination(120)
        return [first, to_topic.trigger(availableNow=True).start()]
    return [to_files.start(), to_topic.start()]


def main(argv: list[str]) -> None:
    spark = local_session("pubsubd-pipeline-job")
    queries = start_queries(spark, *argv[:5])
    print("started", flush=True)
    for query in queries:
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"query failed: {query.exception()}")


if __name__ == "__main__":
    main(sys.argv[1:])
