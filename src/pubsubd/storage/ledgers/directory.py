"""The ZooKeeper side of replicated sources: ledger lists, ledger IDs, ownership, storage nodes.

* A source's ledger list is the data of its znode (``Layout.source``), JSON
  (``meta.LedgerList``), changed only by compare-and-set on the znode's version.
* Its owner is the ephemeral child ``owner``; the znode's czxid (it only grows) is the
  owner's epoch, the fence every storage node enforces. A process whose session is lost stops
  writing (``owns``), and one that cannot prove its session alive acknowledges nothing until
  it can (``lease_holds``, ``renew_lease``: ``coordination/lease.py``); one that restarts
  waits for its previous session's owner znode to expire.
* Ledger IDs are the sequence numbers of ephemeral sequential znodes under ``Layout.ledger_ids``
  (unique for the cluster's life; the znode itself is deleted at once).
* Storage nodes register ephemeral znodes under ``Layout.storage_nodes`` (JSON: address, zone,
  free bytes); the registry is followed with a watch and read from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable

from pubsubd.coordination.errors import BadVersion, CoordinationUnavailable, NodeExists, NoNode
from pubsubd.coordination.zk import Coordinator, Follow
from pubsubd.storage.errors import ListConflict, LostOwnership, ReplicationFailed
from pubsubd.storage.ledgers.meta import LedgerList
from pubsubd.storage.ledgers.placement import NodeInfo

logger = logging.getLogger(__name__)

# How often a restarted owner looks whether its previous session's owner znode expired.
_OWNER_POLL_S = 0.2


class ZooKeeperLedgerDirectory:
    """``writer.LedgerDirectory`` over one ZooKeeper session."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._zk = coordinator
        self._layout = coordinator.layout
        self._nodes: dict[str, NodeInfo] = {}
        self._follow: Follow[list[str] | None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[], None]] = []
        self.identity = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()

    # -- storage node registry -----------------------------------------------------------

    async def start(self) -> None:
        """Follow the storage node registry (read once before this returns)."""
        await self._zk.ensure_path(self._layout.storage_nodes)
        await self._zk.ensure_path(self._layout.ledger_ids)
        await self._read_registry()
        self._follow = self._zk.watch_children(self._layout.storage_nodes, self._registry_changed)

    def _registry_changed(self, _children: list[str] | None) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._read_registry())

    async def _read_registry(self) -> None:
        try:
            children = await self._zk.children(self._layout.storage_nodes)
        except NoNode:
            children = []
        nodes = {}
        for child in children:
            try:
                data, _ = await self._zk.get(f"{self._layout.storage_nodes}/{child}")
                info = json.loads(data)
                nodes[str(info["node_id"])] = NodeInfo(
                    str(info["node_id"]),
                    str(info["address"]),
                    str(info.get("zone", "")),
                    int(info.get("free_bytes", 0)),
                    str(info.get("append_address", "")),
                )
            except (NoNode, ValueError, KeyError) as e:
                logger.debug("storage node %s skipped: %s", child, e)
        if set(nodes) != set(self._nodes):
            logger.info("storage nodes: %s", ", ".join(sorted(nodes)) or "none")
        self._nodes = nodes
        for listener in tuple(self._listeners):
            listener()

    def on_nodes_changed(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    async def wait_for_nodes(self, count: int, wait_s: float) -> None:
        """Wait until at least ``count`` storage nodes are registered (start-up)."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while len(self._nodes) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(
                    f"{len(self._nodes)} storage nodes registered after {wait_s:.0f} s, "
                    f"{count} needed"
                )
            await asyncio.sleep(0.1)
            await self._read_registry()

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes.values())

    def node(self, node_id: str) -> NodeInfo | None:
        return self._nodes.get(node_id)

    def owns(self) -> bool:
        return not self._zk.session_lost

    def lease_holds(self) -> bool:
        return self._zk.lease_holds()

    async def renew_lease(self) -> bool:
        try:
            return await self._zk.renew_lease()
        except CoordinationUnavailable as e:
            raise ReplicationFailed(f"cannot confirm the ZooKeeper session: {e}") from e

    # -- ledger lists ----------------------------------------------------------------------

    async def read(self, topic_uid: str, source: int) -> LedgerList:
        try:
            data, stat = await self._zk.get(self._layout.source(topic_uid, source))
        except NoNode:
            return LedgerList()
        return LedgerList.decode(data, stat.version)

    async def write(self, topic_uid: str, source: int, ledgers: LedgerList) -> LedgerList:
        path = self._layout.source(topic_uid, source)
        data = ledgers.encode()
        try:
            if ledgers.version < 0:
                _, stat = await self._zk.create_with_stat(path, data, makepath=True)
            else:
                stat = await self._zk.set(path, data, ledgers.version)
        except (BadVersion, NodeExists, NoNode) as e:
            raise ListConflict(f"ledger list of {topic_uid}/{source}: {e}") from e
        return LedgerList.decode(data, stat.version)

    async def sources(self, topic_uid: str) -> list[int]:
        """The sources of a topic that have a ledger list."""
        path = self._layout.source(topic_uid, 0).rsplit("/", 1)[0]
        try:
            children = await self._zk.children(path)
        except NoNode:
            return []
        return sorted(int(c) for c in children if c.isdigit())

    async def remove(self, topic_uid: str, source: int) -> None:
        await self._zk.delete(self._layout.source(topic_uid, source), recursive=True)

    async def new_ledger_id(self) -> int:
        path = await self._zk.create(f"{self._layout.ledger_ids}/l-", ephemeral=True, sequence=True)
        await self._zk.delete(path)
        return int(path.rsplit("-", 1)[1])

    # -- ownership ---------------------------------------------------------------------------

    async def acquire(self, topic_uid: str, source: int) -> int:
        """Create the source's ephemeral owner znode; its czxid is the epoch. A znode of an
        earlier session of this process's kind (a crash) is waited out until it expires."""
        path = self._layout.source_owner(topic_uid, source)
        deadline = asyncio.get_running_loop().time() + 2 * self._zk.session_timeout + 5
        while True:
            try:
                _, stat = await self._zk.create_with_stat(
                    path, self.identity, ephemeral=True, makepath=True
                )
                return stat.czxid
            except NodeExists:
                pass
            try:
                data, stat = await self._zk.get(path)
            except NoNode:
                continue
            if stat.ephemeral_owner == self._zk.session_id:
                return stat.czxid
            if asyncio.get_running_loop().time() > deadline:
                raise LostOwnership(
                    f"source {topic_uid}/{source} is owned by {data.decode(errors='replace')}"
                )
            await asyncio.sleep(_OWNER_POLL_S)

    async def release(self, topic_uid: str, source: int) -> None:
        path = self._layout.source_owner(topic_uid, source)
        try:
            _, stat = await self._zk.get(path)
        except NoNode:
            return
        if stat.ephemeral_owner == self._zk.session_id:
            with contextlib.suppress(NoNode, BadVersion):
                await self._zk.delete(path, stat.version)

    async def close(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
        if self._refresh is not None:
            self._refresh.cancel()
