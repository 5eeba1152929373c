"""A storage node cut off by nftables, then healed, under a publish flood: run inside a network
namespace of its own (``tests/cluster/test_partition.py`` makes it), where the cluster, the
client and the firewall rules live, so nothing outside the namespace is touched.

Usage: ``python -m tests.cluster.partition_scenario DIR``; prints one JSON line of counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import ClusterServer, ledger_nodes, running_cluster, topic_uid
from tests.support.drain import drain
from tests.support.flood import Flood
from tests.support.server import wait_for

TABLE = "pubsubd_cut"


def nft(*commands: str) -> None:
    for command in commands:
        subprocess.run(["nft", *command.split()], check=True)


def main(directory: Path) -> None:
    with running_cluster(directory) as cluster:
        server = ClusterServer(cluster)
        pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
        topic = "projects/partition/topics/flood"
        subscription = "projects/partition/subscriptions/flood-sub"
        pub.create_topic(name=topic)
        sub.create_subscription(name=subscription, topic=topic)
        sub.close()
        uid = topic_uid(cluster, topic)
        # Bounded: 2,000 msg/s for at most 200,000 messages (the cut lasts ~10-20 s).
        flood = Flood(server.endpoint, topic, limit=200_000, rate=2000).start()
        counts: dict[str, object] = {}
        try:
            wait_for(lambda: flood.acked_count() >= 1000, 60, "1000 acknowledged publishes")
            node = cluster.process("storage-2")
            ports = {a.rsplit(":", 1)[1] for a in (node.address, node.append_address) if a}
            # Every packet to storage-2's ports (gRPC and append port) is dropped: the serving
            # process's calls to it hang (no reset, no refusal), as behind a partition.
            nft(
                f"add table inet {TABLE}",
                f"add chain inet {TABLE} out {{ type filter hook output priority 0 ; }}",
                *(f"add rule inet {TABLE} out tcp dport {port} drop" for port in sorted(ports)),
            )
            cut_at = flood.acked_count()
            t0 = time.monotonic()
            wait_for(lambda: flood.acked_count() >= cut_at + 3000, 90, "publishing during the cut")
            # Long enough for the calls to storage-2 to time out (NODE_CALL_TIMEOUT_S): the
            # writer closes its ledger and goes on with a new one on the other two nodes.
            wait_for(
                lambda: any("storage-2" not in nodes for nodes in ledger_nodes(cluster, uid)),
                60,
                "a new ledger of the flooded topic without the cut-off node",
            )
            counts["acked_during_cut"] = flood.acked_count() - cut_at
            counts["cut_s"] = round(time.monotonic() - t0, 2)
            nft(f"delete table inet {TABLE}")
            healed_at = flood.acked_count()
            wait_for(lambda: flood.acked_count() >= healed_at + 1000, 60, "publishing after it")
        finally:
            acked = flood.stop()
        received = drain(server.endpoint, subscription, acked, timeout=120)
        counts.update(
            acked=len(acked),
            lost=len(acked - received),
            unexpected=len(received - flood.sent),
            errors=dict(flood.errors),
        )
        print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
