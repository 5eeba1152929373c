"""The ledger writer and the local copy (storage/ledgers/writer.py, materialize.py) over
in-memory storage nodes and directory with the real ones' rules (tests/support/ledger_fakes)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pubsubd.core.records import Entry
from pubsubd.storage import log as log_module
from pubsubd.storage.errors import DamagedEntries, LostOwnership, ReplicationFailed, StorageError
from pubsubd.storage.framing import decode_frames, encode_entry
from pubsubd.storage.ledgers.materialize import materialize
from pubsubd.storage.ledgers.meta import LedgerState, StoragePolicy
from pubsubd.storage.ledgers.writer import SourceLedgers
from pubsubd.storage.log import FsyncPolicy, SourceLog
from pubsubd.storage.replication import QuorumWriter
from tests.support.ledger_fakes import DirectoryState, FakeDirectory, FakeNodes, cluster


def _writer(state: DirectoryState, nodes: FakeNodes, session: str = "p1") -> SourceLedgers:
    return SourceLedgers("t1", 0, FakeDirectory(state, session), nodes, StoragePolicy())


async def _append(writer: SourceLedgers, offset: int, n: int = 1) -> int:
    frames = b"".join(
        encode_entry(Entry(offset + i, 1, 1000 + offset + i, b"m%d" % (offset + i)))
        for i in range(n)
    )
    await writer.append(offset, frames, offset + n)
    return offset + n


async def test_appends_are_acknowledged_at_a_majority_and_survive_one_node() -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    end = await _append(writer, 0, 5)
    ledger = writer.ledgers.last
    assert ledger is not None and ledger.write_quorum == 3 and ledger.ack_quorum == 2
    assert all(nodes.ledger(n, ledger.ledger_id).end == 5 for n in ledger.nodes)
    nodes.down.add(ledger.nodes[0])
    end = await _append(writer, end, 3)  # two of three answer
    end = await _append(writer, end, 2)  # rolls to a new ledger without the failed node
    assert [m.state for m in writer.ledgers.ledgers] == [LedgerState.CLOSED, LedgerState.OPEN]
    assert writer.ledgers.ledgers[0].end_offset == 8
    assert ledger.nodes[0] not in writer.ledgers.ledgers[1].nodes
    assert end == 10


async def test_two_of_three_down_fails_the_append_and_resumes_after() -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    end = await _append(writer, 0, 2)
    nodes.down |= {"n0", "n1"}
    with pytest.raises(ReplicationFailed):
        await _append(writer, end, 1)
    nodes.down.clear()
    assert await _append(writer, end, 1) == end + 1


async def test_a_new_owner_fences_recovers_and_the_old_one_is_refused() -> None:
    state, nodes = cluster()
    old = _writer(state, nodes, "old")
    await old.take_over()
    end = await _append(old, 0, 4)
    ledger = old.ledgers.last
    assert ledger is not None
    # One node got entry 4 (never acknowledged: the writer died before a quorum had it).
    lone = ledger.nodes[0]
    frames = encode_entry(Entry(4, 1, 5, b"late"))
    await nodes.append(state.nodes[lone], ledger.ledger_id, old.epoch or 0, 0, frames, -1)
    old._directory.expire()  # type: ignore[attr-defined]  # its session ended
    new = _writer(state, nodes, "new")
    taken = await new.take_over()
    assert taken.end_offset == 5  # the lone entry is kept: no acknowledged entry is lost
    assert taken.ledgers[-1].state is LedgerState.CLOSED
    holders = [n for n in ledger.nodes if nodes.ledger(n, ledger.ledger_id).end == 5]
    assert len(holders) >= 2  # copied before closing
    with pytest.raises(LostOwnership):
        await _append(old, end, 1)
    assert await _append(new, 5, 1) == 6
    lists = await FakeDirectory(state, "r").read("t1", 0)
    assert sum(1 for m in lists.ledgers if m.state is not LedgerState.CLOSED) == 1


async def test_a_zombie_writer_is_refused_by_the_fence_even_if_it_believes_it_owns() -> None:
    state, nodes = cluster()
    old = _writer(state, nodes, "old")
    await old.take_over()
    await _append(old, 0, 2)
    state.owners.clear()  # the session expired while the process was stopped...
    new = _writer(state, nodes, "new")
    await new.take_over()
    # ...and the old process, resumed, has not noticed yet: the storage nodes refuse it.
    with pytest.raises(LostOwnership):
        await _append(old, 2, 1)
    assert nodes.refused >= 2
    with pytest.raises(LostOwnership):  # and it never writes again
        await _append(old, 2, 1)


async def test_a_zombie_whose_ledger_was_deleted_everywhere_acknowledges_nothing() -> None:
    """The old owner opened a ledger and sent its first append, then stopped past its
    session timeout before the append reached the nodes. The new owner fenced and closed the
    empty ledger, which was then deleted with its fences. When the zombie resumes, the nodes
    accept its append into a ledger no list names; its lease lapsed while it was stopped and
    renewing it finds the session lost, so the publish is not acknowledged."""
    state, nodes = cluster()
    old = _writer(state, nodes, "old")
    await old.take_over()
    loop = asyncio.get_running_loop()
    in_flight: asyncio.Future[None] = loop.create_future()
    nodes.gates = dict.fromkeys(state.nodes, in_flight)  # the process stops here
    appended = asyncio.ensure_future(_append(old, 0, 2))
    await asyncio.sleep(0.05)
    ledger = old.ledgers.last
    assert ledger is not None and not appended.done()
    directory: FakeDirectory = old._directory  # type: ignore[assignment]
    directory.expire()  # its session ends; it will hear of it only after resuming
    directory.alive, directory.lapsed = True, True
    renewed = directory.renew_lease

    async def renew() -> bool:  # ZooKeeper answers in a new session: the old one is lost
        directory.alive = False
        return await renewed()

    directory.renew_lease = renew  # type: ignore[method-assign]
    new = _writer(state, nodes, "new")
    taken = await new.take_over()
    assert taken.end_offset == 0 and taken.ledgers[-1].state is LedgerState.CLOSED
    for node in ledger.nodes:  # the empty closed ledger deleted, fences and all
        del nodes.held[(node, ledger.ledger_id)]
    nodes.gates = {}
    in_flight.set_result(None)  # the process resumes
    with pytest.raises(LostOwnership):
        await appended
    assert all(nodes.ledger(n, ledger.ledger_id).end == 2 for n in ledger.nodes)  # accepted
    assert old.appends_refused == 1
    with pytest.raises(LostOwnership):  # and it never writes again
        await _append(old, 2, 1)


async def test_a_session_that_ends_during_a_roll_refuses_the_append_and_counts_it() -> None:
    """The session expires while the writer rolls to a new ledger: ZooKeeper fails the write
    of the ledger list. The append is refused as a loss of ownership (the caller answers
    UNAVAILABLE), counted, and nothing is written again."""
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    await _append(writer, 0, 2)
    directory: FakeDirectory = writer._directory  # type: ignore[assignment]

    class SessionExpired(Exception):  # what the ZooKeeper directory raises then
        pass

    async def write(*_args: object) -> None:
        directory.expire()
        raise SessionExpired("ZooKeeper session expired (/pubsubd/sources/1/t1/0)")

    directory.write = write  # type: ignore[assignment,method-assign]
    writer.roll_next()
    with pytest.raises(LostOwnership, match="session ended"):
        await _append(writer, 2, 1)
    assert writer.appends_refused == 1
    with pytest.raises(LostOwnership):
        await _append(writer, 2, 1)
    assert writer.appends_refused == 1


async def test_an_acknowledgement_waits_while_zookeeper_cannot_confirm_the_session() -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    directory: FakeDirectory = writer._directory  # type: ignore[assignment]
    directory.lapsed, directory.reachable = True, False
    appended = asyncio.ensure_future(_append(writer, 0, 3))
    await asyncio.sleep(0.5)
    assert not appended.done()  # durable on the nodes, not acknowledged
    assert writer.lease_waits >= 1
    ledger = writer.ledgers.last
    assert ledger is not None and all(
        nodes.ledger(n, ledger.ledger_id).end == 3 for n in ledger.nodes
    )
    directory.reachable = True  # ZooKeeper is back and the session lived on
    assert await asyncio.wait_for(appended, 2.0) == 3
    assert await _append(writer, 3, 1) == 4


async def test_trim_deletes_closed_ledgers_below_the_point(tmp_path: Path) -> None:
    state, nodes = cluster()
    writer = SourceLedgers(
        "t1", 0, FakeDirectory(state, "p"), nodes, StoragePolicy(), ledger_bytes=50
    )
    await writer.take_over()
    end = 0
    for _ in range(5):
        end = await _append(writer, end, 3)  # each append fills a ledger: roll after it
    first = writer.ledgers.ledgers[0]
    assert len(writer.ledgers.ledgers) == 5
    assert await writer.trim(7) == 2
    assert writer.ledgers.start_offset == 6
    assert all(nodes.ledger(n, first.ledger_id) is None for n in first.nodes)


async def test_materialize_copies_the_missing_tail_and_starts_fresh_copies(
    tmp_path: Path,
) -> None:
    state, nodes = cluster()
    writer = SourceLedgers(
        "t1", 0, FakeDirectory(state, "p"), nodes, StoragePolicy(), ledger_bytes=200
    )
    await writer.take_over()
    local = SourceLog.open(tmp_path / "a", fsync=FsyncPolicy.NEVER, remote=writer)
    for i in range(20):
        await local.append(b"m%d" % i, 1, 1000 + i)
    await local.close()
    # A new machine: an empty directory gets every entry, in identical frames.
    reader = SourceLedgers("t1", 0, FakeDirectory(state, "q"), nodes, StoragePolicy())
    await reader.take_over()
    assert await materialize(tmp_path / "b", reader) == 20
    copy = SourceLog.open(tmp_path / "b")
    assert [e.payload for e in copy.read(0, max_entries=20)] == [b"m%d" % i for i in range(20)]
    await copy.close()
    # A copy that lost its tail (a crash of the machine: the local copy is not fsynced)
    # gets only the tail back.
    segment = next((tmp_path / "b").glob("*.seg"))
    with segment.open("r+b") as f:
        f.truncate(segment.stat().st_size - 5)
    assert await materialize(tmp_path / "b", reader) == 1
    copy = SourceLog.open(tmp_path / "b")
    assert copy.end_offset == 20 and copy.read(19)[0].payload == b"m19"
    await copy.close()
    # A local directory that is not a prefix of the ledgers is moved aside, not trusted.
    odd = SourceLog.open(tmp_path / "d")
    for i in range(25):
        await odd.append(b"x", 1, i)
    await odd.close()
    assert await materialize(tmp_path / "d", reader) == 20
    assert len([n for n in os.listdir(tmp_path) if n.startswith("d.stale-")]) == 1


async def test_the_log_fails_publishes_when_the_remote_fails_and_reuses_offsets(
    tmp_path: Path,
) -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    log = SourceLog.open(tmp_path / "s", fsync=FsyncPolicy.ALWAYS, remote=writer)
    assert await log.append(b"a", 1, 1) == 0
    nodes.down |= {"n0", "n1", "n2"}
    with pytest.raises(StorageError):
        await log.append(b"b", 1, 2)
    nodes.down.clear()
    assert await log.append(b"c", 1, 3) == 1
    assert [e.payload for e in log.read(0, max_entries=2)] == [b"a", b"c"]
    await log.close()


async def test_a_new_policy_moves_the_next_ledger_to_the_allowed_zones() -> None:
    state, nodes = cluster(node_count=4, zones=2)  # n0, n2 in z0; n1, n3 in z1
    writer = _writer(state, nodes)
    await writer.take_over()
    end = await _append(writer, 0, 2)
    writer.set_policy(StoragePolicy(replicas=2, allowed_zones=frozenset({"z1"})))
    await _append(writer, end, 1)
    last = writer.ledgers.last
    assert last is not None and set(last.nodes) == {"n1", "n3"} and last.ack_quorum == 2
    assert writer.ledgers.ledgers[0].end_offset == 2  # the earlier ledger closed where it was


async def test_a_straggler_of_a_closed_ledger_does_not_fail_the_node_in_the_next() -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    nodes.gates["n0"] = gate
    end = await _append(writer, 0, 1)  # n1 and n2 answer; n0's call hangs
    del nodes.gates["n0"]
    writer.roll_next()
    end = await _append(writer, end, 1)  # a new ledger, n0 answering again
    assert len(writer.ledgers.ledgers) == 2
    gate.set_exception(ConnectionError("the old call to n0 finally fails"))
    await asyncio.sleep(0)
    for _ in range(3):
        end = await _append(writer, end, 1)
    assert len(writer.ledgers.ledgers) == 2  # no roll: n0 is healthy in the open ledger


async def _damaged_local_copy(tmp_path: Path) -> SourceLedgers:
    """40 entries replicated and in a local copy whose second entry has a flipped byte; the
    writer of the next owner, taken over (the local copy is opened on it by the caller)."""
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    log = SourceLog.open(tmp_path / "s", segment_bytes=400, remote=writer)
    for i in range(40):
        await log.append(b"message %02d" % i, 1, 1000 + i)
    await log.close()
    sealed = sorted((tmp_path / "s").glob("*.seg"))[0]
    data = bytearray(sealed.read_bytes())
    data[60] ^= 0xFF  # one flipped byte in the second entry of the first segment
    sealed.write_bytes(bytes(data))
    writer = _writer(state, nodes, "p2")
    await writer.take_over()
    return writer


async def test_a_damaged_range_of_the_local_copy_is_re_read_from_the_nodes(
    tmp_path: Path,
) -> None:
    writer = await _damaged_local_copy(tmp_path)
    log = SourceLog.open(tmp_path / "s", segment_bytes=400, remote=writer)
    commits: list[int] = []
    log.add_listener(commits.append)
    with pytest.raises(DamagedEntries) as found:
        log.read(1)
    # Found while running: re-read from the nodes at once, and meanwhile readers are told to
    # wait (not to skip the messages or report them lost).
    assert found.value.restoring
    assert len(log.damaged_ranges()) == 1
    for _ in range(200):
        if not log.damaged_ranges():
            break
        await asyncio.sleep(0.01)
    assert not log.damaged_ranges() and commits  # restored; readers waiting at it are woken
    assert [e.payload for e in log.read(0, max_entries=40)] == [
        b"message %02d" % i for i in range(40)
    ]
    await log.close()


async def test_damage_the_nodes_cannot_restore_falls_back_to_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = await _damaged_local_copy(tmp_path)

    async def unreadable(start: int, end: int) -> bytes:
        raise ReplicationFailed("no node holds the range")

    monkeypatch.setattr(writer, "read_frames", unreadable)
    log = SourceLog.open(tmp_path / "s", segment_bytes=400, remote=writer)
    commits: list[int] = []
    log.add_listener(commits.append)
    with pytest.raises(DamagedEntries) as found:
        log.read(1)
    assert found.value.restoring
    for _ in range(200):
        if commits:
            break
        await asyncio.sleep(0.01)
    assert commits  # the failed restore wakes the readers waiting at the damage...
    with pytest.raises(DamagedEntries) as found:
        log.read(1)
    assert not found.value.restoring  # ...which now apply the topic's damage policy
    await log.close()


async def test_an_idle_source_closes_its_ledger_when_one_of_its_nodes_leaves() -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    end = await _append(writer, 0, 3)
    assert not await writer.seal_if_on({"n9"})  # not one of its nodes
    assert await writer.seal_if_on({"n1"})
    assert [m.state for m in writer.ledgers.ledgers] == [LedgerState.CLOSED]
    assert writer.ledgers.ledgers[0].end_offset == 3  # closed where it was confirmed
    del state.nodes["n1"]
    assert await _append(writer, end, 1) == 4  # the next append opens a new one
    assert "n1" not in writer.ledgers.ledgers[-1].nodes


# -- pipelining ------------------------------------------------------------------------------


async def test_appends_sent_without_waiting_complete_in_order() -> None:
    """Appends go out before earlier ones are answered and complete in order; a slow node
    gets every append in order once it catches up."""
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    nodes.gates["n0"] = gate
    completed: list[int] = []

    async def one(i: int) -> None:
        await _append(writer, 2 * i, 2)
        completed.append(i)

    await asyncio.gather(*(one(i) for i in range(20)))
    assert completed == list(range(20)) and writer.end_offset == 40
    ledger = writer.ledgers.last
    assert ledger is not None and len(writer.ledgers.ledgers) == 1
    assert [nodes.ledger(n, ledger.ledger_id).end for n in ("n1", "n2")] == [40, 40]
    del nodes.gates["n0"]
    gate.set_result(None)
    for _ in range(100):
        await asyncio.sleep(0)
    slow = nodes.ledger("n0", ledger.ledger_id)
    assert slow is not None and slow.end == 40


async def test_when_an_append_in_the_pipeline_fails_the_later_ones_follow_it_in_order() -> None:
    """Two of three nodes fail while five appends are on their way: none of them can reach a
    quorum on that ledger, so all five are sent again, in order, to a new ledger; every
    entry is then held once, in order, and the old ledger closes where the quorum ended."""
    state, nodes = cluster(node_count=5)
    writer = _writer(state, nodes)
    await writer.take_over()
    await _append(writer, 0, 1)
    first = writer.ledgers.last
    assert first is not None
    loop = asyncio.get_running_loop()
    gates = {n: loop.create_future() for n in first.nodes[:2]}
    nodes.gates.update(gates)
    appends = [asyncio.ensure_future(_append(writer, 1 + i, 1)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert not any(a.done() for a in appends)  # all five sent, none answered by a quorum
    for node_id, gate in gates.items():
        del nodes.gates[node_id]
        nodes.down.add(node_id)
        gate.set_exception(ConnectionError(f"{node_id} went away"))
    assert await asyncio.gather(*appends) == [2, 3, 4, 5, 6]
    closed, last = writer.ledgers.ledgers[0], writer.ledgers.last
    assert closed.state is LedgerState.CLOSED and closed.end_offset == 1
    assert last is not None and not set(last.nodes) & set(gates)
    held, offset = [], 0
    while offset < 6:  # a read answers from one ledger at a time
        entries = decode_frames(await writer.read_frames(offset, 6))[0]
        held += [e.base_offset for e, _, _ in entries]
        offset = entries[-1][0].next_offset
    assert held == [0, 1, 2, 3, 4, 5]


class _SlowRemote:
    """A RemoteLog whose appends take a while and can be made to fail at an offset."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_at: int | None = None
        self.appended: list[tuple[int, int]] = []

    async def sent(self, calls: int) -> None:
        """Wait until ``calls`` appends have been sent (each group in its own)."""
        async with asyncio.timeout(5):
            while self.calls < calls:
                await self.called.wait()
                self.called.clear()

    async def append(self, first_offset: int, frames: bytes, end_offset: int) -> None:
        self.calls += 1
        self.called.set()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.02)
            if self.fail_at is not None and first_offset <= self.fail_at < end_offset:
                raise ReplicationFailed(f"no quorum for {first_offset}")
            self.appended.append((first_offset, end_offset))
        finally:
            self.in_flight -= 1

    def start_append(
        self,
        first_offset: int,
        frames: bytes,
        end_offset: int,
        done: Callable[[BaseException | None], None],
    ) -> bool:
        return False  # every group in a task of its own (append)

    async def read_frames(self, start: int, end: int) -> bytes:
        return b""

    async def trim(self, before_offset: int) -> int:
        return 0

    async def close(self) -> None:
        pass

    async def destroy(self) -> None:
        pass


async def test_a_replicated_log_keeps_several_groups_in_flight_and_commits_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "REMOTE_PIPELINE_BYTES", 1)  # pipeline even tiny groups
    remote = _SlowRemote()
    log = SourceLog.open(tmp_path / "s", remote=remote)
    appends = []
    for i in range(12):
        appends.append(asyncio.ensure_future(log.append(b"m%d" % i, 1, i)))
        await remote.sent(i + 1)  # one group each (the remote is slower than this)
    assert await asyncio.gather(*appends) == list(range(12))
    assert remote.most_in_flight > 1
    assert [e.payload for e in log.read(0, max_entries=12)] == [b"m%d" % i for i in range(12)]
    # A group that fails fails every group sent after it, whatever the remote answered for
    # them; their offsets are handed out again.
    remote.fail_at = 13
    appends = []
    for i in range(12, 16):
        appends.append(asyncio.ensure_future(log.append(b"n%d" % i, 1, i)))
        await remote.sent(i + 1)
    results = await asyncio.gather(*appends, return_exceptions=True)
    assert results[0] == 12
    assert all(isinstance(r, StorageError) for r in results[1:])
    await asyncio.sleep(0.05)  # the remote answers the groups it still had
    assert remote.in_flight == 0
    assert (12, 13) in remote.appended and any(first > 13 for first, _ in remote.appended)
    remote.fail_at = None
    assert await log.append(b"again", 1, 20) == 13
    assert [e.payload for e in log.read(12, max_entries=5)] == [b"n12", b"again"]
    await log.close()


async def test_a_replicated_log_waits_for_the_round_trip_while_little_is_pending(
    tmp_path: Path,
) -> None:
    """Below REMOTE_PIPELINE_BYTES the next group waits for the one on its way (and grows)."""
    remote = _SlowRemote()
    log = SourceLog.open(tmp_path / "s", remote=remote)
    appends = []
    for i in range(12):
        appends.append(asyncio.ensure_future(log.append(b"m%d" % i, 1, i)))
        await asyncio.sleep(0.002)
    assert await asyncio.gather(*appends) == list(range(12))
    assert remote.most_in_flight == 1 and len(remote.appended) < 12
    await log.close()


async def test_a_writer_goes_on_over_the_auditors_change_from_another_process() -> None:
    """The repair auditor of another process moves a closed ledger's copies (a compare-and-set
    the writer did not see): the writer's next list change is made on top of it, the copies
    stay where the auditor put them. Anything else another process changed stops the writer."""
    state, nodes = cluster(node_count=4)
    writer = _writer(state, nodes)
    await writer.take_over()
    end = await _append(writer, 0, 3)
    nodes.down.add(writer.ledgers.ledgers[0].nodes[0])
    end = await _append(writer, end, 1)  # answered by two of three
    end = await _append(writer, end, 1)  # closes ledger 1 and opens a new one
    closed = writer.ledgers.ledgers[0]
    assert closed.state is LedgerState.CLOSED
    # The auditor, elsewhere, replaces the failed node of the closed ledger.
    auditor = FakeDirectory(state, "auditor-process")
    fresh = await auditor.read("t1", 0)
    spare = next(n for n in state.nodes if n not in closed.nodes)
    moved = closed.with_nodes((*closed.nodes[1:], spare))
    await auditor.write("t1", 0, fresh.replaced(moved))
    nodes.down.clear()
    writer.roll_next()
    end = await _append(writer, end, 1)  # rolling writes the list: on top of the auditor's
    stored = await auditor.read("t1", 0)
    assert stored.ledgers[0] == moved
    assert [m.state for m in stored.ledgers][-1] is LedgerState.OPEN
    assert writer.appends_refused == 0
    # A change that is not the auditor's (a ledger closed elsewhere) stops it for good.
    fresh = await auditor.read("t1", 0)
    last = fresh.ledgers[-1]
    await auditor.write("t1", 0, fresh.replaced_last(last.closed(end)))
    writer.roll_next()
    with pytest.raises(LostOwnership):
        await _append(writer, end, 1)


async def test_a_local_write_that_fails_after_the_quorum_took_the_group_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The storage nodes hold the group, so its offsets are never handed out again: its
    appends are acknowledged, the local copy is written again until it takes, readers see
    the entries then, and later appends go on at the next offsets (they used to be refused
    until a restart: the ledger was ahead of the local log)."""
    monkeypatch.setattr(log_module, "LOCAL_RETRY_FIRST_S", 0.01)
    remote = _SlowRemote()
    log = SourceLog.open(tmp_path / "s", remote=remote)
    assert await log.append(b"a", 1, 0) == 0
    real_append = QuorumWriter.append
    failures = 2

    async def flaky_append(self: QuorumWriter, segment_base: int, data: bytes, sync: bool) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise StorageError("No space left on device (local copy)")
        await real_append(self, segment_base, data, sync)

    monkeypatch.setattr(QuorumWriter, "append", flaky_append)
    assert await log.append(b"b", 1, 1) == 1  # durable on the quorum: acknowledged
    assert await log.append(b"c", 1, 2) == 2  # waited behind the retries, then written
    assert failures == 0 and log.stats()["local_write_retries"] == 2
    assert log.committed_offset == 3
    assert [e.payload for e in log.read(0, max_entries=5)] == [b"a", b"b", b"c"]
    assert remote.appended == [(0, 1), (1, 2), (2, 3)]
    await log.close()


async def test_a_replicated_log_answers_at_the_quorum_and_reads_from_memory_until_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quorum holds a group: its appends are answered and its entries readable (reads,
    entry_at, publish times, time lookups, stored bytes, listeners) while the local copy's
    write is still on its way; once written they are read from the local copy, with no
    second commit notification."""
    remote = _SlowRemote()
    log = SourceLog.open(tmp_path / "s", remote=remote)
    assert await log.append(b"a", 1, 100) == 0
    await _written(log, 1)
    empty = log.stored_bytes(0, 1)
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    real_append = QuorumWriter.append

    async def held(self: QuorumWriter, segment_base: int, data: bytes, sync: bool) -> None:
        await gate
        await real_append(self, segment_base, data, sync)

    monkeypatch.setattr(QuorumWriter, "append", held)
    commits: list[int] = []
    log.add_listener(commits.append)
    assert await asyncio.gather(log.append(b"bb", 2, 200), log.append(b"ccc", 1, 300)) == [1, 3]
    stats = log.stats()
    assert (stats["written_offset"], stats["committed_offset"]) == (1, 4)
    assert stats["unwritten_entries"] == 2 and commits == [4]

    def check_reads() -> None:
        assert [e.payload for e in log.read(0)] == [b"a", b"bb", b"ccc"]
        assert [e.payload for e in log.read(2)] == [b"bb", b"ccc"]
        assert [e.payload for e in log.read(0, max_entries=2)] == [b"a", b"bb"]
        assert [e.payload for e in log.read(1, max_bytes=1)] == [b"bb"]
        assert log.read(4) == []
        assert log.entry_at(2).payload == b"bb" and log.publish_time_us(3) == 300
        assert [log.offset_for_time(t) for t in (50, 150, 300, 301)] == [0, 1, 3, 4]
        assert log.stored_bytes(0, 1) == empty
        assert log.stored_bytes(1, 2) == log.stored_bytes(2, 3) > 0  # half of "bb"'s frame

    check_reads()
    whole = log.stored_bytes(0, 4)
    gate.set_result(None)
    await _written(log, 4)
    assert log.stats()["unwritten_entries"] == 0 and commits == [4]
    check_reads()
    assert log.stored_bytes(0, 4) == whole
    assert await log.append(b"d", 1, 500) == 4
    await log.close()
    reopened = SourceLog.open(tmp_path / "s")
    assert [e.payload for e in reopened.read(0)] == [b"a", b"bb", b"ccc", b"d"]
    await reopened.close()


async def _written(log: SourceLog, offset: int) -> None:
    """Wait until the local copy holds every offset below ``offset``."""
    for _ in range(400):
        if log.stats()["written_offset"] >= offset:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"local copy not written up to {offset}: {log.stats()}")


class _GatedRemote(_SlowRemote):
    """A RemoteLog whose appends are answered when the test says, by their first offset."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[int, asyncio.Future[None]] = {}

    async def append(self, first_offset: int, frames: bytes, end_offset: int) -> None:
        answer = self.answers.setdefault(first_offset, asyncio.get_running_loop().create_future())
        await answer
        self.appended.append((first_offset, end_offset))


async def test_a_group_refused_behind_an_acknowledged_unwritten_one_reuses_only_its_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two groups on their way; the quorum takes the first and refuses the second in the same
    turn: the first is acknowledged (its local write comes after the failure is handled),
    the second fails and only its offsets are handed out again."""
    monkeypatch.setattr(log_module, "REMOTE_PIPELINE_BYTES", 1)  # pipeline even tiny groups
    remote = _GatedRemote()
    log = SourceLog.open(tmp_path / "s", remote=remote)
    first = asyncio.ensure_future(log.append(b"a", 1, 1))
    for _ in range(10):
        await asyncio.sleep(0)
    second = asyncio.ensure_future(log.append(b"b", 1, 2))
    for _ in range(10):
        await asyncio.sleep(0)
    assert set(remote.answers) == {0, 1}  # both sent
    remote.answers[0].set_result(None)
    remote.answers[1].set_exception(ReplicationFailed("no quorum"))
    assert await first == 0
    with pytest.raises(StorageError):
        await second
    assert log.end_offset == 1 and log.committed_offset == 1
    remote.answers[1] = asyncio.get_running_loop().create_future()
    remote.answers[1].set_result(None)
    assert await log.append(b"c", 1, 3) == 1
    assert [e.payload for e in log.read(0)] == [b"a", b"c"]
    await log.close()


async def test_a_read_never_runs_from_a_damaged_local_end_on_to_unwritten_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local copy ends in a damaged range (a sealed segment's tail, the active segment
    empty) while acknowledged entries wait for their local write: a read stops before the
    damage, never returning entries on both sides of it as if they were contiguous."""
    directory = tmp_path / "s"
    local = SourceLog.open(directory)
    for i in range(5):
        await local.append(b"message %d" % i, 1, 100 + i)
    await local.close()
    sealed = directory / "00000000000000000000.seg"
    data = bytearray(sealed.read_bytes())
    data[-3] ^= 0xFF  # the last entry (offset 4) is damaged
    sealed.write_bytes(bytes(data))
    (directory / "00000000000000000005.seg").touch()  # the empty active segment
    log = SourceLog.open(directory, remote=_SlowRemote())
    assert [d.first_offset for d in log.damaged_ranges()] == [4]
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    real_append = QuorumWriter.append

    async def held(self: QuorumWriter, segment_base: int, data: bytes, sync: bool) -> None:
        await gate
        await real_append(self, segment_base, data, sync)

    monkeypatch.setattr(QuorumWriter, "append", held)
    assert await log.append(b"after", 1, 200) == 5  # acknowledged, not written locally
    assert [e.base_offset for e in log.read(0)] == [0, 1, 2, 3]
    assert [e.payload for e in log.read(5)] == [b"after"]
    gate.set_result(None)
    await _written(log, 6)
    assert [e.base_offset for e in log.read(0)] == [0, 1, 2, 3]
    await log.close()


# -- start_append: an append sent and answered without a task (issue 10, session D10) -------


def _frames(offset: int, n: int = 1) -> bytes:
    return b"".join(
        encode_entry(Entry(offset + i, 1, 1000 + offset + i, b"m%d" % (offset + i)))
        for i in range(n)
    )


class _Outcomes:
    """start_append's ``done`` callbacks: what each append was told, in call order."""

    def __init__(self) -> None:
        self.told: list[tuple[int, BaseException | None]] = []
        self.changed = asyncio.Event()

    def done(self, offset: int) -> Callable[[BaseException | None], None]:
        def told(error: BaseException | None) -> None:
            assert offset not in [o for o, _ in self.told], "told twice"
            self.told.append((offset, error))
            self.changed.set()

        return told

    async def wait(self, count: int) -> None:
        while len(self.told) < count:
            async with asyncio.timeout(5):
                await self.changed.wait()
            self.changed.clear()


async def test_start_append_sends_at_once_and_tells_the_outcome_at_the_quorum() -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    await _append(writer, 0, 1)  # opens the ledger
    outcomes = _Outcomes()
    before = nodes.submitted
    end = 1
    for _ in range(4):  # pipelined: each sent before the last is answered
        assert writer.start_append(end, _frames(end, 2), end + 2, outcomes.done(end))
        end += 2
    assert nodes.submitted == before + 4 * 3  # no task: every node got each one at once
    assert outcomes.told == []  # nothing answered before the nodes did
    await outcomes.wait(4)
    assert outcomes.told == [(1, None), (3, None), (5, None), (7, None)]  # in order
    assert writer.end_offset == 9
    ledger = writer.ledgers.last
    assert ledger is not None
    assert all(nodes.ledger(n, ledger.ledger_id).end == 9 for n in ledger.nodes)  # type: ignore[union-attr]


async def test_start_append_declines_what_only_append_can_do() -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    outcomes = _Outcomes()
    assert not writer.start_append(0, _frames(0), 1, outcomes.done(0))  # not taken over yet
    await writer.take_over()
    assert not writer.start_append(0, _frames(0), 1, outcomes.done(0))  # no open ledger yet
    await _append(writer, 0, 1)
    assert not writer.start_append(5, _frames(5), 6, outcomes.done(5))  # not where it ends
    writer.roll_next()
    assert not writer.start_append(1, _frames(1), 2, outcomes.done(1))  # a roll takes the lock
    assert await _append(writer, 1, 1) == 2
    assert writer.start_append(2, _frames(2), 3, outcomes.done(2))
    await outcomes.wait(1)
    assert outcomes.told == [(2, None)] and writer.end_offset == 3
    assert nodes.submitted > 0 and not [e for _, e in outcomes.told if e is not None]


async def test_start_append_keeps_each_nodes_order_behind_an_append_in_a_task() -> None:
    """A node whose connection is not up yet gets the append in a task; once it is up, the
    next append must not overtake the one still waiting in that task (the node would see a
    gap and refuse it)."""
    state, nodes = cluster(connected=False)
    writer = _writer(state, nodes)
    await writer.take_over()
    await _append(writer, 0, 1)
    outcomes = _Outcomes()
    assert writer.start_append(1, _frames(1), 2, outcomes.done(1))  # every node: a task
    nodes.connected = {"n0", "n1", "n2"}  # the connections come up before the tasks run
    assert writer.start_append(2, _frames(2), 3, outcomes.done(2))
    assert nodes.submitted == 0  # behind a queued append each node still gets a task
    await outcomes.wait(2)
    assert outcomes.told == [(1, None), (2, None)]
    assert writer.start_append(3, _frames(3), 4, outcomes.done(3))
    assert nodes.submitted == 3  # nothing queued any more: sent at once
    await outcomes.wait(3)
    ledger = writer.ledgers.last
    assert ledger is not None
    assert all(nodes.ledger(n, ledger.ledger_id).end == 4 for n in ledger.nodes)  # type: ignore[union-attr]


async def test_start_append_failures_go_again_in_order_to_a_new_ledger() -> None:
    """Two of three nodes fail the head of three pipelined appends: all three are refused
    by the open ledger, then sent again, in order, to a new ledger on the nodes left; each
    caller is told once, after that."""
    state, nodes = cluster(node_count=5, zones=5)
    writer = _writer(state, nodes)
    await writer.take_over()
    await _append(writer, 0, 1)
    first = writer.ledgers.last
    assert first is not None
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    nodes.gates = {first.nodes[0]: gate, first.nodes[1]: gate}
    outcomes = _Outcomes()
    for offset in (1, 2, 3):
        assert writer.start_append(offset, _frames(offset), offset + 1, outcomes.done(offset))
    await asyncio.sleep(0.01)
    assert outcomes.told == []
    nodes.down |= {first.nodes[0], first.nodes[1]}
    nodes.gates = {}
    gate.set_exception(ConnectionError("node lost"))
    await outcomes.wait(3)
    assert outcomes.told == [(1, None), (2, None), (3, None)]
    assert writer.end_offset == 4
    closed, second = writer.ledgers.ledgers[-2:]
    assert closed.state is LedgerState.CLOSED and closed.end_offset == 1
    assert second.first_offset == 1 and not {first.nodes[0], first.nodes[1]} & set(second.nodes)
    held = nodes.ledger(second.nodes[0], second.ledger_id)
    assert held is not None and [b for b, _, _ in held.entries] == [1, 2, 3]


async def test_start_append_to_a_fenced_ledger_tells_lost_ownership() -> None:
    state, nodes = cluster()
    old = _writer(state, nodes, "old")
    await old.take_over()
    await _append(old, 0, 2)
    state.owners.clear()  # the session expired while the process was stopped...
    new = _writer(state, nodes, "new")
    await new.take_over()  # ...and the new owner fenced the ledger
    outcomes = _Outcomes()
    assert old.start_append(2, _frames(2), 3, outcomes.done(2))
    await outcomes.wait(1)
    assert isinstance(outcomes.told[0][1], LostOwnership)
    assert old.appends_refused == 1
    assert not old.start_append(2, _frames(2), 3, outcomes.done(2))  # stopped for good


async def test_start_append_waits_for_a_lapsed_lease_and_refuses_a_lost_session() -> None:
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    await _append(writer, 0, 1)
    directory: FakeDirectory = writer._directory  # type: ignore[assignment]
    directory.lapsed = True  # the process was stopped past its lease: renewed first
    outcomes = _Outcomes()
    assert writer.start_append(1, _frames(1), 2, outcomes.done(1))
    await outcomes.wait(1)
    assert outcomes.told == [(1, None)] and not directory.lapsed
    directory.lapsed = True
    renewed = directory.renew_lease

    async def renew() -> bool:  # ZooKeeper answers in a new session: the old one is lost
        directory.alive = False
        return await renewed()

    directory.renew_lease = renew  # type: ignore[method-assign]
    assert writer.start_append(2, _frames(2), 3, outcomes.done(2))
    await outcomes.wait(2)
    assert isinstance(outcomes.told[1][1], LostOwnership)  # durable, but not acknowledged
    assert writer.appends_refused == 1


async def test_a_replicated_log_sends_its_groups_through_start_append(tmp_path: Path) -> None:
    """Through SourceLog: once the ledger is open a group goes out from the writer task
    itself (start_append), not in a task per group, and is acknowledged when it lands."""
    state, nodes = cluster()
    writer = _writer(state, nodes)
    await writer.take_over()
    log = SourceLog.open(tmp_path / "s", remote=writer)
    assert await log.append(b"a", 1, 1) == 0  # opens the ledger (append, in a task)
    submitted = nodes.submitted
    assert [await log.append(b"b%d" % i, 1, 2) for i in range(3)] == [1, 2, 3]
    assert nodes.submitted == submitted + 3 * 3
    assert log.committed_offset == 4
    assert [e.payload for e in log.read(1, max_entries=3)] == [b"b0", b"b1", b"b2"]
    await log.close()
