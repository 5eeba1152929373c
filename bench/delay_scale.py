"""``python -m bench.delay_scale``: the memory cost of many delayed messages.

Starts a fresh pubsubd (fsync=always), creates a topic with one subscription and an open
StreamingPull (so the dispatcher reads the whole log), publishes ``--messages`` 100 B messages in
1000-message requests, either all delayed by an hour (``pubsubd.deliver_after`` = 3600) or not
delayed at all (then acked as they arrive), and reports the server's RSS before and after, the
rows and size of the on-disk delay index, and the publish rate. Run both kinds and compare: the
difference is what delayed messages cost in memory.

    python -m bench.delay_scale --messages 1000000 --kind delayed
    python -m bench.delay_scale --messages 1000000 --kind plain
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import threading
import time
import uuid
from typing import Any

import grpc

from bench import pb
from bench.targets import PubsubdTarget
from bench.workloads import process_status, server_data_dir

TOPIC = "projects/bench/topics/delay-scale"
SUB = "projects/bench/subscriptions/delay-scale"


def _drain(channel: grpc.Channel, stop: threading.Event, seen: list[int]) -> None:
    """One StreamingPull that acks everything it receives (plain kind) until ``stop``."""
    call = channel.stream_stream(
        pb.STREAMING_PULL,
        request_serializer=pb.StreamingPullRequest.SerializeToString,
        response_deserializer=pb.StreamingPullResponse.FromString,
    )
    first = pb.StreamingPullRequest(
        subscription=SUB,
        stream_ack_deadline_seconds=60,
        max_outstanding_messages=5000,
        client_id=uuid.uuid4().hex,
    )
    acks: list[Any] = []
    cond = threading.Condition()

    def requests() -> Any:
        yield first
        while not stop.is_set():
            with cond:
                cond.wait(0.1)
                batch, acks[:] = list(acks), []
            if batch:
                yield pb.StreamingPullRequest(ack_ids=batch)

    try:
        for response in call(requests()):
            ids = [m.ack_id for m in response.received_messages]
            seen[0] += len(ids)
            with cond:
                acks.extend(ids)
                cond.notify()
            if stop.is_set():
                break
    except grpc.RpcError:
        pass


def run(messages: int, kind: str) -> dict[str, Any]:
    target = PubsubdTarget("always").start()
    try:
        pid = target.pid
        assert pid is not None
        with grpc.insecure_channel(target.endpoint) as channel:
            create_topic = channel.unary_unary(
                f"/{pb.PUBLISHER}/CreateTopic",
                request_serializer=lambda r: r.SerializeToString(),
                response_deserializer=lambda b: b,
            )
            create_sub = channel.unary_unary(
                f"/{pb.SUBSCRIBER}/CreateSubscription",
                request_serializer=lambda r: r.SerializeToString(),
                response_deserializer=lambda b: b,
            )
            create_topic(pb.Topic(name=TOPIC))
            create_sub(pb.Subscription(name=SUB, topic=TOPIC, ack_deadline_seconds=60))
            stop = threading.Event()
            seen = [0]
            drainer = threading.Thread(target=_drain, args=(channel, stop, seen), daemon=True)
            drainer.start()
            time.sleep(1.0)
            before = process_status(pid)
            attrs = {"pubsubd.deliver_after": "3600"} if kind == "delayed" else {}
            request = pb.PublishRequest(
                topic=TOPIC,
                messages=[pb.PubsubMessage(data=bytes(100), attributes=attrs) for _ in range(1000)],
            ).SerializeToString()
            publish = channel.unary_unary(
                pb.PUBLISH, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            start = time.perf_counter()
            for _ in range(messages // 1000):
                publish(request)
            elapsed = time.perf_counter() - start
            time.sleep(5.0)  # the dispatcher reads (and skips or delivers) everything
            after = process_status(pid)
            stop.set()
        data_dir = server_data_dir(pid)
        rows = delayed = 0
        index_kb = 0
        if data_dir is not None and (data_dir / "delays.db").exists():
            db = sqlite3.connect(str(data_dir / "delays.db"))
            rows, delayed = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(count), 0) FROM delays"
            ).fetchone()
            db.close()
            index_kb = (
                sum(p.stat().st_size for p in data_dir.glob("delays.db*") if p.is_file()) // 1024
            )
        return {
            "kind": kind,
            "messages": messages,
            "publish_msgs_per_s": round(messages / elapsed),
            "rss_before_mb": round(before["rss_kb"] / 1024, 1),
            "rss_after_mb": round(after["rss_kb"] / 1024, 1),
            "rss_growth_bytes_per_msg": round(
                (after["rss_kb"] - before["rss_kb"]) * 1024 / messages, 1
            ),
            "delivered_before_due": seen[0],
            "index_rows": rows,
            "index_messages": delayed,
            "index_kb": index_kb,
        }
    finally:
        target.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--kind", choices=("delayed", "plain"), default="delayed")
    args = parser.parse_args()
    print(json.dumps(run(args.messages, args.kind), indent=2))


if __name__ == "__main__":
    main()
