"""Damaged entries in a source log: contained to the entries hit, reported, restorable."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsubd.storage import segment_index
from pubsubd.storage.damage import FOUND_AT_START, FOUND_BY_READ, DamagedRange, DamageMap
from pubsubd.storage.errors import DamagedEntries
from pubsubd.storage.framing import FRAME_OVERHEAD, Entry, encode_entry, find_next_frame
from pubsubd.storage.log import SEGMENT_SUFFIX, SourceLog

pytestmark = pytest.mark.unit

PAYLOAD = 40  # bytes per entry payload: frames of 69 bytes


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SEGMENT_SUFFIX}"))


async def _build(directory: Path, entries: int, segment_bytes: int) -> list[Entry]:
    log = SourceLog.open(directory, segment_bytes=segment_bytes)
    for i in range(entries):
        await log.append(b"%-40d" % i, 2, 1000 + i)  # two messages per entry
    written = _readable(log)
    await log.close()
    return written


def _readable(log: SourceLog) -> list[Entry]:
    """Every entry a reader gets by skipping damaged ranges."""
    out: list[Entry] = []
    offset = log.start_offset
    while offset < log.committed_offset:
        try:
            batch = log.read(offset, max_entries=5)
        except DamagedEntries as e:
            offset = e.damaged.end_offset
            continue
        out.extend(batch)
        offset = batch[-1].next_offset
    return out


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


FRAME = FRAME_OVERHEAD + PAYLOAD


@pytest.mark.parametrize("with_index", [True, False])
async def test_a_flipped_byte_in_a_sealed_segment_costs_only_its_entry(
    tmp_path: Path, with_index: bool
) -> None:
    written = await _build(tmp_path, 30, segment_bytes=10 * FRAME)
    first = _segments(tmp_path)[0]
    _flip(first, 3 * FRAME + 30)  # inside entry 3 (offsets 6, 7)
    if not with_index:
        (tmp_path / segment_index.index_file_name(0)).unlink()
    log = SourceLog.open(tmp_path, segment_bytes=10 * FRAME)
    # Reads stop before the damage, never at the intact entries around it.
    assert [e.base_offset for e in log.read(0)] == [0, 2, 4]
    with pytest.raises(DamagedEntries) as caught:
        log.read(6)
    damaged = caught.value.damaged
    assert (damaged.first_offset, damaged.end_offset) == (6, 8)
    assert (damaged.byte_start, damaged.byte_stop) == (3 * FRAME, 4 * FRAME)
    assert damaged.path == str(first)
    assert damaged.found == (FOUND_BY_READ if with_index else FOUND_AT_START)
    assert first.name in str(caught.value)
    assert log.read(8)[0].base_offset == 8
    assert _readable(log) == [e for e in written if e.base_offset != 6]
    assert log.damaged_ranges() == [damaged]
    await log.close()


async def test_damage_in_the_active_segment_is_not_cut_as_a_torn_tail(tmp_path: Path) -> None:
    written = await _build(tmp_path, 8, segment_bytes=1 << 20)
    (active,) = _segments(tmp_path)
    _flip(active, 2 * FRAME + 5)  # the length field of entry 2
    log = SourceLog.open(tmp_path)
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [(4, 6)]
    assert active.stat().st_size == 8 * FRAME  # nothing cut
    assert _readable(log) == [e for e in written if e.base_offset != 4]
    assert await log.append(b"after", 1, 9999) == 16
    await log.close()
    reopened = SourceLog.open(tmp_path)
    assert _readable(reopened)[-1] == Entry(16, 1, 9999, b"after")
    await reopened.close()


async def test_damage_at_the_end_of_the_active_segment_is_a_torn_tail(tmp_path: Path) -> None:
    written = await _build(tmp_path, 5, segment_bytes=1 << 20)
    (active,) = _segments(tmp_path)
    _flip(active, 4 * FRAME + 30)
    log = SourceLog.open(tmp_path)
    assert log.damaged_ranges() == []
    assert _readable(log) == written[:4]
    assert log.end_offset == 8
    await log.close()


async def test_a_damaged_tail_of_a_sealed_segment_runs_to_the_next_segment(
    tmp_path: Path,
) -> None:
    written = await _build(tmp_path, 12, segment_bytes=4 * FRAME)
    first = _segments(tmp_path)[0]
    _flip(first, 3 * FRAME + 2)  # length field of its last entry (offsets 6, 7)
    (tmp_path / segment_index.index_file_name(0)).unlink()
    log = SourceLog.open(tmp_path, segment_bytes=4 * FRAME)
    (damaged,) = log.damaged_ranges()
    assert (damaged.first_offset, damaged.end_offset) == (6, 8)
    assert _readable(log) == [e for e in written if e.base_offset != 6]
    await log.close()


async def test_a_truncated_sealed_segment_is_one_damaged_range(tmp_path: Path) -> None:
    written = await _build(tmp_path, 20, segment_bytes=10 * FRAME)
    first = _segments(tmp_path)[0]
    with first.open("r+b") as f:
        f.truncate(6 * FRAME + 10)
    log = SourceLog.open(tmp_path, segment_bytes=10 * FRAME)  # index present: no scan
    assert _readable(log) == [e for e in written if not 12 <= e.base_offset < 20]
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [(12, 20)]
    await log.close()


async def test_a_lost_segment_file_is_a_damaged_range(tmp_path: Path) -> None:
    written = await _build(tmp_path, 30, segment_bytes=10 * FRAME)
    middle = _segments(tmp_path)[1]
    middle.unlink()
    log = SourceLog.open(tmp_path, segment_bytes=10 * FRAME)
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [(20, 40)]
    assert _readable(log) == [e for e in written if not 20 <= e.base_offset < 40]
    await log.close()


@pytest.mark.parametrize("with_index", [True, False])
async def test_restored_bytes_are_readable_again_without_a_restart(
    tmp_path: Path, with_index: bool
) -> None:
    written = await _build(tmp_path, 30, segment_bytes=10 * FRAME)
    first = _segments(tmp_path)[0]
    backup = tmp_path.parent / "backup.seg"
    shutil.copy(first, backup)
    _flip(first, 5 * FRAME + 40)
    if not with_index:
        (tmp_path / segment_index.index_file_name(0)).unlink()
    log = SourceLog.open(tmp_path, segment_bytes=10 * FRAME)
    commits: list[int] = []
    log.add_listener(commits.append)
    assert len(_readable(log)) == 29
    assert log.recheck_damage() == []  # still damaged
    shutil.copy(backup, first)
    (restored,) = log.recheck_damage()
    assert (restored.first_offset, restored.end_offset) == (10, 12)
    assert log.damaged_ranges() == [] and commits  # readers waiting at it are woken
    assert _readable(log) == written
    await log.close()


async def test_a_read_across_segments_returns_the_intact_prefix(tmp_path: Path) -> None:
    """Reads fetch ahead over several segments: damage further on must not fail them."""
    await _build(tmp_path, 40, segment_bytes=10 * FRAME)
    third = _segments(tmp_path)[2]
    _flip(third, 10)
    log = SourceLog.open(tmp_path, segment_bytes=10 * FRAME)
    batch = log.read(0, max_entries=1000)
    assert [e.base_offset for e in batch] == list(range(0, 40, 2))
    with pytest.raises(DamagedEntries):
        log.read(40)
    await log.close()


async def test_trim_forgets_damage_of_deleted_segments(tmp_path: Path) -> None:
    await _build(tmp_path, 30, segment_bytes=10 * FRAME)
    _flip(_segments(tmp_path)[0], 10)
    log = SourceLog.open(tmp_path, segment_bytes=10 * FRAME)
    _readable(log)
    assert len(log.damaged_ranges()) == 1
    log.trim(20)
    assert log.damaged_ranges() == []
    await log.close()


def test_find_next_frame_skips_garbage() -> None:
    frames = [encode_entry(Entry(10 + i, 1, 5, b"x" * 30)) for i in range(3)]
    garbage = bytes(range(256)) * 3
    buf = frames[0] + garbage + frames[1] + frames[2]
    found = find_next_frame(buf, 0, 11)
    assert found is not None
    assert (found.position, found.base_offset) == (len(frames[0]) + len(garbage), 11)
    assert find_next_frame(buf, 0, 100) is None  # offsets far below what is expected
    assert find_next_frame(garbage, 0, 0) is None


def _range(first: int, end: int, b0: int, b1: int, path: str = "s") -> DamagedRange:
    return DamagedRange(path, first, end, b0, b1, "CRC", FOUND_BY_READ, True)


def test_damage_map_merges_touching_ranges_and_finds_offsets() -> None:
    damage = DamageMap()
    damage.add(_range(10, 12, 100, 200))
    assert damage.add(_range(12, 14, 200, 300)) == _range(10, 14, 100, 300)
    damage.add(_range(20, 22, 500, 600))
    assert [(r.first_offset, r.end_offset) for r in damage] == [(10, 14), (20, 22)]
    assert damage.at(13) == _range(10, 14, 100, 300) and damage.at(14) is None
    assert damage.next_after(0) == 10 and damage.next_after(10) == 20
    assert damage.next_after(20) is None
    assert damage.add(_range(11, 12, 150, 200)) == _range(10, 14, 100, 300)  # known
    with pytest.raises(ValueError, match="overlaps"):
        damage.add(_range(13, 16, 250, 400))
    damage.drop_below(15)
    assert [r.first_offset for r in damage] == [20]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(flip=st.integers(min_value=0), with_index=st.booleans(), data=st.data())
async def test_any_flipped_byte_costs_exactly_the_entry_it_hit(
    tmp_path_factory: pytest.TempPathFactory, flip: int, with_index: bool, data: st.DataObject
) -> None:
    directory = tmp_path_factory.mktemp("log")
    sizes = data.draw(st.lists(st.integers(1, 90), min_size=6, max_size=25))
    log = SourceLog.open(directory, segment_bytes=400)
    entries = [await log.append(bytes([i % 251]) * n, 1, i) for i, n in enumerate(sizes)]
    written = _readable(log)
    await log.close()
    assert [e.base_offset for e in written] == entries
    segments = _segments(directory)
    total = sum(p.stat().st_size for p in segments)
    at = flip % total
    # Which entry's frame holds byte ``at``?
    hit_offset, is_last_entry = -1, False
    position = 0
    for path in segments:
        size = path.stat().st_size
        if at < position + size:
            _flip(path, at - position)
            if not with_index:
                (directory / segment_index.index_file_name(int(path.stem))).unlink(missing_ok=True)
            break
        position += size
    position = 0
    for entry in written:
        length = FRAME_OVERHEAD + len(entry.payload)
        if position <= at < position + length:
            hit_offset = entry.base_offset
            is_last_entry = entry is written[-1]
        position += length
    reopened = SourceLog.open(directory, segment_bytes=400)
    got = _readable(reopened)
    assert [e for e in got if e.base_offset != hit_offset] == [
        e for e in written if e.base_offset != hit_offset
    ]
    assert all(e in written for e in got)  # nothing damaged is ever returned
    if not is_last_entry:  # the very last entry's damage is a torn tail, cut off
        assert [(d.first_offset, d.end_offset) for d in reopened.damaged_ranges()] == [
            (hit_offset, hit_offset + 1)
        ]
    await reopened.close()
