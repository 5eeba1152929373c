"""``python -m bench.restart``: how long a restart takes with a large log.

Starts pubsubd (127.0.0.1, ephemeral port, temp dir, ``--fsync never`` for a fast fill), creates
a topic with one subscription, fills it with ``--gb`` GB of 1000-byte messages through the raw
Publish RPC (1000-message requests, 4 in flight), stops it (SIGTERM), and then restarts it
``--runs`` times, timing each restart from the process start to its ready line. Each round runs
once with the sealed segments' index files (``storage/segment_index.py``) and once with them
deleted first (the start-up scan of every segment, as before they existed), so both figures come
from the same session and the same page cache. A fresh, empty data directory is timed too, as
the floor (interpreter and imports). Prints JSON; medians are what BENCHMARKS.md quotes.

    flock /tmp/pubsubd-bench.lock .venv/bin/python -m bench.restart --gb 3
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
from bench.workloads import raw_publish

TOPIC = "projects/bench/topics/restart"
SUB = "projects/bench/subscriptions/restart"
READY_TIMEOUT_S = 600.0


class Server:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    def start(self) -> float:
        """Start; return the seconds until the ready line."""
        log_path = self.data_dir.with_suffix(".log")
        started = time.perf_counter()
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "pubsubd", "serve", "--port", "0", "--http-port", "0",
                    "--data-dir", str(self.data_dir), "--fsync", "never",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        while time.perf_counter() - started < READY_TIMEOUT_S:
            m = PUBSUBD_READY.search(log_path.read_text(errors="replace"))
            if m:
                self.endpoint = f"127.0.0.1:{m.group(2)}"
                return time.perf_counter() - started
            if self.proc.poll() is not None:
                raise RuntimeError(f"pubsubd exited: {log_path.read_text(errors='replace')}")
            time.sleep(0.01)
        raise RuntimeError("pubsubd not ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _fill(server: Server, gigabytes: float) -> int:
    with grpc.insecure_channel(server.endpoint) as channel:
        for method, request in (
            (f"/{pb.PUBLISHER}/CreateTopic", pb.Topic(name=TOPIC)),
            (f"/{pb.SUBSCRIBER}/CreateSubscription", pb.Subscription(name=SUB, topic=TOPIC)),
        ):
            call = channel.unary_unary(
                method, request_serializer=lambda r: r.SerializeToString(),
                response_deserializer=lambda b: b,
            )  # fmt: skip
            call(request)
    count = int(gigabytes * 1e9 / 1000) // 1000 * 1000
    deadline = time.perf_counter() + 3600
    return asyncio.run(
        raw_publish(
            server.endpoint, TOPIC, size=1000, count=count, batch=1000, concurrency=4,
            deadline=deadline,
        )
    )  # fmt: skip


def _drop_index_files(data_dir: Path) -> int:
    files = list(data_dir.rglob("*.idx"))
    for path in files:
        path.unlink()
    return len(files)


def run(gigabytes: float, runs: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    try:
        empty = Server(root / "empty")
        floor = []
        for _ in range(runs):
            floor.append(empty.start())
            empty.stop()
        server = Server(root / "data")
        server.start()
        messages = _fill(server, gigabytes)
        server.stop()
        size = sum(p.stat().st_size for p in server.data_dir.rglob("*") if p.is_file())
        with_index: list[float] = []
        scanning: list[float] = []
        for _ in range(runs):
            with_index.append(server.start())  # (the previous scan wrote the index files)
            server.stop()
            dropped = _drop_index_files(server.data_dir)
            scanning.append(server.start())
            server.stop()
        return {
            "messages": messages,
            "data_bytes": size,
            "index_files": dropped,
            "empty_ready_s": [round(x, 3) for x in floor],
            "with_index_ready_s": [round(x, 3) for x in with_index],
            "scan_ready_s": [round(x, 3) for x in scanning],
            "median_empty_s": round(statistics.median(floor), 3),
            "median_with_index_s": round(statistics.median(with_index), 3),
            "median_scan_s": round(statistics.median(scanning), 3),
            "loadavg": os.getloadavg(),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=3.0, help="log size to fill, in GB")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(run(args.gb, args.runs), indent=2))


if __name__ == "__main__":
    main()
