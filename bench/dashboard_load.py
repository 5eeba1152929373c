"""Dashboard page load time, and the README's screenshots.

Starts its own ``pubsubd serve`` (temporary data directory, ephemeral loopback ports), creates
``--topics`` topics with one subscription each, publishes ``--messages`` messages to each and
acks a third of them, waits for the dashboard's sampler to have a minute-ish of history, then
times headless Chromium (``--dump-dom``, the same flags as the tests) loading each page until
its scripts fetched the API and rendered. A load of ``/healthz`` (plain text, no script) is
the baseline: the browser's own start-up, which the page's figure includes. Medians of
``--runs`` loads; the JSON API's own answer times (urllib, same machine) are beside them.

    python -m bench.dashboard_load                       # 100 topics, 5 runs per page
    python -m bench.dashboard_load --runs 0 --screenshots docs/screenshots

The server is stopped by its PID at the end (SIGTERM, then SIGKILL if it lingers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
PROJECT = "bench-dashboard"
READY = re.compile(rb"pubsubd ready grpc=(\S+):(\d+) http=(\S+):(\d+)")
# The first poll comes at 5 s: a 4 s virtual budget measures the first load and render only.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--hide-scrollbars",
]


def chromium(
    args: list[str], budget_ms: int, expect: bytes | None = None, timeout: float = 60.0
) -> float:
    """Seconds for one headless Chromium run (a fresh profile each time); ``expect``: what its
    output must contain (the dashboard's mark of a rendered page)."""
    with tempfile.TemporaryDirectory(prefix="pubsubd-chromium-") as profile:
        start = time.perf_counter()
        out = subprocess.run(
            [
                CHROMIUM,
                *FLAGS,
                f"--virtual-time-budget={budget_ms}",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            timeout=timeout,
            check=True,
        )
        elapsed = time.perf_counter() - start
    if expect is not None and expect not in out.stdout:
        raise RuntimeError(f"the page did not render: {args[-1]}")
    return elapsed


def start_server(data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PUBSUB_EMULATOR_HOST"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pubsubd",
                "serve",
                "--port",
                "0",
                "--http-port",
                "0",
                "--data-dir",
                str(data_dir),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        m = READY.search(log.read_bytes())
        if m:
            return proc, f"{m[1].decode()}:{m[2].decode()}", f"{m[3].decode()}:{m[4].decode()}"
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError("pubsubd did not become ready")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def traffic(endpoint: str, topics: int, messages: int) -> tuple[str, str]:
    os.environ["PUBSUB_EMULATOR_HOST"] = endpoint
    from google.cloud import pubsub_v1

    pub = pubsub_v1.PublisherClient()
    sub = pubsub_v1.SubscriberClient()
    first = ("", "")
    for i in range(topics):
        topic = f"projects/{PROJECT}/topics/topic-{i:03d}"
        name = f"projects/{PROJECT}/subscriptions/sub-{i:03d}"
        pub.create_topic(name=topic)
        sub.create_subscription(name=name, topic=topic)
        futures = [pub.publish(topic, b"m%d" % n) for n in range(messages)]
        for f in futures:
            f.result(timeout=30)
        want = messages // 3
        while want > 0:
            got = sub.pull(subscription=name, max_messages=want, timeout=10).received_messages
            if got:
                sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got], timeout=10)
            want -= len(got)
        if i == 0:
            first = (topic, name)
    pub.stop()
    sub.close()
    return first


def api_ms(base: str, path: str, runs: int) -> float:
    times = []
    for _ in range(max(runs, 1)):
        start = time.perf_counter()
        with urllib.request.urlopen(base + path, timeout=10) as resp:
            json.loads(resp.read())
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--history-s", type=float, default=65.0, help="traffic-free wait")
    parser.add_argument("--screenshots", type=Path, help="write the pages' PNGs here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pubsubd-dashboard-bench-") as tmp:
        proc, grpc_at, http_at = start_server(Path(tmp) / "data", Path(tmp) / "pubsubd.log")
        try:
            t0 = time.monotonic()
            topic, sub = traffic(grpc_at, args.topics, args.messages)
            print(f"traffic: {args.topics} topics in {time.monotonic() - t0:.1f} s", flush=True)
            time.sleep(args.history_s)
            base = f"http://{http_at}"
            quote = urllib.parse.quote
            pages = {
                "/healthz (baseline)": "/healthz",
                "/": "/",
                "/ui/topic": f"/ui/topic?name={quote(topic, safe='')}",
                "/ui/subscription": f"/ui/subscription?name={quote(sub, safe='')}",
                "/ui/alerts": "/ui/alerts",
                "/ui/cluster": "/ui/cluster",
            }
            results: dict[str, Any] = {"topics": args.topics, "runs": args.runs, "pages": {}}
            for label, path in pages.items() if args.runs else ():
                expect = b"ok" if path == "/healthz" else b"data-loaded="
                times = [
                    chromium(["--dump-dom", base + path], 4000, expect) for _ in range(args.runs)
                ]
                results["pages"][label] = {
                    "median_ms": round(statistics.median(times) * 1000),
                    "min_ms": round(min(times) * 1000),
                    "max_ms": round(max(times) * 1000),
                }
                print(f"{label:24} {results['pages'][label]}", flush=True)
            if args.runs:
                results["api_median_ms"] = {
                    p: round(api_ms(base, p, args.runs), 1)
                    for p in ("/api/overview", "/api/topics", "/api/subscriptions")
                }
                print(json.dumps(results, indent=2))
            if args.screenshots is not None:
                args.screenshots.mkdir(parents=True, exist_ok=True)
                for label, path in pages.items():
                    if label.startswith("/healthz"):
                        continue
                    name = label.removeprefix("/ui/") if label != "/" else "overview"
                    png = (args.screenshots / f"{name}.png").resolve()
                    height = 1500 if name == "overview" else 900
                    size = f"--window-size=1280,{height}"
                    chromium([size, f"--screenshot={png}", base + path], 10000)
                    print(f"wrote {png}")
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
