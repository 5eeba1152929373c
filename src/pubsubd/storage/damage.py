"""Damaged ranges of a log: entries whose stored bytes fail their checks (pure, no I/O).

A flipped bit or a lost sector must cost only the entries it hit, never the intact data
around them (Kafka and BookKeeper isolate a bad entry the same way). The log records each
damaged run of entries as a :class:`DamagedRange`: its offsets, the segment file and byte
range, why it failed and when it was found. Reads stop at a damaged range and raise
:class:`~pubsubd.storage.errors.DamagedEntries` when asked for an offset inside one; callers
decide whether to skip it (the messages are lost) or to wait until an operator restores the
bytes (the log rechecks them, :meth:`SourceLog.recheck_damage`).

Two kinds, by how they were found:

- ``indexed``: found by a read (the segment's index file spared the start-up scan). The
  entries are in the in-memory index; only their bytes fail the CRC or do not match it.
- not indexed: found by the start-up scan. The scan resynchronised on the next valid frame
  (``framing.find_next_frame``), so the damaged entries are a hole in the index: their
  offsets are known from their neighbours, their count and times are not.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from pubsubd.core.records import DamagedRange

FOUND_AT_START = "start-up scan"
FOUND_BY_READ = "read"

__all__ = ["FOUND_AT_START", "FOUND_BY_READ", "DamageMap", "DamagedRange"]


class DamageMap:
    """The damaged ranges of one log, sorted by offset and never overlapping.

    Adding a range adjacent to one of the same segment file merges them, so a run of bad
    entries (a truncated file, a zeroed page) is one range and one log line."""

    __slots__ = ("_firsts", "_ranges")

    def __init__(self) -> None:
        self._ranges: list[DamagedRange] = []
        self._firsts: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def __len__(self) -> int:
        return len(self._ranges)

    def __iter__(self) -> Iterator[DamagedRange]:
        return iter(list(self._ranges))

    def at(self, offset: int) -> DamagedRange | None:
        """The range containing ``offset``, if any."""
        i = bisect_right(self._firsts, offset) - 1
        if i >= 0 and offset < self._ranges[i].end_offset:
            return self._ranges[i]
        return None

    def next_after(self, offset: int) -> int | None:
        """First offset of the first range starting above ``offset``; None if none does."""
        i = bisect_right(self._firsts, offset)
        return self._firsts[i] if i < len(self._firsts) else None

    def add(self, damaged: DamagedRange) -> DamagedRange:
        """Record ``damaged`` (merged with a touching range of the same file); return the
        range as recorded."""
        if damaged.end_offset <= damaged.first_offset:
            raise ValueError(f"empty damaged range {damaged}")
        for other in self._ranges:
            if other.first_offset < damaged.end_offset and damaged.first_offset < other.end_offset:
                inside = other.first_offset <= damaged.first_offset
                if inside and damaged.end_offset <= other.end_offset:
                    return other  # already known
                raise ValueError(f"{damaged} overlaps {other}")
        i = bisect_right(self._firsts, damaged.first_offset)
        before = self._ranges[i - 1] if i > 0 else None
        after = self._ranges[i] if i < len(self._ranges) else None
        if _touch(before, damaged):
            assert before is not None
            damaged = _merge(before, damaged)
            i -= 1
            del self._ranges[i], self._firsts[i]
        if _touch(damaged, after):
            assert after is not None
            damaged = _merge(damaged, after)
            del self._ranges[i], self._firsts[i]
        self._ranges.insert(i, damaged)
        self._firsts.insert(i, damaged.first_offset)
        return damaged

    def remove(self, damaged: DamagedRange) -> None:
        i = self._ranges.index(damaged)
        del self._ranges[i], self._firsts[i]

    def drop_below(self, offset: int) -> None:
        """Forget ranges wholly below ``offset`` (their segment was trimmed)."""
        while self._ranges and self._ranges[0].end_offset <= offset:
            del self._ranges[0], self._firsts[0]


def _touch(low: DamagedRange | None, high: DamagedRange | None) -> bool:
    return (
        low is not None
        and high is not None
        and low.path == high.path
        and low.indexed == high.indexed
        and low.end_offset == high.first_offset
        and low.byte_stop == high.byte_start
    )


def _merge(low: DamagedRange, high: DamagedRange) -> DamagedRange:
    return DamagedRange(
        low.path,
        low.first_offset,
        high.end_offset,
        low.byte_start,
        high.byte_stop,
        low.reason,
        low.found,
        low.indexed,
    )
