"""``python -m bench.fanout_cpu``: CPU per delivered message at the subscribing side for 1, 4
and 16 subscriptions of one topic (issue 11, part 8: fan-out CPU).

Two deployments, each started here and stopped after:

* ``one-process``: ``pubsubd serve --fsync always`` (every role in one process);
* ``cluster``: ZooKeeper x1, storage x3 in 2 zones, one router, one frontend, one
  publishing-only forwarder (``forwarder-1``, the topic's owner) and one subscribing-only
  forwarder (``forwarder-2``, serving every subscription from its copy of the topic). Clients
  go through the frontend.

Per run and fan-out ``N``: a topic and ``N`` subscriptions; ``--count`` messages of
``--size`` bytes published in 1000-message requests; once every process is quiet, ``N`` raw
StreamingPulls (one per subscription, one event loop, unary Acknowledge of each response's
ack IDs, as ``drain-raw`` does) drain the backlog. CPU (user + system, ``/proc``) of each
process over the drain, divided by the messages delivered (``N`` x ``--count``): the
subscribing process's is the figure (the serve process in one process: it also journals the
acks, which the owner does in a cluster). Resources are deleted after each run.

    flock -w 3600 /tmp/pubsubd-bench.lock .venv/bin/python -m bench.fanout_cpu --runs 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from bench import pb
from bench.workloads import (
    CHANNEL_OPTIONS,
    RPC_TIMEOUT_S,
    machine_busy_s,
    process_cpu_s,
    raw_publish,
)

FANOUTS = (1, 4, 16)
QUIET_CPU_FRACTION = 0.05  # of one core, every process together: the drain starts then


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds by name; names ``x#...`` are summed under ``x`` (``storage``: every
    storage node)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        key = name.split("#", 1)[0]
        out[key] = out.get(key, 0.0) + (process_cpu_s(pid) or 0.0)
    return out


def _measured(pids: dict[str, int]) -> dict[str, int]:
    """The processes measured: the deployment's, and this one (the consumers)."""
    return {**pids, "client": os.getpid()}


def _wait_quiet(pids: dict[str, int], limit_s: float = 20.0) -> None:
    """Until the processes together use under ``QUIET_CPU_FRACTION`` of a core over 0.5 s
    (copies filled, journals flushed), or ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = sum(_cpu(pids).values())
        time.sleep(0.5)
        if sum(_cpu(pids).values()) - before < 0.5 * QUIET_CPU_FRACTION:
            return


async def _drain(endpoint: str, subscriptions: list[str], count: int) -> dict[str, int]:
    """One raw StreamingPull per subscription until each has seen ``count`` distinct
    messages (and every ack is answered)."""
    async with grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS) as channel:
        streaming_pull, acknowledge = pb.subscriber_stubs(channel)

        async def one(subscription: str) -> tuple[int, int]:
            seen: set[str] = set()
            deliveries = 0
            acks: list[Any] = []
            call = streaming_pull()
            await call.write(
                pb.StreamingPullRequest(
                    subscription=subscription,
                    stream_ack_deadline_seconds=60,
                    max_outstanding_messages=5000,
                    client_id=uuid.uuid4().hex,
                )
            )
            try:
                while len(seen) < count:
                    response = await call.read()
                    if response is grpc.aio.EOF:
                        break
                    ack_ids = [r.ack_id for r in response.received_messages]
                    seen.update(r.message.message_id for r in response.received_messages)
                    deliveries += len(ack_ids)
                    for i in range(0, len(ack_ids), 1000):
                        request = pb.AcknowledgeRequest(
                            subscription=subscription, ack_ids=ack_ids[i : i + 1000]
                        )
                        acks.append(
                            asyncio.ensure_future(acknowledge(request, timeout=RPC_TIMEOUT_S))
                        )
                await asyncio.gather(*acks)
            finally:
                call.cancel()
            return len(seen), deliveries

        results = await asyncio.gather(*(one(s) for s in subscriptions))
    return {
        "received": sum(r[0] for r in results),
        "deliveries": sum(r[1] for r in results),
    }


def run_once(
    endpoint: str,
    pids: dict[str, int],
    fanout: int,
    count: int,
    size: int,
    placed: Callable[[list[str]], bool],
) -> dict[str, Any]:
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    tag = uuid.uuid4().hex[:8]
    topic = f"projects/bench/topics/fanout-{tag}"
    subscriptions = [f"projects/bench/subscriptions/fanout-{tag}-{i}" for i in range(fanout)]
    publisher.create_topic(name=topic)
    for name in subscriptions:
        subscriber.create_subscription(
            request={"name": name, "topic": topic, "ack_deadline_seconds": 60}
        )
    try:
        deadline = time.monotonic() + 60
        while not placed(subscriptions):
            if time.monotonic() > deadline:
                raise RuntimeError("subscriptions not served within 60 s")
            time.sleep(0.2)
        published = asyncio.run(
            raw_publish(
                endpoint,
                topic,
                size=size,
                count=count,
                batch=1000,
                concurrency=4,
                deadline=time.perf_counter() + 120,
            )
        )
        _wait_quiet(pids)
        before, started = _cpu(_measured(pids)), time.perf_counter()
        busy_before = machine_busy_s()
        drained = asyncio.run(asyncio.wait_for(_drain(endpoint, subscriptions, count), 300))
        elapsed = time.perf_counter() - started
        after = _cpu(_measured(pids))
        busy = machine_busy_s() - busy_before
    finally:
        for name in subscriptions:
            subscriber.delete_subscription(subscription=name)
        publisher.delete_topic(topic=topic)
        subscriber.close()
        publisher.stop()
    delivered = drained["deliveries"]
    return {
        "fanout": fanout,
        "published": published,
        "received": drained["received"],
        "complete": drained["received"] == fanout * count,
        "deliveries": delivered,
        "seconds": round(elapsed, 3),
        "delivered_per_s": round(delivered / elapsed),
        # CPU the machine spent on other processes meanwhile (other sessions, ZooKeeper)
        "foreign_cpu_s": round(busy - sum(after[n] - before[n] for n in after), 3),
        "cpu_us_per_delivery": {
            name: round((after[name] - before[name]) / delivered * 1e6, 2) for name in after
        },
    }


def _one_process(root: Path) -> tuple[str, dict[str, int], Callable[[list[str]], bool], Any]:
    from bench.cluster import Embedded

    server = Embedded(root)
    server.start()
    assert server.pid is not None
    return server.endpoint, {"serve": server.pid}, lambda _names: True, server.stop


def _cluster(root: Path) -> tuple[str, dict[str, int], Callable[[list[str]], bool], Any]:
    import urllib.request

    from pubsubd.cluster.launcher import LocalCluster

    cluster = LocalCluster(root / "cluster")
    cluster.up(
        zk_nodes=1, storage_nodes=3, zones=2, routers=1, frontends=1, forwarders=2,
        forwarder_args=[["--no-subscribing"], ["--no-publishing"]],
    )  # fmt: skip
    names = {"subscribing": "forwarder-2", "owner": "forwarder-1", "frontend": "frontend-1"}
    pids = {role: cluster.process(name).pid for role, name in names.items()}
    for p in cluster.processes:  # the cursor ledgers' writes land on the storage nodes
        if p.role == "storage":
            pids[f"storage#{p.name}"] = p.pid
    subscribing = cluster.process("forwarder-2")
    port = subscribing.args[subscribing.args.index("--http-port") + 1]

    def placed(subscriptions: list[str]) -> bool:
        url = f"http://127.0.0.1:{port}/status"
        with urllib.request.urlopen(url, timeout=10) as r:
            served = json.loads(r.read()).get("subscriptions", {})
        return all(s in served for s in subscriptions)

    return cluster.grpc, {k: v for k, v in pids.items() if v}, placed, cluster.down


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--deployments", default="one-process,cluster")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fanout-cpu-"))
    starters = {"one-process": _one_process, "cluster": _cluster}
    results: list[dict[str, Any]] = []
    for key in args.deployments.split(","):
        endpoint, pids, placed, stop = starters[key](root)
        os.environ["PUBSUB_EMULATOR_HOST"] = endpoint
        try:
            for run in range(args.runs):
                for fanout in FANOUTS:
                    result = run_once(endpoint, pids, fanout, args.count, args.size, placed)
                    result.update(deployment=key, run=run)
                    print(json.dumps(result), flush=True)
                    results.append(result)
        finally:
            stop()
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
