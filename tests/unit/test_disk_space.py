"""A full disk (storage/disk_space.py): what counts as one, the episode (one line when it starts,
one with the count when it ends, nothing per failed write), the error a client gets, and the
writers that report it: topic log, ack journal, metadata store, delay index. Every writer keeps
what failed and succeeds by itself once space is back."""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pubsubd.acks import journal as journal_mod
from pubsubd.core import pb
from pubsubd.core.errors import DiskFull, ResourceExhausted
from pubsubd.core.records import CursorState
from pubsubd.data.publish import delays as delays_mod
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.observability import metrics
from pubsubd.storage import disk_space, replication
from pubsubd.storage.delay_index import DelayIndex
from pubsubd.storage.disk_space import DiskSpace, disk_full_reason
from pubsubd.storage.errors import ReplicationFailed, StorageError
from pubsubd.storage.log import FsyncPolicy
from pubsubd.storage.metadata import SqliteMetadataStore, TopicRecord

pytestmark = pytest.mark.unit

ENOSPC = OSError(errno.ENOSPC, "No space left on device")
MB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Free:
    def __init__(self, free: int | None = 0) -> None:
        self.free = free

    def __call__(self, _directory: Path) -> int | None:
        return self.free


def _disk(tmp_path: Path, free: Free, clock: Clock) -> DiskSpace:
    return DiskSpace(tmp_path, clock=clock, free=free)


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == disk_space.__name__]


# --- what a full disk is ---------------------------------------------------------------------


def test_full_disk_errors_are_recognised_through_their_causes() -> None:
    assert disk_full_reason(ENOSPC) == "No space left on device"
    assert disk_full_reason(OSError(errno.EDQUOT, "quota")) == "Disk quota exceeded"
    wrapped = StorageError("append failed: append failed")
    try:
        try:
            raise ENOSPC
        except OSError as e:
            raise ReplicationFailed("append failed") from e
    except ReplicationFailed as e:
        wrapped.__cause__ = e
    assert disk_full_reason(wrapped) == "No space left on device"
    assert disk_full_reason(sqlite3.OperationalError("database or disk is full")) is not None
    # Not a full disk: other I/O errors, other SQLite errors, bugs.
    assert disk_full_reason(OSError(errno.EIO, "I/O error")) is None
    assert disk_full_reason(sqlite3.OperationalError("database is locked")) is None
    assert disk_full_reason(ValueError("no")) is None


def test_sqlite_full_is_recognised_by_its_code(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    db.execute("CREATE TABLE t (b BLOB)")
    db.execute("PRAGMA max_page_count = 4")  # a database that cannot grow: SQLITE_FULL
    with pytest.raises(sqlite3.OperationalError) as full:
        db.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    assert full.value.sqlite_errorcode == 13  # SQLITE_FULL
    assert disk_full_reason(full.value) == "database or disk is full"
    db.close()


def test_a_sqlite_io_error_counts_only_when_no_space_is_left(tmp_path: Path) -> None:
    io_error = sqlite3.OperationalError("disk I/O error")
    io_error.sqlite_errorcode = 10 | (3 << 8)  # type: ignore[attr-defined]  # IOERR_WRITE
    free = Free(100)
    disk = _disk(tmp_path, free, Clock())
    assert disk.reason(io_error) is not None
    free.free = 10 * MB
    assert disk.reason(io_error) is None


# --- episodes ---------------------------------------------------------------------------------


def test_an_episode_logs_once_counts_every_failure_and_ends_when_space_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    free, clock = Free(512), Clock()
    disk = _disk(tmp_path, free, clock)
    counted = metrics.DISK_FULL_WRITES.labels(disk_space.LOG)._value.get()
    errors = [disk.failed(ENOSPC, disk_space.LOG) for _ in range(1000)]
    assert disk.full and metrics.DISK_FULL._value.get() == 1
    assert metrics.DISK_FULL_WRITES.labels(disk_space.LOG)._value.get() == counted + 1000
    # The client's error: RESOURCE_EXHAUSTED naming the data directory and the free space.
    error = errors[-1]
    assert isinstance(error, ResourceExhausted) and error.retriable
    assert str(tmp_path) in str(error) and "512 bytes free" in str(error)
    assert "No space left on device" in str(error) and "topic log" in str(error)
    lines = _lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR and not lines[0].exc_info
    assert str(tmp_path) in lines[0].getMessage()
    # A write succeeds while almost nothing is free: still the same episode.
    disk.succeeded()
    assert disk.full and len(_lines(caplog)) == 1
    problem = disk.problem()
    assert problem is not None and "disk full" in problem and str(tmp_path) in problem
    assert disk.status()["full"] and disk.status()["episode"]["failed_writes"] == 1000
    # Space is back: the next success ends it, with one line and the count.
    free.free = 10 * MB
    clock.now += 3.5
    disk.succeeded()
    assert not disk.full and metrics.DISK_FULL._value.get() == 0
    lines = _lines(caplog)
    assert len(lines) == 2 and "after 1000 failed writes in 3.5 s" in lines[1].getMessage()
    assert disk.problem() is None and not disk.status()["full"]
    # The next failure is a new episode, logged again.
    disk.failed(ENOSPC, disk_space.ACKS)
    assert disk.full and disk.episodes == 2 and len(_lines(caplog)) == 3
    assert disk.status()["failed_writes"] == 1001


def test_the_periodic_check_ends_an_episode_only_after_a_quiet_while(tmp_path: Path) -> None:
    free, clock = Free(0), Clock()
    disk = _disk(tmp_path, free, clock)
    disk.failed(OSError(errno.EDQUOT, "quota"), disk_space.METADATA)
    free.free = 10 * MB  # a quota: the file system shows space while writes still fail
    assert disk.check()
    clock.now += disk_space.CHECK_HOLD_S
    assert not disk.check()
    assert not disk.full


def test_guard_turns_a_full_disk_into_disk_full_and_passes_other_errors(tmp_path: Path) -> None:
    free, clock = Free(0), Clock()
    disk = _disk(tmp_path, free, clock)
    with pytest.raises(DiskFull) as full, disk.guard(disk_space.METADATA):
        raise sqlite3.OperationalError("database or disk is full")
    assert "metadata store" in str(full.value) and isinstance(full.value.__cause__, sqlite3.Error)
    with pytest.raises(sqlite3.OperationalError), disk.guard(disk_space.METADATA):
        raise sqlite3.OperationalError("database is locked")
    assert disk.total_failures == 1
    free.free = 10 * MB
    with disk.guard(disk_space.METADATA):
        pass
    assert not disk.full


# --- the writers ------------------------------------------------------------------------------


def test_metadata_store_answers_disk_full_and_works_again(tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path)
    store.put_topic(TopicRecord("projects/p/topics/first", "u1", b""))
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # the file cannot grow
    with pytest.raises(DiskFull) as full:
        store.put_topic(TopicRecord("projects/p/topics/big", "u2", b"x" * 200_000))
    assert str(tmp_path) in str(full.value) and "metadata store" in str(full.value)
    assert not store._db.in_transaction and store.disk.full
    store._db.execute("PRAGMA max_page_count = 1000000")  # space is back
    store.put_topic(TopicRecord("projects/p/topics/big", "u2", b"x" * 200_000))
    assert {t.name for t in store.load_topics()} == {
        "projects/p/topics/first",
        "projects/p/topics/big",
    }
    store.close()


def test_delay_index_answers_disk_full_rolls_back_and_works_again(tmp_path: Path) -> None:
    index = DelayIndex.open(tmp_path)
    index.add("t", [(1, 0, 1)], {0: 1})
    pages = index._db.execute("PRAGMA page_count").fetchone()[0]
    index._db.execute(f"PRAGMA max_page_count = {pages + 1}")
    rows = [(at, at, 1) for at in range(2, 20_000)]
    with pytest.raises(DiskFull):
        index.add("t", rows, {0: 20_000})
    assert not index._db.in_transaction  # a later BEGIN must not fail
    assert index.count("t") == 1 and index.progress("t") == {0: 1}  # all or nothing
    index._db.execute("PRAGMA max_page_count = 1000000")
    index.add("t", rows, {0: 20_000})
    assert index.count("t") == 20_000 - 1
    index.close()


def _request(n: int, **attrs: str) -> bytes:
    msgs = [pb.PubsubMessage(data=str(i).encode(), attributes=attrs) for i in range(n)]
    return pb.PublishRequest(messages=msgs).SerializeToString()


class _Enospc:
    """``write_all`` of a module failing with ENOSPC while ``on``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.on = True

    def __call__(self, fd: int, data: bytes) -> None:
        if self.on:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.real(fd, data)


async def test_publish_answers_disk_full_without_a_traceback_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    try:
        assert await publishing.publish("t", _request(1), 1) == (0, 0)
        enospc = _Enospc(replication.write_all)
        monkeypatch.setattr(replication, "write_all", enospc)
        for _ in range(50):
            with pytest.raises(DiskFull) as full:
                await publishing.publish("t", _request(1), 1)
        assert str(tmp_path) in str(full.value) and "bytes free" in str(full.value)
        assert publishing.disk.full and publishing.disk.failures == 50
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and errors[0].name == disk_space.__name__
        assert not any(r.exc_info for r in caplog.records)
        enospc.on = False  # space is back (tmp_path has more than the margin free)
        assert await publishing.publish("t", _request(1), 1) == (0, 1)  # the offset is reused
        assert not publishing.disk.full
        assert "after 50 failed writes" in caplog.records[-1].getMessage()
        stored = publishing.read("t", 0, 0, 10, 1 << 20)
        assert [e.base_offset for e in stored] == [0, 1]
    finally:
        await publishing.close()


async def test_ack_journal_keeps_acks_while_full_and_makes_them_durable_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    try:
        await publishing.publish("t", _request(3), 3)
        assert publishing.attach("t", "s", {0: 0}) == {0: CursorState(0)}
        journal = publishing.topics["t"].journals["s"]  # white-box: the publishing side's
        enospc = _Enospc(journal_mod.write_all)
        monkeypatch.setattr(journal_mod, "write_all", enospc)
        publishing.record_acks("t", "s", 0, [(0, 2)])
        await publishing._flush_acks()  # the background flush: fails, counted, kept dirty
        assert publishing.disk.full and journal in publishing._dirty_journals
        publishing.record_acks("t", "s", 0, [(2, 3)])
        with pytest.raises(DiskFull) as full:  # an exactly-once ack: refused, not INTERNAL
            await publishing.flush_acks("t", "s")
        assert "ack journal" in str(full.value) and str(tmp_path) in str(full.value)
        assert journal in publishing._dirty_journals
        enospc.on = False
        await publishing._flush_acks()  # heals by itself
        assert not publishing.disk.full and not publishing._dirty_journals
    finally:
        await publishing.close()
    reopened = journal_mod.AckJournal.open(tmp_path / "subscriptions" / "s", initial={0: 0})
    assert reopened.cursors[0].mark_delete == 3  # every ack taken while full is durable


async def test_delayed_messages_not_indexed_for_lack_of_space_are_indexed_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        tracker = publishing.delay_tracker("t")
        got: list[int] = []
        tracker.add_listener(1, delays_mod.DueListener(got.extend, lambda: 0))
        real_add = DelayIndex.add
        full = True

        def add(self: DelayIndex, *args: Any) -> None:
            if full:
                raise DiskFull(str(tmp_path), 0, disk_space.DELAYS, "No space left on device")
            real_add(self, *args)

        monkeypatch.setattr(DelayIndex, "add", add)
        await publishing.publish("t", _request(2, **{"pubsubd.deliver_after": "0.3"}), 2)
        assert tracker.pending_rows() == 0  # not indexed: the dispatchers skip them meanwhile
        full = False
        tracker.flush_progress()  # what the trim loop calls every 2 s
        assert tracker.pending_rows() == 2
        for _ in range(250):  # due in 0.3 s
            if len(got) == 2:
                break
            await asyncio.sleep(0.02)
        assert sorted(got) == [0, 1]
    finally:
        await publishing.close()
