"""A copy of a source owned elsewhere catching up from the storage nodes.

``plan_catch_up`` (storage/ledgers/catch_up.py, pure): which offsets come from the nodes' closed
ledgers and where the owner's ``Tail`` takes over. ``LedgerReader`` (storage/ledgers/reader.py)
and ``RemoteSources``'s fill over in-memory nodes written by the real ledger writer
(tests/support/ledger_fakes.py): a node down or sending damaged frames is passed over, none
left stops the fill with the copy still a prefix, and the counts say where entries came from.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsubd.core.records import Entry
from pubsubd.data.subscribe.remote_sources import RemoteSources
from pubsubd.storage.errors import ReplicationFailed
from pubsubd.storage.framing import encode_entry
from pubsubd.storage.ledgers.catch_up import LedgerRead, closed_end, plan_catch_up
from pubsubd.storage.ledgers.meta import LedgerList, LedgerMeta, LedgerState, StoragePolicy
from pubsubd.storage.ledgers.reader import LedgerReader
from pubsubd.storage.ledgers.writer import SourceLedgers
from tests.support.ledger_fakes import DirectoryState, FakeDirectory, FakeNodes, cluster

NODES = ("n0", "n1", "n2")


def _closed(ledger_id: int, first: int, end: int) -> LedgerMeta:
    return LedgerMeta(ledger_id, first, NODES, 2, LedgerState.CLOSED, end)


def _list(*ledgers: LedgerMeta, start: int = 0) -> LedgerList:
    return LedgerList(ledgers=ledgers, version=3, start_offset=start)


# Closed [100, 200), [200, 350), [350, 500); the open ledger from 500.
LEDGERS = _list(
    _closed(1, 100, 200),
    _closed(2, 200, 350),
    _closed(3, 350, 500),
    LedgerMeta(4, 500, NODES, 2),
    start=100,
)


def _spans(reads: tuple[LedgerRead, ...]) -> list[tuple[int, int, int]]:
    return [(r.ledger.ledger_id, r.start, r.end) for r in reads]


def test_a_new_copy_starts_at_the_first_ledger_and_reads_every_closed_one() -> None:
    plan = plan_catch_up(0, False, LEDGERS)
    assert plan is not None
    assert plan.restart_at == 100
    assert _spans(plan.reads) == [(1, 100, 200), (2, 200, 350), (3, 350, 500)]
    assert plan.end == 500 and plan.messages == 400  # the owner tails from 500 only


def test_a_copy_behind_goes_on_from_its_end_inside_a_ledger() -> None:
    plan = plan_catch_up(260, True, LEDGERS)
    assert plan is not None and plan.restart_at is None
    assert _spans(plan.reads) == [(2, 260, 350), (3, 350, 500)]
    assert plan.end == 500


def test_a_copy_the_owner_trimmed_past_is_started_anew() -> None:
    plan = plan_catch_up(40, True, LEDGERS)
    assert plan is not None and plan.restart_at == 100
    assert _spans(plan.reads)[0] == (1, 100, 200)


@pytest.mark.parametrize("copy_end", [500, 510, 700])
def test_a_copy_at_or_past_the_closed_end_tails_the_owner(copy_end: int) -> None:
    assert plan_catch_up(copy_end, True, LEDGERS) is None


def test_a_small_gap_is_left_to_the_owner() -> None:
    assert plan_catch_up(450, True, LEDGERS, min_messages=100) is None
    plan = plan_catch_up(400, True, LEDGERS, min_messages=100)
    assert plan is not None and _spans(plan.reads) == [(3, 400, 500)]


def test_only_closed_ledgers_count() -> None:
    open_only = _list(LedgerMeta(1, 0, NODES, 2))
    assert closed_end(open_only) is None and plan_catch_up(0, False, open_only) is None
    recovering = _list(_closed(1, 0, 50), LedgerMeta(2, 50, NODES, 2, LedgerState.IN_RECOVERY))
    plan = plan_catch_up(0, True, recovering)
    assert plan is not None and plan.end == 50 and _spans(plan.reads) == [(1, 0, 50)]
    assert plan_catch_up(0, False, LedgerList()) is None
    # An empty closed ledger (closed at its start) is skipped.
    empty = _list(_closed(1, 0, 10), _closed(2, 10, 10), _closed(3, 10, 30))
    plan = plan_catch_up(0, True, empty)
    assert plan is not None and _spans(plan.reads) == [(1, 0, 10), (3, 10, 30)]


# --- over in-memory nodes -----------------------------------------------------------------


async def _written(state: DirectoryState, nodes: FakeNodes, messages: int) -> SourceLedgers:
    """A source written by the real writer, rolling every few entries (small ledgers)."""
    writer = SourceLedgers(
        "t1", 0, FakeDirectory(state, "owner"), nodes, StoragePolicy(), ledger_bytes=200
    )
    await writer.take_over()
    for offset in range(0, messages, 2):
        frames = b"".join(
            encode_entry(Entry(o, 1, 1000 + o, b"m%d" % o)) for o in (offset, offset + 1)
        )
        await writer.append(offset, frames, offset + 2)
    return writer


def _remote(tmp_path: Path, state: DirectoryState, nodes: FakeNodes) -> RemoteSources:
    reader = LedgerReader(FakeDirectory(state, "reader"), nodes)
    remote = RemoteSources(
        tmp_path / "copies", lambda _uid: [], ledgers=reader, fill_min_messages=1
    )
    remote.copy.open_topic("t1")
    return remote


def _payloads(remote: RemoteSources) -> list[bytes]:
    end = remote.end_offsets("t1")[0]
    return [e.payload for e in remote.read("t1", 0, remote.start_offset("t1", 0), end, 1 << 20)]


async def test_a_copy_fills_the_closed_ledgers_from_the_nodes(tmp_path: Path) -> None:
    state, nodes = cluster()
    writer = await _written(state, nodes, 60)
    listed = writer.ledgers
    assert len(listed.ledgers) > 3 and listed.ledgers[-1].state is LedgerState.OPEN
    end = closed_end(listed)
    assert end is not None and 0 < end < 60
    remote = _remote(tmp_path, state, nodes)
    try:
        await remote._fill_from_nodes("t1", 0)  # what each Tail does first
        assert remote.end_offsets("t1") == {0: end}
        assert _payloads(remote) == [b"m%d" % o for o in range(end)]
        status = remote.status()
        from_nodes = status["filled_from_nodes"]
        assert isinstance(from_nodes, dict)
        assert from_nodes["entries"] == from_nodes["messages"] == end and from_nodes["bytes"] > 0
        assert status["filled_from_owner"] == {"entries": 0, "messages": 0, "bytes": 0}
    finally:
        await remote.close()
        await writer.close()


async def test_a_node_down_or_damaged_is_passed_over(tmp_path: Path) -> None:
    state, nodes = cluster()
    writer = await _written(state, nodes, 40)
    end = closed_end(writer.ledgers)
    assert end is not None
    first = writer.ledgers.ledgers[0]
    # The reader's first choice for the first ledger is down, its second one's copy damaged:
    # the third answers.
    shift = first.ledger_id % len(first.nodes)
    order = first.nodes[shift:] + first.nodes[:shift]
    nodes.down.add(order[0])
    held = nodes.ledger(order[1], first.ledger_id)
    assert held is not None
    base, nxt, frame = held.entries[0]
    held.entries[0] = (base, nxt, frame[:-1] + bytes([frame[-1] ^ 0xFF]))
    remote = _remote(tmp_path, state, nodes)
    try:
        await remote._fill_from_nodes("t1", 0)
        assert remote.end_offsets("t1") == {0: end}
        assert _payloads(remote) == [b"m%d" % o for o in range(end)]
        assert remote.ledgers is not None and remote.ledgers.node_failures >= 2
    finally:
        await remote.close()
        await writer.close()


async def test_no_node_left_stops_the_fill_with_a_prefix(tmp_path: Path) -> None:
    state, nodes = cluster()
    writer = await _written(state, nodes, 40)
    second = writer.ledgers.ledgers[1]
    for node in second.nodes:  # the second ledger unreadable everywhere
        nodes.held.pop((node, second.ledger_id), None)
    remote = _remote(tmp_path, state, nodes)
    try:
        await remote._fill_from_nodes("t1", 0)
        # What the first ledger holds, in order; the owner's Tail goes on from there.
        assert remote.end_offsets("t1") == {0: second.first_offset}
        assert _payloads(remote) == [b"m%d" % o for o in range(second.first_offset)]
        assert remote.status()["fills_failed"] == 1
        reader = remote.ledgers
        assert reader is not None
        with pytest.raises(ReplicationFailed):
            await reader.read(LedgerRead(second, second.first_offset, 40), second.first_offset)
    finally:
        await remote.close()
        await writer.close()


async def test_reads_are_bounded_in_bytes_per_second() -> None:
    state, nodes = cluster()
    writer = await _written(state, nodes, 60)
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    # The clock stands still: each read waits until every byte past the first second's worth
    # would have been allowed.
    reader = LedgerReader(
        FakeDirectory(state, "reader"), nodes, rate_bytes=100, clock=lambda: 0.0, sleep=sleep
    )
    try:
        sizes = []
        for ledger in writer.ledgers.ledgers[:3]:
            assert ledger.end_offset is not None
            read = LedgerRead(ledger, ledger.first_offset, ledger.end_offset)
            _, nbytes = await reader.read(read, ledger.first_offset)
            sizes.append(nbytes)
        assert sum(sizes) > 100
        assert len(slept) == 3 and slept == sorted(slept)
        assert abs(slept[-1] - (sum(sizes) - 100) / 100) < 0.01
    finally:
        await writer.close()
