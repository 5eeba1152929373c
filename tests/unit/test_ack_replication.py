"""A subscription's ack journal on cursor ledgers (acks/replicated.py): every flush and
compaction reaches the ledgers first, and a new machine rebuilds the same cursors from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsubd.acks.journal import AckJournal
from pubsubd.acks.replicated import JournalLedgers, cursor_source, restore_journal
from pubsubd.storage.errors import StorageError
from pubsubd.storage.ledgers.meta import StoragePolicy
from pubsubd.storage.ledgers.writer import SourceLedgers
from tests.support.ledger_fakes import DirectoryState, FakeDirectory, FakeNodes, cluster


def _ledgers(state: DirectoryState, nodes: FakeNodes, session: str) -> SourceLedgers:
    return SourceLedgers(
        cursor_source("sub1"), 0, FakeDirectory(state, session), nodes, StoragePolicy()
    )


def _ack(journal: AckJournal, start: int, end: int) -> None:
    journal.record(0, journal.cursor(0, 0).ack_range(start, end))


def _states(journal: AckJournal) -> dict[int, object]:
    return {s: c.snapshot() for s, c in journal.cursors.items()}


async def test_a_new_machine_gets_the_cursors_flushed_on_the_old_one(tmp_path: Path) -> None:
    state, nodes = cluster()
    mirror = JournalLedgers(_ledgers(state, nodes, "old"))
    journal = AckJournal.open(tmp_path / "a", {0: 0}, mirror=mirror, compact_bytes=200)
    for i in range(0, 400, 4):  # acks with holes, many flushes, compactions on the way
        _ack(journal, i, i + 3)
        await journal.flush()
    _ack(journal, 1000, 1001)
    await journal.flush()
    expected = _states(journal)
    await journal.close()
    # Compactions wrote snapshots and let the ledgers before them go.
    listed = await FakeDirectory(state, "r").read(cursor_source("sub1"), 0)
    assert len(listed.ledgers) <= 2
    new = _ledgers(state, nodes, "new")
    await new.take_over()
    assert await restore_journal(tmp_path / "b", new)
    restored = AckJournal.open(tmp_path / "b", {0: 0})
    assert _states(restored) == expected
    await restored.close()


async def test_a_flush_the_storage_nodes_refuse_keeps_its_records(tmp_path: Path) -> None:
    state, nodes = cluster()
    journal = AckJournal.open(
        tmp_path / "a", {0: 0}, mirror=JournalLedgers(_ledgers(state, nodes, "p"))
    )
    _ack(journal, 0, 5)
    await journal.flush()
    nodes.down |= {"n0", "n1", "n2"}
    _ack(journal, 10, 20)
    with pytest.raises(StorageError):
        await journal.flush()
    nodes.down.clear()
    await journal.flush()  # the records of the refused flush go now
    expected = _states(journal)
    await journal.close()
    new = _ledgers(state, nodes, "q")
    await new.take_over()
    assert await restore_journal(tmp_path / "b", new)
    assert _states(AckJournal.open(tmp_path / "b", {0: 0})) == expected


async def test_nothing_to_restore_leaves_the_directory_alone(tmp_path: Path) -> None:
    state, nodes = cluster()
    ledgers = _ledgers(state, nodes, "p")
    await ledgers.take_over()
    assert not await restore_journal(tmp_path / "b", ledgers)
    assert not (tmp_path / "b").exists()
