"""Example pipeline: a pubsubd topic -> PySpark Structured Streaming -> another pubsubd topic.

    make spark-demo                    # starts a throwaway pubsubd, or uses PUBSUB_EMULATOR_HOST
    make spark-demo ARGS=--cluster     # on a throwaway Spark standalone cluster (two workers)
    make spark-demo ARGS=--connect     # from a Spark Connect client (throwaway Connect server)
    make spark-demo ARGS=--pubsubd-cluster  # against a throwaway pubsubd cluster (2 frontends)
    python examples/spark_demo.py --messages 5000

Publishes JSON orders to ``orders``, runs a streaming query that parses them, keeps the large
ones and publishes an enriched copy to ``large-orders`` (effectively once: dedup IDs), then reads
the result back with a batch query. Needs ``pip install 'pubsubd[spark]'`` and Java 17+.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROJECT = "spark-demo"
READY = re.compile(r"pubsubd ready grpc=(\S+):(\d+)")


def start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    log = data_dir / "pubsubd.log"
    out = log.open("wb")
    cmd = [sys.executable, "-m", "pubsubd", "serve", "--port", "0", "--http-port", "0"]
    cmd += ["--pulsar-port", "-1"]  # a throwaway server leaves 6650 alone
    proc = subprocess.Popen([*cmd, "--data-dir", str(data_dir / "data")], stdout=out, stderr=out)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = READY.search(log.read_text(errors="replace"))
        if found:
            return proc, f"{found.group(1)}:{found.group(2)}"
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"pubsubd did not start:\n{log.read_text(errors='replace')}")


def publish_orders(endpoint: str, source: str, target: str, count: int) -> None:
    os.environ["PUBSUB_EMULATOR_HOST"] = endpoint
    from google.api_core.exceptions import AlreadyExists
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    for topic in (source, target):
        with contextlib.suppress(AlreadyExists):
            publisher.create_topic(name=topic)
    futures = []
    for i in range(count):
        order = {"id": i, "customer": f"c{i % 17}", "amount": round((i * 37) % 1000 / 3, 2)}
        futures.append(publisher.publish(source, json.dumps(order).encode(), region="eu"))
    for f in futures:
        f.result(timeout=60)


def spark_session(args: argparse.Namespace, work: Path, services: contextlib.ExitStack) -> Any:
    """local[*], a throwaway standalone cluster (--cluster) or a Connect client (--connect)."""
    from pyspark.sql import SparkSession

    if args.connect:
        from pubsubd.spark.connect_server import ConnectServer

        started = time.monotonic()
        server = services.enter_context(ConnectServer(work / "spark-connect"))
        print(f"Spark Connect server at {server.url} in {time.monotonic() - started:.1f}s")
        return SparkSession.builder.remote(server.url).getOrCreate()
    builder = SparkSession.builder.appName("pubsubd-spark-demo")
    master = args.master
    if args.cluster:
        from pubsubd.spark.standalone import StandaloneCluster

        started = time.monotonic()
        cluster = services.enter_context(StandaloneCluster(work / "spark-cluster", workers=2))
        master = cluster.master_url
        print(f"Spark standalone cluster at {master} in {time.monotonic() - started:.1f}s")
        builder = (
            builder.config("spark.executor.cores", "1")
            .config("spark.executor.memory", "512m")
            .config("spark.cores.max", "2")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    spark = (
        builder.master(master)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--master", default="local[*]")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--cluster",
        action="store_true",
        help="start a Spark standalone cluster on loopback (master + 2 workers) and run on it",
    )
    where.add_argument(
        "--connect",
        action="store_true",
        help="start a Spark Connect server on loopback and run from a Connect client session",
    )
    parser.add_argument(
        "--pubsubd-cluster",
        action="store_true",
        help="start a local pubsubd cluster (ZooKeeper, 3 storage nodes, a router, 2 frontends) "
        "and list both frontends in the connector's endpoint option",
    )
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need pyarrow + pubsubd
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="pubsubd-spark-demo-"))
    server = None
    cluster = None
    endpoint = os.environ.get("PUBSUB_EMULATOR_HOST")
    if args.pubsubd_cluster:
        from pubsubd.cluster.launcher import LocalCluster

        cluster = LocalCluster(work / "pubsubd-cluster")
        try:
            cluster.up(zk_nodes=1, storage_nodes=3, routers=1, frontends=2)
        except BaseException:
            cluster.down()
            raise
        endpoint = "ipv4:" + ",".join(cluster.frontends)  # the connector and the official client
        print(f"started a pubsubd cluster in {cluster.directory}; frontends {endpoint}")
    elif not endpoint:
        server, endpoint = start_server(work)
        print(f"started pubsubd on {endpoint} (data in {work})")
    source = f"projects/{PROJECT}/topics/orders-{int(time.time())}"
    target = f"projects/{PROJECT}/topics/large-orders-{int(time.time())}"
    spark_services = contextlib.ExitStack()
    try:
        started = time.monotonic()
        publish_orders(endpoint, source, target, args.messages)
        print(f"published {args.messages} orders to {source} in {time.monotonic() - started:.1f}s")

        from pyspark.sql import functions as F

        from pubsubd.spark import PubsubdDataSource

        spark = spark_session(args, work, spark_services)
        spark.dataSource.register(PubsubdDataSource)  # from a Connect client too

        schema = "id long, customer string, amount double"
        orders = (
            spark.readStream.format("pubsubd")
            .option("endpoint", endpoint)
            .option("topic", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "1000")  # admission control: bounded micro-batches
            .option("subscription", "demo-pipeline")  # the service's backlog metrics follow it
            .load()
        )
        large = (
            orders.select(
                F.from_json(F.col("data").cast("string"), schema).alias("o"), "attributes"
            )
            .where("o.amount >= 200")
            .select(
                F.to_json(
                    F.struct("o.id", "o.customer", "o.amount", F.lit("large").alias("tier"))
                ).alias("data"),
                F.map_concat("attributes", F.create_map(F.lit("tier"), F.lit("large"))).alias(
                    "attributes"
                ),
                F.col("o.customer").alias("ordering_key"),
            )
        )
        started = time.monotonic()
        query = (
            large.writeStream.format("pubsubd")
            .option("endpoint", endpoint)
            .option("topic", target)
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        batches = [p.numInputRows for p in query.recentProgress if p.numInputRows]
        print(
            f"streaming query: {sum(batches)} orders read in {len(batches)} micro-batches "
            f"{batches} in {time.monotonic() - started:.1f}s"
        )

        result = (
            spark.read.format("pubsubd").option("endpoint", endpoint).option("topic", target).load()
        )
        expected = sum(1 for i in range(args.messages) if round((i * 37) % 1000 / 3, 2) >= 200)
        count = result.count()
        print(f"{target}: {count} large orders (expected {expected})")
        result.select("offset", F.col("data").cast("string").alias("data"), "ordering_key").show(
            3, truncate=False
        )
        from pubsubd.spark.client import get_client

        cursor = get_client(endpoint).get_cursor(source, "demo-pipeline")
        print(f"cursor demo-pipeline of {source}: {cursor} (one micro-batch behind the query)")
        spark.stop()
        if count != expected:
            raise SystemExit("count mismatch")
    finally:
        spark_services.close()  # the Spark cluster or Connect server, by PID
        if server is not None:
            server.terminate()
            server.wait(20)
        if cluster is not None:
            cluster.down()
        if server is not None or cluster is not None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
