"""``pubsubd sli-report``: the SLI analytics job over the server's monitoring events.

Reads ``projects/_pubsubd/topics/sli-events`` (observability/events.py) through the ``pubsubd``
connector in batch, and writes under ``--out``:

* ``publish_minute/`` (Parquet, partitioned by ``date``): per topic and minute, publish calls,
  failures, error rate, p50/p95/p99 latency (``percentile_approx``) and ``latency_sketch``, a KLL
  sketch (``kll_sketch_agg_double``) that merges exactly into hourly or daily figures;
* ``publish_hour/``: the hourly roll-up, built by merging the minute sketches
  (``kll_merge_agg_double`` + ``kll_sketch_get_quantile_double``), never from percentiles;
* ``errors_minute/``: errors per minute, RPC method and gRPC code;
* ``backlog_minute/``: per subscription and minute, max and last backlog and oldest unacked age;
* ``delivery_minute/`` (partitioned by ``date``): per subscription (and its topic) and minute,
  messages acked and p50/p95/p99 end-to-end delivery latency (publish time to ack) with its KLL
  sketch; ``delivery_hour/``: the hourly roll-up from merged sketches;
* ``slo/``: one row per SLO check with PASS or FAIL;
* ``report.html``: one self-contained page (inline SVG, no scripts): the verdicts first, then
  p99 publish latency, p99 delivery latency, error rate and backlog age over time against their
  targets.

SLO targets default to :data:`DEFAULT_SLO`; ``--slo FILE`` (TOML or JSON) overrides them,
globally at the top level and per topic under ``[topics."projects/p/topics/t"]``.
"""

from __future__ import annotations

import html
import json
import math
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pubsubd.observability.events import EVENTS_TOPIC

# Targets: publish latency (ms, of the whole window), publish error rate (fraction), backlog
# oldest unacked age (s, the worst minute), end-to-end delivery latency (ms, publish time to ack,
# per subscription over the whole window; it includes the subscriber's own processing time).
DEFAULT_SLO: dict[str, float] = {
    "publish_p99_ms": 100.0,
    "publish_p95_ms": 50.0,
    "error_rate": 0.01,
    "backlog_oldest_age_s": 600.0,
    "delivery_p99_ms": 5000.0,
    "delivery_p95_ms": 1000.0,
}

EVENT_SCHEMA = (
    "kind string, ts double, topic string, count long, failed long, latency_ms array<double>, "
    "method string, code string, subscription string, messages long, "
    "oldest_unacked_age_s double"
)


@dataclass(frozen=True)
class SloConfig:
    default: dict[str, float]
    topics: dict[str, dict[str, float]]

    def target(self, name: str, topic: str | None = None) -> float:
        if topic is not None and name in self.topics.get(topic, {}):
            return self.topics[topic][name]
        return self.default[name]


def load_slo(path: Path | None) -> SloConfig:
    """DEFAULT_SLO overridden by a TOML or JSON file (unknown keys are an error)."""
    if path is None:
        return SloConfig(dict(DEFAULT_SLO), {})
    text = path.read_text()
    raw: dict[str, Any] = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    topics_raw = raw.pop("topics", {})

    def clean(d: dict[str, Any], where: str) -> dict[str, float]:
        unknown = set(d) - set(DEFAULT_SLO)
        if unknown:
            raise ValueError(f"{path}: unknown SLO keys {sorted(unknown)} in {where}")
        return {k: float(v) for k, v in d.items()}

    return SloConfig(
        {**DEFAULT_SLO, **clean(raw, "the top level")},
        {t: clean(v, t) for t, v in topics_raw.items()},
    )


# --- the Spark job -----------------------------------------------------------------------------


def read_events(
    spark: Any, endpoint: str, since: str | None = None, topic: str = EVENTS_TOPIC
) -> Any:
    """The monitoring events as typed rows (``ts`` a timestamp, ``minute`` its minute)."""
    from pyspark.sql import functions as F

    reader = spark.read.format("pubsubd").option("endpoint", endpoint).option("topic", topic)
    if since:
        reader = reader.option("startingTimestamp", since)
    raw = reader.load()
    events = raw.select(F.from_json(F.col("data").cast("string"), EVENT_SCHEMA).alias("e")).select(
        "e.*"
    )
    return events.withColumn("ts", F.timestamp_seconds("ts")).withColumn(
        "minute", F.date_trunc("minute", "ts")
    )


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


@dataclass(frozen=True)
class Check:
    slo: str
    scope: str
    target: float
    actual: float
    bad_minutes: int
    minutes: int

    @property
    def status(self) -> str:
        return "PASS" if self.actual <= self.target else "FAIL"


def evaluate(
    slo: SloConfig,
    publish: list[Any],
    totals: list[Any],
    errors: list[Any],
    backlog: list[Any],
    delivery: list[Any] | None = None,
    delivery_totals: list[Any] | None = None,
) -> list[Check]:
    """SLO verdicts. Latency: the topic's quantile over the whole window (merged sketches).
    Error rate: errors / (successful publishes + errors), all RPCs, whole window. Backlog: the
    worst minute per subscription. Delivery latency: the subscription's quantile over the whole
    window (merged sketches), against its topic's target. ``bad_minutes`` counts the minutes over
    the target."""
    checks: list[Check] = []
    by_topic: dict[str, list[Any]] = {}
    for r in publish:
        by_topic.setdefault(r["topic"], []).append(r)
    for t in totals:
        rows = by_topic.get(t["topic"], [])
        for key, col in (("publish_p95_ms", "p95_ms"), ("publish_p99_ms", "p99_ms")):
            target = slo.target(key, t["topic"])
            if t[col] is None:
                continue
            bad = sum(1 for r in rows if r[col] is not None and r[col] > target)
            checks.append(Check(key, t["topic"], target, float(t[col]), bad, len(rows)))
    ok_by_minute: dict[Any, int] = {}
    for r in publish:
        ok_by_minute[r["minute"]] = ok_by_minute.get(r["minute"], 0) + r["publishes"] - r["failed"]
    err_by_minute: dict[Any, int] = {}
    for r in errors:
        err_by_minute[r["minute"]] = err_by_minute.get(r["minute"], 0) + r["errors"]
    minutes = set(ok_by_minute) | set(err_by_minute)
    if minutes:
        target = slo.target("error_rate")
        ok, err = sum(ok_by_minute.values()), sum(err_by_minute.values())
        bad = sum(
            1 for m in minutes if _rate(err_by_minute.get(m, 0), ok_by_minute.get(m, 0)) > target
        )
        checks.append(Check("error_rate", "all RPCs", target, _rate(err, ok), bad, len(minutes)))
    by_sub: dict[str, list[Any]] = {}
    for r in backlog:
        by_sub.setdefault(r["subscription"], []).append(r)
    for sub, rows in sorted(by_sub.items()):
        target = slo.target("backlog_oldest_age_s", rows[0]["topic"])
        worst = max(float(r["max_oldest_age_s"] or 0.0) for r in rows)
        bad = sum(1 for r in rows if (r["max_oldest_age_s"] or 0.0) > target)
        checks.append(Check("backlog_oldest_age_s", sub, target, worst, bad, len(rows)))
    by_delivery: dict[str, list[Any]] = {}
    for r in delivery or []:
        by_delivery.setdefault(r["subscription"], []).append(r)
    for t in sorted(delivery_totals or [], key=lambda t: str(t["subscription"])):
        rows = by_delivery.get(t["subscription"], [])
        for key, col in (("delivery_p95_ms", "p95_ms"), ("delivery_p99_ms", "p99_ms")):
            target = slo.target(key, t["topic"])
            if t[col] is None:
                continue
            bad = sum(1 for r in rows if r[col] is not None and r[col] > target)
            checks.append(Check(key, t["subscription"], target, float(t[col]), bad, len(rows)))
    return checks


def _rate(errors: int, ok: int) -> float:
    return errors / (errors + ok) if errors + ok else 0.0


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
    from pyspark.sql import functions as F

    slo = slo or load_slo(None)
    out.mkdir(parents=True, exist_ok=True)
    events = read_events(spark, endpoint, since, topic).cache()
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
    report.write_text(
        render_html(
            checks, publish, totals, errors, backlog, slo, endpoint, delivery, delivery_totals
        )
    )
    return Result(out, checks, len(publish), report, len(delivery))


# --- the HTML report ---------------------------------------------------------------------------

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
MAX_SERIES = 8

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1100px}
h1{margin:0 0 4px;font-size:24px} h2{margin:28px 0 8px;font-size:18px}
.meta{color:#666;margin-bottom:16px}
.banner{padding:14px 18px;border-radius:6px;font-size:20px;font-weight:600;margin:12px 0}
.banner.ok{background:#e6f4ea;color:#137333} .banner.bad{background:#fce8e6;color:#a50e0e}
table{border-collapse:collapse;width:100%} th,td{padding:6px 10px;border-bottom:1px solid #e3e3e3;
text-align:left} th{background:#f5f5f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
.PASS{color:#137333;font-weight:700} .FAIL{color:#a50e0e;font-weight:700}
tr.FAILrow{background:#fff5f4} .chart{margin:8px 0 4px} .note{color:#666;font-size:12px}
"""


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value * 100:.2f}%"
    if unit == "ms":  # delivery latencies reach seconds: keep axis labels short
        return f"{value:,.0f} ms" if abs(value) >= 1000 else f"{value:.2f} ms"
    if unit == "s":
        return f"{value:.1f} s"
    return f"{value:g}"


UNITS = {
    "publish_p99_ms": "ms",
    "publish_p95_ms": "ms",
    "error_rate": "%",
    "backlog_oldest_age_s": "s",
    "delivery_p99_ms": "ms",
    "delivery_p95_ms": "ms",
}
LABELS = {
    "publish_p99_ms": "Publish latency p99",
    "publish_p95_ms": "Publish latency p95",
    "error_rate": "Error rate",
    "backlog_oldest_age_s": "Oldest unacked message",
    "delivery_p99_ms": "Delivery latency p99 (publish to ack)",
    "delivery_p95_ms": "Delivery latency p95 (publish to ack)",
}


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = float(10.0 ** math.floor(math.log10(v)))
    for m in (1, 2, 2.5, 5, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def svg_chart(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    unit: str,
    threshold: float | None = None,
    width: int = 1000,
    height: int = 260,
    xrange: tuple[float, float] | None = None,
) -> str:
    """A line chart: x = epoch seconds, y in ``unit``; a dashed red line at ``threshold``."""
    left, right, top, bottom = 70, 230, 30, 40
    pw, ph = width - left - right, height - top - bottom
    e = html.escape
    parts = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="system-ui,sans-serif" font-size="12">',
        f'<text x="{left}" y="18" font-size="14" font-weight="600">{e(title)}</text>',
    ]
    points = [p for pts in series.values() for p in pts]
    if not points:
        parts.append(
            f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" fill="#888">'
            "no data in this window</text></svg>"
        )
        return "".join(parts)
    x0, x1 = xrange or (min(p[0] for p in points), max(p[0] for p in points))
    if x1 - x0 < 600:  # at least ten minutes wide, the data centred
        mid = (x0 + x1) / 2
        x0, x1 = mid - 300, mid + 300
    ymax = _nice_max(max([p[1] for p in points] + ([threshold * 1.1] if threshold else [])))

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - min(y, ymax) / ymax * ph

    for i in range(5):  # y grid and labels
        y = ymax * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
            f'stroke="#e5e5e5"/><text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" '
            f'fill="#555">{e(_fmt(y, unit))}</text>'
        )
    step = next(s for s in TICK_STEPS_S if (x1 - x0) / s <= 8)
    for x in range(int(math.ceil(x0 / step) * step), int(x1) + 1, step):  # x labels (UTC)
        fmt = "%H:%M" if step < 86_400 else "%m-%d"
        label = datetime.fromtimestamp(x, UTC).strftime(fmt)
        parts.append(
            f'<text x="{sx(x):.1f}" y="{top + ph + 18}" text-anchor="middle" fill="#555">'
            f"{label}</text>"
        )
    parts.append(
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="#999"/>'
        f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#999"/>'
        f'<text x="{left + pw}" y="{top + ph + 34}" text-anchor="end" fill="#888">time (UTC)'
        "</text>"
    )
    if threshold is not None:
        ty = sy(threshold)
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#d93025" '
            f'stroke-width="2" stroke-dasharray="6,4"/><text x="{left + pw - 4}" y="{ty - 5:.1f}" '
            f'text-anchor="end" fill="#d93025" font-weight="600">SLO {e(_fmt(threshold, unit))}'
            "</text>"
        )
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(pts)
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        if len(pts) > 1:
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
        if len(pts) <= 60:
            parts.extend(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
                f"<title>{e(name)} {e(_fmt(y, unit))}</title></circle>"
                for x, y in pts
            )
        ly = top + 6 + i * 18
        short = _short(name)
        short = short if len(short) <= 28 else "…" + short[-27:]
        parts.append(
            f'<rect x="{left + pw + 14}" y="{ly}" width="12" height="12" fill="{color}"/>'
            f'<text x="{left + pw + 32}" y="{ly + 10}">{e(short)}<title>{e(name)}</title></text>'
        )
    parts.append("</svg>")
    return "".join(parts)


TICK_STEPS_S = [60, 120, 300, 600, 900, 1800, 3600, 7200, 21_600, 43_200, 86_400, 7 * 86_400]


def _short(name: str) -> str:
    """``projects/P/topics/T`` -> ``P/T`` (legends are narrow)."""
    parts = name.split("/")
    return f"{parts[1]}/{parts[3]}" if len(parts) == 4 and parts[0] == "projects" else name


def _epoch(t: Any) -> float:
    if isinstance(t, datetime):
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    return float(t)


def _top(series: dict[str, list[tuple[float, float]]]) -> dict[str, list[tuple[float, float]]]:
    """The MAX_SERIES series with the highest peaks (the ones worth looking at)."""
    ranked = sorted(series.items(), key=lambda kv: -max(y for _, y in kv[1]))
    return dict(ranked[:MAX_SERIES])


def render_html(
    checks: list[Check],
    publish: list[Any],
    totals: list[Any],
    errors: list[Any],
    backlog: list[Any],
    slo: SloConfig,
    source: str,
    delivery: list[Any] | None = None,
    delivery_totals: list[Any] | None = None,
) -> str:
    e = html.escape
    delivery = delivery or []
    failed = [c for c in checks if c.status == "FAIL"]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    minutes = sorted({_epoch(r["minute"]) for rows in (publish, errors, delivery) for r in rows})
    window = (
        f"{datetime.fromtimestamp(minutes[0], UTC):%Y-%m-%d %H:%M} to "
        f"{datetime.fromtimestamp(minutes[-1], UTC):%H:%M} UTC ({len(minutes)} min)"
        if minutes
        else "no events"
    )
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<title>pubsubd SLI report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>pubsubd SLI report</h1>",
        f"<div class='meta'>Window: {e(window)} · source {e(source)} · generated {when}</div>",
    ]
    if not checks:
        out.append("<div class='banner bad'>No SLI events found: nothing to check.</div>")
    elif failed:
        out.append(
            f"<div class='banner bad'>✗ {len(failed)} of {len(checks)} SLO checks FAIL</div>"
        )
    else:
        out.append(f"<div class='banner ok'>✓ All {len(checks)} SLO checks pass</div>")
    out.append(
        "<table class='summary'><thead><tr><th>Status</th><th>SLO</th><th>Scope</th>"
        "<th>Target</th><th>Actual</th><th>Minutes over target</th></tr></thead><tbody>"
    )
    for c in sorted(checks, key=lambda c: (c.status == "PASS", c.slo, -c.actual)):
        unit = UNITS[c.slo]
        out.append(
            f"<tr class='{c.status}row'><td class='{c.status}'>{c.status}</td>"
            f"<td>{e(LABELS[c.slo])}</td><td>{e(c.scope)}</td>"
            f"<td class='num'>≤ {e(_fmt(c.target, unit))}</td>"
            f"<td class='num'>{e(_fmt(c.actual, unit))}</td>"
            f"<td class='num'>{c.bad_minutes} / {c.minutes}</td></tr>"
        )
    out.append("</tbody></table>")

    every = [_epoch(r["minute"]) for rows in (publish, errors, backlog, delivery) for r in rows]
    span = (min(every), max(every)) if every else None  # one time axis for all charts
    if span is not None and span[1] - span[0] < 600:
        span = ((span[0] + span[1]) / 2 - 300, (span[0] + span[1]) / 2 + 300)
    p99: dict[str, list[tuple[float, float]]] = {}
    for r in publish:
        if r["p99_ms"] is not None:
            p99.setdefault(r["topic"], []).append((_epoch(r["minute"]), float(r["p99_ms"])))
    out.append("<h2>Publish latency p99 per minute</h2>")
    out.append(
        svg_chart(
            "p99 publish latency by topic",
            _top(p99),
            "ms",
            slo.default["publish_p99_ms"],
            xrange=span,
        )
    )
    d99: dict[str, list[tuple[float, float]]] = {}
    for r in delivery:
        if r["p99_ms"] is not None:
            d99.setdefault(r["subscription"], []).append((_epoch(r["minute"]), float(r["p99_ms"])))
    out.append("<h2>End-to-end delivery latency p99 per minute (publish to ack)</h2>")
    out.append(
        svg_chart(
            "p99 delivery latency by subscription",
            _top(d99),
            "ms",
            slo.default["delivery_p99_ms"],
            xrange=span,
        )
    )
    ok: dict[float, int] = {}
    for r in publish:
        m = _epoch(r["minute"])
        ok[m] = ok.get(m, 0) + r["publishes"] - r["failed"]
    err: dict[float, int] = {}
    for r in errors:
        m = _epoch(r["minute"])
        err[m] = err.get(m, 0) + r["errors"]
    rate = [(m, _rate(err.get(m, 0), ok.get(m, 0))) for m in sorted(set(ok) | set(err))]
    out.append("<h2>Error rate per minute</h2>")
    out.append(
        svg_chart(
            "errors / (successful publishes + errors)",
            {"all RPCs": rate},
            "%",
            slo.default["error_rate"],
            xrange=span,
        )
    )
    age: dict[str, list[tuple[float, float]]] = {}
    for r in backlog:
        age.setdefault(r["subscription"], []).append(
            (_epoch(r["minute"]), float(r["max_oldest_age_s"] or 0.0))
        )
    out.append("<h2>Backlog: oldest unacked message per minute</h2>")
    out.append(
        svg_chart(
            "oldest unacked age by subscription",
            _top(age),
            "s",
            slo.default["backlog_oldest_age_s"],
            xrange=span,
        )
    )

    out.append("<h2>Topics by p99 (whole window, merged sketches)</h2>")
    out.append(
        "<table><thead><tr><th>Topic</th><th>Publish calls</th><th>Failed</th><th>p50</th>"
        "<th>p95</th><th>p99</th></tr></thead><tbody>"
    )
    for t in sorted(totals, key=lambda t: -(t["p99_ms"] or 0.0))[:20]:
        cells = _percentile_cells(t)
        out.append(
            f"<tr><td>{e(t['topic'])}</td><td class='num'>{t['publishes']}</td>"
            f"<td class='num'>{t['failed']}</td>{cells}</tr>"
        )
    out.append("</tbody></table>")
    out.append("<h2>Subscriptions by delivery p99 (whole window, merged sketches)</h2>")
    if delivery_totals:
        out.append(
            "<table><thead><tr><th>Subscription</th><th>Topic</th><th>Acked</th><th>p50</th>"
            "<th>p95</th><th>p99</th></tr></thead><tbody>"
        )
        for t in sorted(delivery_totals, key=lambda t: -(t["p99_ms"] or 0.0))[:20]:
            cells = _percentile_cells(t)
            out.append(
                f"<tr><td>{e(t['subscription'])}</td><td>{e(t['topic'])}</td>"
                f"<td class='num'>{t['acked']}</td>{cells}</tr>"
            )
        out.append("</tbody></table>")
    else:
        out.append("<p>No acknowledged messages in this window.</p>")
    by_code: dict[tuple[str, str], int] = {}
    for r in errors:
        key = (r["method"], r["code"])
        by_code[key] = by_code.get(key, 0) + r["errors"]
    out.append("<h2>Errors by method and code</h2>")
    if by_code:
        out.append("<table><thead><tr><th>Method</th><th>Code</th><th>Errors</th></tr></thead>")
        out.extend(
            f"<tr><td>{e(m)}</td><td>{e(c)}</td><td class='num'>{n}</td></tr>"
            for (m, c), n in sorted(by_code.items(), key=lambda kv: -kv[1])
        )
        out.append("</table>")
    else:
        out.append("<p>No errors.</p>")
    out.append(
        "<p class='note'>Charts show the global targets; per-topic overrides are applied in the "
        "table above. Publish latency is measured from receiving a Publish to acknowledging it; "
        "delivery latency from a message's publish time to the subscriber's ack of it (a sample "
        "of the acks, including the subscriber's processing time and any redeliveries).</p>"
    )
    out.append("</body></html>")
    return "\n".join(out)


def main(endpoint: str, out: Path, slo_file: Path | None, since: str | None) -> Result:
    """Entry point of ``pubsubd sli-report``: a local Spark session unless one is active."""
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
    return run(spark, endpoint, out, load_slo(slo_file), since)


def _percentile_cells(row: Any) -> str:
    """The p50/p95/p99 table cells of one report row (a dash where there is no value)."""
    return "".join(
        f"<td class='num'>{_fmt(float(row[k]), 'ms') if row[k] is not None else '&ndash;'}</td>"
        for k in ("p50_ms", "p95_ms", "p99_ms")
    )
