"""The storage node's ledger store (storagenode/ledger_store.py) on temporary directories: the
append rules (fence, gap, overlap, retry, CRC), majority writes over M disks with failing disks,
start-up recovery (torn tails, lagging and diverging copies), reads, fences, deletes, digests,
idle files."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pubsubd.core.records import Entry
from pubsubd.storage.framing import decode_frames, encode_entry
from pubsubd.storagenode.errors import (
    AppendGap,
    BadFrames,
    BadRead,
    DisksFull,
    FencedAppend,
    OverlapMismatch,
    TooFewDisks,
    UnknownLedger,
)
from pubsubd.storagenode.ledger_store import Disk, LedgerFile, LedgerStore

pytestmark = pytest.mark.unit


def frame(offset: int, payload: bytes | None = None, count: int = 1) -> bytes:
    return encode_entry(Entry(offset, count, 1_000 + offset, payload or b"m%06d" % offset))


def frames(start: int, n: int) -> bytes:
    return b"".join(frame(i) for i in range(start, start + n))


def offsets(data: bytes) -> list[int]:
    decoded, end = decode_frames(data)
    assert end == len(data)
    return [entry.base_offset for entry, _, _ in decoded]


def dirs(tmp_path: Path, m: int = 3) -> list[Path]:
    return [tmp_path / f"disk{i}" for i in range(m)]


def ledger_file(disk_dir: Path, ledger_id: int) -> Path:
    return disk_dir / "ledgers" / f"{ledger_id:020d}.ledger"


async def every_disk_holds(store: LedgerStore, ledger_id: int, expected: bytes) -> list[int]:
    """The disks whose copy of the ledger differs from ``expected`` once the writes settle:
    an append is answered at a majority of disks, so the last one may still be writing."""
    deadline = time.monotonic() + 10.0
    while True:
        differ = [
            d.index for d in store.disks if ledger_file(d.path, ledger_id).read_bytes() != expected
        ]
        if not differ or time.monotonic() > deadline:
            return differ
        await asyncio.sleep(0.01)


async def opened(paths: list[Path], **kwargs: Any) -> LedgerStore:
    kwargs.setdefault("gap_wait_s", 0.0)
    store = LedgerStore(paths, **kwargs)
    await store.open()
    return store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LedgerStore]:
    s = await opened(dirs(tmp_path))
    yield s
    await s.close()


async def read_all(store: LedgerStore, ledger_id: int, start: int = 0) -> bytes:
    out = b""
    while True:
        data, _ = await store.read(ledger_id, start, max_bytes=64)
        if not data:
            return out
        out += data
        start = offsets(data)[-1] + 1


def fenced_metric() -> float:
    return REGISTRY.get_sample_value("pubsubd_storage_fenced_appends_total") or 0.0


# --- the append rules ------------------------------------------------------------------------


async def test_append_read_and_fence(store: LedgerStore) -> None:
    assert await store.append(7, 1, 100, frames(100, 3), lac=-1) == 103
    assert await store.append(7, 1, 100, frames(103, 2), lac=103) == 105
    data, end = await store.read(7, 100)
    assert offsets(data) == [100, 101, 102, 103, 104] and end == 105
    data, _ = await store.read(7, 103)
    assert offsets(data) == [103, 104]
    fence = await store.fence(7, 5)
    assert (fence.exists, fence.first_offset, fence.end_offset) == (True, 100, 105)
    assert (fence.last_add_confirmed, fence.fenced_epoch) == (103, 5)
    # The fence only rises.
    assert (await store.fence(7, 3)).fenced_epoch == 5
    [summary] = store.summaries()
    assert (summary.ledger_id, summary.first_offset, summary.end_offset) == (7, 100, 105)
    assert summary.healthy_disks == 3 and summary.fenced_epoch == 5
    assert summary.bytes == len(frames(100, 5))
    assert await every_disk_holds(store, 7, frames(100, 5)) == []


async def test_lower_epoch_refused_and_counted(store: LedgerStore) -> None:
    await store.append(1, 4, 0, frames(0, 2))
    await store.fence(1, 9)
    before, metric = store.fenced_appends, fenced_metric()
    with pytest.raises(FencedAppend) as e:
        await store.append(1, 4, 0, frames(2, 1))
    assert e.value.fenced_epoch == 9 and str(e.value).startswith("fenced")
    assert store.fenced_appends == before + 1
    assert fenced_metric() == metric + 1
    # The new owner's epoch passes.
    assert await store.append(1, 9, 0, frames(2, 1)) == 3


async def test_gap_refused_with_the_node_end(store: LedgerStore) -> None:
    with pytest.raises(AppendGap) as e:
        await store.append(2, 1, 10, frames(12, 1))
    assert e.value.node_end == 10  # a new ledger's end is its first offset
    await store.append(2, 1, 10, frames(10, 2))
    with pytest.raises(AppendGap) as e:
        await store.append(2, 1, 10, frames(13, 1))
    assert e.value.node_end == 12
    with pytest.raises(BadFrames):
        await store.append(3, 1, 10, frames(9, 2))  # before the ledger's first offset


async def test_identical_retry_accepted_and_only_the_tail_written(store: LedgerStore) -> None:
    await store.append(3, 1, 0, frames(0, 4))
    size = ledger_file(store.disks[0].path, 3).stat().st_size
    assert await store.append(3, 1, 0, frames(0, 4)) == 4  # the same append again
    assert await store.append(3, 1, 0, frames(2, 2)) == 4  # a suffix of it
    assert ledger_file(store.disks[0].path, 3).stat().st_size == size
    assert await store.append(3, 1, 0, frames(2, 5)) == 7  # overlap plus a new tail
    assert await every_disk_holds(store, 3, frames(0, 7)) == []


async def test_differing_overlap_refused(store: LedgerStore) -> None:
    await store.append(4, 1, 0, frames(0, 3))
    with pytest.raises(OverlapMismatch) as e:
        await store.append(4, 1, 0, frame(1, b"other bytes") + frame(2) + frame(3))
    assert e.value.node_end == 3
    with pytest.raises(OverlapMismatch):  # starts inside a stored batch entry
        await store.append(5, 1, 0, frame(0, count=3))
        await store.append(5, 1, 0, frame(1))
    with pytest.raises(OverlapMismatch):  # a different first offset
        await store.append(4, 1, 1, frames(3, 1))
    assert await every_disk_holds(store, 4, frames(0, 3)) == []


async def test_crc_flip_and_bad_framing_refused(store: LedgerStore) -> None:
    data = bytearray(frames(0, 3))
    data[len(frame(0)) + 30] ^= 0x01  # a payload byte of the second frame
    with pytest.raises(BadFrames, match="CRC"):
        await store.append(6, 1, 0, bytes(data))
    with pytest.raises(BadFrames, match="consecutive"):
        await store.append(6, 1, 0, frame(0) + frame(2))
    with pytest.raises(BadFrames):
        await store.append(6, 1, 0, frames(0, 2)[:-3])
    with pytest.raises(UnknownLedger):
        await store.read(6, 0)


async def test_out_of_order_appends_wait_for_the_gap(tmp_path: Path) -> None:
    store = await opened(dirs(tmp_path), gap_wait_s=2.0)
    try:
        later = asyncio.create_task(store.append(8, 1, 0, frames(3, 3)))
        await asyncio.sleep(0.05)
        assert not later.done()
        # Written in one group: both answered with the end after it.
        assert await store.append(8, 1, 0, frames(0, 3)) == 6
        assert await later == 6
        assert offsets(await read_all(store, 8)) == list(range(6))
    finally:
        await store.close()


async def test_parked_append_times_out_as_a_gap(tmp_path: Path) -> None:
    store = await opened(dirs(tmp_path), gap_wait_s=0.1)
    try:
        await store.append(9, 1, 0, frames(0, 1))
        with pytest.raises(AppendGap) as e:
            await store.append(9, 1, 0, frames(5, 1))
        assert e.value.node_end == 1
    finally:
        await store.close()


async def test_concurrent_appends_share_group_commits(store: LedgerStore) -> None:
    n = 60
    calls = [store.append(10, 1, 0, frame(i)) for i in range(n)]
    ends = await asyncio.gather(*calls)
    assert max(ends) == n
    assert store.group_commits < n / 2  # many appends per write and fsync
    assert offsets(await read_all(store, 10)) == list(range(n))


async def test_last_add_confirmed_only_rises_and_is_kept(tmp_path: Path) -> None:
    paths = dirs(tmp_path)
    store = await opened(paths)
    await store.append(11, 1, 0, frames(0, 3), lac=2)
    await store.append(11, 1, 0, b"", lac=3)  # a last-add-confirmed alone
    await store.append(11, 1, 0, frames(0, 1), lac=1)  # a retry with an older LAC
    assert store.summaries()[0].last_add_confirmed == 3
    await store.close()
    store = await opened(paths)
    try:
        assert (await store.fence(11, 1)).last_add_confirmed == 3
    finally:
        await store.close()


# --- reads -----------------------------------------------------------------------------------


async def test_read_bounds(store: LedgerStore) -> None:
    big = frame(3, b"x" * 500)
    await store.append(12, 1, 0, frames(0, 3) + big + frames(4, 2))
    one = len(frame(0))
    data, end = await store.read(12, 0, max_bytes=2 * one)
    assert offsets(data) == [0, 1] and end == 6
    data, _ = await store.read(12, 3, max_bytes=10)  # at least one whole frame
    assert offsets(data) == [3]
    data, _ = await store.read(12, 1, end_offset=3)
    assert offsets(data) == [1, 2]
    data, _ = await store.read(12, 0, end_offset=0)  # 0: to the node's end
    assert offsets(data) == list(range(6))
    assert await store.read(12, 6) == (b"", 6)  # the node's end: empty
    assert await store.read(12, 9) == (b"", 6)
    await store.append(13, 1, 0, frame(0, count=4))
    with pytest.raises(BadRead):
        await store.read(13, 2)


# --- fences, deletes -------------------------------------------------------------------------


async def test_fence_of_an_unknown_ledger_holds_across_restart(tmp_path: Path) -> None:
    paths = dirs(tmp_path)
    store = await opened(paths)
    fence = await store.fence(20, 7)
    assert (fence.exists, fence.end_offset, fence.fenced_epoch) == (False, 0, 7)
    assert store.summaries() == []
    await store.close()
    store = await opened(paths)
    try:
        with pytest.raises(FencedAppend):
            await store.append(20, 6, 0, frames(0, 1))
        assert await store.append(20, 7, 0, frames(0, 1)) == 1
    finally:
        await store.close()


async def test_delete(store: LedgerStore) -> None:
    await store.append(21, 1, 0, frames(0, 2))
    await store.fence(21, 3)
    assert await store.delete(21) is True
    assert await store.delete(21) is False
    assert store.summaries() == []
    with pytest.raises(UnknownLedger):
        await store.read(21, 0)
    for d in store.disks:
        assert list((d.path / "ledgers").iterdir()) == []


async def test_delete_waits_for_a_slow_disks_fence_record(
    store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fence answers once a majority of disks wrote its record; the slowest disk's write
    may still be running when a delete comes: the delete waits for it, so no record of the
    deleted ledger is left behind (CI once found one under load)."""
    slow = store.disks[-1]
    real = Disk.write_fence

    def slow_write_fence(self: Disk, ledger_id: int, record: bytes) -> None:
        if self is slow:
            time.sleep(0.3)
        real(self, ledger_id, record)

    monkeypatch.setattr(Disk, "write_fence", slow_write_fence)
    await store.append(22, 1, 0, frames(0, 2))
    await store.fence(22, 3)  # answered by the two fast disks
    assert await store.delete(22) is True
    await asyncio.sleep(0.5)  # past the slow write
    for d in store.disks:
        assert list((d.path / "ledgers").iterdir()) == []


# --- recovery --------------------------------------------------------------------------------


async def test_torn_tail_cut_at_restart(tmp_path: Path) -> None:
    paths = dirs(tmp_path)
    store = await opened(paths)
    await store.append(30, 1, 0, frames(0, 5))
    await store.close()
    torn = frame(5)[:-4]
    for p in paths:
        with ledger_file(p, 30).open("ab") as f:
            f.write(torn)
    store = await opened(paths)
    try:
        [summary] = store.summaries()
        assert summary.end_offset == 5 and summary.healthy_disks == 3
        for p in paths:
            assert ledger_file(p, 30).read_bytes() == frames(0, 5)
        assert await store.append(30, 1, 0, frames(5, 1)) == 6
    finally:
        await store.close()


async def test_lagging_and_missing_copies_repaired_at_start(tmp_path: Path) -> None:
    paths = dirs(tmp_path)
    store = await opened(paths)
    await store.append(31, 1, 0, frames(0, 10))
    await store.append(32, 1, 0, frames(0, 3))
    digests = {s.ledger_id: s.digest for s in store.summaries()}
    await store.close()
    # Disk 1 lags (a write that reached only the others), disk 2 lost a file, disk 0 has
    # a flipped byte in its last frame.
    full = frames(0, 10)
    with ledger_file(paths[1], 31).open("r+b") as f:
        f.truncate(len(frames(0, 6)))
    ledger_file(paths[2], 32).unlink()
    data = bytearray(full)
    data[-3] ^= 0xFF
    ledger_file(paths[0], 31).write_bytes(bytes(data))
    store = await opened(paths)
    try:
        assert {s.ledger_id: s.digest for s in store.summaries()} == digests
        assert all(s.healthy_disks == 3 for s in store.summaries())
        assert store.repaired_copies == 3
        for p in paths:
            assert ledger_file(p, 31).read_bytes() == full
            assert ledger_file(p, 32).read_bytes() == frames(0, 3)
        assert (paths[0] / "ledgers" / f"{31:020d}.ledger.damaged").exists()
    finally:
        await store.close()


async def test_longest_valid_copy_wins(tmp_path: Path) -> None:
    """Entries durable on only one disk (never answered) are kept and copied, not lost."""
    paths = dirs(tmp_path)
    store = await opened(paths)
    await store.append(33, 1, 0, frames(0, 4))
    await store.close()
    ledger_file(paths[2], 33).write_bytes(frames(0, 6))
    store = await opened(paths)
    try:
        assert store.summaries()[0].end_offset == 6
        for p in paths:
            assert ledger_file(p, 33).read_bytes() == frames(0, 6)
    finally:
        await store.close()


# --- failing disks ---------------------------------------------------------------------------


def failing(disk: Disk, err: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def write_at(*args: Any) -> float:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(disk, "write_at", write_at)


async def test_one_failing_disk_appends_answered_at_majority(
    store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.append(40, 1, 0, frames(0, 2))
    failing(store.disks[1], errno.EIO, monkeypatch)
    assert await store.append(40, 1, 0, frames(2, 2)) == 4
    assert not store.disks[1].healthy and "Input/output error" in store.disks[1].error
    assert await store.append(40, 1, 0, frames(4, 1)) == 5
    assert await store.append(41, 1, 0, frames(0, 1)) == 1  # a new ledger too
    assert {s.ledger_id: s.healthy_disks for s in store.summaries()} == {40: 2, 41: 2}
    assert offsets(await read_all(store, 40)) == list(range(5))
    health = store.disk_health()
    assert [d.healthy for d in health] == [True, False, True]
    # A second failing disk leaves no majority: refused, nothing half-written stays.
    failing(store.disks[2], errno.EIO, monkeypatch)
    with pytest.raises(TooFewDisks):
        await store.append(40, 1, 0, frames(5, 1))
    with pytest.raises(TooFewDisks):
        await store.append(40, 1, 0, frames(5, 1))
    assert ledger_file(store.disks[0].path, 40).read_bytes() == frames(0, 5)


def threads_of(disk: Disk, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads ``disk.write_at`` runs on, call by call (filled as it runs)."""
    seen: list[str] = []
    write_at = disk.write_at

    def recorded(*args: Any) -> float:
        seen.append(threading.current_thread().name)
        return write_at(*args)

    monkeypatch.setattr(disk, "write_at", recorded)
    return seen


async def test_one_disk_writes_on_the_loop_while_one_ledger_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one disk and one ledger writing, the group is written and synced on the event
    loop's thread (no thread hop before the answer); two ledgers writing at once use the
    disk's threads, so one's fdatasync does not wait for the other's."""
    store = await opened(dirs(tmp_path, 1))
    try:
        seen = threads_of(store.disks[0], monkeypatch)
        assert await store.append(50, 1, 0, frames(0, 2)) == 2
        assert await store.append(50, 1, 0, frames(2, 3)) == 5
        loop_thread = threading.current_thread().name
        assert seen == [loop_thread, loop_thread]
        seen.clear()
        assert await asyncio.gather(
            store.append(51, 1, 0, frames(0, 1)), store.append(52, 1, 0, frames(0, 2))
        ) == [1, 2]
        assert len(seen) == 2 and all(name.startswith("disk0") for name in seen)
        for ledger_id, end in ((50, 5), (51, 1), (52, 2)):
            assert ledger_file(store.disks[0].path, ledger_id).read_bytes() == frames(0, end)
        assert offsets(await read_all(store, 50)) == list(range(5))
    finally:
        await store.close()


async def test_one_disk_failing_on_the_loop_refuses_and_cuts_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write on the loop that fails is refused like one in a thread: a full disk is
    RESOURCE_EXHAUSTED and stays in service, an I/O error takes the disk out; nothing of the
    refused group stays in the file."""
    store = await opened(dirs(tmp_path, 1))
    try:
        disk = store.disks[0]
        assert await store.append(53, 1, 0, frames(0, 2)) == 2
        failing(disk, errno.ENOSPC, monkeypatch)
        with pytest.raises(DisksFull):
            await store.append(53, 1, 0, frames(2, 1))
        assert disk.healthy
        monkeypatch.undo()
        assert await store.append(53, 1, 0, frames(2, 1)) == 3
        failing(disk, errno.EIO, monkeypatch)
        with pytest.raises(TooFewDisks):
            await store.append(53, 1, 0, frames(3, 1))
        assert not disk.healthy
        assert ledger_file(disk.path, 53).read_bytes() == frames(0, 3)
    finally:
        await store.close()


async def test_full_disks_resource_exhausted_and_rolled_back(
    store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.append(42, 1, 0, frames(0, 2))
    failing(store.disks[0], errno.ENOSPC, monkeypatch)
    assert await store.append(42, 1, 0, frames(2, 1)) == 3  # one full disk: a majority left
    assert store.disks[0].healthy  # full, not broken
    failing(store.disks[2], errno.ENOSPC, monkeypatch)
    with pytest.raises(DisksFull):
        await store.append(43, 1, 0, frames(0, 2))
    # The one disk that took the refused write was cut back.
    assert ledger_file(store.disks[1].path, 43).read_bytes() == b""
    monkeypatch.undo()
    assert await store.append(43, 1, 0, frames(0, 2)) == 2  # space is back
    assert store.summaries()[-1].healthy_disks == 3


# --- digests, many ledgers -------------------------------------------------------------------


async def test_digest_equal_for_equal_entries(tmp_path: Path) -> None:
    a = await opened(dirs(tmp_path / "a", 1))
    b = await opened(dirs(tmp_path / "b", 3))
    try:
        await a.append(50, 1, 0, frames(0, 6))
        for i in range(6):  # the same entries in other batches
            await b.append(50, 2, 0, frame(i))
        await b.append(51, 2, 0, frames(0, 5) + frame(5, b"different"))
        da = a.summaries()[0].digest
        assert da == b.summaries()[0].digest
        assert da != b.summaries()[1].digest
    finally:
        await a.close()
        await b.close()
    c = await opened(dirs(tmp_path / "b", 3))
    try:
        assert c.summaries()[0].digest == da  # recomputed at start-up
    finally:
        await c.close()


async def test_idle_ledgers_close_their_files(tmp_path: Path) -> None:
    now = [0.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    store = await opened(dirs(tmp_path), idle_close_s=30.0, clock=clock)

    async def workers_done() -> None:  # the last disk of a group may still be writing
        for _ in range(200):
            if not store._workers:
                return
            await asyncio.sleep(0.01)

    try:
        for ledger_id in range(20):
            await store.append(ledger_id, 1, 0, frames(0, 1), lac=0)
        await workers_done()
        assert store.open_files() == 60
        now[0] = 31.0
        assert store.close_idle() == 0  # each dirty last-add-confirmed is saved first
        await workers_done()
        now[0] = 62.0
        assert store.close_idle() == 20
        assert store.open_files() == 0
        data, _ = await store.read(3, 0)  # reopened on demand
        assert offsets(data) == [0]
    finally:
        await store.close()


async def test_a_disk_unusable_at_start_leaves_a_majority(tmp_path: Path) -> None:
    paths = dirs(tmp_path)
    store = await opened(paths)
    await store.append(60, 1, 0, frames(0, 2))
    await store.close()
    ledgers = paths[2] / "ledgers"
    for f in ledgers.iterdir():
        f.unlink()
    ledgers.rmdir()
    ledgers.write_bytes(b"not a directory")
    store = await opened(paths)
    try:
        assert [d.healthy for d in store.disks] == [True, True, False]
        assert store.summaries()[0].healthy_disks == 2
        assert await store.append(60, 1, 0, frames(2, 1)) == 3
        assert offsets(await read_all(store, 60)) == [0, 1, 2]
    finally:
        await store.close()


async def test_delete_then_append_starts_the_ledger_again(store: LedgerStore) -> None:
    await store.append(61, 1, 0, frames(0, 3))
    deleted = asyncio.create_task(store.delete(61))
    again = asyncio.create_task(store.append(61, 1, 5, frames(5, 1)))
    assert await deleted is True
    assert await again == 6
    assert [(s.first_offset, s.end_offset) for s in store.summaries()] == [(5, 6)]


def test_a_file_closed_while_in_use_closes_after_its_last_user(tmp_path: Path) -> None:
    file = LedgerFile(tmp_path / "f")
    with file.use(create=True) as fd:
        file.close()
        os.pwrite(fd, b"still mine", 0)  # the descriptor stays valid for this user
        assert file.fd == fd
    assert file.fd is None
    assert (tmp_path / "f").read_bytes() == b"still mine"


def test_fence_records_written_at_once_by_a_disks_threads_end_with_the_highest(
    tmp_path: Path,
) -> None:
    """A disk's threads may write one ledger's fence record at once (a fence and a
    last-add-confirmed save): no write fails (before, both used one temporary file and one
    rename found it gone, which took the disk out of service) and the highest record wins
    whatever order they ran in."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    from pubsubd.storagenode.ledger_store import decode_fence, encode_fence

    disk = Disk(0, tmp_path / "disk0")
    disk.dir.mkdir(parents=True)
    records = [(epoch, lac) for epoch in range(1, 6) for lac in range(0, 40, 3)]
    random.Random(7).shuffle(records)
    with ThreadPoolExecutor(8) as pool:
        for done in [pool.submit(disk.write_fence, 9, encode_fence(e, lac)) for e, lac in records]:
            done.result()
    assert decode_fence(disk.fence_path(9).read_bytes()) == max(records)
    assert disk.healthy
    disk.executor.shutdown()


async def test_start_append_tells_its_callback_in_the_group_commits_own_step(
    store: LedgerStore,
) -> None:
    """``answered`` is called by the step that settles the append, before anything the
    settlement schedules (the future's callbacks run one event-loop turn later); a refusal
    found later (a gap that stays open) reaches it too, and its future's exception counts as
    retrieved."""
    told: list[tuple[int | None, BaseException | None]] = []
    seen_by_future_callback: list[int] = []

    def answered(end: int | None, error: BaseException | None) -> None:
        told.append((end, error))

    future = store.start_append(3, 1, 0, frames(0, 2), answered=answered)
    future.add_done_callback(lambda _: seen_by_future_callback.append(len(told)))
    assert await future == 2
    assert told == [(2, None)] and seen_by_future_callback == [1]
    # Past the end: parked, then refused as a gap when its wait runs out (a timer's step).
    late = store.start_append(3, 1, 0, frames(5, 1), answered=answered)
    await asyncio.sleep(store.gap_wait_s + 0.3)
    assert late.done() and isinstance(told[1][1], AppendGap) and told[1][0] is None
    del late  # its exception was retrieved: no "never retrieved" warning at collection
