"""pulsar-client produce and consume rates against pubsubd's Pulsar front and a null broker.

Workloads (100-byte messages, one client process, the official ``pulsar-client``):

* ``produce-batched``: ``send_async`` of N messages with batching (≤1000 messages, 10 ms),
  ``block_if_queue_full``, 5000 pending; timed until ``flush()`` returns (every receipt in).
* ``produce-sync``: ``send()`` one at a time (each waits for its receipt) for a fixed time.
* ``consume``: a backlog of N messages (published batched beforehand), then one Shared consumer
  (receiver queue 1000) that ``receive()``s and ``acknowledge()``s each; timed from subscribe
  until the last message is received.

Targets: ``pubsubd serve --fsync always`` (and ``--fsync never`` for the produce workloads), and
``bench/pulsar_null_broker.py``, a broker that stores nothing (the client's ceiling; it is Python
too, so for consume it may be the limit itself). Each workload and target runs 3 times; the median
is reported. Run under the benchmark lock: ``flock /tmp/pubsubd-bench.lock python -m
bench.pulsar_bench``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import _pulsar
import pulsar

PAYLOAD = b"x" * 100


def _start(cmd: list[str], ready: re.Pattern[str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = ready.search(line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    raise RuntimeError(f"{cmd} did not start")


def _client(port: int) -> pulsar.Client:
    return pulsar.Client(
        f"pulsar://127.0.0.1:{port}",
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error),
    )


def produce_batched(port: int, n: int) -> float:
    client = _client(port)
    producer = client.create_producer(
        f"bench-{uuid.uuid4().hex[:8]}",
        batching_enabled=True,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
        max_pending_messages=5000,
    )
    failed = []

    def done(result: object, _mid: object) -> None:
        if result != pulsar.Result.Ok:
            failed.append(result)

    start = time.perf_counter()
    for _ in range(n):
        producer.send_async(PAYLOAD, done)
    producer.flush()
    elapsed = time.perf_counter() - start
    client.close()
    if failed:
        raise RuntimeError(f"{len(failed)} sends failed: {failed[0]}")
    return n / elapsed


def produce_sync(port: int, seconds: float) -> float:
    client = _client(port)
    producer = client.create_producer(f"bench-{uuid.uuid4().hex[:8]}")
    producer.send(PAYLOAD)  # warm
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        producer.send(PAYLOAD)
        count += 1
    elapsed = time.perf_counter() - start
    client.close()
    return count / elapsed


def consume(port: int, n: int, null: bool) -> float:
    client = _client(port)
    topic = f"bench-{uuid.uuid4().hex[:8]}" + (f"-prebuilt-{n}" if null else "")
    sub = "drain"
    if not null:
        client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared).close()
        producer = client.create_producer(
            topic, batching_enabled=True, block_if_queue_full=True, max_pending_messages=5000
        )
        for _ in range(n):
            producer.send_async(PAYLOAD, None)
        producer.flush()
    start = time.perf_counter()
    consumer = client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    for _ in range(n):
        consumer.acknowledge(consumer.receive(30000))
    elapsed = time.perf_counter() - start
    client.close()
    return n / elapsed


def _runs(fn: Callable[[], float], runs: int) -> dict[str, object]:
    values = [fn() for _ in range(runs)]
    return {"median": statistics.median(values), "runs": values}


def _measure(port: int, fsync: str | None, args: argparse.Namespace) -> dict[str, object]:
    row: dict[str, object] = {
        "produce-batched": _runs(lambda: produce_batched(port, args.messages), args.runs),
        "produce-sync": _runs(lambda: produce_sync(port, args.sync_seconds), args.runs),
    }
    if fsync != "never":
        row["consume"] = _runs(lambda: consume(port, args.messages, fsync is None), args.runs)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--sync-seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    targets = [("null", None), ("pubsubd-fsync-always", "always"), ("pubsubd-fsync-never", "never")]
    for name, fsync in targets:
        with tempfile.TemporaryDirectory() as tmp:
            if fsync is None:
                cmd = [sys.executable, "-m", "bench.pulsar_null_broker", "--port", "0"]
                proc, port = _start(cmd, re.compile(r"null-pulsar ready port=(\d+)"))
            else:
                cmd = [
                    sys.executable, "-m", "pubsubd", "serve", "--port", "0", "--http-port", "-1",
                    "--pulsar-port", "0", "--fsync", fsync, "--data-dir", tmp,
                ]  # fmt: skip
                proc, port = _start(cmd, re.compile(r"pubsubd ready .* pulsar=(\d+)"))
            try:
                row = _measure(port, fsync, args)
                results[name] = row
            finally:
                proc.kill()
                proc.wait()
        print(name, json.dumps({k: round(v["median"]) for k, v in row.items()}), flush=True)  # type: ignore[index]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"pulsar-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
