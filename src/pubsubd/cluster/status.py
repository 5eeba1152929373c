"""What ``pubsubd cluster status`` reports from ZooKeeper: nodes, zones, ledgers, copies, the
repair auditor and the routing (``control/cluster_view.py``, read with a connection of its own).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pubsubd.control.cluster_view import storage_and_routing
from pubsubd.coordination.errors import CoordinationError
from pubsubd.coordination.zk import Coordinator


async def _collect(zk: str, root: str) -> dict[str, Any]:
    coordinator = Coordinator(zk, root, session_timeout=5.0)
    await coordinator.start(connect_timeout=5.0)
    try:
        return await storage_and_routing(coordinator)
    finally:
        await coordinator.stop()


def cluster_status(zk: str, root: str = "/pubsubd") -> dict[str, Any]:
    """The storage side of a cluster; ``{"error": ...}`` when ZooKeeper cannot be reached."""
    try:
        return asyncio.run(_collect(zk, root))
    except (CoordinationError, TimeoutError, OSError) as e:
        return {"error": f"ZooKeeper at {zk}: {e}"}
