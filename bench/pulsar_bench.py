"""pulsar-client produce and consume rates against pubsubd's Pulsar front and a null broker.

Workloads (100-byte messages, one client process, the official ``pulsar-client``):

* ``produce-batched``: ``send_async`` of N messages with batching (≤1000 messages, 10 ms),
  ``block_if_queue_full``, 5000 pending; timed until ``flush()`` returns (every receipt in).
* ``produce-sync``: ``send()`` one at a time (each waits for its receipt) for a fixed time.
* ``grpc-sync`` (pubsubd only): google.pubsub.v1 Publish of one message per call from a
  blocking gRPC stub, each waiting for its answer, for a fixed time: the same server's
  one-at-a-time publish without the Pulsar front.
* ``consume``: a backlog of N messages (published batched beforehand), then one Shared consumer
  (receiver queue 1000) that ``receive()``s and ``acknowledge()``s each; timed from subscribe
  until the last message is received.

Targets: ``pubsubd serve --fsync always`` (and ``--fsync never`` for the produce workloads), and
``bench/pulsar_null_broker.py``, a broker that stores nothing (the client's ceiling; it is Python
too, so for consume it may be the limit itself): ``null`` sends one message per MESSAGE,
``null-batched`` (consume only) up to 1000 per MESSAGE as a Pulsar batch, as pubsubd's front
does. Each workload and target runs 3 times
(``--runs``), interleaved; the median is reported. ``--baseline REV`` adds pubsubd at another
revision (``git archive`` of its ``src/``, first on ``PYTHONPATH``), fsync always, for a
before/after comparison; ``--only consume,produce-sync`` picks workloads. Run under the
benchmark lock: ``flock /tmp/pubsubd-bench.lock python -m bench.pulsar_bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _pulsar
import grpc
import pulsar

from bench import pb

PAYLOAD = b"x" * 100


def _start(
    cmd: list[str], ready: re.Pattern[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], tuple[int, ...]]:
    """The process and the ports its ready line names (``ready``'s groups)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = ready.search(line)
        if m:
            return proc, tuple(int(g) for g in m.groups())
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


def grpc_sync(port: int, seconds: float) -> float:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    topic = f"projects/bench/topics/sync-{uuid.uuid4().hex[:8]}"
    channel.unary_unary(
        f"/{pb.PUBLISHER}/CreateTopic", pb.Topic.SerializeToString, pb.Topic.FromString
    )(pb.Topic(name=topic))
    publish = channel.unary_unary(pb.PUBLISH, lambda b: b, pb.PublishResponse.FromString)
    request = pb.publish_request(topic, 1, len(PAYLOAD))
    publish(request)  # warm
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        publish(request)
        count += 1
    elapsed = time.perf_counter() - start
    channel.close()
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


WORKLOADS = ("produce-batched", "produce-sync", "grpc-sync", "consume")


def _one(workload: str, ports: tuple[int, ...], null: bool, args: argparse.Namespace) -> float:
    port = ports[-1]  # the Pulsar port; pubsubd's gRPC port is first
    if workload == "grpc-sync":
        return grpc_sync(ports[0], args.sync_seconds)
    if workload == "produce-batched":
        return produce_batched(port, args.messages)
    if workload == "produce-sync":
        return produce_sync(port, args.sync_seconds)
    return consume(port, args.messages, null)


def _targets(args: argparse.Namespace, baseline_src: Path | None) -> list[tuple[str, str | None]]:
    """(name, fsync) of each target; fsync None is the null broker."""
    out: list[tuple[str, str | None]] = [
        ("null", None),
        ("null-batched", None),
        ("pubsubd-fsync-always", "always"),
    ]
    if baseline_src is not None:
        out.append((f"baseline-{args.baseline}-fsync-always", "always"))
    if not args.no_fsync_never:
        out.append(("pubsubd-fsync-never", "never"))
    return out


def _start_target(
    name: str, fsync: str | None, tmp: str, src: Path | None
) -> tuple[subprocess.Popen[str], tuple[int, ...]]:
    if fsync is None:
        batch = "1000" if name == "null-batched" else "1"
        cmd = [sys.executable, "-m", "bench.pulsar_null_broker", "--port", "0", "--batch", batch]
        return _start(cmd, re.compile(r"null-pulsar ready port=(\d+)"))
    cmd = [
        sys.executable, "-m", "pubsubd", "serve", "--port", "0", "--http-port", "-1",
        "--pulsar-port", "0", "--fsync", fsync, "--data-dir", tmp,
    ]  # fmt: skip
    env = None if src is None else {**os.environ, "PYTHONPATH": str(src)}
    return _start(cmd, re.compile(r"pubsubd ready grpc=\S+:(\d+) .* pulsar=(\d+)"), env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--sync-seconds", type=float, default=3.0)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    parser.add_argument(
        "--baseline",
        help="also run pubsubd at this git revision (its src/ exported, fsync always); "
        "runs interleave with this tree's",
    )
    parser.add_argument("--no-fsync-never", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    workloads = [w for w in args.only.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    with contextlib.ExitStack() as stack:
        baseline_src = None
        if args.baseline:
            from bench.targets import exported

            baseline_src = stack.enter_context(exported(args.baseline)).src
        targets = _targets(args, baseline_src)
        ports: dict[str, tuple[int, ...]] = {}
        for name, fsync in targets:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            src = baseline_src if name.startswith("baseline-") else None
            proc, ports[name] = _start_target(name, fsync, tmp, src)
            stack.callback(proc.wait)
            stack.callback(proc.kill)
        values: dict[str, dict[str, list[float]]] = {name: {} for name, _ in targets}
        # Interleaved: run i of every target before run i + 1, the order rotating, so a drift
        # of the shared machine affects every target alike.
        for run in range(args.runs):
            order = targets[run % len(targets) :] + targets[: run % len(targets)]
            for name, fsync in order:
                for workload in workloads:
                    if workload == "consume" and fsync == "never":
                        continue
                    if workload != "consume" and name == "null-batched":
                        continue  # produce does not depend on how a broker delivers
                    if workload == "grpc-sync" and fsync is None:
                        continue  # a null broker has no gRPC port
                    rate = _one(workload, ports[name], fsync is None, args)
                    values[name].setdefault(workload, []).append(rate)
                    print(f"run {run + 1} {name} {workload} {rate:.0f}", flush=True)
    results = {
        name: {w: {"median": statistics.median(v), "runs": v} for w, v in row.items()}
        for name, row in values.items()
    }
    for name, row in results.items():
        print(name, json.dumps({k: round(v["median"]) for k, v in row.items()}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"pulsar-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
