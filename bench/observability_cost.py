"""``python -m bench.observability_cost``: what the request SLIs and the in-server prober cost.

Three server variants, started afresh for every round and interleaved round by round so they
share the machine's state: ``slis`` (the default), ``no-slis`` (``PUBSUBD_REQUEST_SLIS=0``)
and ``prober`` (the default plus ``--prober-interval 1``), in a rotating order. Each round:

* publishes ``--requests`` one-message requests (100 B, 8 in flight) through the raw Publish
  RPC and reads the server's CPU seconds (/proc) before and after: CPU per request, the unit
  the SLIs are paid in (one record per request, whatever its size);
* then leaves the server idle for ``--idle`` seconds and reads its CPU again: the idle cost,
  where the prober's rounds show.

Prints JSON with every round and the medians; BENCHMARKS.md quotes the medians.

    flock /tmp/pubsubd-bench.lock .venv/bin/python -m bench.observability_cost --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench import pb
from bench.targets import PUBSUBD_READY
from bench.workloads import process_cpu_s, raw_publish

TOPIC = "projects/bench/topics/observability"
VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "slis": ({}, []),
    "no-slis": ({"PUBSUBD_REQUEST_SLIS": "0"}, []),
    "prober": ({}, ["--prober-interval", "1"]),
}


def _start(root: Path, env: dict[str, str], args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    log = root / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pubsubd", "serve", "--port", "0", "--http-port", "-1",
             "--data-dir", str(root / "data"), *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PUBSUBD_SLI_EVENTS_S": "0", **env},
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = PUBSUBD_READY.search(log.read_text(errors="replace"))
        if m:
            return proc, f"127.0.0.1:{m.group(2)}"
        if proc.poll() is not None:
            raise RuntimeError(log.read_text(errors="replace"))
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError("pubsubd not ready")


def _round(variant: str, requests: int, idle_s: float) -> dict[str, float]:
    env, args = VARIANTS[variant]
    root = Path(tempfile.mkdtemp(prefix="bench-observability-"))
    try:
        proc, endpoint = _start(root, env, args)
        try:
            with grpc.insecure_channel(endpoint) as channel:
                channel.unary_unary(
                    f"/{pb.PUBLISHER}/CreateTopic",
                    request_serializer=lambda r: r.SerializeToString(),
                    response_deserializer=lambda b: b,
                )(pb.Topic(name=TOPIC))
            time.sleep(1.0)  # past start-up
            before = process_cpu_s(proc.pid) or 0.0
            started = time.perf_counter()
            acked = asyncio.run(
                raw_publish(
                    endpoint, TOPIC, size=100, count=requests, batch=1, concurrency=8,
                    deadline=started + 600,
                )
            )  # fmt: skip
            elapsed = time.perf_counter() - started
            after = process_cpu_s(proc.pid) or 0.0
            time.sleep(idle_s)
            idle = (process_cpu_s(proc.pid) or 0.0) - after
            return {
                "requests": acked,
                "requests_per_s": round(acked / elapsed),
                "cpu_us_per_request": round((after - before) / acked * 1e6, 1),
                "idle_cpu_pct": round(idle / idle_s * 100, 2),
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(rounds: int, requests: int, idle_s: float) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    names = list(VARIANTS)
    for i in range(rounds):  # each round in another order: no variant always goes first
        for variant in names[i % len(names) :] + names[: i % len(names)]:
            results[variant].append(_round(variant, requests, idle_s))
    medians = {
        v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in results.items()
    }
    base = medians["no-slis"]["cpu_us_per_request"]
    return {
        "rounds": results,
        "medians": medians,
        "slis_cpu_us_per_request_added": round(medians["slis"]["cpu_us_per_request"] - base, 1),
        "prober_idle_cpu_pct_added": round(
            medians["prober"]["idle_cpu_pct"] - medians["slis"]["idle_cpu_pct"], 2
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--idle", type=float, default=20.0, help="idle seconds per round")
    a = parser.parse_args()
    print(json.dumps(run(a.rounds, a.requests, a.idle), indent=2))


if __name__ == "__main__":
    main()
