"""The ledger writer and the local copy (storage/ledgers/writer.py, materialize.py) over
in-memory storage nodes and directory with the real ones' rules (tests/support/ledger_fakes)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pubsubd.core.records import Entry
from pubsubd.storage.errors import DamagedEntries, LostOwnership, ReplicationFailed, StorageError
from pubsubd.storage.framing import encode_entry
from pubsubd.storage.ledgers.materialize import materialize
from pubsubd.storage.ledgers.meta import LedgerState, StoragePolicy
from pubsubd.storage.ledgers.writer import SourceLedgers
from pubsubd.storage.log import FsyncPolicy, SourceLog
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


async def test_a_damaged_range_of_the_local_copy_is_re_read_from_the_nodes(
    tmp_path: Path,
) -> None:
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
    log = SourceLog.open(tmp_path / "s", segment_bytes=400, remote=writer)
    with pytest.raises(DamagedEntries):
        log.read(1)
    assert len(log.damaged_ranges()) == 1
    assert await log.restore_damage() == 1
    assert len(log.recheck_damage()) == 1 and not log.damaged_ranges()
    assert [e.payload for e in log.read(0, max_entries=40)] == [
        b"message %02d" % i for i in range(40)
    ]
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
