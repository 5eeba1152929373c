"""``python -m bench.iam_cost``: what authorization (``--iam``) costs on publish throughput.

Two server variants, started afresh for every round and interleaved round by round in a
rotating order: ``iam-off`` (the default) and ``iam-on`` (``--iam`` with a policy file granting
``roles/pubsub.admin`` to ``allUsers`` on every project, so the raw client's anonymous calls
pass; each call still reads its resource from the request bytes and evaluates the policies).
Each round, on a fresh server: ``--requests`` one-message Publish requests (100 B, 8 in flight),
then ``--batched`` requests of 100 messages (100 B each), through the raw Publish RPC; the
rate and the server's CPU seconds (/proc) per request of each.

Prints JSON with every round and the medians; BENCHMARKS.md quotes the medians.

    flock /tmp/pubsubd-bench.lock .venv/bin/python -m bench.iam_cost --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench import pb
from bench.observability_cost import _start
from bench.workloads import process_cpu_s, raw_publish

TOPIC = "projects/bench/topics/iam"
POLICY = {
    "projects": {"*": {"bindings": [{"role": "roles/pubsub.admin", "members": ["allUsers"]}]}}
}
VARIANTS = ("iam-off", "iam-on")


def _publish(
    proc: subprocess.Popen[bytes], endpoint: str, requests: int, batch: int
) -> dict[str, float]:
    before = process_cpu_s(proc.pid) or 0.0
    started = time.perf_counter()
    acked = asyncio.run(
        raw_publish(
            endpoint, TOPIC, size=100, count=requests * batch, batch=batch, concurrency=8,
            deadline=started + 600,
        )
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    after = process_cpu_s(proc.pid) or 0.0
    done = acked // batch
    return {
        "requests_per_s": round(done / elapsed),
        "messages_per_s": round(acked / elapsed),
        "cpu_us_per_request": round((after - before) / done * 1e6, 1),
    }


def _round(variant: str, requests: int, batched: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bench-iam-"))
    try:
        args: list[str] = []
        if variant == "iam-on":
            (root / "policy.json").write_text(json.dumps(POLICY))
            args = ["--iam", "--iam-policy-file", str(root / "policy.json")]
        proc, endpoint = _start(root, {}, args)
        try:
            with grpc.insecure_channel(endpoint) as channel:
                channel.unary_unary(
                    f"/{pb.PUBLISHER}/CreateTopic",
                    request_serializer=lambda r: r.SerializeToString(),
                    response_deserializer=lambda b: b,
                )(pb.Topic(name=TOPIC))
            time.sleep(1.0)  # past start-up
            one = _publish(proc, endpoint, requests, 1)
            hundred = _publish(proc, endpoint, batched, 100)
            return {
                **{f"single_{k}": v for k, v in one.items()},
                **{f"batch100_{k}": v for k, v in hundred.items()},
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


def run(rounds: int, requests: int, batched: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    names = list(VARIANTS)
    for i in range(rounds):  # each round in another order: no variant always goes first
        for variant in names[i % len(names) :] + names[: i % len(names)]:
            results[variant].append(_round(variant, requests, batched))
    medians = {
        v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in results.items()
    }
    return {"rounds": results, "medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=5000, help="one-message requests")
    parser.add_argument("--batched", type=int, default=1000, help="100-message requests")
    a = parser.parse_args()
    print(json.dumps(run(a.rounds, a.requests, a.batched), indent=2))


if __name__ == "__main__":
    main()
