"""``python -m bench.kill_each_role``: what a publisher sees when one process of each role is
killed with SIGKILL (issue 11, part 8: time to take over after kill -9 of each role).

Starts the full local cluster (ZooKeeper x3, storage x3 over two zones, forwarders x3, routers
x2, frontends x2; ZooKeeper sessions of ``--session`` seconds) and publishes ``--rate``
messages per second to one topic through both frontends (``ipv4:A,B``) with the official
publisher, one message per request. In turn it kills a frontend, the leading router, the
forwarder owning the topic, a storage node holding the topic's open ledger and a ZooKeeper node,
waits ``--settle`` seconds, starts it again and waits again. Reported per role: the worst
publish latency of the messages sent from the kill until ``--settle`` seconds after it (the
pause a client sees; the takeover included), and publishes that failed for good.

    python -m bench.kill_each_role --rate 200 --session 4
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.forwarder_moves import topic_owner
from bench.steady_publisher import SteadyPublisher


def _leading_router(cluster: Any) -> str:
    for p in cluster.processes:
        if p.role == "router" and p.pid is not None:
            with urllib.request.urlopen(f"http://{p.address}/status", timeout=5) as r:
                if json.loads(r.read())["role"] == "leader":
                    return str(p.name)
    raise RuntimeError("no router leads")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--session", type=float, default=4.0)
    parser.add_argument("--settle", type=float, default=8.0)
    args = parser.parse_args()
    os.environ["PUBSUBD_ZK_SESSION_TIMEOUT_S"] = str(args.session)
    from pubsubd.cluster.launcher import LocalCluster

    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="kill-roles-")))
    cluster.up(zk_nodes=3, storage_nodes=3, zones=2, routers=2, frontends=2, forwarders=3)
    os.environ["PUBSUB_EMULATOR_HOST"] = "ipv4:" + ",".join(cluster.frontends)
    topic = "projects/bench/topics/killed"
    steady: SteadyPublisher | None = None
    try:
        steady = SteadyPublisher(topic, args.rate).start()
        time.sleep(args.settle)
        picks: dict[str, Callable[[], str]] = {
            "frontend": lambda: "frontend-1",
            "router (leader)": lambda: _leading_router(cluster),
            "forwarder (the topic's owner)": lambda: topic_owner(cluster, topic),
            "storage node": lambda: "storage-1",
            "ZooKeeper node": lambda: "zookeeper-1",
        }
        results = []
        for role, pick in picks.items():
            name = pick()
            killed = time.monotonic()
            cluster.kill(name)
            time.sleep(args.settle)
            cluster.restart(name)
            time.sleep(args.settle)
            window = steady.latencies(killed, killed + args.settle)
            lost = steady.failures(killed)
            results.append(
                {
                    "role": role,
                    "process": name,
                    "worst_ms": round(max(window) * 1e3, 1) if window else None,
                    "messages": len(window),
                    "failed_for_good": len(lost),
                }
            )
        print(json.dumps({"rate": args.rate, "session_s": args.session, "kills": results}))
    finally:
        if steady is not None:
            steady.stop()
        cluster.down()


if __name__ == "__main__":
    main()
