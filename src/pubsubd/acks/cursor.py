"""Ack cursor of one subscription on one message source: mark-delete plus individual acks.

Pure state machine, no I/O (persistence lives in :mod:`pubsubd.acks.journal`).

State: ``mark_delete`` (every offset ``< mark_delete`` is acked) and ``acked``, a
:class:`~pubsubd.acks.ranges.RangeSet` of individually acked offsets above it.

Rules:

1. ``ack``/``ack_range`` add offsets to ``acked``; offsets below ``mark_delete`` or
   already acked are ignored, and the *newly* acked ranges are returned so the caller
   can journal exactly them.
2. After every mutation, if the lowest acked range starts at ``mark_delete``,
   ``mark_delete`` advances to that range's end and the range is dropped. Because
   ranges are coalesced, one step is enough.
3. ``mark_delete`` only moves forward through acked offsets (rule 2); the only
   other way to move it (backwards or forwards) is an explicit ``reset`` (Seek).

Invariants (hold after every public method returns):

* ``mark_delete < start`` for every range in ``acked`` (strictly: ``mark_delete``
  itself is never acked, otherwise rule 2 would have advanced it).
* Hence ``mark_delete`` is the smallest unacked offset.

The acked set is therefore ``{x : x < mark_delete} | acked``; ``ack`` is a set
union (idempotent) and ``reset`` a set replacement, which is what makes journal
replay over a newer snapshot safe.
"""

from __future__ import annotations

from collections.abc import Iterable

from pubsubd.acks.ranges import RangeSet
from pubsubd.core.records import CursorState

__all__ = ["Cursor", "CursorState"]


class Cursor:
    """Mark-delete position plus individually acked ranges above it."""

    __slots__ = ("_acked", "_mark_delete")

    def __init__(self, mark_delete: int) -> None:
        self._mark_delete = mark_delete
        self._acked = RangeSet()

    @classmethod
    def from_state(cls, state: CursorState) -> Cursor:
        cursor = cls(state.mark_delete)
        cursor.reset(state.mark_delete, state.ranges)
        return cursor

    # -- mutation ---------------------------------------------------------------

    def ack(self, offsets: Iterable[int]) -> list[tuple[int, int]]:
        """Ack individual offsets (any order); return the newly acked ranges."""
        md = self._mark_delete
        if not isinstance(offsets, list) or (offsets and min(offsets) < md):
            offsets = [o for o in offsets if o >= md]
        added = self._acked.add_many(offsets)
        if added:
            self._advance()
        return added

    def ack_range(self, start: int, end: int) -> list[tuple[int, int]]:
        """Ack every offset in ``[start, end)``; return the newly acked ranges."""
        added = self._acked.add(max(start, self._mark_delete), end)
        if added:
            self._advance()
        return added

    def reset(self, mark_delete: int, acked_ranges: Iterable[tuple[int, int]] = ()) -> None:
        """Replace the whole state (Seek). Ranges below ``mark_delete`` are clipped."""
        self._mark_delete = mark_delete
        self._acked.clear()
        for start, end in acked_ranges:
            self._acked.add(max(start, mark_delete), end)
        self._advance()

    def _advance(self) -> None:
        # Rule 2. Ranges never touch, so after one step mark_delete is unacked again.
        first = self._acked.first()
        if first is not None and first[0] <= self._mark_delete:
            self._mark_delete = max(self._mark_delete, first[1])
            self._acked.remove_below(self._mark_delete)

    # -- queries ----------------------------------------------------------------

    @property
    def mark_delete(self) -> int:
        """Every offset below this is acked; this offset itself is not."""
        return self._mark_delete

    def is_acked(self, offset: int) -> bool:
        return offset < self._mark_delete or offset in self._acked

    def unacked_run(self, offset: int) -> tuple[int, int | None]:
        """(start, end): every offset in [start, end) is unacked, ``start`` the smallest
        unacked offset ``>= offset`` and ``end`` the next acked one (None: none above)."""
        return self._acked.gap_at_or_after(max(offset, self._mark_delete))

    def acked_ranges(self) -> list[tuple[int, int]]:
        """Individually acked ranges above ``mark_delete``, sorted."""
        return self._acked.ranges()

    def next_unacked(self, offset: int) -> int:
        """Smallest unacked offset ``>= offset``."""
        return self._acked.first_gap_at_or_after(max(offset, self._mark_delete))

    def unacked_count(self, end_offset: int) -> int:
        """Number of unacked offsets below ``end_offset`` (the log end): the backlog."""
        if end_offset <= self._mark_delete:
            return 0
        return end_offset - self._mark_delete - self._acked.count_below(end_offset)

    def snapshot(self) -> CursorState:
        return CursorState(self._mark_delete, tuple(self._acked.ranges()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cursor):
            return NotImplemented
        return self._mark_delete == other._mark_delete and self._acked == other._acked

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Cursor(mark_delete={self._mark_delete}, acked={self._acked.ranges()!r})"
