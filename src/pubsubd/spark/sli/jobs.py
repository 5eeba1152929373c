"""The Spark side of the SLI job: read the monitoring events, aggregate them, write Parquet.

``read_events`` turns the JSON messages of ``projects/_pubsubd/topics/sli-events``
(observability/events.py) into typed rows through the ``pubsubd`` connector; the ``*_minutes``
functions aggregate them per minute (percentiles with ``percentile_approx`` and a KLL sketch
per minute), and the ``*rollup`` functions merge the minute sketches into hours or days, so the
quantiles of a longer bucket stay exact merges rather than percentiles of percentiles. ``run``
is the whole job (it hands the collected rows to :mod:`.slo` and :mod:`.report`); ``main`` is
``pubsubd sli-report``'s entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsubd.observability.events import EVENTS_TOPIC
from pubsubd.spark.sli.quantiles import weighted_quantiles, weighted_samples
from pubsubd.spark.sli.report import render_html
from pubsubd.spark.sli.slo import Check, SloConfig, evaluate, load_slo

EVENT_SCHEMA = (
    "kind string, ts double, topic string, count long, failed long, latency_ms array<double>, "
    "method string, code string, subscription string, messages long, "
    "oldest_unacked_age_s double"
)


def read_events(
    spark: Any, endpoint: str, since: str | None = None, topic: str = EVENTS_TOPIC
) -> Any:
    """The monitoring events as typed rows (``ts`` a timestamp, ``minute`` its minute)."""

    reader = spark.read.format("pubsubd").option("endpoint", endpoint).option("topic", topic)
    if since:
        reader = reader.option("startingTimestamp", since)
    return parse_events(reader.load())


def parse_events(raw: Any) -> Any:
    """The connector's rows (batch or stream) as typed events."""
    from pyspark.sql import functions as F

    events = raw.select(F.from_json(F.col("data").cast("string"), EVENT_SCHEMA).alias("e")).select(
        "e.*"
    )
    return events.withColumn("ts", F.timestamp_seconds("ts")).withColumn(
        "minute", F.date_trunc("minute", "ts")
    )


def publish_weights(events: Any, keys: tuple[str, ...] = ("topic", "minute")) -> Any:
    """Volume-weighted publish latency quantiles per ``keys`` (a sample stands for its
    interval's successful calls / samples)."""
    from pyspark.sql import functions as F

    volume = F.col("count") - F.coalesce(F.col("failed"), F.lit(0))
    return weighted_quantiles(weighted_samples(events, "publish", keys, volume), keys)


def delivery_weights(
    events: Any, keys: tuple[str, ...] = ("subscription", "topic", "minute")
) -> Any:
    """Volume-weighted delivery latency quantiles per ``keys`` (weighted by messages acked)."""
    from pyspark.sql import functions as F

    return weighted_quantiles(weighted_samples(events, "delivery", keys, F.col("count")), keys)


def publish_minutes(events: Any) -> Any:
    from pyspark.sql import functions as F

    pub = events.where(F.col("kind") == "publish").select(
        "topic", "minute", "count", "failed", F.posexplode_outer("latency_ms").alias("i", "lat")
    )
    first = F.col("i").isNull() | (F.col("i") == 0)  # count each event's totals once
    return (
        pub.groupBy("topic", "minute")
        .agg(
            F.sum(F.when(first, F.col("count")).otherwise(0)).alias("publishes"),
            F.sum(F.when(first, F.col("failed")).otherwise(0)).alias("failed"),
            F.count("lat").alias("samples"),
            F.percentile_approx("lat", [0.5, 0.95, 0.99], 1000).alias("q"),
            F.kll_sketch_agg_double("lat").alias("latency_sketch"),
        )
        .select(
            "topic",
            "minute",
            F.to_date("minute").alias("date"),
            "publishes",
            "failed",
            (F.col("failed") / F.greatest(F.col("publishes"), F.lit(1))).alias("error_rate"),
            "samples",
            F.col("q")[0].alias("p50_ms"),
            F.col("q")[1].alias("p95_ms"),
            F.col("q")[2].alias("p99_ms"),
            "latency_sketch",
        )
        .join(publish_weights(events), ["topic", "minute"], "left")
    )


def rollup(minutes: Any, unit: str = "hour") -> Any:
    """Merge minute sketches into ``unit`` (hour, day) buckets: the quantiles stay correct."""
    from pyspark.sql import functions as F

    merged = minutes.groupBy("topic", F.date_trunc(unit, "minute").alias(unit)).agg(
        F.sum("publishes").alias("publishes"),
        F.sum("failed").alias("failed"),
        F.kll_merge_agg_double("latency_sketch").alias("latency_sketch"),
    )
    q = F.kll_sketch_get_quantile_double("latency_sketch", F.array(*map(F.lit, (0.5, 0.95, 0.99))))
    return merged.select(
        "topic",
        unit,
        "publishes",
        "failed",
        (F.col("failed") / F.greatest(F.col("publishes"), F.lit(1))).alias("error_rate"),
        q[0].alias("p50_ms"),
        q[1].alias("p95_ms"),
        q[2].alias("p99_ms"),
        "latency_sketch",
    )


def error_minutes(events: Any) -> Any:
    from pyspark.sql import functions as F

    return (
        events.where(F.col("kind") == "error")
        .groupBy("minute", "method", "code")
        .agg(F.sum("count").alias("errors"))
        .withColumn("date", F.to_date("minute"))
    )


def backlog_minutes(events: Any) -> Any:
    from pyspark.sql import functions as F

    return (
        events.where(F.col("kind") == "backlog")
        .groupBy("subscription", "topic", "minute")
        .agg(
            F.max("messages").alias("max_messages"),
            F.max_by("messages", "ts").alias("last_messages"),
            F.max("oldest_unacked_age_s").alias("max_oldest_age_s"),
        )
        .withColumn("date", F.to_date("minute"))
    )


def delivery_minutes(events: Any) -> Any:
    """Per subscription and minute: acks and end-to-end (publish to ack) latency quantiles."""
    from pyspark.sql import functions as F

    acks = events.where(F.col("kind") == "delivery").select(
        "subscription",
        "topic",
        "minute",
        "count",
        F.posexplode_outer("latency_ms").alias("i", "lat"),
    )
    first = F.col("i").isNull() | (F.col("i") == 0)  # count each event's acks once
    q = F.col("q")
    return (
        acks.groupBy("subscription", "topic", "minute")
        .agg(
            F.sum(F.when(first, F.col("count")).otherwise(0)).alias("acked"),
            F.count("lat").alias("samples"),
            F.percentile_approx("lat", [0.5, 0.95, 0.99], 1000).alias("q"),
            F.kll_sketch_agg_double("lat").alias("latency_sketch"),
        )
        .select(
            "subscription",
            "topic",
            "minute",
            F.to_date("minute").alias("date"),
            "acked",
            "samples",
            q[0].alias("p50_ms"),
            q[1].alias("p95_ms"),
            q[2].alias("p99_ms"),
            "latency_sketch",
        )
        .join(delivery_weights(events), ["subscription", "topic", "minute"], "left")
    )


def delivery_rollup(minutes: Any, unit: str = "hour") -> Any:
    """Merge the delivery minute sketches into ``unit`` buckets per subscription."""
    from pyspark.sql import functions as F

    merged = minutes.groupBy("subscription", "topic", F.date_trunc(unit, "minute").alias(unit)).agg(
        F.sum("acked").alias("acked"),
        F.kll_merge_agg_double("latency_sketch").alias("latency_sketch"),
    )
    q = F.kll_sketch_get_quantile_double("latency_sketch", F.array(*map(F.lit, (0.5, 0.95, 0.99))))
    return merged.select(
        "subscription",
        "topic",
        unit,
        "acked",
        q[0].alias("p50_ms"),
        q[1].alias("p95_ms"),
        q[2].alias("p99_ms"),
        "latency_sketch",
    )


@dataclass
class Result:
    out: Path
    checks: list[Check]
    publish_rows: int
    report: Path
    delivery_rows: int = 0


def run(
    spark: Any,
    endpoint: str,
    out: Path,
    slo: SloConfig | None = None,
    since: str | None = None,
    topic: str = EVENTS_TOPIC,
) -> Result:
    """Run the whole job: read, aggregate, write Parquet, evaluate the SLOs, render the report."""
    return refresh(spark, read_events(spark, endpoint, since, topic), out, slo, endpoint)


def refresh(
    spark: Any, events: Any, out: Path, slo: SloConfig | None = None, source: str = ""
) -> Result:
    """Aggregate ``events`` (typed, see :func:`parse_events`), rewrite every table under
    ``out``, evaluate the SLOs and render the report (the batch job, and each micro-batch of
    ``--follow`` over its stored events)."""
    from pyspark.sql import functions as F

    slo = slo or load_slo(None)
    out.mkdir(parents=True, exist_ok=True)
    events = events.cache()
    try:
        pub = publish_minutes(events).cache()
        pub.write.mode("overwrite").partitionBy("date").parquet(str(out / "publish_minute"))
        rollup(pub, "hour").write.mode("overwrite").parquet(str(out / "publish_hour"))
        errs = error_minutes(events)
        errs.write.mode("overwrite").partitionBy("date").parquet(str(out / "errors_minute"))
        back = backlog_minutes(events)
        back.write.mode("overwrite").partitionBy("date").parquet(str(out / "backlog_minute"))
        cols = ["topic", "minute", "publishes", "failed", "p50_ms", "p95_ms", "p99_ms"]
        publish = [r.asDict() for r in pub.select(*cols).orderBy("minute").collect()]
        totals = [
            r.asDict()
            for r in rollup(pub.withColumn("minute", F.lit("1970-01-01").cast("timestamp")), "day")
            .select("topic", "publishes", "failed", "p50_ms", "p95_ms", "p99_ms")
            .join(publish_weights(events, ("topic",)), ["topic"], "left")
            .collect()
        ]
        errors = [r.asDict() for r in errs.orderBy("minute").collect()]
        backlog = [r.asDict() for r in back.orderBy("minute").collect()]
        dlv = delivery_minutes(events).cache()
        dlv.write.mode("overwrite").partitionBy("date").parquet(str(out / "delivery_minute"))
        delivery_rollup(dlv, "hour").write.mode("overwrite").parquet(str(out / "delivery_hour"))
        dcols = ["subscription", "topic", "minute", "acked", "p50_ms", "p95_ms", "p99_ms"]
        delivery = [r.asDict() for r in dlv.select(*dcols).orderBy("minute").collect()]
        delivery_totals = [
            r.asDict()
            for r in delivery_rollup(
                dlv.withColumn("minute", F.lit("1970-01-01").cast("timestamp")), "day"
            )
            .select("subscription", "topic", "acked", "p50_ms", "p95_ms", "p99_ms")
            .join(
                delivery_weights(events, ("subscription", "topic")),
                ["subscription", "topic"],
                "left",
            )
            .collect()
        ]
        dlv.unpersist()
        pub.unpersist()
    finally:
        events.unpersist()
    checks = evaluate(slo, publish, totals, errors, backlog, delivery, delivery_totals)
    spark.createDataFrame(
        [(c.slo, c.scope, c.target, c.actual, c.bad_minutes, c.minutes, c.status) for c in checks],
        "slo string, scope string, target double, actual double, bad_minutes int, "
        "minutes int, status string",
    ).write.mode("overwrite").parquet(str(out / "slo"))
    report = out / "report.html"
    tmp = out / ".report.html.tmp"  # readers of a followed report never see half a page
    tmp.write_text(
        render_html(
            checks, publish, totals, errors, backlog, slo, source, delivery, delivery_totals
        )
    )
    tmp.replace(report)
    return Result(out, checks, len(publish), report, len(delivery))


def spark_session() -> Any:
    """The active Spark session, else a local one for the command line (pubsubd registered)."""
    import os
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need pubsubd + pyarrow
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pubsubd.spark import register

    spark = SparkSession.getActiveSession()
    if spark is None:
        spark = (
            SparkSession.builder.appName("pubsubd-sli-report")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", "16")  # minute rows are few
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main(endpoint: str, out: Path, slo_file: Path | None, since: str | None) -> Result:
    """Entry point of ``pubsubd sli-report``: a local Spark session unless one is active."""
    return run(spark_session(), endpoint, out, load_slo(slo_file), since)
