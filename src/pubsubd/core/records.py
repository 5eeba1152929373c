"""Plain values that cross role boundaries (pure): what a publishing forwarder, a subscribing
forwarder, the control plane and the frontends hand each other (``core/roles.py``).

Each is a frozen dataclass of numbers, strings and bytes, so the same calls can later go over
a network transport unchanged. The modules that produce them re-export them
(``storage.framing.Entry``, ``acks.cursor.CursorState``, ``storage.damage.DamagedRange``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored log entry: ``count`` messages from ``base_offset`` (a Publish request)."""

    base_offset: int
    count: int
    publish_time_us: int
    payload: bytes

    @property
    def next_offset(self) -> int:
        """The first offset after this entry."""
        return self.base_offset + self.count


@dataclass(frozen=True, slots=True)
class CursorState:
    """A subscription's ack state on one source: every offset below ``mark_delete`` is acked,
    and so are the sorted, disjoint ``ranges`` (start, end) above it."""

    mark_delete: int
    ranges: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class SourceRange:
    """The positions of one publish message source: retained from ``start_offset``, readable
    below ``committed_offset``, assigned below ``end_offset`` (appends in flight included)."""

    start_offset: int
    committed_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class DamagedRange:
    """Offsets ``[first_offset, end_offset)`` stored at bytes ``[byte_start, byte_stop)`` of
    ``path``, unreadable because of ``reason`` (storage/damage.py)."""

    path: str
    first_offset: int
    end_offset: int
    byte_start: int
    byte_stop: int
    reason: str
    found: str
    indexed: bool

    @property
    def messages(self) -> int:
        return self.end_offset - self.first_offset

    def describe(self) -> str:
        return (
            f"offsets [{self.first_offset}, {self.end_offset}) at bytes "
            f"[{self.byte_start}, {self.byte_stop}) of {self.path} ({self.reason}; found by "
            f"{self.found})"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.path,
            "first_offset": self.first_offset,
            "end_offset": self.end_offset,
            "byte_start": self.byte_start,
            "byte_stop": self.byte_stop,
            "reason": self.reason,
            "found": self.found,
        }
