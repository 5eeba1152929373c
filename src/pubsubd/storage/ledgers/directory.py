"""The ZooKeeper side of replicated sources: ledger lists, ledger IDs, ownership, storage nodes.

* A source's ledger list is the data of its znode (``Layout.source``), JSON
  (``meta.LedgerList``), changed only by compare-and-set on the znode's version.
* Its owner is the ephemeral child ``owner``; the znode's czxid (it only grows) is the
  owner's epoch, the fence every storage node enforces. A process whose session is lost stops
  writing (``owns``), and one that cannot prove its session alive acknowledges nothing until
  it can (``lease_holds``, ``renew_lease``: ``coordination/lease.py``). The znode's data names
  the owner process (``core.liveness.ProcessIdentity``): a process taking over waits for the
  owner to let go, or for its session to expire, unless ``OwnerCheck`` finds the owner dead
  first (its PID gone on this machine, or its address refusing or answering with another
  session): then the znode is deleted at once (only that version of it), and the takeover's
  fencing keeps a wrongly declared owner from writing (``coordination/liveness.py``).
* Ledger IDs are the sequence numbers of ephemeral sequential znodes under ``Layout.ledger_ids``
  (unique for the cluster's life; the znode itself is deleted at once).
* Storage nodes register ephemeral znodes under ``Layout.storage_nodes`` (JSON: address, zone,
  free bytes); the registry is followed with a watch and read from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable

from pubsubd.coordination.errors import BadVersion, CoordinationUnavailable, NodeExists, NoNode
from pubsubd.coordination.liveness import OwnerCheck, this_process
from pubsubd.coordination.zk import Coordinator, Follow
from pubsubd.core.liveness import Liveness
from pubsubd.storage.errors import ListConflict, LostOwnership, ReplicationFailed
from pubsubd.storage.ledgers.meta import LedgerList
from pubsubd.storage.ledgers.placement import NodeInfo

logger = logging.getLogger(__name__)

# How often a process taking over looks whether the owner znode went.
_OWNER_POLL_S = 0.2
# How often it asks whether the owner is dead (an address probe is a connection).
_OWNER_CHECK_S = 0.5


class ZooKeeperLedgerDirectory:
    """``writer.LedgerDirectory`` over one ZooKeeper session."""

    def __init__(self, coordinator: Coordinator, owner_check: OwnerCheck | None = None) -> None:
        self._zk = coordinator
        self._layout = coordinator.layout
        self._nodes: dict[str, NodeInfo] = {}
        self._follow: Follow[list[str] | None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[], None]] = []
        self.owner_check = owner_check or OwnerCheck(this_process())
        self.identity = self.owner_check.here.encode()
        self.taken_from_dead = 0  # owner znodes deleted because their process was gone

    def set_address(self, address: str) -> None:
        """The gRPC address this process serves, named in the owner znodes it creates from
        now on (a process taking over from it asks there whether it is alive)."""
        self.owner_check.here = dataclasses.replace(self.owner_check.here, address=address)
        self.identity = self.owner_check.here.encode()

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
        """Create the source's ephemeral owner znode; its czxid is the epoch. Another
        session's znode is waited out until it goes (released, or its session expired), or
        deleted once its process is found dead (``OwnerCheck``)."""
        path = self._layout.source_owner(topic_uid, source)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self._zk.session_timeout + 5
        next_check = loop.time()
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
            if loop.time() >= next_check:
                next_check = loop.time() + _OWNER_CHECK_S
                if await self._delete_if_dead(path, data, stat.ephemeral_owner, stat.version):
                    continue
            if loop.time() > deadline:
                raise LostOwnership(
                    f"source {topic_uid}/{source} is owned by {data.decode(errors='replace')}"
                )
            await asyncio.sleep(_OWNER_POLL_S)

    async def _delete_if_dead(self, path: str, data: bytes, session: int, version: int) -> bool:
        """Delete the owner znode (this version of it) if its process is dead."""
        try:
            verdict, why = await self.owner_check.verdict(data, session)
        except Exception:  # a check that fails is no verdict: wait for the session instead
            logger.exception("%s: checking the owner failed", path)
            return False
        if verdict is not Liveness.DEAD:
            return False
        try:
            await self._zk.delete(path, version)
        except (NoNode, BadVersion):
            return True  # it changed meanwhile: look again
        self.taken_from_dead += 1
        logger.info("%s: the owner is dead (%s); its owner znode is deleted", path, why)
        return True

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
