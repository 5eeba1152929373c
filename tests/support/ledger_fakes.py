"""In-memory storage nodes and ledger directory with the real ones' rules, for unit tests of
the ledger writer (storage/ledgers/writer.py) without processes."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from pubsubd.storage.errors import ListConflict, LostOwnership, ReplicationFailed
from pubsubd.storage.framing import decode_frames
from pubsubd.storage.ledgers.meta import LedgerList
from pubsubd.storage.ledgers.placement import NodeInfo
from pubsubd.storage.ledgers.writer import NodeFence


class NodeDown(ConnectionError):
    pass


class FencedAppend(Exception):
    pass


@dataclass
class FakeLedger:
    first: int
    entries: list[tuple[int, int, bytes]] = field(default_factory=list)  # base, next, frame
    fence: int = 0

    @property
    def end(self) -> int:
        return self.entries[-1][1] if self.entries else self.first


class FakeNodes:
    """Storage nodes: per node and ledger the frames held, fences, nodes that are down."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], FakeLedger] = {}
        self.down: set[str] = set()
        self.refused = 0
        # Node -> a future its next appends wait for (a slow node); its exception fails them.
        self.gates: dict[str, asyncio.Future[None]] = {}
        # Nodes whose connection is up: appends go through submit_encoded (no task).
        self.connected: set[str] = set()
        self.submitted = 0

    def ledger(self, node: str, ledger_id: int) -> FakeLedger | None:
        return self.held.get((node, ledger_id))

    async def append(
        self, node: NodeInfo, ledger_id: int, epoch: int, first_offset: int, frames: bytes, lac: int
    ) -> int:
        if node.node_id in self.down:
            raise NodeDown(node.node_id)
        gate = self.gates.get(node.node_id)
        if gate is not None:
            await gate
        ledger = self.held.setdefault((node.node_id, ledger_id), FakeLedger(first_offset))
        if epoch < ledger.fence:
            self.refused += 1
            raise FencedAppend(f"fenced at {ledger.fence}")
        decoded, _ = decode_frames(frames)
        for entry, pos, length in decoded:
            frame = frames[pos : pos + length]
            if entry.base_offset < ledger.end:
                stored = [f for b, _, f in ledger.entries if b == entry.base_offset]
                assert stored == [frame], "differing overlap"
            elif entry.base_offset == ledger.end:
                ledger.entries.append((entry.base_offset, entry.next_offset, frame))
            else:
                raise ValueError(f"gap: node ends at {ledger.end}")
        return ledger.end

    def encode_append(
        self, ledger_id: int, epoch: int, first_offset: int, frames: bytes, lac: int
    ) -> tuple[int, int, int, bytes, int]:
        return (ledger_id, epoch, first_offset, frames, lac)

    async def append_encoded(
        self, node: NodeInfo, request: tuple[int, int, int, bytes, int]
    ) -> int:
        return await self.append(node, *request)

    def submit_encoded(
        self,
        node: NodeInfo,
        request: tuple[int, int, int, bytes, int],
        answered: Callable[[int | None, BaseException | None], None],
    ) -> bool:
        """The connected path (a node in ``connected``): the append runs now, its answer is
        handed to ``answered`` when done; else False (the writer uses append_encoded)."""
        if node.node_id not in self.connected:
            return False
        self.submitted += 1
        call = asyncio.ensure_future(self.append(node, *request))

        def done(call: asyncio.Future[int]) -> None:
            if call.cancelled():
                answered(None, asyncio.CancelledError())
            elif (error := call.exception()) is not None:
                answered(None, error)
            else:
                answered(call.result(), None)

        call.add_done_callback(done)
        return True

    async def fence(self, node: NodeInfo, ledger_id: int, epoch: int) -> NodeFence:
        if node.node_id in self.down:
            raise NodeDown(node.node_id)
        ledger = self.held.get((node.node_id, ledger_id))
        if ledger is None:
            ledger = self.held[(node.node_id, ledger_id)] = FakeLedger(0)
            ledger.fence = epoch
            return NodeFence(False, 0, 0)
        ledger.fence = max(ledger.fence, epoch)
        return NodeFence(True, ledger.first, ledger.end)

    async def read(
        self, node: NodeInfo, ledger_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> tuple[bytes, int]:
        if node.node_id in self.down:
            raise NodeDown(node.node_id)
        ledger = self.held.get((node.node_id, ledger_id))
        if ledger is None:
            raise KeyError(ledger_id)
        out = [f for b, _, f in ledger.entries if start_offset <= b < (end_offset or 1 << 62)]
        return b"".join(out[:50]), ledger.end

    async def delete(self, node: NodeInfo, ledger_id: int) -> None:
        self.held.pop((node.node_id, ledger_id), None)

    def is_fenced(self, error: BaseException) -> bool:
        return isinstance(error, FencedAppend)


@dataclass
class DirectoryState:
    """What ZooKeeper would hold: ledger lists with versions, owners with epochs, nodes."""

    lists: dict[tuple[str, int], tuple[bytes, int]] = field(default_factory=dict)
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    epochs: dict[tuple[str, int], int] = field(default_factory=dict)  # the owner's epoch
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    zxid: itertools.count[int] = field(default_factory=lambda: itertools.count(100))
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class FakeDirectory:
    """One process's session with the directory (``expire`` ends it, as a lost session)."""

    def __init__(self, state: DirectoryState, session: str) -> None:
        self.state = state
        self.session = session
        self.alive = True
        self.lapsed = False  # the lease ran out (the process was stopped), not yet renewed
        self.reachable = True

    def expire(self) -> None:
        self.alive = False
        for key, owner in list(self.state.owners.items()):
            if owner == self.session:
                del self.state.owners[key]

    async def read(self, topic_uid: str, source: int) -> LedgerList:
        data, version = self.state.lists.get((topic_uid, source), (b"", -1))
        return LedgerList.decode(data, version)

    async def write(self, topic_uid: str, source: int, ledgers: LedgerList) -> LedgerList:
        _, version = self.state.lists.get((topic_uid, source), (b"", -1))
        if version != ledgers.version:
            raise ListConflict(f"version {ledgers.version}, now {version}")
        data = ledgers.encode()
        self.state.lists[(topic_uid, source)] = (data, version + 1)
        return LedgerList.decode(data, version + 1)

    async def new_ledger_id(self) -> int:
        return next(self.state.ids)

    async def acquire(self, topic_uid: str, source: int) -> int:
        key = (topic_uid, source)
        owner = self.state.owners.get(key)
        if owner == self.session:
            return self.state.epochs[key]
        if owner is not None:
            raise LostOwnership(f"owned by {owner}")
        self.state.owners[key] = self.session
        self.state.epochs[key] = next(self.state.zxid)
        return self.state.epochs[key]

    async def release(self, topic_uid: str, source: int) -> None:
        if self.state.owners.get((topic_uid, source)) == self.session:
            del self.state.owners[(topic_uid, source)]

    async def remove(self, topic_uid: str, source: int) -> None:
        self.state.lists.pop((topic_uid, source), None)
        self.state.owners.pop((topic_uid, source), None)

    def nodes(self) -> list[NodeInfo]:
        return list(self.state.nodes.values())

    def node(self, node_id: str) -> NodeInfo | None:
        return self.state.nodes.get(node_id)

    def owns(self) -> bool:
        return self.alive

    def lease_holds(self) -> bool:
        return self.alive and not self.lapsed

    async def renew_lease(self) -> bool:
        if not self.reachable:
            raise ReplicationFailed("cannot confirm the ZooKeeper session")
        self.lapsed = False
        return self.alive


def cluster(
    node_count: int = 3, zones: int = 3, *, connected: bool = True
) -> tuple[DirectoryState, FakeNodes]:
    """``connected``: appends go to every node through ``submit_encoded`` (no task), as to
    nodes whose append port is connected; False: through tasks (``append_encoded``)."""
    state = DirectoryState()
    for i in range(node_count):
        state.nodes[f"n{i}"] = NodeInfo(f"n{i}", f"fake:{i}", f"z{i % zones}")
    nodes = FakeNodes()
    if connected:
        nodes.connected = set(state.nodes)
    return state, nodes
