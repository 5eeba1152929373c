"""``python -m bench.forwarder_moves``: what a publisher sees while a topic moves between
forwarders (issue 11, part 8: time to take over).

Starts a local cluster with ``--forwarders 3`` (ZooKeeper x1, storage x3 in 2 zones, a router,
a frontend; ZooKeeper sessions of ``--session`` seconds), creates a topic, and publishes
``--rate`` messages per second to it through the frontend with the official publisher, one
message per request, recording each message's latency from ``publish()`` to its
acknowledgement. Then it moves the topic twice: a **drain** of its owner (a planned move:
the old owner hands over) and a **kill -9** of its new owner (the topic is taken over once the
dead forwarder's session expires). Reported per move: the worst publish latency during the
move (the pause clients see, the new owner's take-over included), the time until the router
named the new owner, and publishes that failed for good.

    python -m bench.forwarder_moves --rate 200 --session 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.steady_publisher import SteadyPublisher


def topic_owner(cluster: Any, topic_name: str) -> str:
    """The forwarder the published assignment gives ``topic_name`` ("" if none yet)."""
    import asyncio

    from pubsubd.control.routing_store import RoutingStore
    from pubsubd.control.routing_table import publishing_unit
    from pubsubd.coordination.zk import Coordinator
    from pubsubd.storage.zk_metadata import ZooKeeperMetadataStore

    async def read() -> str:
        zk = Coordinator(cluster.zk, "/pubsubd")
        await zk.start()
        try:
            store = ZooKeeperMetadataStore(zk)
            uid = next(t.uid for t in store.load_topics() if t.name == topic_name)
            route = (await RoutingStore(zk).routes()).get(publishing_unit(uid, 0), ())
            return route[0] if route else ""
        finally:
            await zk.stop()

    return asyncio.run(read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--session", type=float, default=4.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between moves")
    args = parser.parse_args()
    os.environ["PUBSUBD_ZK_SESSION_TIMEOUT_S"] = str(args.session)
    from pubsubd.cluster.launcher import LocalCluster

    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="fwd-moves-")))
    cluster.up(zk_nodes=1, storage_nodes=3, zones=2, routers=1, frontends=1, forwarders=3)
    os.environ["PUBSUB_EMULATOR_HOST"] = cluster.grpc
    topic = "projects/bench/topics/moving"
    steady: SteadyPublisher | None = None
    try:
        steady = SteadyPublisher(topic, args.rate).start()
        time.sleep(args.settle)
        results = []
        for move in ("drain", "kill -9"):
            owner = topic_owner(cluster, topic)
            started = time.monotonic()
            if move == "drain":
                subprocess.run(
                    [sys.executable, "-m", "pubsubd", "routing", "drain", owner,
                     "--cluster", cluster.zk],
                    check=True, capture_output=True,
                )  # fmt: skip
            else:
                cluster.kill(owner)
            while True:
                new = topic_owner(cluster, topic)
                if new not in ("", owner):
                    break
                time.sleep(0.05)
            rerouted = time.monotonic() - started
            time.sleep(args.settle)
            during = steady.latencies(started - 1.0)
            results.append(
                {
                    "move": move,
                    "from": owner,
                    "to": new,
                    "rerouted_s": round(rerouted, 2),
                    "worst_publish_latency_ms": round(max(during) * 1e3, 1) if during else None,
                    "messages": len(during),
                }
            )
        print(json.dumps({"rate": args.rate, "session_s": args.session, "moves": results,
                          "failed_for_good": len(steady.failures())}, indent=1))  # fmt: skip
    finally:
        if steady is not None:
            steady.stop()
        cluster.down()


if __name__ == "__main__":
    main()
