"""Unit tests for pubsubd.acks.journal.AckJournal: durability, recovery, compaction."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from pubsubd.acks import journal as journal_mod
from pubsubd.acks.cursor import CursorState
from pubsubd.acks.journal import (
    JOURNAL_FILENAME,
    SNAPSHOT_FILENAME,
    TMP_SUFFIX,
    AckJournal,
    AckJournalCorruptError,
    AckJournalError,
    encode_journal_header,
    encode_snapshot,
)
from tests.support.fds import open_files

pytestmark = pytest.mark.unit


def states(j: AckJournal) -> dict[int, CursorState]:
    return {sid: c.snapshot() for sid, c in j.cursors.items()}


def crash_copy(src: Path, dst: Path) -> Path:
    """What a crash would leave on disk: the files as they are now, journal not closed."""
    shutil.copytree(src, dst)
    return dst


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def ack(j: AckJournal, source_id: int, offsets: list[int], start: int = 0) -> None:
    c = j.cursor(source_id, start)
    j.record(source_id, c.ack(offsets))


async def test_open_creates_empty_state(tmp_path: Path) -> None:
    d = tmp_path / "sub"
    j = AckJournal.open(d)
    assert j.cursors == {}
    await j.close()
    assert not d.exists()  # nothing to write: no files yet
    j2 = AckJournal.open(d)
    assert j2.cursors == {}
    ack(j2, 1, [0])
    await j2.flush()
    assert (d / JOURNAL_FILENAME).exists()
    assert not (d / SNAPSHOT_FILENAME).exists()
    await j2.close()
    j3 = AckJournal.open(d)
    assert j3.cursors[1].mark_delete == 1
    await j3.close()


async def test_new_journal_defers_files_until_a_real_record(tmp_path: Path) -> None:
    d = tmp_path / "subscriptions" / "sub"
    j = AckJournal.open(d, initial={0: 500})
    await j.flush()
    await j.close()
    assert not d.exists()  # only the initial cursor, which the caller passes again
    j = AckJournal.open(d, initial={0: 500})
    assert j.cursors[0].mark_delete == 500
    j.record(0, j.cursors[0].ack([500, 502]))
    await j.flush()
    assert names(d) == [JOURNAL_FILENAME]
    # A crash now: the journal alone (no initial) restores the cursor and its acks.
    j2 = AckJournal.open(crash_copy(d, tmp_path / "copy"))
    assert states(j2) == {0: CursorState(501, ((502, 503),))}
    await j2.close()
    await j.close()
    j.delete()
    assert not d.exists()


async def test_flush_holds_no_descriptor(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    before = open_files(tmp_path)
    ack(j, 1, [0, 1])
    await j.flush()
    assert open_files(tmp_path) == before
    await j.close()


async def test_flush_and_reopen_restores_exactly(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, [45], start=0)
    ack(j, 1, [3, 1, 0, 2, 50, 51])
    ack(j, 7, [1000, 1002], start=990)
    j.cursor(9, 12345)  # created, never acked
    await j.flush()
    expected = states(j)
    assert expected[1] == CursorState(4, ((45, 46), (50, 52)))
    await j.close()

    j2 = AckJournal.open(tmp_path)
    assert states(j2) == expected
    await j2.close()


async def test_unflushed_records_are_lost_but_flushed_survive(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path / "a")
    ack(j, 1, [0, 1, 2])
    await j.flush()
    durable = states(j)
    ack(j, 1, [3, 4, 10])
    assert j.buffered_bytes > 0
    crashed = crash_copy(tmp_path / "a", tmp_path / "b")
    await j.close()

    j2 = AckJournal.open(crashed)
    assert states(j2) == durable
    await j2.close()


async def test_reset_is_journaled(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, list(range(100)))
    j.reset(1, CursorState(20, ((30, 40),)))
    assert j.cursors[1].mark_delete == 20
    j.reset(2, CursorState(5))  # creates the cursor
    ack(j, 1, [20, 41])
    await j.close()
    j2 = AckJournal.open(tmp_path)
    assert states(j2) == {1: CursorState(21, ((30, 40), (41, 42))), 2: CursorState(5)}
    await j2.close()


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 20])
async def test_torn_tail_record_is_ignored_and_truncated(tmp_path: Path, cut: int) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, [0, 5])
    await j.flush()
    durable = states(j)
    size_before = (tmp_path / JOURNAL_FILENAME).stat().st_size
    ack(j, 1, [7, 9, 11])
    await j.close()
    path = tmp_path / JOURNAL_FILENAME
    data = path.read_bytes()
    assert len(data) > size_before + cut
    path.write_bytes(data[: len(data) - cut])

    j2 = AckJournal.open(tmp_path)
    assert states(j2) == durable
    assert path.stat().st_size == size_before  # torn bytes removed
    # New appends after recovery must be readable on the next open.
    ack(j2, 1, [1])
    await j2.close()
    j3 = AckJournal.open(tmp_path)
    assert states(j3) == {1: CursorState(2, ((5, 6),))}
    await j3.close()


async def test_corrupt_crc_in_last_record_is_ignored(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, [0])
    await j.flush()
    durable = states(j)
    ack(j, 1, [1, 2])
    await j.close()
    path = tmp_path / JOURNAL_FILENAME
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    j2 = AckJournal.open(tmp_path)
    assert states(j2) == durable
    await j2.close()


async def test_garbage_after_valid_records_is_ignored(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, [0, 1, 5])
    await j.close()
    with (tmp_path / JOURNAL_FILENAME).open("ab") as f:
        f.write(b"\xff\xff\xff\x7f" + os.urandom(40))
    j2 = AckJournal.open(tmp_path)
    assert states(j2) == {1: CursorState(2, ((5, 6),))}
    await j2.close()


async def test_compaction_preserves_state_and_shrinks_journal(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    for i in range(0, 400, 2):
        ack(j, 1, [i])
    ack(j, 2, [3], start=3)
    await j.flush()
    expected = states(j)
    await j.compact()
    assert states(j) == expected
    assert (tmp_path / SNAPSHOT_FILENAME).exists()
    assert (tmp_path / JOURNAL_FILENAME).stat().st_size == journal_mod.JOURNAL_HEADER_SIZE
    ack(j, 1, [1])  # goes to the new journal
    expected = states(j)
    await j.close()
    assert names(tmp_path) == [JOURNAL_FILENAME, SNAPSHOT_FILENAME]
    j2 = AckJournal.open(tmp_path)
    assert states(j2) == expected
    await j2.close()


async def test_automatic_compaction(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path, compact_bytes=2048)
    for i in range(0, 2000, 2):
        ack(j, 1, [i, i + 1 if i % 10 == 0 else i])
        await j.flush(sync=False)
    await j.flush()
    assert (tmp_path / SNAPSHOT_FILENAME).exists()
    assert (tmp_path / JOURNAL_FILENAME).stat().st_size <= 2048 + 64
    expected = states(j)
    await j.close()
    j2 = AckJournal.open(tmp_path, compact_bytes=2048)
    assert states(j2) == expected
    await j2.close()


async def _build_compacted_then_more(d: Path) -> tuple[dict[int, CursorState], int]:
    """State with a snapshot (generation 1) plus journal records; returns (state, generation)."""
    j = AckJournal.open(d)
    ack(j, 1, [0, 1, 5, 6])
    await j.compact()
    ack(j, 1, [2, 9])
    j.reset(2, CursorState(50, ((52, 53),)))
    await j.close()
    j = AckJournal.open(d)
    result = states(j)
    await j.close()
    return result, 1


async def test_crash_with_leftover_temp_files(tmp_path: Path) -> None:
    expected, _ = await _build_compacted_then_more(tmp_path)
    # Crash while writing the next snapshot / journal temp files: partial garbage.
    (tmp_path / (SNAPSHOT_FILENAME + TMP_SUFFIX)).write_bytes(b"PSDACKS1\x00\x01")
    (tmp_path / (JOURNAL_FILENAME + TMP_SUFFIX)).write_bytes(b"PSD")
    j = AckJournal.open(tmp_path)
    assert states(j) == expected
    assert not (tmp_path / (SNAPSHOT_FILENAME + TMP_SUFFIX)).exists()
    assert not (tmp_path / (JOURNAL_FILENAME + TMP_SUFFIX)).exists()
    await j.close()


async def test_crash_after_snapshot_installed_before_journal_switch(tmp_path: Path) -> None:
    expected, generation = await _build_compacted_then_more(tmp_path)
    # Step (a) of compaction done: a newer snapshot holding the full state; journal is old.
    (tmp_path / SNAPSHOT_FILENAME).write_bytes(encode_snapshot(generation + 1, expected))
    (tmp_path / (JOURNAL_FILENAME + TMP_SUFFIX)).write_bytes(encode_journal_header(generation + 1))
    j = AckJournal.open(tmp_path)
    assert states(j) == expected
    # The stale journal was replaced by an empty one of the new generation.
    assert (tmp_path / JOURNAL_FILENAME).stat().st_size == journal_mod.JOURNAL_HEADER_SIZE
    ack(j, 1, [3])
    await j.close()
    j2 = AckJournal.open(tmp_path)
    assert j2.cursors[1].snapshot() == CursorState(4, ((5, 7), (9, 10)))
    await j2.close()


class Crash(Exception):
    """Simulated process death at a chosen file operation."""


class CrashAfter:
    """Counts file operations and raises :class:`Crash` at the n-th one."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ops = 0

    def tick(self) -> None:
        self.ops += 1
        if self.ops == self.n:
            raise Crash


async def test_crash_at_every_compaction_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kill compaction after each file operation; reopening must give the same cursors."""
    src = tmp_path / "src"
    expected, _ = await _build_compacted_then_more(src)
    real_replace = os.replace
    real_fsync_dir = journal_mod.fsync_directory

    # Operations: replace(snapshot), fsync dir, replace(journal), fsync dir.
    for crash_at in range(1, 5):
        d = tmp_path / f"run{crash_at}"
        shutil.copytree(src, d)
        j = AckJournal.open(d)
        crash = CrashAfter(crash_at)

        def replace(
            a: str | os.PathLike[str], b: str | os.PathLike[str], crash: CrashAfter = crash
        ) -> None:
            crash.tick()
            real_replace(a, b)

        def fsync_dir(p: Path, crash: CrashAfter = crash) -> None:
            real_fsync_dir(p)
            crash.tick()

        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(journal_mod, "fsync_directory", fsync_dir)
        with pytest.raises(Crash):
            await j.compact()
        monkeypatch.undo()
        j2 = AckJournal.open(d)  # as after a crash at that point
        assert states(j2) == expected, crash_at
        await j2.close()
        await j.flush()  # the survivor heals by compacting again
        j3 = AckJournal.open(d)
        assert states(j3) == expected, crash_at
        await j3.close()
        await j.close()


async def test_initial_starts(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path, initial={1: 100, 2: 0})
    assert j.cursors[1].mark_delete == 100
    assert j.cursors[2].mark_delete == 0
    ack(j, 1, [100, 101])
    await j.close()
    # initial only applies to sources without state.
    j2 = AckJournal.open(tmp_path, initial={1: 5, 3: 7})
    assert {s: c.mark_delete for s, c in j2.cursors.items()} == {1: 102, 2: 0, 3: 7}
    await j2.close()
    j3 = AckJournal.open(tmp_path)
    assert j3.cursors[3].mark_delete == 7
    await j3.close()


async def test_cursor_creation_is_durable_before_acks(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    c = j.cursor(4, 500)
    assert j.cursor(4, 0) is c  # default_start ignored when the cursor exists
    j.record(4, c.ack([502]))
    await j.close()
    j2 = AckJournal.open(tmp_path)  # no initial: start must come from the journal
    assert j2.cursors[4].snapshot() == CursorState(500, ((502, 503),))
    await j2.close()


async def test_record_unknown_source_raises(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    with pytest.raises(KeyError):
        j.record(1, [(0, 1)])
    j.record(1, [])  # nothing to journal: fine
    await j.close()


async def test_delete(tmp_path: Path) -> None:
    d = tmp_path / "sub"
    j = AckJournal.open(d)
    ack(j, 1, [0, 4])
    await j.compact()
    ack(j, 1, [1])
    await j.flush()
    j.delete()
    assert not d.exists()
    with pytest.raises(AckJournalError):
        j.cursor(2, 0)
    await j.close()  # no-op after delete
    j2 = AckJournal.open(d)
    assert j2.cursors == {}
    await j2.close()


async def test_delete_keeps_directory_with_foreign_files(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    (tmp_path / "other").write_text("x")
    await j.close()
    j.delete()
    assert names(tmp_path) == ["other"]


async def test_concurrent_flushes_group_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    real_write_all = journal_mod.write_all

    def counting_write_all(fd: int, data: bytes) -> None:
        writes.append(len(data))
        real_write_all(fd, data)

    monkeypatch.setattr(journal_mod, "write_all", counting_write_all)
    j = AckJournal.open(tmp_path)
    writes.clear()
    for i in range(0, 40, 2):
        ack(j, 1, [i])
    await asyncio.gather(*(j.flush() for _ in range(10)))
    assert len(writes) == 1

    async def acker(k: int) -> None:
        for i in range(50):
            ack(j, 2, [k * 1000 + i * 3])
            await j.flush(sync=i % 2 == 0)

    await asyncio.gather(*(acker(k) for k in range(5)))
    expected = states(j)
    await j.close()
    j2 = AckJournal.open(tmp_path)
    assert states(j2) == expected
    await j2.close()


async def test_write_failure_is_healed_by_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, [0])
    await j.flush()
    durable = states(j)
    real_write_all = journal_mod.write_all

    def torn_write(fd: int, data: bytes) -> None:
        real_write_all(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_mod, "write_all", torn_write)
    ack(j, 1, [1, 2, 3])
    with pytest.raises(OSError):
        await j.flush()
    # A crash now recovers what was durable; the torn record is ignored.
    crashed = AckJournal.open(tmp_path)
    assert states(crashed) == durable
    await crashed.close()
    # The disk still fails: the heal fails too and is retried later.
    monkeypatch.setattr(journal_mod, "install_file", _failing_install)
    ack(j, 1, [4])
    with pytest.raises(OSError):
        await j.flush()
    monkeypatch.undo()
    ack(j, 1, [5])
    await j.flush()  # heals: snapshot of every ack, including those whose write failed
    ack(j, 1, [6])
    await j.flush()  # and the journal works again
    expected = states(j)
    await j.close()
    j2 = AckJournal.open(tmp_path)
    assert states(j2) == expected
    assert expected != durable
    await j2.close()


def _failing_install(directory: Path, name: str, data: bytes) -> None:
    raise OSError(5, "Input/output error")


async def test_cancelled_flush_still_completes_io(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, [0, 1, 2])
    task = asyncio.create_task(j.flush())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not j._lock.locked()
    ack(j, 1, [3])
    await j.close()
    j2 = AckJournal.open(tmp_path)
    assert j2.cursors[1].mark_delete == 4
    await j2.close()


async def test_damaged_snapshot_raises(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, [0])
    await j.compact()
    await j.close()
    path = tmp_path / SNAPSHOT_FILENAME
    data = bytearray(path.read_bytes())
    data[20] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(AckJournalCorruptError):
        AckJournal.open(tmp_path)


async def test_journal_newer_than_snapshot_raises(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    await j.close()
    (tmp_path / JOURNAL_FILENAME).write_bytes(encode_journal_header(3))
    with pytest.raises(AckJournalCorruptError):
        AckJournal.open(tmp_path)


async def test_torn_journal_header_starts_empty(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    ack(j, 1, [0])
    await j.compact()
    await j.close()
    (tmp_path / JOURNAL_FILENAME).write_bytes(b"PSDA")
    j2 = AckJournal.open(tmp_path)
    assert states(j2) == {1: CursorState(1)}
    await j2.close()


async def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    # After a crash some filesystems expose allocated-but-unwritten blocks as zeros.
    j = AckJournal.open(tmp_path)
    ack(j, 1, [0, 1, 7])
    await j.close()
    with (tmp_path / JOURNAL_FILENAME).open("ab") as f:
        f.write(bytes(4096))
    j2 = AckJournal.open(tmp_path)
    assert states(j2) == {1: CursorState(2, ((7, 8),))}
    await j2.close()


async def test_large_journal_is_compacted_on_open(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    for i in range(0, 600, 2):
        ack(j, 1, [i])
    await j.close()
    expected = states(j)
    j2 = AckJournal.open(tmp_path, compact_bytes=1024)
    assert states(j2) == expected
    assert (tmp_path / JOURNAL_FILENAME).stat().st_size == journal_mod.JOURNAL_HEADER_SIZE
    await j2.close()
    j3 = AckJournal.open(tmp_path)
    assert states(j3) == expected
    await j3.close()


async def test_after_close_flush_is_noop_and_record_raises(tmp_path: Path) -> None:
    j = AckJournal.open(tmp_path)
    c = j.cursor(1, 0)
    await j.close()
    await j.flush()  # e.g. a periodic flusher racing with detach
    with pytest.raises(AckJournalError):
        j.record(1, c.ack([0]))
    with pytest.raises(AckJournalError):
        await j.compact()
    assert issubclass(AckJournalError, OSError)
