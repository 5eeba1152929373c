"""``python -m bench.rolling``: what a client sees while every process of a cluster restarts.

Starts a full local cluster (``pubsubd cluster up``'s launcher: ZooKeeper x3, storage x3 in 3
zones, the serving process or ``--forwarders N``, routers x2, frontends x2), points the
official publisher at both frontends (``PUBSUB_EMULATOR_HOST=ipv4:A,B``) and publishes
``--rate`` messages per second, one message per request (``max_messages=1``), recording each
message's latency from ``publish()`` to its acknowledgement. After ``--before`` seconds it
runs ``LocalCluster.rolling_restart`` (the same as ``pubsubd cluster restart --rolling``), then
goes on for ``--after`` seconds. Reported per phase: messages, publishes that failed for good,
and the latency percentiles up to p99.99 (Pulsar's published figure for a rolling restart with
pre-assigned owners: p99.99 1,228 ms).

    python -m bench.rolling --rate 500
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PHASES = ("before", "restart", "after")


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50_ms": at(0.50) * 1e3,
        "p99_ms": at(0.99) * 1e3,
        "p999_ms": at(0.999) * 1e3,
        "p9999_ms": at(0.9999) * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


def run(
    rate: int, before: float, after: float, directory: Path, forwarders: int = 0
) -> dict[str, Any]:
    from google.cloud import pubsub_v1

    from pubsubd.cluster.launcher import LocalCluster

    cluster = LocalCluster(directory)
    cluster.up(
        zk_nodes=3,
        storage_nodes=3,
        zones=3,
        replicas=3,
        routers=2,
        frontends=2,
        forwarders=forwarders,
    )
    latencies: dict[str, list[float]] = {p: [] for p in PHASES}
    samples: list[tuple[float, float]] = []  # (sent at, latency) during the restart
    errors: dict[str, int] = dict.fromkeys(PHASES, 0)
    phase = ["before"]
    lock = threading.Lock()
    stop = threading.Event()
    try:
        os.environ["PUBSUB_EMULATOR_HOST"] = "ipv4:" + ",".join(cluster.frontends)
        publisher = pubsub_v1.PublisherClient(
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=1)
        )
        topic = "projects/bench/topics/rolling"
        publisher.create_topic(name=topic)

        def publish_loop() -> None:
            interval, next_at, n = 1.0 / rate, time.monotonic(), 0
            while not stop.is_set():
                sent_at, current = time.monotonic(), phase[0]

                def done(future: Any, sent_at: float = sent_at, current: str = current) -> None:
                    took = time.monotonic() - sent_at
                    with lock:
                        if future.exception() is None:
                            latencies[current].append(took)
                            if current == "restart":
                                samples.append((sent_at, took))
                        else:
                            errors[current] += 1

                publisher.publish(topic, b"m-%d" % n).add_done_callback(done)
                n += 1
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

        thread = threading.Thread(target=publish_loop, daemon=True)
        thread.start()
        time.sleep(before)
        phase[0] = "restart"
        started = time.monotonic()
        back: list[tuple[str, float]] = []
        restarted = cluster.rolling_restart(each=lambda n: back.append((n, time.monotonic())))
        restart_s = time.monotonic() - started
        phase[0] = "after"
        time.sleep(after)
        stop.set()
        thread.join(10)
        time.sleep(5)  # the last publishes' answers
        publisher.stop()
    finally:
        cluster.down()
    # Per process: the slowest publish sent while it was down or starting.
    per_process = []
    begin = started
    for name, end in back:
        worst = max((took for at, took in samples if begin <= at < end), default=0.0)
        per_process.append({"process": name, "seconds": end - begin, "worst_ms": worst * 1e3})
        begin = end
    with lock:
        return {
            "rate": rate,
            "restarted": restarted,
            "restart_s": restart_s,
            "per_process": per_process,
            "phases": {
                p: {
                    "messages": len(latencies[p]),
                    "failed": errors[p],
                    **_percentiles(latencies[p]),
                }
                for p in PHASES
            },
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=500, help="messages per second")
    parser.add_argument("--before", type=float, default=15.0, help="s of load before")
    parser.add_argument("--after", type=float, default=10.0, help="s of load after")
    parser.add_argument(
        "--forwarders", type=int, default=0, help="forwarders instead of one serving process"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pubsubd-rolling-") as tmp:
        result = run(args.rate, args.before, args.after, Path(tmp), args.forwarders)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"rolling restart of {len(result['restarted'])} processes in {result['restart_s']:.1f} s "
        f"at {args.rate} msg/s (one message per publish request)"
    )
    print("| phase | messages | failed | p50 | p99 | p99.9 | p99.99 | max (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p, s in result["phases"].items():
        cells = " | ".join(
            f"{s.get(k, 0):.1f}" for k in ("p50_ms", "p99_ms", "p999_ms", "p9999_ms", "max_ms")
        )
        print(f"| {p} | {s['messages']:,} | {s['failed']} | {cells} |")
    print()
    print("| process restarted | s until ready | slowest publish sent meanwhile, ms |")
    print("|---|---:|---:|")
    for row in result["per_process"]:
        print(f"| {row['process']} | {row['seconds']:.1f} | {row['worst_ms']:.0f} |")


if __name__ == "__main__":
    main()
