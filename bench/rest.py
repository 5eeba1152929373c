"""``python -m bench.rest``: REST v1 publish and pull beside gRPC on the same server.

One fresh ``pubsubd serve`` (fsync=always) per round; in each round every workload runs over
both APIs, in a rotating order, on fresh topics:

* ``publish-1``: ``--requests`` Publish requests of one 100 B message, 8 in flight;
* ``publish-100``: ``--requests`` / 10 requests of 100 messages of 100 B, 8 in flight;
* ``pull``: a backlog of ``--backlog`` 100 B messages (published over gRPC), drained by 4
  pullers each looping Pull (maxMessages 1000, returnImmediately) then Acknowledge of what came;
  over REST twice: with Google's default pretty-printed JSON, and with ``prettyPrint=false``
  (``rest-compact``).

The clients are raw on both sides, so the figures are the server's: gRPC through ``grpc.aio``
with pre-serialized requests; REST through a minimal HTTP/1.1 client over kept-alive
connections (one per in-flight request) that sends pre-built request bytes and reads
Content-Length bodies; its pull decodes the JSON to find the ack IDs, as any REST client must.
Reported per run: messages/s and the server's CPU per request and per message (/proc).

    flock /tmp/pubsubd-bench.lock .venv/bin/python -m bench.rest --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from bench import pb
from bench.workloads import process_cpu_s, raw_publish

READY = re.compile(r"pubsubd ready grpc=(\S+):(\d+) http=(\S+):(\d+)")
PROJECT = "bench"
SIZE = 100
PUBLISH_CONCURRENCY = 8
PULLERS = 4
PULL_MAX = 1000
SUBSCRIBER = "google.pubsub.v1.Subscriber"


class HttpClient:
    """One kept-alive HTTP/1.1 connection: send request bytes, read a Content-Length answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> HttpClient:
        return cls(*await asyncio.open_connection(host, port))

    async def call(self, request: bytes) -> bytes:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = head[9:12]
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        body = await self.reader.readexactly(length)
        if status != b"200":
            raise RuntimeError(f"HTTP {status.decode()}: {body[:300]!r}")
        return body

    def close(self) -> None:
        self.writer.close()


def http_request(verb: str, path: str, body: Any = None) -> bytes:
    data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
    return (
        f"{verb} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def _start(root: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    log = root / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pubsubd", "serve", "--port", "0", "--http-port", "0",
             "--data-dir", str(root / "data")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PUBSUBD_SLI_EVENTS_S": "0"},
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = READY.search(log.read_text(errors="replace"))
        if m:
            return proc, f"127.0.0.1:{m.group(2)}", int(m.group(4))
        if proc.poll() is not None:
            raise RuntimeError(log.read_text(errors="replace"))
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError("pubsubd not ready")


async def _setup(http_port: int, tag: str) -> tuple[str, str]:
    topic, sub = f"projects/{PROJECT}/topics/{tag}", f"projects/{PROJECT}/subscriptions/{tag}"
    client = await HttpClient.open("127.0.0.1", http_port)
    try:
        await client.call(http_request("PUT", f"/v1/{topic}", {}))
        await client.call(
            http_request("PUT", f"/v1/{sub}", {"topic": topic, "ackDeadlineSeconds": 600})
        )
    finally:
        client.close()
    return topic, sub


async def rest_publish(http_port: int, topic: str, requests: int, batch: int) -> int:
    body = {"messages": [{"data": base64.b64encode(b"x" * SIZE).decode()}] * batch}
    request = http_request("POST", f"/v1/{topic}:publish", body)
    clients = [await HttpClient.open("127.0.0.1", http_port) for _ in range(PUBLISH_CONCURRENCY)]
    left = requests
    acked = 0

    async def sender(client: HttpClient) -> None:
        nonlocal left, acked
        while left > 0:
            left -= 1
            answer = await client.call(request)
            acked += answer.count(b'"') // 2 - 1  # {"messageIds":["1","2",...]}

    try:
        await asyncio.gather(*(sender(c) for c in clients))
    finally:
        for c in clients:
            c.close()
    return acked


async def grpc_publish(endpoint: str, topic: str, requests: int, batch: int) -> int:
    return await raw_publish(
        endpoint, topic, size=SIZE, count=requests * batch, batch=batch,
        concurrency=PUBLISH_CONCURRENCY, deadline=time.perf_counter() + 600,
    )  # fmt: skip


async def rest_pull(http_port: int, sub: str, expected: int, compact: bool = False) -> int:
    query = "?prettyPrint=false" if compact else ""
    pull = http_request(
        "POST", f"/v1/{sub}:pull{query}", {"maxMessages": PULL_MAX, "returnImmediately": True}
    )
    clients = [await HttpClient.open("127.0.0.1", http_port) for _ in range(PULLERS)]
    got = 0

    async def puller(client: HttpClient) -> None:
        nonlocal got
        while got < expected:
            answer = json.loads(await client.call(pull))
            ack_ids = [m["ackId"] for m in answer.get("receivedMessages", [])]
            if not ack_ids:
                await asyncio.sleep(0.005)
                continue
            got += len(ack_ids)
            await client.call(http_request("POST", f"/v1/{sub}:acknowledge", {"ackIds": ack_ids}))

    try:
        await asyncio.gather(*(puller(c) for c in clients))
    finally:
        for c in clients:
            c.close()
    return got


async def grpc_pull(endpoint: str, sub: str, expected: int) -> int:
    got = 0
    async with grpc.aio.insecure_channel(endpoint) as channel:
        pull = channel.unary_unary(
            f"/{SUBSCRIBER}/Pull", request_serializer=None,
            response_deserializer=pb.PullResponse.FromString,
        )  # fmt: skip
        ack = channel.unary_unary(
            f"/{SUBSCRIBER}/Acknowledge", request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=None,
        )  # fmt: skip
        request = pb.PullRequest(
            subscription=sub, max_messages=PULL_MAX, return_immediately=True
        ).SerializeToString()

        async def puller() -> None:
            nonlocal got
            while got < expected:
                answer = await pull(request, timeout=60)
                ack_ids = [m.ack_id for m in answer.received_messages]
                if not ack_ids:
                    await asyncio.sleep(0.005)
                    continue
                got += len(ack_ids)
                await ack(pb.AcknowledgeRequest(subscription=sub, ack_ids=ack_ids), timeout=60)

        await asyncio.gather(*(puller() for _ in range(PULLERS)))
    return got


async def _measure(pid: int, work: Callable[[], Awaitable[int]], requests: int) -> dict[str, float]:
    before = process_cpu_s(pid) or 0.0
    started = time.perf_counter()
    messages = await work()
    elapsed = time.perf_counter() - started
    cpu = (process_cpu_s(pid) or 0.0) - before
    return {
        "messages": messages,
        "seconds": round(elapsed, 3),
        "messages_per_s": round(messages / elapsed),
        "requests_per_s": round(requests / elapsed),
        "server_cpu_us_per_request": round(cpu / requests * 1e6, 1),
        "server_cpu_us_per_message": round(cpu / messages * 1e6, 2),
    }


async def _round(i: int, requests: int, backlog: int) -> dict[str, dict[str, float]]:
    root = Path(tempfile.mkdtemp(prefix="bench-rest-"))
    proc, endpoint, http_port = _start(root)
    results: dict[str, dict[str, float]] = {}
    try:
        await asyncio.sleep(1.0)  # past start-up
        apis = ["grpc", "rest"] if i % 2 == 0 else ["rest", "grpc"]
        for batch, n in ((1, requests), (100, requests // 10)):
            for api in apis:
                topic, _ = await _setup(http_port, f"publish-{batch}-{api}-{i}")
                if api == "rest":
                    work = lambda t=topic, b=batch, n=n: rest_publish(http_port, t, n, b)  # noqa: E731
                else:
                    work = lambda t=topic, b=batch, n=n: grpc_publish(endpoint, t, n, b)  # noqa: E731
                results[f"publish-{batch}/{api}"] = await _measure(proc.pid, work, n)
        pulls = [*apis, "rest-compact"]
        for api in pulls[i % 3 :] + pulls[: i % 3]:
            topic, sub = await _setup(http_port, f"pull-{api}-{i}")
            await grpc_publish(endpoint, topic, backlog // 100, 100)
            await asyncio.sleep(0.5)
            if api.startswith("rest"):
                compact = api == "rest-compact"
                work = lambda s=sub, c=compact: rest_pull(http_port, s, backlog, c)  # noqa: E731
            else:
                work = lambda s=sub: grpc_pull(endpoint, s, backlog)  # noqa: E731
            # Requests: one Pull and one Acknowledge per PULL_MAX messages (at least).
            results[f"pull/{api}"] = await _measure(proc.pid, work, 2 * backlog // PULL_MAX)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    return results


def run(rounds: int, requests: int, backlog: int) -> dict[str, Any]:
    runs = [asyncio.run(_round(i, requests, backlog)) for i in range(rounds)]
    medians = {
        key: {k: statistics.median(r[key][k] for r in runs) for k in runs[0][key]}
        for key in runs[0]
    }
    ratios = {
        work: round(
            medians[f"{work}/rest"]["messages_per_s"] / medians[f"{work}/grpc"]["messages_per_s"], 2
        )
        for work in ("publish-1", "publish-100", "pull")
    }
    ratios["pull-compact"] = round(
        medians["pull/rest-compact"]["messages_per_s"] / medians["pull/grpc"]["messages_per_s"], 2
    )
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "load_average_before": os.getloadavg(),
        },
        "settings": {"rounds": rounds, "requests": requests, "backlog": backlog, "size": SIZE},
        "runs": runs,
        "medians": medians,
        "rest_over_grpc_messages_per_s": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--backlog", type=int, default=50000)
    a = parser.parse_args()
    print(json.dumps(run(a.rounds, a.requests, a.backlog), indent=2))


if __name__ == "__main__":
    main()
