"""Unit tests for the segmented source log (pubsubd.storage.log)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pubsubd.storage import log as log_module
from pubsubd.storage import replication, segment_index
from pubsubd.storage.errors import CorruptEntry, LogClosed, OffsetOutOfRange, StorageError
from pubsubd.storage.framing import Entry, encode_entry
from pubsubd.storage.log import SEGMENT_SUFFIX, FsyncPolicy, SourceLog
from tests.support.fds import open_files

pytestmark = pytest.mark.unit


def _segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SEGMENT_SUFFIX}"))


def _index_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{segment_index.SUFFIX}"))


def _read_all(log: SourceLog, offset: int | None = None) -> list[Entry]:
    entries: list[Entry] = []
    offset = log.start_offset if offset is None else offset
    while batch := log.read(offset, max_entries=7):
        entries.extend(batch)
        offset = batch[-1].next_offset
    return entries


async def _fill(log: SourceLog, n: int, *, count: int = 1) -> list[int]:
    return [await log.append(b"payload-%d" % i, count, 1000 + i) for i in range(n)]


async def test_append_and_read(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path)
    assert (log.start_offset, log.end_offset, log.committed_offset) == (0, 0, 0)
    assert await log.append(b"one", 1, 10) == 0
    assert await log.append(b"three", 3, 11) == 1
    assert await log.append(b"two", 2, 12) == 4
    assert (log.end_offset, log.committed_offset) == (6, 6)
    assert log.read(0) == [
        Entry(0, 1, 10, b"one"),
        Entry(1, 3, 11, b"three"),
        Entry(4, 2, 12, b"two"),
    ]
    # An offset inside an entry returns the entry containing it first.
    assert [e.base_offset for e in log.read(2)] == [1, 4]
    assert log.entry_at(3) == Entry(1, 3, 11, b"three")
    assert log.read(6) == [] and log.read(100) == []
    await log.close()


async def test_read_limits(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path)
    await log.append(b"x" * 100, 1, 1)
    await log.append(b"y" * 10, 1, 2)
    await log.append(b"z" * 10, 1, 3)
    assert [e.base_offset for e in log.read(0, max_entries=2)] == [0, 1]
    # At least one entry even when it alone exceeds max_bytes.
    assert [e.base_offset for e in log.read(0, max_bytes=5)] == [0]
    assert [e.base_offset for e in log.read(1, max_bytes=20)] == [1, 2]
    assert [e.base_offset for e in log.read(1, max_bytes=19)] == [1]
    with pytest.raises(ValueError):
        log.read(0, max_entries=0)
    await log.close()


async def test_offset_out_of_range(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=64)
    await _fill(log, 10)
    log.trim(5)
    start = log.start_offset
    assert start > 0
    with pytest.raises(OffsetOutOfRange, match=rf"\[{start}, 10\)"):
        log.read(start - 1)
    with pytest.raises(OffsetOutOfRange):
        log.entry_at(start - 1)
    with pytest.raises(OffsetOutOfRange):
        log.entry_at(10)
    await log.close()


async def test_group_commit_needs_far_fewer_fsyncs(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, fsync=FsyncPolicy.ALWAYS)
    first = asyncio.ensure_future(log.append(b"first", 1, 0))
    await asyncio.sleep(0)  # the writer starts its first fsync while more appends arrive
    offsets = await asyncio.gather(*(log.append(b"m%d" % i, 1, i) for i in range(1, 500)))
    assert await first == 0
    assert offsets == list(range(1, 500))
    stats = log.stats()
    assert stats["entries"] == 500
    assert stats["fsyncs"] <= 10, stats
    assert stats["write_groups"] <= 10, stats
    assert [e.payload for e in log.read(0, max_entries=3)] == [b"first", b"m1", b"m2"]
    await log.close()


async def test_roll_over_and_reopen(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=100)
    offsets = await _fill(log, 20, count=2)
    assert offsets == list(range(0, 40, 2))
    files = _segment_files(tmp_path)
    assert len(files) > 3
    assert all(f.stat().st_size <= 100 + 64 for f in files)
    assert files[0].name == f"{0:020d}{SEGMENT_SUFFIX}"
    before = _read_all(log)
    assert [e.base_offset for e in before] == offsets
    await log.close()

    reopened = SourceLog.open(tmp_path, segment_bytes=100)
    assert (reopened.start_offset, reopened.end_offset, reopened.committed_offset) == (0, 40, 40)
    assert _read_all(reopened) == before
    assert _read_all(reopened, 33) == before[16:]
    assert await reopened.append(b"after", 1, 5000) == 40
    assert reopened.entry_at(40).payload == b"after"
    await reopened.close()


@pytest.mark.parametrize("tail", [b"\x07", b"garbage that is not a frame" * 3, "partial"])
async def test_torn_tail_is_truncated(tmp_path: Path, tail: bytes | str) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=120)
    await _fill(log, 12)
    expected = _read_all(log)
    await log.close()
    last = _segment_files(tmp_path)[-1]
    good_size = last.stat().st_size
    if tail == "partial":
        tail = encode_entry(Entry(12, 1, 9999, b"never acknowledged"))[:-3]
    assert isinstance(tail, bytes)
    with last.open("ab") as f:
        f.write(tail)

    log = SourceLog.open(tmp_path, segment_bytes=120)
    assert last.stat().st_size == good_size
    assert (log.end_offset, log.committed_offset) == (12, 12)
    assert _read_all(log) == expected
    assert await log.append(b"new", 1, 5000) == 12
    await log.close()
    log = SourceLog.open(tmp_path, segment_bytes=120)
    assert _read_all(log) == [*expected, Entry(12, 1, 5000, b"new")]
    await log.close()


async def test_corruption_in_an_older_segment_is_reported_not_fatal(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=80)
    await _fill(log, 10)
    await log.close()
    first = _segment_files(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[20] ^= 0xFF
    first.write_bytes(bytes(data))
    # With its index file the sealed segment is not read at start-up: the first read of the
    # damaged entry reports it (tests/unit/test_log_damage.py has the rest).
    log = SourceLog.open(tmp_path)
    with pytest.raises(CorruptEntry, match=first.name):
        log.read(0)
    await log.close()
    # Without it, the start-up scan finds it, and the log still opens.
    (tmp_path / segment_index.index_file_name(0)).unlink()
    log = SourceLog.open(tmp_path)
    assert [d.path for d in log.damaged_ranges()] == [str(first)]
    with pytest.raises(CorruptEntry, match=first.name):
        log.read(0)
    await log.close()


async def test_sealed_segments_reopen_from_their_index_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=100)
    await _fill(log, 30, count=2)
    expected = _read_all(log)
    await log.close()
    segments = _segment_files(tmp_path)
    indexes = _index_files(tmp_path)
    assert len(segments) > 3 and [p.stem for p in indexes] == [p.stem for p in segments[:-1]]

    scanned: list[int] = []
    real_scan = log_module.scan_frames

    def counting_scan(data: bytes, start: int = 0) -> object:
        scanned.append(len(data))
        return real_scan(data, start)

    monkeypatch.setattr(log_module, "scan_frames", counting_scan)
    reopened = SourceLog.open(tmp_path, segment_bytes=100)
    assert scanned == [segments[-1].stat().st_size]  # only the active segment was read
    assert _read_all(reopened) == expected
    assert reopened.publish_time_us(33) == expected[16].publish_time_us
    assert await reopened.append(b"after", 1, 5000) == 60
    await reopened.close()

    # A damaged or stale index file only costs a scan, and is written again.
    damaged = bytearray(indexes[1].read_bytes())
    damaged[-1] ^= 0xFF
    indexes[1].write_bytes(bytes(damaged))
    indexes[2].write_bytes(indexes[3].read_bytes())  # another segment's index
    scanned.clear()
    again = SourceLog.open(tmp_path, segment_bytes=100)
    assert len(scanned) == 3 and _read_all(again)[:-1] == expected
    assert segment_index.load(tmp_path, int(segments[1].stem), segments[1].stat().st_size)
    # Trimming deletes a segment's index file with it.
    again.trim(int(segments[3].stem))
    assert _index_files(tmp_path)[0].stem == segments[3].stem
    await again.close()


def test_segment_index_files_round_trip_and_refuse_what_does_not_match() -> None:
    from array import array

    index = segment_index.SegmentIndex(
        40, 46, 300, array("q", [40, 43]), array("q", [0, 150]), array("q", [7, 8])
    )
    data = segment_index.encode(index)
    assert segment_index.decode(data, 40) == index
    assert segment_index.decode(data, 41) is None  # another segment's
    assert segment_index.decode(data[:-1], 40) is None  # torn
    assert segment_index.decode(data[:20], 40) is None
    flipped = bytearray(data)
    flipped[30] ^= 1
    assert segment_index.decode(bytes(flipped), 40) is None


async def test_trim_deletes_whole_segments_only(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=100)
    await _fill(log, 30)
    files = _segment_files(tmp_path)
    bases = [int(f.name.removesuffix(SEGMENT_SUFFIX)) for f in files]
    assert log.trim(0) == 0
    # An offset inside the second segment deletes only the first.
    assert log.trim(bases[1] + 1) == bases[1]
    assert [int(f.name[:20]) for f in _segment_files(tmp_path)] == bases[1:]
    assert log.read(bases[1])[0].base_offset == bases[1]
    assert log.trim(bases[3]) == bases[3]
    assert log.stats()["segments"] == len(bases) - 3
    assert _read_all(log) == [e for e in _read_all(log) if e.base_offset >= bases[3]]
    assert log.end_offset == 30
    await log.close()
    assert SourceLog.open(tmp_path).start_offset == bases[3]


async def test_end_offset_survives_restart_after_full_trim(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=50)
    await _fill(log, 8)
    assert log.trim(8) == 8  # the active segment is empty: everything else goes
    assert log.start_offset == log.end_offset == 8
    assert log.read(8) == []
    await log.close()
    assert len(_segment_files(tmp_path)) == 1
    log = SourceLog.open(tmp_path, segment_bytes=50)
    assert (log.start_offset, log.end_offset) == (8, 8)
    assert await log.append(b"next", 1, 1) == 8
    await log.close()


async def test_offset_for_time(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=100)
    for i, t in enumerate([10, 20, 20, 30, 40, 40, 50, 60]):
        await log.append(b"e%d" % i, 2, t)
    assert log.offset_for_time(0) == 0
    assert log.offset_for_time(10) == 0
    assert log.offset_for_time(11) == 2
    assert log.offset_for_time(20) == 2
    assert log.offset_for_time(21) == 6
    assert log.offset_for_time(40) == 8
    assert log.offset_for_time(60) == 14
    assert log.offset_for_time(61) == log.end_offset == 16
    # The publish time of an offset comes from the same index (the SLI hook's lookup).
    assert [log.publish_time_us(o) for o in (0, 1, 2, 3, 15)] == [10, 10, 20, 20, 60]
    with pytest.raises(OffsetOutOfRange):
        log.publish_time_us(16)
    await log.close()


async def test_listeners_see_committed_offset(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path)
    seen: list[int] = []
    log.add_listener(seen.append)
    await log.append(b"a", 2, 1)
    await log.append(b"b", 1, 2)
    log.remove_listener(seen.append)
    log.remove_listener(seen.append)  # unknown: ignored
    await log.append(b"c", 1, 3)
    assert seen == [2, 3]
    await log.close()


async def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path)
    pending = [asyncio.ensure_future(log.append(b"x", 1, i)) for i in range(5)]
    await asyncio.sleep(0)
    await asyncio.gather(log.close(), log.close())
    assert [await p for p in pending] == list(range(5))
    await log.close()
    with pytest.raises(LogClosed):
        await log.append(b"late", 1, 9)
    with pytest.raises(LogClosed):
        log.read(0)
    assert len(_read_all(SourceLog.open(tmp_path))) == 5


@pytest.mark.parametrize("policy", [FsyncPolicy.INTERVAL, FsyncPolicy.NEVER])
async def test_relaxed_fsync_policies(tmp_path: Path, policy: FsyncPolicy) -> None:
    log = SourceLog.open(tmp_path, fsync=policy, fsync_interval_s=0.01)
    await _fill(log, 20)
    for _ in range(200):  # INTERVAL: wait (at most 2 s) for the background fsync
        await asyncio.sleep(0.01)
        if log.stats()["fsyncs"] or policy is FsyncPolicy.NEVER:
            break
    fsyncs = log.stats()["fsyncs"]
    if policy is FsyncPolicy.NEVER:
        assert fsyncs == 0
    else:
        assert fsyncs >= 1
    await log.close()
    assert len(_read_all(SourceLog.open(tmp_path))) == 20


async def test_failed_write_fails_the_group_and_keeps_the_log_consistent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SourceLog.open(tmp_path)
    await _fill(log, 3)
    real_write_all = replication.write_all

    def torn_write(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(replication, "write_all", torn_write)
    results = await asyncio.gather(
        *(log.append(b"doomed", 1, 10) for _ in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, StorageError) for r in results)
    assert (log.end_offset, log.committed_offset) == (3, 3)

    monkeypatch.setattr(replication, "write_all", real_write_all)
    assert await log.append(b"recovered", 1, 11) == 3
    await log.close()
    log = SourceLog.open(tmp_path)
    assert [e.payload for e in _read_all(log)] == [
        b"payload-0",
        b"payload-1",
        b"payload-2",
        b"recovered",
    ]
    await log.close()


async def test_cached_and_disk_reads_agree(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=200, cache_bytes=30)
    await _fill(log, 25)
    from_mixed = _read_all(log)
    await log.close()
    log = SourceLog.open(tmp_path, segment_bytes=200, cache_bytes=0)
    assert _read_all(log) == from_mixed
    assert len(from_mixed) == 25
    await log.close()


def _open_fds() -> int:
    return len(open_files())


async def test_new_log_creates_its_files_on_first_write(tmp_path: Path) -> None:
    directory = tmp_path / "topics" / "uid" / "source-0"
    log = SourceLog.open(directory)
    assert not (tmp_path / "topics").exists()  # subscribing to an unused topic costs no files
    assert log.read(0) == [] and log.on_disk is False
    await log.close()
    assert not (tmp_path / "topics").exists()
    log = SourceLog.open(directory)
    assert await log.append(b"one", 1, 10) == 0
    assert log.on_disk and len(_segment_files(directory)) == 1
    await log.close()
    reopened = SourceLog.open(directory)
    assert _read_all(reopened) == [Entry(0, 1, 10, b"one")]
    await reopened.close()


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_idle_log_releases_its_files_and_reopens_them(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    log = SourceLog.open(tmp_path, fsync=policy, fsync_interval_s=0.01, cache_bytes=0)
    before = _open_fds()
    await _fill(log, 5)
    assert len(_read_all(log)) == 5  # cache_bytes=0: reads open the segment
    assert _open_fds() == before + 2  # the active segment for appends, one for reads
    log.release_idle()  # used since the last call: keeps its files
    assert _open_fds() == before + 2
    await asyncio.sleep(0.05)  # INTERVAL: the background fsync makes it clean
    log.release_idle()
    for _ in range(100):  # the writer closes the active segment between groups
        if _open_fds() == before:
            break
        await asyncio.sleep(0.01)
    assert _open_fds() == before
    await _fill(log, 3)  # reopens on demand
    assert [e.base_offset for e in _read_all(log)] == list(range(8))
    await log.close()
    reopened = SourceLog.open(tmp_path)
    assert len(_read_all(reopened)) == 8
    await reopened.close()


async def test_stored_bytes_share_an_entrys_bytes_among_its_messages(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=200)
    await log.append(b"a" * 10, 1, 10)  # offset 0
    await log.append(b"b" * 100, 4, 11)  # offsets 1-4
    await log.append(b"c" * 50, 2, 12)  # offsets 5-6
    await log.append(b"d" * 80, 1, 13)  # offset 7, probably in a second segment
    frames = [len(encode_entry(e)) for e in _read_all(log)]
    assert log.stats()["segments"] > 1
    assert log.stored_bytes(0, 8) == pytest.approx(sum(frames)) == log.stats()["bytes"]
    assert log.stored_bytes(1, 5) == pytest.approx(frames[1])
    assert log.stored_bytes(2, 4) == pytest.approx(frames[1] / 2)  # 2 of its 4 messages
    assert log.stored_bytes(4, 6) == pytest.approx(frames[1] / 4 + frames[2] / 2)
    assert log.stored_bytes(7, 8) == pytest.approx(frames[3])  # across the segment boundary
    assert log.stored_bytes(5, 5) == 0 and log.stored_bytes(6, 2) == 0
    assert log.stored_bytes(7, 100) == pytest.approx(frames[3])  # nothing past the end
    first = log.stats()["start_offset"]
    log.trim(7)
    assert log.start_offset > first and log.stored_bytes(0, 8) == pytest.approx(
        log.stats()["bytes"]
    )  # trimmed messages count nothing
    await log.close()
