"""The repair auditor: one per cluster, elected through ZooKeeper, runs in every serve process.

SCALE_OUT.md §2, step 7 (issue 10, part 5). Election (``coordination/election.py``): every
``pubsubd serve --cluster`` stands under ``Layout.auditor``; the lowest candidate is the auditor.
It acts only while its session is connected and is the one its candidate was made in: a
suspended connection pauses it before the next change, a lost session ends its turn and it
stands again.

Every ``interval_s`` the auditor makes one pass:

1. every registered storage node's copies (``ListLedgers``: offsets, digest, fence), then
   every source's ledger list (so a ledger a node holds was in a list before it was read);
2. per CLOSED ledger, ``repair.plan_ledger`` says what is wrong and what to copy;
3. copies, at most ``rate_bytes`` per second: delete a damaged copy first where the plan says
   so, fence the target at the plan's epoch (the ledger is CLOSED: harmless), then read pages
   from a healthy copy and append them; a full copy's digest is checked against the ledger's
   before it counts. A copy to a new node is then made part of the ledger by compare-and-set of
   its node list (``LedgerMeta.with_nodes``, ``LedgerList.replaced``); when this process owns
   the source, under its writer's lock, and the writer's list follows the change, so the
   writer's own next change does not conflict. A conflict or a ledger that changed meanwhile
   leaves it to the next pass, and the copy is deleted again;
4. orphans (copies, and fence records of ledgers the node holds no entry of, that no list
   gives to their node) seen for ``grace_s`` are deleted.

What it found and did is counted in ``pubsubd_repair_*`` metrics, in ``/status`` (``cluster``
→ ``auditor``) and in the znode ``Layout.auditor/status`` that ``pubsubd cluster status``
reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prometheus_client import Counter, Gauge

from pubsubd.coordination.election import Election, LeadershipLost
from pubsubd.coordination.errors import CoordinationError, NoNode
from pubsubd.coordination.zk import Coordinator
from pubsubd.storage.errors import ListConflict, StorageError
from pubsubd.storage.ledgers.cluster import ClusterStorage
from pubsubd.storage.ledgers.meta import LedgerList, LedgerMeta, StoragePolicy
from pubsubd.storage.ledgers.placement import NodeInfo
from pubsubd.storage.ledgers.repair import (
    CopyInfo,
    CopyTask,
    Issue,
    LedgerPlan,
    RateLimiter,
    RepairSettings,
    Sightings,
    extend_digest,
    find_orphans,
    plan_ledger,
)
from pubsubd.storage.ledgers.writer import COPY_PAGE_BYTES
from pubsubd.storage.node_client import NodeUnavailable, ReadResult, StorageNodeError

logger = logging.getLogger(__name__)

STATUS_NODE = "status"

PASSES = Counter("pubsubd_repair_passes", "Repair auditor passes completed")
LEDGERS_REPAIRED = Counter(
    "pubsubd_repair_ledgers_repaired", "Ledgers whose missing or damaged copies were made again"
)
BYTES_COPIED = Counter("pubsubd_repair_bytes_copied", "Bytes copied between storage nodes")
ORPHANS_DELETED = Counter(
    "pubsubd_repair_orphans_deleted", "Ledger copies no ledger list gives to their node, deleted"
)
FAILURES = Counter("pubsubd_repair_failures", "Repair copies or passes that failed")
UNDER_REPLICATED = Gauge(
    "pubsubd_repair_under_replicated",
    "CLOSED ledgers with a copy missing, short, damaged or on a node gone (last pass)",
)
LEADER = Gauge("pubsubd_repair_leader", "1 while this process is the cluster's repair auditor")


class RepairFailed(StorageError):
    """A copy could not be made (what the source sent or the target holds is not right)."""


class Auditor:
    """The repair auditor's election and passes over one ``ClusterStorage``."""

    def __init__(
        self,
        storage: ClusterStorage,
        settings: RepairSettings | None = None,
        *,
        policy_for: Callable[[str], StoragePolicy] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``policy_for(topic_uid)``: the storage policy a source's ledgers follow (copies,
        zones); by default the topic's, as the writers follow it."""
        self._storage = storage
        self._policy_for = policy_for or storage.policy_for
        self._zk: Coordinator = storage.coordinator
        self._layout = self._zk.layout
        self.settings = settings or RepairSettings()
        self._clock = clock
        self._wall = wall
        self._limiter = RateLimiter(float(self.settings.rate_bytes))
        self._absent: Sightings[str] = Sightings()
        self._orphans: Sightings[tuple[str, int]] = Sightings()
        self._blocked: set[str] = set()
        self._unanswered: set[str] = set()
        self.identity = json.dumps({"host": socket.gethostname(), "pid": os.getpid()})
        self._election = Election(
            self._zk,
            self._layout.auditor,
            self.identity.encode(),
            self._step,
            name="repair auditor",
            interval_s=self.settings.interval_s,
            on_leading=lambda leading: LEADER.set(1 if leading else 0),
        )
        # What /status and the status znode show.
        self.passes = 0
        self.ledgers_repaired = 0
        self.bytes_copied = 0
        self.orphans_deleted = 0
        self.failures = 0
        self.last_pass: dict[str, Any] = {}

    # -- life cycle ------------------------------------------------------------------------

    @property
    def role(self) -> str:
        """What /status and the status znode show: standby, auditor, stopped, ..."""
        role = self._election.role
        return "auditor" if role == "leader" else role

    def start(self) -> None:
        self._election.start()

    async def close(self) -> None:
        await self._election.close()

    def status(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "passes": self.passes,
            "ledgers_repaired": self.ledgers_repaired,
            "bytes_copied": self.bytes_copied,
            "orphans_deleted": self.orphans_deleted,
            "failures": self.failures,
            "last_pass": self.last_pass,
            "interval_s": self.settings.interval_s,
            "grace_s": self.settings.grace_s,
            "rate_bytes": self.settings.rate_bytes,
        }

    async def _step(self) -> None:
        try:
            await self.run_pass()
        except LeadershipLost:
            raise
        except (CoordinationError, StorageError, TimeoutError) as e:
            self.failures += 1
            FAILURES.inc()
            logger.warning("repair auditor: pass failed: %s", e)
        except Exception:
            self.failures += 1
            FAILURES.inc()
            logger.exception("repair auditor: pass failed")

    def _check(self) -> None:
        self._election.check()

    # -- one pass ----------------------------------------------------------------------------

    async def run_pass(self) -> dict[str, Any]:
        """One audit and repair of every CLOSED ledger; returns what it found and did."""
        self._check()
        started, started_wall = self._clock(), self._wall()
        registered = {n.node_id: n for n in self._storage.directory.nodes()}
        copies, fenced_only, unanswered = await self._list_copies(registered)
        sources, complete = await self._read_lists()
        now = self._clock()
        listed_nodes = {n for _, _, lst in sources for m in lst.ledgers for n in m.nodes}
        self._absent.update((n for n in listed_nodes if n not in registered), now)
        lost = frozenset(self._absent.due(now, self.settings.grace_s))
        plans = [
            (
                uid,
                source,
                plan_ledger(
                    m,
                    registered=registered,
                    copies=copies,
                    lost=lost,
                    policy=self._policy_for(uid),
                ),
            )
            for uid, source, lst in sources
            for m in lst.ledgers
        ]
        under = sum(1 for *_, p in plans if p.under_replicated)
        UNDER_REPLICATED.set(under)
        found: dict[str, int] = {}
        for *_, plan in plans:
            for finding in plan.findings:
                found[finding.issue.value] = found.get(finding.issue.value, 0) + 1
        repaired = failed = 0
        copied_before = self.bytes_copied
        blocked = []
        for uid, source, plan in plans:
            if plan.blocked:
                blocked.append(f"ledger {plan.ledger.ledger_id}: {plan.blocked}")
            if not plan.tasks:
                continue
            if await self._repair(uid, source, plan):
                repaired += 1
                under -= 1
                UNDER_REPLICATED.set(under)
            else:
                failed += 1
        for line in sorted(set(blocked) - self._blocked)[:20]:
            logger.warning("repair auditor: cannot repair %s", line)
        self._blocked = set(blocked)
        held = {node: [*copies[node], *fenced_only.get(node, ())] for node in copies}
        orphans_deleted = await self._delete_orphans(held, sources, complete)
        self.passes += 1
        PASSES.inc()
        self.last_pass = {
            "at": started_wall,
            "seconds": round(self._clock() - started, 3),
            "nodes": len(registered),
            "nodes_unanswered": sorted(unanswered),
            "nodes_absent": sorted(self._absent.since),
            "sources": len(sources),
            "ledgers": sum(len(lst.ledgers) for _, _, lst in sources),
            "under_replicated": under,
            "waiting_grace": sum(1 for *_, p in plans if p.waiting),
            "findings": found,
            "blocked": len(blocked),
            "repaired": repaired,
            "failed": failed,
            "bytes_copied": self.bytes_copied - copied_before,
            "orphans_deleted": orphans_deleted,
        }
        await self._publish()
        return self.last_pass

    async def _list_copies(
        self, registered: dict[str, NodeInfo]
    ) -> tuple[dict[str, dict[int, CopyInfo]], dict[str, list[int]], set[str]]:
        """Per node that answered: its copies, and the ledgers it holds only a fence of; the
        nodes that did not answer."""
        nodes = sorted(registered.values(), key=lambda n: n.node_id)
        results = await asyncio.gather(
            *(self._storage.pool.client(n.address).list_held() for n in nodes),
            return_exceptions=True,
        )
        copies: dict[str, dict[int, CopyInfo]] = {}
        fenced_only: dict[str, list[int]] = {}
        unanswered = set()
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                if node.node_id not in self._unanswered:  # once per episode
                    logger.info(
                        "repair auditor: %s did not list its ledgers: %s", node.node_id, result
                    )
                unanswered.add(node.node_id)
                continue
            summaries, fenced_only[node.node_id] = result
            copies[node.node_id] = {
                s.ledger_id: CopyInfo(
                    s.first_offset, s.end_offset, s.digest, s.fenced_epoch, s.bytes
                )
                for s in summaries
            }
        self._unanswered = unanswered
        return copies, fenced_only, unanswered

    async def _read_lists(self) -> tuple[list[tuple[str, int, LedgerList]], bool]:
        """Every source's ledger list (``Layout.sources/{bucket}/{uid}/{source}``, cursor
        ledgers ``acks-*`` included) and whether every one could be decoded."""
        root = self._layout.sources
        out: list[tuple[str, int, LedgerList]] = []
        complete = True
        try:
            buckets = await self._zk.children(root)
        except NoNode:
            return out, True
        for bucket in sorted(buckets):
            try:
                uids = await self._zk.children(f"{root}/{bucket}")
            except NoNode:
                continue
            for uid in sorted(uids):
                try:
                    names = await self._zk.children(f"{root}/{bucket}/{uid}")
                except NoNode:
                    continue
                numbered = sorted(int(n) for n in names if n.isdigit())
                paths = [f"{root}/{bucket}/{uid}/{n}" for n in numbered]
                for source, got in zip(numbered, await self._zk.get_many(paths), strict=True):
                    if got is None:
                        continue  # removed meanwhile, with its ledgers
                    data, stat = got
                    try:
                        out.append((uid, source, LedgerList.decode(data, stat.version)))
                    except (ValueError, KeyError, TypeError) as e:
                        complete = False
                        logger.error("repair auditor: ledger list of %s/%d: %s", uid, source, e)
        return out, complete

    # -- repairs -----------------------------------------------------------------------------

    async def _repair(self, uid: str, source: int, plan: LedgerPlan) -> bool:
        """Carry out a ledger's copies, then change its node list if some went to new nodes.
        True when every copy (and the list change) succeeded."""
        ledger = plan.ledger
        joined: list[CopyTask] = []
        ok = True
        for task in plan.tasks:
            self._check()
            started = self._clock()
            try:
                copied = await self._copy_with_fallback(task)
            except LeadershipLost:
                raise
            except (StorageError, CoordinationError, TimeoutError) as e:
                ok = False
                self.failures += 1
                FAILURES.inc()
                logger.warning(
                    "repair auditor: ledger %d (%s/%d): copy to %s failed: %s",
                    ledger.ledger_id,
                    uid,
                    source,
                    task.target,
                    e,
                )
                continue
            seconds = self._clock() - started
            logger.info(
                "repair auditor: ledger %d (%s/%d): %s copy on %s: %d bytes from %s in %.2f s",
                ledger.ledger_id,
                uid,
                source,
                task.reason.value,
                task.target,
                copied,
                task.source or "-",
                seconds,
            )
            if task.changes_list:
                joined.append(task)
        if joined:
            nodes = list(ledger.nodes)
            for task in joined:
                if task.replaces is not None:
                    nodes[nodes.index(task.replaces)] = task.target
                else:
                    nodes.append(task.target)
            if await self._update_nodes(uid, source, ledger, tuple(nodes)):
                logger.info(
                    "repair auditor: ledger %d (%s/%d) now on %s (was %s)",
                    ledger.ledger_id,
                    uid,
                    source,
                    ",".join(nodes),
                    ",".join(ledger.nodes),
                )
            else:
                ok = False
                for task in joined:
                    await self._discard(task)
        if ok:
            self.ledgers_repaired += 1
            LEDGERS_REPAIRED.inc()
        return ok

    async def _copy_with_fallback(self, task: CopyTask) -> int:
        try:
            return await self._copy(task)
        except StorageNodeError as e:
            # A short copy whose entries do not line up with the healthy one's: copy it whole.
            if task.reason is not Issue.SHORT or isinstance(e, NodeUnavailable):
                raise
            logger.info(
                "repair auditor: ledger %d on %s: %s; copying it whole",
                task.ledger.ledger_id,
                task.target,
                e,
            )
            return await self._copy(_whole(task))
        except RepairFailed:
            if task.reason is not Issue.SHORT:
                raise
            return await self._copy(_whole(task))

    def _node(self, node_id: str) -> NodeInfo:
        node = self._storage.directory.node(node_id)
        if node is None:
            raise RepairFailed(f"storage node {node_id} is not registered")
        return node

    async def _copy(self, task: CopyTask) -> int:
        """Make ``task.target`` hold entries ``[task.start, task.end)`` of the ledger."""
        ledger = task.ledger
        target = self._storage.pool.client(self._node(task.target).address)
        if task.delete_first:
            self._check()
            await target.delete_ledger(ledger.ledger_id)
        if not task.source or task.start >= task.end:
            return 0
        self._check()
        fence = await target.fence(ledger.ledger_id, task.epoch)
        epoch = max(task.epoch, fence.fenced_epoch)
        source = self._storage.pool.client(self._node(task.source).address)

        def read(start: int) -> asyncio.Future[ReadResult]:
            return asyncio.ensure_future(
                source.read(ledger.ledger_id, start, task.end, COPY_PAGE_BYTES)
            )

        offset, digest, copied = task.start, 0, 0
        # The next page is read while the current one is appended (and made durable).
        pending: asyncio.Future[ReadResult] | None = read(offset)
        try:
            while pending is not None:
                self._check()
                frames = (await pending).frames
                pending = None
                digest, next_offset, valid = extend_digest(digest, frames)
                if next_offset is None or valid != len(frames) or next_offset > task.end:
                    raise RepairFailed(
                        f"ledger {ledger.ledger_id}: {task.source} sent {len(frames)} bytes at "
                        f"{offset} that are not whole entries below {task.end}"
                    )
                delay = self._limiter.take(len(frames), self._clock())
                if delay > 0:
                    await asyncio.sleep(delay)
                if next_offset < task.end:
                    pending = read(next_offset)
                self._check()
                node_end = await target.append(
                    ledger.ledger_id, epoch, ledger.first_offset, frames, -1
                )
                if node_end != next_offset:
                    raise RepairFailed(
                        f"ledger {ledger.ledger_id}: {task.target} ends at {node_end} after an "
                        f"append up to {next_offset}"
                    )
                copied += len(frames)
                self.bytes_copied += len(frames)
                BYTES_COPIED.inc(len(frames))
                offset = next_offset
        finally:
            if pending is not None:
                pending.cancel()
                pending.add_done_callback(_retrieve)
        whole = task.start == ledger.first_offset
        if whole and task.expected_digest is not None and digest != task.expected_digest:
            raise RepairFailed(
                f"ledger {ledger.ledger_id}: the copy on {task.target} has digest "
                f"{digest:08x}, the ledger's is {task.expected_digest:08x}"
            )
        return copied

    async def _update_nodes(
        self, uid: str, source: int, planned: LedgerMeta, nodes: tuple[str, ...]
    ) -> bool:
        """Compare-and-set the ledger's node list, if the ledger is still what was planned."""
        directory = self._storage.directory
        owner = self._storage.sources.get((uid, source))
        lock = owner.list_lock if owner is not None else contextlib.nullcontext()
        async with lock:
            self._check()
            fresh = await directory.read(uid, source)
            current = next((m for m in fresh.ledgers if m.ledger_id == planned.ledger_id), None)
            if current != planned:
                logger.info(
                    "repair auditor: ledger %d (%s/%d) changed meanwhile; next pass",
                    planned.ledger_id,
                    uid,
                    source,
                )
                return False
            assert current is not None
            try:
                written = await directory.write(
                    uid, source, fresh.replaced(current.with_nodes(nodes))
                )
            except ListConflict as e:
                logger.info("repair auditor: %s; next pass", e)
                return False
            if owner is not None:
                owner.adopt(written, fresh.version)  # its next change builds on this version
        return True

    async def _discard(self, task: CopyTask) -> None:
        """Delete a copy that did not become part of its ledger (else an orphan later)."""
        with contextlib.suppress(StorageError, CoordinationError, TimeoutError):
            node = self._node(task.target)
            await self._storage.pool.client(node.address).delete_ledger(task.ledger.ledger_id)

    # -- orphans -----------------------------------------------------------------------------

    async def _delete_orphans(
        self,
        held: dict[str, list[int]],
        sources: list[tuple[str, int, LedgerList]],
        complete: bool,
    ) -> int:
        """Delete what nodes hold (copies and fence-only records, by node) that no list
        gives them, once seen so for the grace period."""
        if not complete:
            return 0  # a list that could not be read must not make its ledgers look orphaned
        now = self._clock()
        orphans = find_orphans(held, (m for _, _, lst in sources for m in lst.ledgers))
        self._orphans.update(orphans, now)
        deleted = 0
        for node_id, ledger_id in sorted(self._orphans.due(now, self.settings.grace_s)):
            self._check()
            node = self._storage.directory.node(node_id)
            if node is None:
                continue
            try:
                await self._storage.pool.client(node.address).delete_ledger(ledger_id)
            except StorageError as e:
                logger.warning(
                    "repair auditor: deleting orphan %d on %s: %s", ledger_id, node_id, e
                )
                continue
            logger.info(
                "repair auditor: deleted ledger %d on %s (no list gives it to it)",
                ledger_id,
                node_id,
            )
            deleted += 1
            self.orphans_deleted += 1
            ORPHANS_DELETED.inc()
        return deleted

    async def _publish(self) -> None:
        """The last pass in ``Layout.auditor/status`` for ``pubsubd cluster status``."""
        data = json.dumps(
            {"auditor": json.loads(self.identity), **self.status()}, separators=(",", ":")
        ).encode()
        path = f"{self._layout.auditor}/{STATUS_NODE}"
        try:
            await self._zk.set(path, data)
        except NoNode:
            with contextlib.suppress(CoordinationError):
                await self._zk.create(path, data)
        except CoordinationError as e:
            logger.info("repair auditor: status not published: %s", e)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # a read nobody waits for any more: its error is not news


def _whole(task: CopyTask) -> CopyTask:
    """The same repair as a full copy onto an emptied target."""
    return replace(task, start=task.ledger.first_offset, delete_first=True, reason=Issue.DIVERGENT)
