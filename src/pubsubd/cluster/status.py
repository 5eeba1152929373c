"""What ``pubsubd cluster status`` reports from ZooKeeper: nodes, zones, ledgers, copies, the
repair auditor and the routing (``control/cluster_view.py``, read with a connection of its own).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pubsubd.control.cluster_view import storage_and_routing
from pubsubd.coordination.credentials import DigestCredential
from pubsubd.coordination.errors import CoordinationError
from pubsubd.coordination.zk import Coordinator
from pubsubd.core.tls import ClientTls


async def _collect(
    zk: str, root: str, tls: ClientTls | None, auth: DigestCredential | None
) -> dict[str, Any]:
    coordinator = Coordinator(zk, root, session_timeout=5.0, tls=tls, auth=auth)
    await coordinator.start(connect_timeout=5.0)
    try:
        return await storage_and_routing(coordinator)
    finally:
        await coordinator.stop()


def cluster_status(
    zk: str,
    root: str = "/pubsubd",
    tls: ClientTls | None = None,
    auth: DigestCredential | None = None,
) -> dict[str, Any]:
    """The storage side of a cluster; ``{"error": ...}`` when ZooKeeper cannot be reached.
    ``tls``: a ZooKeeper speaking TLS (``cluster up --tls-dir``); ``auth``: the cluster's
    ZooKeeper credential (``cluster up --zk-auth``)."""
    try:
        return asyncio.run(_collect(zk, root, tls, auth))
    except (CoordinationError, TimeoutError, OSError) as e:
        return {"error": f"ZooKeeper at {zk}: {e}"}
