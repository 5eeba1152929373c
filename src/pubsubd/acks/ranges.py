"""Sorted set of disjoint half-open integer ranges, the building block of ack cursors.

Pure data structure, no I/O.

Invariants (hold after every public method returns):

* ``_starts`` and ``_ends`` are parallel lists of equal length; range ``i`` is
  ``[_starts[i], _ends[i])`` and is never empty (``_starts[i] < _ends[i]``).
* Ranges are sorted and neither overlap nor touch: ``_ends[i] < _starts[i + 1]``
  (adjacent ranges are always coalesced into one). Hence both lists are strictly
  increasing and can be searched with :mod:`bisect`.
* ``_count`` equals the sum of ``_ends[i] - _starts[i]``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

__all__ = ["RangeSet", "runs"]

# add_many() switches from per-run add() to a single merge pass above this many runs.
_MERGE_THRESHOLD = 16


def runs(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Collapse offsets (any order, duplicates allowed) into sorted disjoint half-open runs.

    Sorted and distinct, ``ordered[lo:hi]`` is one run exactly when its ends are ``hi - lo - 1``
    apart, so spans are halved until each is a run: O(runs * log n) steps in Python instead of
    one per offset (a grouped ACK names tens of thousands of mostly consecutive offsets)."""
    ordered = sorted(set(offsets))
    out: list[tuple[int, int]] = []
    spans = [(0, len(ordered))] if ordered else []
    while spans:  # a stack, the lowest span on top: runs come out in order
        lo, hi = spans.pop()
        if ordered[hi - 1] - ordered[lo] == hi - lo - 1:
            if out and out[-1][1] == ordered[lo]:  # continues the previous run
                out[-1] = (out[-1][0], ordered[hi - 1] + 1)
            else:
                out.append((ordered[lo], ordered[hi - 1] + 1))
            continue
        mid = (lo + hi) // 2
        spans.append((mid, hi))
        spans.append((lo, mid))
    return out


class RangeSet:
    """A set of integers stored as sorted, coalesced half-open ``[start, end)`` ranges."""

    __slots__ = ("_count", "_ends", "_starts")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._count = 0
        for start, end in ranges:
            self.add(start, end)

    # -- mutation ---------------------------------------------------------------

    def add(self, start: int, end: int) -> list[tuple[int, int]]:
        """Add ``[start, end)``; return the sub-ranges that were not already present.

        An empty or inverted range (``start >= end``) is a no-op.
        """
        if start >= end:
            return []
        starts, ends = self._starts, self._ends
        # Ranges i..j-1 overlap or touch [start, end): end_i >= start and start_j <= end.
        i = bisect_left(ends, start)
        j = bisect_right(starts, end, lo=i)
        added: list[tuple[int, int]] = []
        cur = start
        for k in range(i, j):
            s, e = starts[k], ends[k]
            if s > cur:
                added.append((cur, s))  # s <= end because k < j
            cur = max(cur, e)
        if cur < end:
            added.append((cur, end))
        if i < j:
            new_start = min(start, starts[i])
            new_end = max(end, ends[j - 1])
        else:
            new_start, new_end = start, end
        starts[i:j] = [new_start]
        ends[i:j] = [new_end]
        for s, e in added:
            self._count += e - s
        return added

    def add_many(self, offsets: Iterable[int]) -> list[tuple[int, int]]:
        """Add individual offsets (any order, duplicates allowed); return newly added ranges.

        The offsets are first collapsed into runs. A few runs are added one by one;
        many runs are merged into the existing lists in a single pass, so a batch of
        ~1000 scattered offsets costs O(runs * log n) Python work plus one O(n) copy.
        """
        batch = runs(offsets)
        if len(batch) <= _MERGE_THRESHOLD:
            added: list[tuple[int, int]] = []
            # Runs are sorted and separated by gaps, and each added piece lies inside
            # its run, so the concatenation is already sorted and non-touching.
            for start, end in batch:
                added.extend(self.add(start, end))
            return added
        return self._merge_runs(batch)

    def _merge_runs(self, batch: list[tuple[int, int]]) -> list[tuple[int, int]]:
        starts, ends = self._starts, self._ends
        new_starts: list[int] = []
        new_ends: list[int] = []
        added: list[tuple[int, int]] = []
        pos = 0  # existing ranges before pos have been copied/merged into new_*
        for start, end in batch:
            i = bisect_left(ends, start, lo=pos)
            j = bisect_right(starts, end, lo=i)
            if i > pos:
                # Untouched ranges; they cannot touch new_*[-1] (invariant of the input).
                new_starts.extend(starts[pos:i])
                new_ends.extend(ends[pos:i])
            merge_last = bool(new_ends) and new_ends[-1] >= start
            cur = start
            lo = start
            hi = end
            if merge_last:
                # The previous merged range (from an older range reaching past the
                # previous run) overlaps or touches this run.
                cur = max(cur, new_ends[-1])
                lo = new_starts[-1]
                hi = max(hi, new_ends[-1])
            for k in range(i, j):
                s, e = starts[k], ends[k]
                if s > cur:
                    added.append((cur, s))
                cur = max(cur, e)
            if cur < end:
                added.append((cur, end))
            if i < j:
                lo = min(lo, starts[i])
                hi = max(hi, ends[j - 1])
            if merge_last:
                new_starts[-1] = lo
                new_ends[-1] = hi
            else:
                new_starts.append(lo)
                new_ends.append(hi)
            pos = j
        new_starts.extend(starts[pos:])
        new_ends.extend(ends[pos:])
        self._starts = new_starts
        self._ends = new_ends
        for s, e in added:
            self._count += e - s
        return added

    def remove_below(self, x: int) -> None:
        """Remove every member smaller than ``x``."""
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, x)  # ranges 0..i-1 end at or before x: wholly below
        if i:
            self._count -= sum(e - s for s, e in zip(starts[:i], ends[:i], strict=True))
            del starts[:i]
            del ends[:i]
        if starts and starts[0] < x:
            self._count -= x - starts[0]
            starts[0] = x

    def clear(self) -> None:
        """Remove every member."""
        self._starts.clear()
        self._ends.clear()
        self._count = 0

    # -- queries ----------------------------------------------------------------

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, int):
            return False
        i = bisect_right(self._starts, x) - 1
        return i >= 0 and x < self._ends[i]

    def first_gap_at_or_after(self, x: int) -> int:
        """Smallest ``y >= x`` that is not a member."""
        i = bisect_right(self._starts, x) - 1
        if i >= 0 and x < self._ends[i]:
            return self._ends[i]  # ranges never touch, so ends[i] is not a member
        return x

    def gap_at_or_after(self, x: int) -> tuple[int, int | None]:
        """(start, end) of the first run of non-members at or after ``x``: ``start`` as
        :meth:`first_gap_at_or_after`, ``end`` the next member above it (None: none)."""
        starts = self._starts
        i = bisect_right(starts, x)  # the first range starting above x
        if i > 0 and x < self._ends[i - 1]:
            x = self._ends[i - 1]  # inside the range before: the gap starts at its end
        return x, starts[i] if i < len(starts) else None

    def first(self) -> tuple[int, int] | None:
        """The lowest range, or ``None`` when empty."""
        if not self._starts:
            return None
        return self._starts[0], self._ends[0]

    def count(self) -> int:
        """Number of member offsets (not ranges)."""
        return self._count

    def count_below(self, x: int) -> int:
        """Number of member offsets smaller than ``x``."""
        starts, ends = self._starts, self._ends
        # Subtract what lies at or above x; usually nothing, so this is O(log n).
        i = bisect_right(ends, x)  # ranges i.. have end > x
        above = 0
        for k in range(i, len(starts)):
            above += ends[k] - max(starts[k], x)
        return self._count - above

    def ranges(self) -> list[tuple[int, int]]:
        """All ranges, sorted, as ``(start, end)`` tuples."""
        return list(zip(self._starts, self._ends, strict=True))

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.ranges())

    def __len__(self) -> int:
        """Number of ranges (not offsets); see :meth:`count`."""
        return len(self._starts)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self._starts == other._starts and self._ends == other._ends

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"RangeSet({self.ranges()!r})"
