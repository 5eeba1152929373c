"""Property test: SourceLog behaves like a naive in-memory list of entries.

Random sequences of appends (single and concurrent), reopens, trims, torn tails
(bytes cut off or garbage added to the last segment file) are applied to a real log and
to a model; after every step reads, offsets and time lookups must agree with the model.
"""

from __future__ import annotations

import asyncio
import bisect
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.storage.framing import Entry, frame_length
from pubsubd.storage.log import SEGMENT_SUFFIX, FsyncPolicy, SourceLog

pytestmark = pytest.mark.property

_append = st.tuples(
    st.just("append"),
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 3)), min_size=1, max_size=6),
)
_reopen = st.tuples(st.just("reopen"), st.just(0))
_trim = st.tuples(st.just("trim"), st.integers(0, 200))
_cut = st.tuples(st.just("cut"), st.integers(1, 120))
_garbage = st.tuples(st.just("garbage"), st.binary(min_size=1, max_size=40))
_ops = st.lists(st.one_of(_append, _append, _reopen, _trim, _cut, _garbage), max_size=25)


@dataclass
class _Model:
    entries: list[Entry] = field(default_factory=list)
    start: int = 0
    end: int = 0
    clock: int = 0

    def append(self, payload: bytes, count: int) -> Entry:
        self.clock += 1
        entry = Entry(self.end, count, self.clock, payload)
        self.entries.append(entry)
        self.end += count
        return entry


def _last_segment(directory: Path) -> Path:
    return sorted(directory.glob(f"*{SEGMENT_SUFFIX}"))[-1]


def _check(log: SourceLog, model: _Model) -> None:
    assert (log.start_offset, log.end_offset, log.committed_offset) == (
        model.start,
        model.end,
        model.end,
    )
    got: list[Entry] = []
    offset = log.start_offset
    while batch := log.read(offset, max_entries=3, max_bytes=50):
        got.extend(batch)
        offset = batch[-1].next_offset
    assert got == model.entries
    for entry in model.entries[:: max(1, len(model.entries) // 4)]:
        assert log.entry_at(entry.next_offset - 1) == entry
    times = [e.publish_time_us for e in model.entries]
    for t in (0, model.clock // 2, model.clock, model.clock + 1):
        i = bisect.bisect_left(times, t)
        expected = model.entries[i].base_offset if i < len(times) else model.end
        assert log.offset_for_time(t) == expected


async def _scenario(
    directory: Path, ops: list[tuple[str, object]], segment_bytes: int, policy: FsyncPolicy
) -> None:
    def open_log() -> SourceLog:
        return SourceLog.open(directory, fsync=policy, segment_bytes=segment_bytes, cache_bytes=64)

    model = _Model()
    log = open_log()
    for op, arg in ops:
        if op == "append":
            assert isinstance(arg, list)
            calls = []
            for size, count in arg:
                entry = model.append(bytes([model.end % 251]) * size, count)
                calls.append(log.append(entry.payload, entry.count, entry.publish_time_us))
            offsets = await asyncio.gather(*calls)
            assert offsets == [e.base_offset for e in model.entries[-len(arg) :]]
        elif op == "reopen":
            await log.close()
            log = open_log()
        elif op == "trim":
            assert isinstance(arg, int)
            new_start = log.trim(arg)
            assert new_start == model.start or model.start <= new_start <= arg
            assert new_start == model.end or new_start in {e.base_offset for e in model.entries}
            model.start = new_start
            model.entries = [e for e in model.entries if e.base_offset >= new_start]
        elif op == "cut":
            assert isinstance(arg, int)
            await log.close()
            last = _last_segment(directory)
            base = int(last.name.removesuffix(SEGMENT_SUFFIX))
            size = last.stat().st_size
            keep = max(0, size - arg)
            with last.open("r+b") as f:
                f.truncate(keep)
            position = 0
            kept: list[Entry] = []
            for entry in model.entries:
                if entry.base_offset < base:
                    kept.append(entry)
                    continue
                position += frame_length(len(entry.payload))
                if position > keep:
                    break
                kept.append(entry)
            model.entries = kept
            model.end = kept[-1].next_offset if kept and kept[-1].base_offset >= base else base
            log = open_log()
        elif op == "garbage":
            assert isinstance(arg, bytes)
            await log.close()
            with _last_segment(directory).open("ab") as tail_file:
                tail_file.write(arg)
            log = open_log()
        _check(log, model)
    await log.close()
    log = open_log()
    _check(log, model)
    await log.close()


@settings(max_examples=150, deadline=None)
@given(
    ops=_ops,
    segment_bytes=st.sampled_from([60, 150, 400]),
    policy=st.sampled_from(list(FsyncPolicy)),
)
def test_log_matches_model(
    ops: list[tuple[str, object]], segment_bytes: int, policy: FsyncPolicy
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_scenario(Path(tmp), ops, segment_bytes, policy))
