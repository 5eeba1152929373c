"""Replicated appends of one publish message source: the ledger writer behind a ``SourceLog``.

The source's owner is the only writer (``LedgerDirectory.acquire`` gives its epoch). Each append
goes to every node of the source's open ledger in parallel, in order per node, and returns once
``ack_quorum`` nodes have it durable (SCALE_OUT.md §2, step 5). Appends may be pipelined (the
next one sent before the last is answered; ``SourceLog`` does so only with a large backlog);
they complete in order. When a node fails, the ledger is closed at the last confirmed entry and
the source rolls to a new ledger on other nodes, as Pulsar does instead of changing ensembles;
the append that failed and every one sent after it go again, in order, to the new ledger. The
closed ledger keeps its copies on the nodes that answered and is repaired in the background. A
node that refuses an append because the ledger was fenced means another owner took over: the
source stops (every later append fails) and never writes again. A quorum's answer is passed
on only while the process can prove its ZooKeeper session alive (``_confirm_owner``): a zombie
resumed after its ledgers were deleted, fences and all, has no node left to refuse it.

Takeover (``SourceLedgers.take_over``): the owner marks an unclosed last ledger IN_RECOVERY,
fences it on its nodes, copies the entries some nodes lack (``recovery.plan_recovery``) and
closes it by compare-and-set, so exactly one ledger per source is ever OPEN.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pubsubd.core.deadlines import within
from pubsubd.observability import metrics
from pubsubd.storage.errors import (
    Fenced,
    ListConflict,
    LostOwnership,
    ReplicationFailed,
    StorageError,
)
from pubsubd.storage.ledgers.meta import (
    LedgerList,
    LedgerMeta,
    LedgerState,
    StoragePolicy,
    rebased,
)
from pubsubd.storage.ledgers.placement import NodeInfo, NotEnoughNodes, choose_nodes
from pubsubd.storage.ledgers.recovery import FenceReply, NotEnoughReplies, plan_recovery

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How a SourceLedgers.start_append caller learns its append's outcome: None, durable on
# ack_quorum nodes; else why not (ReplicationFailed, LostOwnership).
AppendDone = Callable[[BaseException | None], None]

# A ledger rolls over after this many bytes, so retention deletes whole ledgers.
DEFAULT_LEDGER_BYTES = 64 << 20
# How long one storage node call may take before the node counts as failed for it.
NODE_CALL_TIMEOUT_S = 10.0
# Bytes per Read when copying entries (recovery, materialization).
COPY_PAGE_BYTES = 4 << 20
# How soon an acknowledgement that could not confirm the ZooKeeper session asks again.
_LEASE_RETRY_S = 0.2


@dataclass(frozen=True, slots=True)
class NodeFence:
    exists: bool
    first_offset: int
    end_offset: int


class StorageNodes(Protocol):
    """The storage nodes' API as the writer needs it (``storage/node_client.py`` over gRPC)."""

    async def append(
        self, node: NodeInfo, ledger_id: int, epoch: int, first_offset: int, frames: bytes, lac: int
    ) -> int: ...
    def encode_append(
        self, ledger_id: int, epoch: int, first_offset: int, frames: bytes, lac: int
    ) -> Any:
        """The append as :meth:`append_encoded` sends it: made once for all of a ledger's
        nodes (the serialized request), not once per node."""
        ...

    async def append_encoded(self, node: NodeInfo, request: Any) -> int:
        """Answers, or fails, within NODE_CALL_TIMEOUT_S (the node client's deadline)."""
        ...

    def submit_encoded(
        self,
        node: NodeInfo,
        request: Any,
        answered: Callable[[int | None, BaseException | None], None],
    ) -> bool:
        """:meth:`append_encoded` without a task, when the node's connection is up: sent
        now, ``answered`` (end offset, or the error) called once from the connection's reader.
        False: nothing was sent, await :meth:`append_encoded` instead."""
        ...

    async def fence(self, node: NodeInfo, ledger_id: int, epoch: int) -> NodeFence: ...
    async def read(
        self, node: NodeInfo, ledger_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> tuple[bytes, int]: ...
    async def delete(self, node: NodeInfo, ledger_id: int) -> None: ...
    def is_fenced(self, error: BaseException) -> bool: ...


class LedgerDirectory(Protocol):
    """The ZooKeeper side (``ledgers/directory.py``): ledger lists, IDs, ownership, nodes."""

    async def read(self, topic_uid: str, source: int) -> LedgerList: ...
    async def write(self, topic_uid: str, source: int, ledgers: LedgerList) -> LedgerList:
        """Compare-and-set on ``ledgers.version``; raises ListConflict; returns the new
        version's list."""
        ...

    async def new_ledger_id(self) -> int: ...
    async def acquire(self, topic_uid: str, source: int) -> int:
        """Become the source's owner; returns the epoch. Raises LostOwnership if another
        live process owns it."""
        ...

    async def release(self, topic_uid: str, source: int) -> None: ...
    async def remove(self, topic_uid: str, source: int) -> None:
        """Delete the source's ledger list and ownership (its topic is gone)."""
        ...

    def nodes(self) -> list[NodeInfo]: ...
    def node(self, node_id: str) -> NodeInfo | None: ...
    def owns(self) -> bool:
        """False once the ZooKeeper session is lost: stop writing."""
        ...

    def lease_holds(self) -> bool:
        """True while the session is provably alive (``coordination/lease.py``)."""
        ...

    async def renew_lease(self) -> bool:
        """Prove the session alive now; False if it was lost. ReplicationFailed if
        ZooKeeper does not answer."""
        ...


@dataclass(eq=False, slots=True)
class _Flight:
    """One append on its way to the open ledger's nodes."""

    ledger_id: int
    end_offset: int
    size: int
    needed: int  # the ledger's ack quorum
    live: int  # nodes it was sent to
    outcome: asyncio.Future[None]  # completed in order by SourceLedgers._advance
    sent_at: float = 0.0  # time.perf_counter() when sent
    # Sent by start_append: told its outcome by _advance (and retried from there), no task.
    done: AppendDone | None = None
    first_offset: int = 0
    frames: bytes = b""
    ok: int = 0
    failed: int = 0
    settled: bool = False  # enough answers to know (error: why it failed)
    error: BaseException | None = None

    def settle(self, error: BaseException | None) -> None:
        self.settled, self.error = True, error


@dataclass(eq=False, slots=True)
class _Queued:
    """An append to one node waiting in a task to be sent (``SourceLedgers._queued``)."""

    node_id: str
    started: bool = False


async def _timed(awaitable: Awaitable[T]) -> T:
    return await within(awaitable, NODE_CALL_TIMEOUT_S)


class SourceLedgers:
    """The replicated log of one source, as its owner sees it."""

    def __init__(
        self,
        topic_uid: str,
        source: int,
        directory: LedgerDirectory,
        nodes: StorageNodes,
        policy: StoragePolicy,
        *,
        ledger_bytes: int = DEFAULT_LEDGER_BYTES,
    ) -> None:
        self.topic_uid = topic_uid
        self.source = source
        self._directory = directory
        self._nodes = nodes
        self._policy = policy
        self._ledger_bytes = ledger_bytes
        self.epoch: int | None = None
        self.ledgers = LedgerList()
        self._open: LedgerMeta | None = None  # the ledger this process writes
        self._open_bytes = 0
        self._roll_next = False
        self._confirmed_end = 0  # every offset below is on ack_quorum nodes
        # Every offset below is on every node of its ledger (the replication lag's floor).
        self.replicated_end = 0
        self._sent_end = 0  # where the next append goes: the end of the last one sent
        self._in_flight: deque[_Flight] = deque()  # sent, not yet completed, in order
        self._failed: set[str] = set()  # nodes that failed an append of the open ledger
        self._queued: dict[str, int] = {}  # per node: appends in tasks not yet sent
        self._followups: set[asyncio.Future[None]] = set()  # start_append's lease checks, retries
        self._stopped: str | None = None
        self._lock = asyncio.Lock()
        self.appends_refused = 0
        self.lease_waits = 0  # times an acknowledgement waited for ZooKeeper to confirm the session

    @property
    def name(self) -> str:
        return f"{self.topic_uid}/{self.source}"

    @property
    def end_offset(self) -> int:
        """Where the next append goes: every offset below is on ``ack_quorum`` nodes."""
        return self._confirmed_end

    @property
    def taken_over(self) -> bool:
        return self.epoch is not None

    @property
    def list_lock(self) -> asyncio.Lock:
        """Held while this writer changes its ledger list; another process part that changes
        it (the repair auditor) holds it too, so their compare-and-sets never cross."""
        return self._lock

    def adopt(self, written: LedgerList, read_version: int) -> None:
        """Take a list someone else wrote (under ``list_lock``) from the version this writer
        holds, so its next change builds on it."""
        if self.ledgers.version == read_version:
            self.ledgers = written

    def set_policy(self, policy: StoragePolicy) -> None:
        """Where the next ledgers go (the topic's storage policy changed); the open ledger
        rolls with the next append so new messages follow it at once."""
        if policy != self._policy:
            self._policy = policy
            self.roll_next()

    def roll_next(self) -> None:
        """Start a new ledger with the next append (so what precedes it can be trimmed
        whole, e.g. before a snapshot that replaces it)."""
        if self._open is not None:
            self._roll_next = True

    # -- takeover ------------------------------------------------------------------------

    async def take_over(self) -> LedgerList:
        """Own the source: epoch, ledger list, recovery of an unclosed last ledger. Returns
        the list with every ledger closed; the end is where this owner appends next."""
        self.epoch = await self._directory.acquire(self.topic_uid, self.source)
        while True:
            ledgers = await self._directory.read(self.topic_uid, self.source)
            try:
                if ledgers.needs_recovery():
                    ledgers = await self._recover(ledgers)
                break
            except ListConflict:
                continue  # someone changed the list meanwhile: read it again
        self.ledgers = ledgers
        end = ledgers.end_offset
        assert end is not None
        self._confirmed_end = self._sent_end = self.replicated_end = end
        return ledgers

    async def _recover(self, ledgers: LedgerList) -> LedgerList:
        last = ledgers.last
        assert last is not None and self.epoch is not None
        if last.state is LedgerState.OPEN:
            ledgers = await self._directory.write(
                self.topic_uid, self.source, ledgers.replaced_last(last.recovering())
            )
        replies = await self._fence(last)
        try:
            plan = plan_recovery(last.first_offset, replies, last.write_quorum, last.ack_quorum)
        except NotEnoughReplies as e:
            raise ReplicationFailed(f"source {self.name}: ledger {last.ledger_id}: {e}") from e
        for node_id, start in plan.copies:
            await self._copy(last, plan.source, node_id, start, plan.end_offset)
        logger.info(
            "source %s: recovered ledger %d: closed at %d (epoch %d, %d copies)",
            self.name,
            last.ledger_id,
            plan.end_offset,
            self.epoch,
            len(plan.copies),
        )
        last = ledgers.last
        assert last is not None
        return await self._directory.write(
            self.topic_uid, self.source, ledgers.replaced_last(last.closed(plan.end_offset))
        )

    async def _fence(self, ledger: LedgerMeta) -> list[FenceReply]:
        assert self.epoch is not None
        nodes = [self._directory.node(n) for n in ledger.nodes]
        calls = [
            _timed(self._nodes.fence(node, ledger.ledger_id, self.epoch))
            for node in nodes
            if node is not None
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        replies = []
        for node, result in zip([n for n in nodes if n is not None], results, strict=True):
            if isinstance(result, BaseException):
                logger.warning(
                    "source %s: fence of ledger %d on %s failed: %s",
                    self.name,
                    ledger.ledger_id,
                    node.node_id,
                    result,
                )
                continue
            end = result.end_offset if result.exists else ledger.first_offset
            replies.append(FenceReply(node.node_id, end))
        return replies

    async def _copy(
        self, ledger: LedgerMeta, source_id: str, target_id: str, start: int, end: int
    ) -> None:
        """Copy entries [start, end) of ``ledger`` from one node to another (epoch: ours)."""
        source = self._directory.node(source_id)
        target = self._directory.node(target_id)
        if source is None or target is None:
            raise ReplicationFailed(f"ledger {ledger.ledger_id}: node gone during recovery")
        assert self.epoch is not None
        offset = start
        while offset < end:
            frames, _ = await _timed(
                self._nodes.read(source, ledger.ledger_id, offset, end, COPY_PAGE_BYTES)
            )
            if not frames:
                raise ReplicationFailed(
                    f"ledger {ledger.ledger_id}: {source_id} returned nothing at {offset}"
                )
            offset = await _timed(
                self._nodes.append(
                    target, ledger.ledger_id, self.epoch, ledger.first_offset, frames, -1
                )
            )

    # -- appends -------------------------------------------------------------------------

    def start_append(
        self, first_offset: int, frames: bytes, end_offset: int, done: AppendDone
    ) -> bool:
        """:meth:`append` without a coroutine, when the open ledger takes it as it is (no
        takeover, no roll, no other append waiting for the lock): sent to the nodes at once,
        and ``done`` called once, from the step that completes it (the node connection's
        reader when the nodes' answers come that way): ``done(None)`` when ``ack_quorum``
        nodes have the entries durable and the session is proven alive (a lease that must be
        renewed first takes a task), else ``done(error)`` after :meth:`append`'s retries. False:
        nothing was sent; await :meth:`append`."""
        ledger = self._open
        if (
            ledger is None
            or self._roll_next
            or self._lock.locked()
            or self._stopped is not None
            or self.epoch is None
            or first_offset != self._sent_end
            or not self._directory.owns()
        ):
            return False
        try:
            self._send(ledger, frames, end_offset, (done, first_offset))
        except ReplicationFailed:
            return False  # too few healthy nodes: append() rolls
        return True

    def _finish(self, flight: _Flight, error: BaseException | None) -> None:
        """Tell a start_append caller its append's outcome (as append() would return)."""
        done = flight.done
        assert done is not None
        if error is None and self._directory.lease_holds():
            done(None)
            return
        if isinstance(error, Fenced):
            try:
                self._stop(str(error))
            except LostOwnership as e:
                done(e)
            return
        if error is not None and not isinstance(error, ReplicationFailed):
            done(error)
            return
        # The lease must be renewed first, or the append goes again to a new ledger.
        again = (
            self._confirm_owner()
            if error is None
            else self.append(flight.first_offset, flight.frames, flight.end_offset, sent_before=1)
        )
        task = asyncio.ensure_future(again)
        self._followups.add(task)
        task.add_done_callback(functools.partial(self._followed_up, done))

    def _followed_up(self, done: AppendDone, task: asyncio.Future[None]) -> None:
        self._followups.discard(task)
        done(StorageError("cancelled") if task.cancelled() else task.exception())

    async def append(
        self, first_offset: int, frames: bytes, end_offset: int, *, sent_before: int = 0
    ) -> None:
        """Make the entries ``[first_offset, end_offset)`` (``frames``) durable on
        ``ack_quorum`` nodes. Raises ReplicationFailed (the caller fails the publishes and
        reuses the offsets) or LostOwnership.

        Appends are pipelined: each is sent as soon as the one before it was sent, and they
        complete in order. When one fails, every append sent after it fails too (a node keeps a
        ledger's entries in order, so none of them can reach a quorum without it); each is then
        sent again, in the same order, to a new ledger, up to three times in all
        (``sent_before``: how many times it was sent already)."""
        for attempt in range(sent_before, 3):
            async with self._lock:
                try:
                    if self._stopped is not None:
                        raise LostOwnership(self._stopped)
                    if not self._directory.owns():
                        self._stop("its ZooKeeper session ended")
                    if self.epoch is None:  # a source created after start-up: owned on first write
                        await self.take_over()
                    if self._open is None or self._roll_next:
                        await self._drain()  # the open ledger closes at the last confirmed entry
                        if self._stopped is not None:
                            raise LostOwnership(self._stopped)
                    if first_offset != self._sent_end:
                        raise ReplicationFailed(
                            f"source {self.name}: append at {first_offset}, "
                            f"but the replicated log ends at {self._sent_end}"
                        )
                    if self._open is None or self._roll_next:
                        await self._roll(first_offset)
                    assert self._open is not None
                    try:
                        flight = self._send(self._open, frames, end_offset)
                    except ReplicationFailed as e:
                        if attempt == 2:
                            raise
                        logger.warning("source %s: %s; rolling to a new ledger", self.name, e)
                        self._roll_next = True
                        continue
                except LostOwnership:
                    raise
                except Exception:
                    # A ZooKeeper call of the roll failed because the session ended: the
                    # sources it owned may be another process's now. Refused and counted.
                    if not self._directory.owns():
                        self._stop("its ZooKeeper session ended")
                    raise
            try:
                await flight.outcome
            except Fenced as e:
                self._stop(str(e))
            except ReplicationFailed as e:
                if attempt == 2:
                    raise
                logger.warning("source %s: %s; sending it to a new ledger", self.name, e)
            else:
                await self._confirm_owner()
                return

    async def _confirm_owner(self) -> None:
        """Acknowledge durable entries only while this process provably still owns the
        source. A process stopped past its session timeout resumes with appends in flight
        before it hears that its session is gone; if the source was taken over meanwhile and
        its ledgers trimmed and deleted, fences and all, the nodes accept those appends into
        a ledger no list names. The lease says whether the session lived until now; while
        ZooKeeper does not answer, nothing is acknowledged (the entries are durable: once
        the session is confirmed they are, once it is lost the new owner recovers them)."""
        while not self._directory.lease_holds():
            try:
                if await self._directory.renew_lease():
                    return
            except ReplicationFailed as e:
                if self._directory.owns():
                    self.lease_waits += 1
                    logger.warning("source %s: %s; acknowledging nothing until then", self.name, e)
                    await asyncio.sleep(_LEASE_RETRY_S)
                    continue
            self._stop("its ZooKeeper session ended while its appends were in flight")

    def _stop(self, why: str) -> None:
        self._stopped = f"source {self.name} is no longer written by this process: {why}"
        self.appends_refused += 1
        logger.error("%s", self._stopped)
        raise LostOwnership(self._stopped)

    def _send(
        self,
        ledger: LedgerMeta,
        frames: bytes,
        end_offset: int,
        started: tuple[AppendDone, int] | None = None,
    ) -> _Flight:
        """Send an append to every healthy node of ``ledger``; the caller awaits its outcome.

        To a node whose connection is up the append is written at once and its answer
        settles the flight from the connection's reader (``submit_encoded``: no task, no
        event-loop turn on either side); otherwise, or while an earlier append to that node
        still waits in a task to be sent, it goes in a task of its own. Either way each node
        receives a ledger's appends in the order sent. ``started``: start_append's callback
        and first offset (the flight then tells its outcome that way)."""
        assert self.epoch is not None
        live = [n for n in ledger.nodes if n not in self._failed]
        if len(live) < ledger.ack_quorum:
            raise ReplicationFailed(f"ledger {ledger.ledger_id}: too few healthy nodes")
        flight = _Flight(
            ledger.ledger_id,
            end_offset,
            len(frames),
            ledger.ack_quorum,
            len(live),
            asyncio.get_running_loop().create_future(),
            time.perf_counter(),
        )
        if started is not None:
            flight.done, flight.first_offset = started
            flight.frames = frames
        request = self._nodes.encode_append(
            ledger.ledger_id, self.epoch, ledger.first_offset, frames, self._confirmed_end
        )
        for node_id in live:
            if not self._queued.get(node_id) and self._submit(flight, node_id, request):
                continue
            # Tasks start in creation order, so each node receives the appends in order.
            self._queued[node_id] = self._queued.get(node_id, 0) + 1
            ticket = _Queued(node_id)
            task = asyncio.ensure_future(self._send_to(ticket, request))
            task.add_done_callback(functools.partial(self._settle_task, flight, ticket))
        self._in_flight.append(flight)
        self._sent_end = end_offset
        return flight

    def _submit(self, flight: _Flight, node_id: str, request: Any) -> bool:
        node = self._directory.node(node_id)
        if node is None:
            return False  # the task fails it

        def answered(_: int | None, error: BaseException | None) -> None:
            self._settle(flight, node_id, error)

        try:
            return self._nodes.submit_encoded(node, request, answered)
        except Exception:  # the connection broke just now: the task path reports it
            return False

    async def _send_to(self, ticket: _Queued, request: Any) -> int:
        self._unqueue(ticket)  # from here on it is sent before any later append
        node_id = ticket.node_id
        if node_id in self._failed:
            raise ReplicationFailed(f"{node_id} failed an earlier append")
        node = self._directory.node(node_id)
        if node is None:
            raise ReplicationFailed(f"storage node {node_id} is not registered")
        return await self._nodes.append_encoded(node, request)  # it has its own deadline

    def _unqueue(self, ticket: _Queued) -> None:
        if not ticket.started:
            ticket.started = True
            self._queued[ticket.node_id] -= 1

    def _settle_task(self, flight: _Flight, ticket: _Queued, task: asyncio.Future[int]) -> None:
        self._unqueue(ticket)  # (a task cancelled before it started)
        error = asyncio.CancelledError() if task.cancelled() else task.exception()
        self._settle(flight, ticket.node_id, error)

    def _settle(self, flight: _Flight, node_id: str, error: BaseException | None) -> None:
        """One node answered ``flight`` (``error``: it failed)."""
        if error is not None:
            if self._open is not None and self._open.ledger_id == flight.ledger_id:
                self._failed.add(node_id)  # (a straggler of a closed ledger says nothing)
                self._roll_next = True
            flight.failed += 1
            if flight.settled:
                return
            if self._nodes.is_fenced(error):
                flight.settle(Fenced(f"ledger {flight.ledger_id} fenced on {node_id}"))
            elif flight.live - flight.failed < flight.needed:
                flight.settle(
                    ReplicationFailed(
                        f"ledger {flight.ledger_id}: append failed on {flight.failed} of "
                        f"{flight.live} nodes (last: {node_id}: {error})"
                    )
                )
            else:
                return
        else:
            flight.ok += 1
            if flight.ok == flight.live:  # every copy written: the slowest one's lag is over
                metrics.LEDGER_REPLICATION_SECONDS.observe(time.perf_counter() - flight.sent_at)
                self.replicated_end = max(self.replicated_end, flight.end_offset)
            if flight.settled or flight.ok < flight.needed:
                return
            metrics.LEDGER_APPEND_SECONDS.observe(time.perf_counter() - flight.sent_at)
            flight.settle(None)
        self._advance()

    def _advance(self) -> None:
        """Complete the settled appends at the head of the pipeline, in order."""
        in_flight = self._in_flight
        while in_flight and in_flight[0].settled:
            head = in_flight.popleft()
            if head.error is None:
                self._confirmed_end = head.end_offset
                self._open_bytes += head.size
                if self._open_bytes >= self._ledger_bytes:
                    self._roll_next = True
                head.outcome.set_result(None)
                if head.done is not None:
                    self._finish(head, None)
                continue
            failed = [(head, head.error)]
            for later in in_flight:  # cannot reach a quorum without the one that failed
                failed.append(
                    (
                        later,
                        Fenced(str(head.error))
                        if isinstance(head.error, Fenced)
                        else ReplicationFailed(f"an earlier append failed: {head.error}"),
                    )
                )
            in_flight.clear()
            self._sent_end = self._confirmed_end
            self._roll_next = True
            for flight, error in failed:  # in order: their retries take the lock in order
                flight.outcome.set_exception(error)
                if flight.done is not None:
                    flight.outcome.exception()  # retrieved: nobody awaits it
                    self._finish(flight, error)

    async def _drain(self) -> None:
        """Wait until every append sent has completed (the lock keeps new ones out)."""
        while self._in_flight:
            await asyncio.wait([self._in_flight[-1].outcome])

    async def _roll(self, first_offset: int) -> None:
        """Close the open ledger at ``first_offset`` (every entry below is confirmed) and
        open a new one starting there, on nodes that did not fail."""
        ledgers = self.ledgers
        if self._open is not None:
            closed = self._open.closed(first_offset)
            ledgers = await self._write(ledgers.replaced_last(closed))
            self._open = None
        # The policy's copies; fewer while nodes are missing (repair adds the rest later),
        # but never fewer than its ack quorum: below a majority, publishing stops.
        nodes = self._directory.nodes()
        count, ack_quorum = self._policy.replicas, self._policy.ack_quorum
        exclude = frozenset(self._failed)
        usable = [n for n in nodes if n.node_id not in exclude]
        ledger_id = await self._directory.new_ledger_id()
        try:
            chosen = choose_nodes(
                nodes,
                self._policy,
                count=max(ack_quorum, min(count, len(usable))),
                exclude=exclude,
                spread=ledger_id,
            )
        except NotEnoughNodes as e:
            self._failed = set()  # the next attempt tries every node again
            raise ReplicationFailed(f"source {self.name}: {e}") from e
        meta = LedgerMeta(ledger_id, first_offset, chosen, ack_quorum, epoch=self.epoch or 0)
        self.ledgers = await self._write(ledgers.appended(meta))
        self._open = meta
        self._open_bytes = 0
        self._roll_next = False
        self._failed = set()
        logger.info(
            "source %s: ledger %d open at %d on %s", self.name, ledger_id, first_offset, chosen
        )

    async def _write(self, ledgers: LedgerList) -> LedgerList:
        """Write this writer's change to its list. The repair auditor (which may run in
        another process) may have moved closed ledgers' copies meanwhile: the change is then
        made again on top of that; any other change means another owner: stop."""
        while True:
            try:
                self.ledgers = await self._directory.write(self.topic_uid, self.source, ledgers)
                return self.ledgers
            except ListConflict as e:
                fresh = await self._directory.read(self.topic_uid, self.source)
                again = rebased(self.ledgers, ledgers, fresh) if self._directory.owns() else None
                if again is None:
                    self._stop(f"its ledger list was changed by another process ({e})")
                    raise  # unreachable: _stop raises
                logger.info(
                    "source %s: ledger list changed by the repair auditor; writing on top",
                    self.name,
                )
                self.ledgers, ledgers = fresh, again

    # -- trim and close ------------------------------------------------------------------

    async def trim(self, before_offset: int) -> int:
        """Delete the closed ledgers wholly below ``before_offset``; returns how many."""
        async with self._lock:
            if self._stopped is not None:
                return 0
            kept, dropped = self.ledgers.trimmed(before_offset)
            if not dropped:
                return 0
            await self._write(kept)
        for ledger in dropped:
            await self._delete_everywhere(ledger)
        return len(dropped)

    async def seal_if_on(self, node_ids: set[str]) -> bool:
        """Close the open ledger at the confirmed end if it lives on one of ``node_ids`` (they
        left the cluster): a source nobody publishes to would otherwise keep a ledger listing
        a dead node, which repair never touches (it repairs closed ledgers). The next append
        opens a new ledger. Returns whether it closed one."""
        async with self._lock:
            if self._open is None or self._stopped is not None:
                return False
            if not node_ids & set(self._open.nodes):
                return False
            await self._drain()
            if self._open is None or self._stopped is not None:
                return False
            try:
                await self._write(
                    self.ledgers.replaced_last(self._open.closed(self._confirmed_end))
                )
            except LostOwnership:
                return False
            logger.info(
                "source %s: ledger %d closed at %d: its node %s left",
                self.name,
                self._open.ledger_id,
                self._confirmed_end,
                ", ".join(sorted(node_ids & set(self._open.nodes))),
            )
            self._open = None
            self._failed = set()
            return True

    async def close(self) -> None:
        """Close the open ledger at the confirmed end and let the source go (a clean stop:
        the next owner has nothing to recover)."""
        async with self._lock:
            await self._drain()
            if self._open is not None and self._stopped is None:
                try:
                    await self._write(
                        self.ledgers.replaced_last(self._open.closed(self._confirmed_end))
                    )
                except (StorageError, Exception) as e:
                    logger.warning("source %s: closing ledger failed: %s", self.name, e)
                self._open = None
            if self._stopped is None and self.epoch is not None:
                try:
                    await self._directory.release(self.topic_uid, self.source)
                except Exception as e:
                    logger.warning("source %s: release failed: %s", self.name, e)
            self._stopped = self._stopped or "closed"

    async def destroy(self) -> None:
        """Delete every ledger of the source from its nodes, then the source's znode."""
        await self.close()
        ledgers = await self._directory.read(self.topic_uid, self.source)
        for ledger in ledgers.ledgers:
            await self._delete_everywhere(ledger)
        await self._directory.remove(self.topic_uid, self.source)

    async def _delete_everywhere(self, ledger: LedgerMeta) -> None:
        for node_id in ledger.nodes:
            node = self._directory.node(node_id)
            if node is None:
                continue  # the auditor deletes what it finds unlisted later
            try:
                await _timed(self._nodes.delete(node, ledger.ledger_id))
            except Exception as e:
                logger.warning("ledger %d: delete on %s failed: %s", ledger.ledger_id, node_id, e)

    # -- reading (materialization, repair) -------------------------------------------------

    async def read_frames(self, start: int, end: int) -> bytes:
        """Frames from ``start`` (an entry's base offset) up to ``end`` at most, from any
        node holding the ledger; at least one entry when ``start < end``."""
        ledger = self.ledgers.ledger_at(start)
        if ledger is None:
            raise ReplicationFailed(f"source {self.name}: no ledger holds offset {start}")
        stop = end if ledger.end_offset is None else min(end, ledger.end_offset)
        errors = []
        for node_id in ledger.nodes:
            node = self._directory.node(node_id)
            if node is None:
                errors.append(f"{node_id}: not registered")
                continue
            try:
                frames, _ = await _timed(
                    self._nodes.read(node, ledger.ledger_id, start, stop, COPY_PAGE_BYTES)
                )
            except Exception as e:
                errors.append(f"{node_id}: {e}")
                continue
            if frames:
                return frames
            errors.append(f"{node_id}: no entry at {start}")
        raise ReplicationFailed(
            f"source {self.name}: ledger {ledger.ledger_id} unreadable at {start}: "
            + "; ".join(errors)
        )


RemoteFactory = Callable[[str, int], SourceLedgers]
