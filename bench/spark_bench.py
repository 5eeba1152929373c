"""``python -m bench.spark_bench`` (``make spark-bench``): Spark connector throughput.

Starts one pubsubd (``bench.targets.PubsubdTarget``, 127.0.0.1, ephemeral port, temp dir),
fills a topic with N messages of S bytes through the raw Publish RPC (pre-serialized
1000-message requests, 4 in flight), then measures, each as the median of ``--runs`` runs after
one warm-up run that is not reported:

* ``raw read``: the replay API's paged ``Read`` in the columnar form the connector reads
  (``ReadRequest.columnar``), from the Python client it uses
  (``pubsubd.spark.client.ReplayClient.read_columns``, pages of ``fetchSize`` = 5000), one
  thread;
* ``raw read + Arrow``: what one Spark task does minus Spark: pages asked for as Arrow IPC
  (``ReplayClient.read_page``, ``ReadRequest.arrow``) and made the task's RecordBatches
  (``source.arrow_to_record_batch``; ``columns_to_record_batch`` when the server answers
  columns);
* ``Spark read``: ``spark.read.format("pubsubd")`` over the whole range into the ``noop`` sink
  (every column materialized), with the default planning (one Spark partition per source) and
  with ``minPartitions=2``; and ``count()``;
* ``raw PublishDeduplicated``: the client's deduplicated publish, 1000-row requests, one thread
  (what one sink task does minus Spark);
* ``Spark write``: ``df.write.format("pubsubd")`` of N rows of S bytes (``spark.range`` split in
  ``--write-partitions`` partitions) to a second topic;
* the same Spark read (``minPartitions=2``) and Spark write against the null server
  (``bench.null_server``: it generates the pages a Read asks for and stores nothing), so the
  figures show how fast Spark and the connector go when the server costs nothing;
* the Spark read (``minPartitions=2``) with a user-specified schema of two columns
  (``COLUMNS_SCHEMA``: offset and data), from pubsubd and from the null server: what a query
  that needs only the payload and its position gets by saying so.

``--java-options`` sets ``spark.driver.extraJavaOptions`` (the local[N] executor runs in the
driver's JVM), e.g. Arrow's unchecked access, to measure JVM settings without code changes.

``--only NAME,...`` runs only those measurements (names as in the JSON).

Spark runs on ``local[2]`` by default (``--master``) with the UI off; PYSPARK_PYTHON is this
interpreter. Prints a markdown table (rows/s, MB/s of payload, CPU of the server and of the rest
of the machine) and saves it with the raw runs under ``bench/results/spark-bench-<UTC>.{json,md}``.
Other processes on the machine skew the figures: the ``other CPU`` column shows how much CPU
was used outside the server and this benchmark's own process tree during each measurement.
Run it under ``flock /tmp/pubsubd-bench.lock`` when other benchmarks may run at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from bench import pb
from bench.report import RESULTS_DIR, machine_info
from bench.targets import REPO_ROOT, NullTarget, PubsubdTarget
from bench.workloads import CHANNEL_OPTIONS, machine_busy_s, process_cpu_s, raw_publish

PROJECT = "bench"
CREATE_TOPIC = f"/{pb.PUBLISHER}/CreateTopic"
FETCH_SIZE = 5000  # the source's default fetchSize
PUBLISH_BATCH = 1000  # the sink's default publishBatchSize
COLUMNS_SCHEMA = "offset long, data binary"  # the column-selection measurements' schema


def log(msg: str) -> None:
    print(f"[spark-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- CPU accounting ----------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def tree_cpu_s(root: int, exclude: int | None = None) -> float:
    """CPU seconds of ``root`` and its live descendants (Spark's JVM and Python workers),
    without the subtree of ``exclude`` (the server, measured on its own)."""
    children = _children()
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        if pid == exclude:
            continue
        total += process_cpu_s(pid) or 0.0
        stack.extend(children.get(pid, []))
    return total


@dataclass
class Section:
    """Wall time and CPU of one measured run: the server, our process tree, the rest."""

    server_pid: int
    elapsed_s: float = 0.0
    server_cpu_s: float = 0.0
    own_cpu_s: float = 0.0
    machine_cpu_s: float = 0.0
    _t0: float = 0.0
    _marks: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __enter__(self) -> Section:
        self._marks = (
            process_cpu_s(self.server_pid) or 0.0,
            tree_cpu_s(os.getpid(), self.server_pid),
            machine_busy_s(),
        )
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed_s = time.perf_counter() - self._t0
        server0, own0, machine0 = self._marks
        self.server_cpu_s = (process_cpu_s(self.server_pid) or server0) - server0
        self.own_cpu_s = max(0.0, tree_cpu_s(os.getpid(), self.server_pid) - own0)
        self.machine_cpu_s = machine_busy_s() - machine0

    def result(self, rows: int, size: int) -> dict[str, float]:
        t = max(self.elapsed_s, 1e-9)
        other = max(0.0, self.machine_cpu_s - self.server_cpu_s - self.own_cpu_s)
        return {
            "rows": rows,
            "elapsed_s": round(self.elapsed_s, 4),
            "rows_per_s": rows / t,
            "mb_per_s": rows * size / t / 1e6,
            "server_cpu_pct": 100.0 * self.server_cpu_s / t,
            "own_cpu_pct": 100.0 * self.own_cpu_s / t,
            "other_cpu_pct": 100.0 * other / t,
        }


# --- the measurements --------------------------------------------------------------------------


def create_topic(endpoint: str, name: str) -> None:
    """A topic that keeps its messages for a day (a retention pin: nothing is trimmed)."""
    with grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(
            CREATE_TOPIC,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.Topic.FromString,
        )
        call(
            pb.Topic(name=name, message_retention_duration=duration_pb2.Duration(seconds=86_400)),
            timeout=30,
        )


def fill(endpoint: str, topic: str, count: int, size: int) -> int:
    return asyncio.run(
        raw_publish(
            endpoint,
            topic,
            size=size,
            count=count,
            batch=PUBLISH_BATCH,
            concurrency=4,
            deadline=float("inf"),
        )
    )


def raw_read(endpoint: str, topic: str, arrow: bool) -> int:
    """Every row through the columnar ``Read``; with ``arrow``, as a Spark task reads: pages
    asked for as Arrow (columnar from a server without pyarrow) and made the task's batches."""
    from pubsubd.spark.client import get_client
    from pubsubd.spark.source import arrow_to_record_batch, columns_to_record_batch, page_rows

    client = get_client(endpoint)
    rows = 0
    for partition, b in client.topic_bounds(topic).items():
        cur = b.earliest
        while cur < b.latest:
            if arrow:
                page, next_offset = client.read_page(topic, partition, cur, b.latest, FETCH_SIZE)
                if isinstance(page, bytes):
                    batch = arrow_to_record_batch(topic, partition, page_rows(page))
                else:
                    batch = columns_to_record_batch(topic, partition, page)
                offsets = batch.column("offset").to_numpy()
            else:
                columns, next_offset = client.read_columns(
                    topic, partition, cur, b.latest, FETCH_SIZE
                )
                offsets = columns.offsets
            if not len(offsets):
                cur = next_offset
                continue
            rows += len(offsets)
            cur = max(next_offset, int(offsets[-1]) + 1)
    return rows


def raw_publish_dedup(endpoint: str, topic: str, count: int, size: int) -> int:
    from pubsubd.spark.client import OutgoingMessage, get_client

    client = get_client(endpoint)
    data = b"x" * size
    prefix = uuid.uuid4().hex
    published = 0
    for start in range(0, count, PUBLISH_BATCH):
        batch = [
            OutgoingMessage(f"{prefix}:{i}", data)
            for i in range(start, min(count, start + PUBLISH_BATCH))
        ]
        ids, duplicates = client.publish_deduplicated(topic, batch)
        published += len(ids) - duplicates
    return published


def spark_session(master: str, java_options: str = "") -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    from pyspark.sql import SparkSession

    from pubsubd.spark import register

    builder = SparkSession.builder
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    spark = (
        builder.master(master)
        .appName("pubsubd-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@dataclass
class Measurement:
    name: str
    title: str
    run: Callable[[], int]  # returns the rows moved
    expected: int
    runs: list[dict[str, float]] = field(default_factory=list)

    def median(self, key: str) -> float:
        return float(statistics.median(r[key] for r in self.runs))


def measure(m: Measurement, runs: int, server_pid: int, size: int) -> None:
    for i in range(runs + 1):  # run 0 is the warm-up
        with Section(server_pid) as s:
            rows = m.run()
        if rows != m.expected:
            raise RuntimeError(f"{m.name}: moved {rows} rows, expected {m.expected}")
        r = s.result(rows, size)
        label = "warm-up" if i == 0 else f"run {i}"
        log(f"{m.name} {label}: {r['rows_per_s']:,.0f} rows/s ({r['elapsed_s']:.2f} s)")
        if i:
            m.runs.append(r)


def markdown(measurements: list[Measurement], ratios: list[tuple[str, str, str]]) -> str:
    by_name = {m.name: m for m in measurements}
    lines = [
        "| Measurement | Rows | Median rows/s | Median MB/s | Runs (rows/s) | Server CPU | "
        "Own CPU | Other CPU |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for m in measurements:
        runs = ", ".join(f"{r['rows_per_s'] / 1e3:,.0f}k" for r in m.runs)
        lines.append(
            f"| {m.title} | {m.expected:,} | **{m.median('rows_per_s'):,.0f}** | "
            f"{m.median('mb_per_s'):.1f} | {runs} | {m.median('server_cpu_pct'):.0f}% | "
            f"{m.median('own_cpu_pct'):.0f}% | {m.median('other_cpu_pct'):.0f}% |"
        )
    lines.append("")
    for label, a, b in ratios:
        if a in by_name and b in by_name:
            ratio = by_name[a].median("rows_per_s") / by_name[b].median("rows_per_s")
            lines.append(f"* {label}: **{ratio:.2f}**")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_bench", description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000, help="rows per measurement")
    parser.add_argument("--size", type=int, default=100, help="payload bytes per message")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (plus one warm-up)")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--write-partitions", type=int, default=2, help="Spark write tasks")
    parser.add_argument("--fsync", default="always", help="pubsubd --fsync (always, interval)")
    parser.add_argument("--only", default="", help="comma-separated measurement names")
    parser.add_argument("--java-options", default="", help="spark.driver.extraJavaOptions")
    args = parser.parse_args(argv)
    n: int = args.messages
    size: int = args.size

    info = machine_info()
    started_at = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    target = PubsubdTarget(args.fsync).start()
    null = NullTarget().start()
    try:
        null_endpoint = null.endpoint
        endpoint = target.endpoint
        assert target.pid is not None
        pid = target.pid
        suffix = uuid.uuid4().hex[:8]
        source = f"projects/{PROJECT}/topics/spark-read-{suffix}"
        sink = f"projects/{PROJECT}/topics/spark-write-{suffix}"
        create_topic(endpoint, source)
        create_topic(endpoint, sink)
        log(f"pubsubd pid {pid} on {endpoint}; publishing {n:,} x {size} B")
        with Section(pid) as s:
            published = fill(endpoint, source, n, size)
        if published != n:
            raise RuntimeError(f"published {published} of {n}")
        fill_result = s.result(n, size)
        log(f"filled: {fill_result['rows_per_s']:,.0f} msg/s")

        t_spark = time.monotonic()
        spark = spark_session(args.master, args.java_options)
        spark_start_s = time.monotonic() - t_spark
        log(f"Spark {spark.version} on {args.master} started in {spark_start_s:.1f} s")
        from pyspark.sql import functions as F

        def reader(
            at: str = endpoint, topic: str = source, schema: str | None = None, **options: str
        ) -> Any:
            r = spark.read.format("pubsubd").option("endpoint", at).option("topic", topic)
            if schema is not None:
                r = r.schema(schema)
            for k, v in options.items():
                r = r.option(k, v)
            return r.load()

        def spark_noop(schema: str | None = None, **options: str) -> Callable[[], int]:
            def go() -> int:
                reader(schema=schema, **options).write.format("noop").mode("overwrite").save()
                return n  # checked once by the count() measurement

            return go

        null_source = f"projects/{PROJECT}/topics/null-read-{n}-{size}"  # generated pages

        def null_noop(schema: str | None = None) -> int:
            reader(null_endpoint, null_source, schema, minPartitions="2").write.format("noop").mode(
                "overwrite"
            ).save()
            return n

        rows = spark.range(0, n, numPartitions=args.write_partitions).select(
            F.lit(bytearray(b"x" * size)).alias("data")
        )

        def spark_write(at: str = endpoint) -> int:
            (
                rows.write.format("pubsubd")
                .option("endpoint", at)
                .option("topic", sink)
                .mode("append")
                .save()
            )
            return n

        measurements = [
            Measurement(
                "raw-read", "Raw read: replay API columnar `Read`, Python client, 1 thread",
                lambda: raw_read(endpoint, source, arrow=False), n,
            ),
            Measurement(
                "raw-read-arrow", "Raw Arrow read + batches (one Spark task minus Spark)",
                lambda: raw_read(endpoint, source, arrow=True), n,
            ),
            Measurement(
                "spark-read", "Spark read -> `noop` (1 source = 1 Spark partition)",
                spark_noop(), n,
            ),
            Measurement(
                "spark-read-2", "Spark read -> `noop`, `minPartitions=2`",
                spark_noop(minPartitions="2"), n,
            ),
            Measurement(
                "spark-count", "Spark read, `count()`, `minPartitions=2`",
                lambda: int(reader(minPartitions="2").count()), n,
            ),
            Measurement(
                "raw-publish-dedup", "Raw write: `PublishDeduplicated`, 1000/request, 1 thread",
                lambda: raw_publish_dedup(endpoint, sink, n, size), n,
            ),
            Measurement(
                "spark-write",
                f"Spark write: `df.write.format(\"pubsubd\")`, {args.write_partitions} tasks",
                spark_write, n,
            ),
            Measurement(
                "null-spark-read-2", "Spark read -> `noop`, `minPartitions=2`, null server",
                null_noop, n,
            ),
            Measurement(
                "null-spark-write",
                f"Spark write, {args.write_partitions} tasks, to the null server",
                lambda: spark_write(null_endpoint), n,
            ),
            Measurement(
                "spark-read-2-columns",
                f"Spark read -> `noop`, `minPartitions=2`, schema `{COLUMNS_SCHEMA}`",
                spark_noop(schema=COLUMNS_SCHEMA, minPartitions="2"), n,
            ),
            Measurement(
                "null-spark-read-2-columns",
                f"Spark read -> `noop`, `minPartitions=2`, schema `{COLUMNS_SCHEMA}`, null server",
                lambda: null_noop(COLUMNS_SCHEMA), n,
            ),
        ]  # fmt: skip
        if args.only:
            wanted = set(args.only.split(","))
            measurements = [m for m in measurements if m.name in wanted]
        for m in measurements:
            measure(m, args.runs, pid, size)
        spark.stop()
    finally:
        null.stop()
        target.stop()

    ratios = [
        ("Spark read / raw read", "spark-read", "raw-read"),
        ("Spark read (minPartitions=2) / raw read", "spark-read-2", "raw-read"),
        ("Spark write / raw PublishDeduplicated", "spark-write", "raw-publish-dedup"),
    ]
    table = markdown(measurements, ratios)
    info["loadavg_end"] = os.getloadavg()
    report = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t0, 1),
        "machine": info,
        "settings": {
            "messages": n,
            "size": size,
            "runs": args.runs,
            "master": args.master,
            "write_partitions": args.write_partitions,
            "fsync": args.fsync,
            "java_options": args.java_options,
            "fetch_size": FETCH_SIZE,
            "publish_batch": PUBLISH_BATCH,
            "spark_start_s": round(spark_start_s, 1),
        },
        "fill": fill_result,
        "measurements": {m.name: {"title": m.title, "runs": m.runs} for m in measurements},
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = RESULTS_DIR / f"spark-bench-{started_at.strftime('%Y%m%dT%H%M%SZ')}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(table + "\n")
    print(
        f"## Spark connector throughput ({n:,} x {size} B, {args.master}, median of "
        f"{args.runs}, {report['duration_s']:.0f} s)\n"
    )
    print(
        f"{info['nproc']} CPUs ({info['cpu_model']}), Python {info['python']}, pubsubd "
        f"--fsync {args.fsync}, commit {info.get('git_commit', '?')}; load average "
        f"{info['loadavg_start'][0]:.2f} -> {info['loadavg_end'][0]:.2f}; fill (raw Publish, "
        f"4 in flight) {fill_result['rows_per_s']:,.0f} msg/s; Spark session start "
        f"{spark_start_s:.1f} s\n"
    )
    print(table)
    print(f"\nraw results: {stem.with_suffix('.json').relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
