"""The cluster's storage as one serving process uses it: every source on storage nodes.

``ClusterStorage.prepare`` runs at start-up, before the forwarders open any log: for every
source of every topic it takes the source over (fencing a crashed owner's last ledger and
recovering it) and brings the local copy up to the ledgers (``materialize``), so the logs open
on complete directories. ``remote_log`` then hands each ``SourceLog`` its ``SourceLedgers``
(sources created later are taken over on their first write).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any

from pubsubd.coordination.liveness import OwnerCheck
from pubsubd.coordination.zk import Coordinator
from pubsubd.core import pb, storage_policy
from pubsubd.core.errors import PubsubError
from pubsubd.storage.ledgers.directory import ZooKeeperLedgerDirectory
from pubsubd.storage.ledgers.materialize import materialize
from pubsubd.storage.ledgers.meta import StoragePolicy
from pubsubd.storage.ledgers.placement import NodeInfo
from pubsubd.storage.ledgers.writer import DEFAULT_LEDGER_BYTES, NodeFence, SourceLedgers
from pubsubd.storage.metadata import Change, MetadataStore, TopicRecord
from pubsubd.storage.node_client import (
    AnswerCallback,
    EncodedAppend,
    LedgerFenced,
    StorageNodePool,
    encode_append,
)

logger = logging.getLogger(__name__)


class PooledNodes:
    """``writer.StorageNodes`` over gRPC, one channel per node address."""

    def __init__(self, pool: StorageNodePool) -> None:
        self._pool = pool

    async def append(
        self, node: NodeInfo, ledger_id: int, epoch: int, first_offset: int, frames: bytes, lac: int
    ) -> int:
        client = self._pool.client(node.address, node.append_address)
        return await client.append(ledger_id, epoch, first_offset, frames, lac)

    def encode_append(
        self, ledger_id: int, epoch: int, first_offset: int, frames: bytes, lac: int
    ) -> EncodedAppend:
        return encode_append(ledger_id, epoch, first_offset, frames, lac)

    async def append_encoded(self, node: NodeInfo, request: EncodedAppend) -> int:
        client = self._pool.client(node.address, node.append_address)
        return await client.append_encoded(request)

    def submit_encoded(
        self, node: NodeInfo, request: EncodedAppend, answered: AnswerCallback
    ) -> bool:
        client = self._pool.client(node.address, node.append_address)
        return client.submit_encoded(request, answered)

    async def fence(self, node: NodeInfo, ledger_id: int, epoch: int) -> NodeFence:
        result = await self._pool.client(node.address).fence(ledger_id, epoch)
        return NodeFence(result.exists, result.first_offset, result.end_offset)

    async def read(
        self, node: NodeInfo, ledger_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> tuple[bytes, int]:
        client = self._pool.client(node.address)
        result = await client.read(ledger_id, start_offset, end_offset, max_bytes)
        return result.frames, result.node_end_offset

    async def delete(self, node: NodeInfo, ledger_id: int) -> None:
        await self._pool.client(node.address).delete_ledger(ledger_id)

    def is_fenced(self, error: BaseException) -> bool:
        return isinstance(error, LedgerFenced)


class ClusterStorage:
    """Ledger directory, node clients and the sources this process owns."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        replicas: int = 3,
        ledger_bytes: int = DEFAULT_LEDGER_BYTES,
        owner_check: OwnerCheck | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.directory = ZooKeeperLedgerDirectory(coordinator, owner_check)
        self.pool = StorageNodePool()
        self.nodes = PooledNodes(self.pool)
        self.policy = StoragePolicy(replicas=replicas)  # the default of every topic
        self.ledger_bytes = ledger_bytes
        self.sources: dict[tuple[str, int], SourceLedgers] = {}
        # Topics whose Topic says otherwise (core/storage_policy.py): topic uid -> policy.
        self._topic_policies: dict[str, StoragePolicy] = {}
        self._registered: set[str] = set()  # node addresses registered at the last change
        self._registered_ids: set[str] = set()
        self._discards: set[asyncio.Task[Any]] = set()

    async def start(self, *, wait_for_nodes: int = 1, wait_s: float = 30.0) -> None:
        self.directory.on_nodes_changed(self._nodes_changed)
        await self.directory.start()
        await self.directory.wait_for_nodes(wait_for_nodes, wait_s)

    def _nodes_changed(self) -> None:
        """A node that (re)registers gets a fresh channel: the old one may still be backing
        off from the node's restart (seconds of UNAVAILABLE for writers and repair). Open
        ledgers on a node that left are closed, so repair can copy them elsewhere."""
        nodes = self.directory.nodes()
        registered = {n.address for n in nodes}
        for address in registered - self._registered:
            if address in self.pool.addresses():
                self._background(self.pool.discard(address))
        self._registered = registered
        ids = {n.node_id for n in nodes}
        left = self._registered_ids - ids
        self._registered_ids = ids
        if left:
            for ledgers in list(self.sources.values()):
                self._background(ledgers.seal_if_on(left))

    def _background(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._discards.add(task)
        task.add_done_callback(self._discards.discard)

    def _ledgers(self, topic_uid: str, source: int) -> SourceLedgers:
        found = self.sources.get((topic_uid, source))
        if found is None:
            found = SourceLedgers(
                topic_uid,
                source,
                self.directory,
                self.nodes,
                self.policy_for(topic_uid),
                ledger_bytes=self.ledger_bytes,
            )
            self.sources[(topic_uid, source)] = found
        return found

    async def prepare(self, topics_dir: Path, topic_uids: Iterable[str]) -> int:
        """Take over every source of ``topic_uids`` and bring its local copy under
        ``topics_dir`` up to its ledgers; returns the entries copied."""
        copied = 0
        for uid in topic_uids:
            for source in await self.directory.sources(uid):
                ledgers = self._ledgers(uid, source)
                await ledgers.take_over()
                copied += await materialize(topics_dir / uid / f"source-{source}", ledgers)
        return copied

    async def release(self, keys: Iterable[tuple[str, int]]) -> None:
        """Close these sources' ledgers and let them go (their topic moved to another
        forwarder); a later take-over starts afresh."""
        for key in keys:
            ledgers = self.sources.pop(key, None)
            if ledgers is not None:
                await ledgers.close()

    def source_keys(self, topic_uid: str) -> list[tuple[str, int]]:
        """The (topic uid, source) of every source of a topic this process has touched."""
        return [key for key in self.sources if key[0] == topic_uid]

    def follow_topics(self, store: MetadataStore) -> None:
        """Take every topic's storage policy from the store, now and on every change (its
        next ledger follows it: ledgers already written stay where they are)."""
        for record in store.load_topics():
            self._topic_changed(record)
        store.changes.watch(self._on_change)

    def _on_change(self, change: Change) -> None:
        if isinstance(change.record, TopicRecord) and not change.deleted:
            self._topic_changed(change.record)

    def _topic_changed(self, record: TopicRecord) -> None:
        try:
            wanted = storage_policy.parse(pb.Topic.FromString(record.body))
        except PubsubError as e:  # validated when written; never refuse to start over it
            logger.warning("topic %s: storage policy ignored: %s", record.name, e)
            return
        if wanted.replicas is None and not wanted.zones:
            policy = self.policy
        else:
            policy = StoragePolicy(
                replicas=min(wanted.replicas or self.policy.replicas, self.policy_ceiling),
                allowed_zones=wanted.zones,
            )
        if policy == self._topic_policies.get(record.uid, self.policy):
            return
        self._topic_policies[record.uid] = policy
        for (uid, _), ledgers in self.sources.items():
            if uid == record.uid:
                ledgers.set_policy(policy)

    def policy_for(self, topic_uid: str) -> StoragePolicy:
        """A topic's storage policy (the server's default for topics that say nothing and
        for cursor ledgers)."""
        return self._topic_policies.get(topic_uid, self.policy)

    @property
    def policy_ceiling(self) -> int:
        """At most as many copies as there are storage nodes (at least one)."""
        return max(1, len(self.directory.nodes()))

    def remote_log(self, topic_uid: str, source: int) -> SourceLedgers:
        return self._ledgers(topic_uid, source)

    def replication_lag(self) -> int:
        """Entries acknowledged by a quorum and not yet on every node of their ledger."""
        return sum(max(0, s.end_offset - s.replicated_end) for s in self.sources.values())

    def status(self) -> dict[str, object]:
        return {
            "storage_nodes": sorted(n.node_id for n in self.directory.nodes()),
            "sources": len(self.sources),
            "ledgers": sum(len(s.ledgers.ledgers) for s in self.sources.values()),
            "appends_refused": sum(s.appends_refused for s in self.sources.values()),
            "lease_waits": sum(s.lease_waits for s in self.sources.values()),
            "replication_lag_entries": self.replication_lag(),
            # Sources taken over from an owner found dead before its session expired.
            "taken_from_dead_owners": self.directory.taken_from_dead,
        }

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.sources.values()), return_exceptions=True)
        await self.directory.close()
        await self.pool.close()
