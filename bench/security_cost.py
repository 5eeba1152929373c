"""``python -m bench.security_cost``: what TLS and bearer-token checks cost on publish.

Four server variants, started afresh for every round and interleaved round by round (in a
rotating order) so they share the machine's state: ``plain`` (the default), ``token``
(``--auth-secret-file``: every call carries an HS256 JWT as ``authorization`` metadata),
``tls`` (``--tls-cert``/``--tls-key``, certificates of ``pubsubd certs dev``) and
``tls+token``. Each round, after a warm-up request on the connection:

* ``--requests`` one-message Publish requests (100 B, 8 in flight) through the raw Publish
  RPC, reading the server's CPU seconds (/proc) before and after: requests per second and
  server CPU per request, the unit a token check is paid in;
* ``--batches`` Publish requests of 100 messages of 1 KB (8 in flight): messages per second,
  where the bytes TLS encrypts show.

``--micro`` times the token check alone, in process (``TokenVerifier.verify``): a token seen
before (the verifier remembers it until it expires), a new HS256 and a new RS256 token.

Servers run with ``--fsync interval`` so the figures are the request path's, not the disk's.
Prints JSON with every round and the medians; BENCHMARKS.md quotes the medians.

    flock /tmp/pubsubd-bench.lock .venv/bin/python -m bench.security_cost --rounds 3
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
from bench.workloads import CHANNEL_OPTIONS, process_cpu_s
from pubsubd.cli.security import write_dev_certs
from pubsubd.core.tokens import create_token

TOPIC = "projects/bench/topics/security"
SECRET = b"bench-secret-bench-secret-bench-secret"
VARIANTS = ("plain", "token", "tls", "tls+token")


def _start(root: Path, args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    log = root / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pubsubd", "serve", "--port", "0", "--http-port", "-1",
             "--pulsar-port", "-1", "--fsync", "interval", "--data-dir", str(root / "data"),
             *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PUBSUBD_SLI_EVENTS_S": "0"},
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


async def _publish(
    channel: grpc.aio.Channel, request: bytes, count: int, metadata: Any, concurrency: int = 8
) -> int:
    publish = channel.unary_unary(
        pb.PUBLISH, request_serializer=None, response_deserializer=pb.PublishResponse.FromString
    )
    left = count
    acked = 0

    async def sender() -> None:
        nonlocal left, acked
        while left > 0:
            left -= 1
            response = await publish(request, timeout=60, metadata=metadata)
            acked += len(response.message_ids)

    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return acked


async def _measure(
    endpoint: str, pid: int, certs: Path | None, token: str | None, requests: int, batches: int
) -> dict[str, float]:
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    if certs is not None:
        creds = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        channel = grpc.aio.secure_channel(endpoint, creds, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
    async with channel:
        create = channel.unary_unary(f"/{pb.PUBLISHER}/CreateTopic")
        await create(pb.Topic(name=TOPIC).SerializeToString(), metadata=metadata)
        small = pb.publish_request(TOPIC, 1, 100)
        big = pb.publish_request(TOPIC, 100, 1000)
        await _publish(channel, small, 200, metadata)  # warm-up: connection, caches
        before = process_cpu_s(pid) or 0.0
        started = time.perf_counter()
        acked = await _publish(channel, small, requests, metadata)
        elapsed = time.perf_counter() - started
        cpu = (process_cpu_s(pid) or 0.0) - before
        started = time.perf_counter()
        messages = await _publish(channel, big, batches, metadata)
        batch_elapsed = time.perf_counter() - started
    return {
        "requests_per_s": round(acked / elapsed),
        "cpu_us_per_request": round(cpu / acked * 1e6, 1),
        "batched_messages_per_s": round(messages / batch_elapsed),
    }


def _round(
    variant: str, certs: Path, secret: Path, requests: int, batches: int
) -> dict[str, float]:
    args: list[str] = []
    if "tls" in variant:
        args += [
            "--tls-cert",
            str(certs / "server.pem"),
            "--tls-key",
            str(certs / "server-key.pem"),
        ]
    token = None
    if "token" in variant:
        args += ["--auth-secret-file", str(secret)]
        token = create_token("bench@example.com", secret=SECRET, expires_in_s=3600, now=time.time())
    root = Path(tempfile.mkdtemp(prefix="bench-security-"))
    try:
        proc, endpoint = _start(root, args)
        try:
            return asyncio.run(
                _measure(
                    endpoint,
                    proc.pid,
                    certs if "tls" in variant else None,
                    token,
                    requests,
                    batches,
                )
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(rounds: int, requests: int, batches: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-security-certs-"))
    try:
        write_dev_certs(work / "certs")
        secret = work / "secret"
        secret.write_bytes(SECRET)
        results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        names = list(VARIANTS)
        for i in range(rounds):  # each round in another order: no variant always goes first
            for variant in names[i % len(names) :] + names[: i % len(names)]:
                results[variant].append(_round(variant, work / "certs", secret, requests, batches))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {
        v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in results.items()
    }
    plain = medians["plain"]
    return {
        "rounds": results,
        "medians": medians,
        "relative_to_plain": {
            v: {k: round(m[k] / plain[k], 3) for k in m} for v, m in medians.items()
        },
    }


def micro(n: int = 20000) -> dict[str, float]:
    """Microseconds per ``TokenVerifier.verify``: remembered, new HS256, new RS256."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from pubsubd.core.tokens import TokenSettings, TokenVerifier

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    now = time.time()
    hs = create_token("bench", secret=SECRET, expires_in_s=3600, now=now)
    rs = create_token("bench", private_key=private, expires_in_s=3600, now=now)
    out = {}
    verifier = TokenVerifier(TokenSettings(secret=SECRET, public_key=public))
    for name, token, remembered in (
        ("remembered_us", hs, True),
        ("new_hs256_us", hs, False),
        ("new_rs256_us", rs, False),
    ):
        started = time.perf_counter()
        for _ in range(n):
            if not remembered:
                verifier._verified.clear()  # a token not seen before, every time
            verifier.verify(token)
        out[name] = round((time.perf_counter() - started) / n * 1e6, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--micro", action="store_true", help="only time the token check")
    a = parser.parse_args()
    if a.micro:
        print(json.dumps(micro(), indent=2))
        return
    print(json.dumps(run(a.rounds, a.requests, a.batches), indent=2))


if __name__ == "__main__":
    main()
