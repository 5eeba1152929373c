"""What a schema costs on Publish: raw throughput to a topic without a schema beside topics with
an Avro (JSON encoding) and a Protocol Buffer (BINARY encoding) schema, one server, runs
interleaved.

``python -m bench.schema_publish [--runs 5] [--seconds 3]``: starts its own ``pubsubd serve``
(``--fsync always``, 127.0.0.1, ephemeral ports, a temporary data directory), publishes
pre-serialized requests of 1000 messages (~100 B of data each, valid for the schema) with 4 in
flight for ``--seconds`` per run and topic, prints msgs/s per run and the medians, and stops
the server by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from google.pubsub_v1 import types as T

PUBLISH = "/google.pubsub.v1.Publisher/Publish"
CREATE_SCHEMA = "/google.pubsub.v1.SchemaService/CreateSchema"
CREATE_TOPIC = "/google.pubsub.v1.Publisher/CreateTopic"
PROJECT = "projects/bench"
AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "customer", "type": "string"},
            {"name": "note", "type": "string"},
        ],
    }
)
PROTO = (
    'syntax = "proto3";\n'
    "message Order {\n  int64 id = 1;\n  string customer = 2;\n  string note = 3;\n}\n"
)
BATCH = 1000
IN_FLIGHT = 4


def _start(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pubsubd",
            "serve",
            "--port",
            "0",
            "--http-port",
            "-1",
            "--pulsar-port",
            "-1",
            "--data-dir",
            str(data_dir),
        ],
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        text = line.decode()
        if "pubsubd ready" in text:
            grpc_addr = text.split("grpc=")[1].split()[0]
            return proc, grpc_addr
    raise RuntimeError("pubsubd did not start")


def _requests(topic: str, kind: str) -> bytes:
    """One PublishRequest of BATCH messages valid for the topic's schema, serialized."""
    message = T.PubsubMessage.pb()
    if kind == "proto":
        messages = [message(data=_proto_order(i)) for i in range(BATCH)]
    else:
        note = "x" * 60
        messages = [
            message(data=json.dumps({"id": i, "customer": "customer-0042", "note": note}).encode())
            for i in range(BATCH)
        ]
    serialized: bytes = T.PublishRequest.pb()(topic=topic, messages=messages).SerializeToString()
    return serialized


def _proto_order(i: int) -> bytes:
    # Order{id=i, customer="customer-0042", note="x"*60}, written by hand (fields 1, 2, 3).
    out = bytearray(b"\x08")
    value = i
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            break
    out += b"\x12\x0dcustomer-0042" + b"\x1a\x3c" + b"x" * 60
    return bytes(out)


async def _setup(channel: grpc.aio.Channel) -> dict[str, bytes]:
    unary = channel.unary_unary
    create_schema = unary(CREATE_SCHEMA, request_serializer=None, response_deserializer=None)
    create_topic = unary(CREATE_TOPIC, request_serializer=None, response_deserializer=None)
    topics = {}
    for kind, schema_type, definition, encoding in (
        ("none", None, "", 0),
        ("avro-json", T.Schema.Type.AVRO, AVRO, T.Encoding.JSON),
        ("proto-binary", T.Schema.Type.PROTOCOL_BUFFER, PROTO, T.Encoding.BINARY),
    ):
        topic = f"{PROJECT}/topics/schema-bench-{kind}"
        body = T.Topic.pb()(name=topic)
        if schema_type is not None:
            request = T.CreateSchemaRequest.pb()(parent=PROJECT, schema_id=f"bench-{kind}")
            request.schema.type_ = schema_type
            request.schema.definition = definition
            await create_schema(request.SerializeToString())
            body.schema_settings.schema = f"{PROJECT}/schemas/bench-{kind}"
            body.schema_settings.encoding = encoding
        await create_topic(body.SerializeToString())
        topics[kind] = _requests(topic, "proto" if kind == "proto-binary" else "json")
    return topics


async def _run(channel: grpc.aio.Channel, payload: bytes, seconds: float) -> float:
    publish = channel.unary_unary(PUBLISH, request_serializer=None, response_deserializer=None)
    deadline = time.perf_counter() + seconds
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while time.perf_counter() < deadline:
            await publish(payload, timeout=60)
            sent += BATCH

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return sent / (time.perf_counter() - start)


async def _main(runs: int, seconds: float, endpoint: str) -> dict[str, list[float]]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(endpoint, options=options) as channel:
        payloads = await _setup(channel)
        for payload in payloads.values():
            await _run(channel, payload, 0.5)  # warm-up
        results: dict[str, list[float]] = {k: [] for k in payloads}
        for run in range(runs):
            order = list(payloads) if run % 2 == 0 else list(reversed(payloads))
            for kind in order:
                rate = await _run(channel, payloads[kind], seconds)
                results[kind].append(rate)
                print(f"run {run + 1} {kind}: {rate:,.0f} msg/s", flush=True)
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="schema-bench-") as tmp:
        proc, endpoint = _start(Path(tmp) / "data")
        try:
            results = asyncio.run(_main(args.runs, args.seconds, endpoint))
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    base = statistics.median(results["none"])
    for kind, rates in results.items():
        median = statistics.median(rates)
        print(
            f"{kind}: median {median:,.0f} msg/s ({min(rates):,.0f}-{max(rates):,.0f}), "
            f"{median / base:.2f}x of no schema"
        )


if __name__ == "__main__":
    main()
