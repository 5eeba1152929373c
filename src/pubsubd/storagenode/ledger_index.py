"""One ledger's in-memory index on a storage node, and the rules an append must pass (pure).

A ledger file is a concatenation of frames (storage/framing.py) with consecutive offsets from
the ledger's first offset on. The index keeps, per frame, its base offset and its position in
the file (two ``array('q')``: 16 bytes per entry), the end offset, the size in bytes and the
digest: CRC32C over the frames' CRC fields in order, extended frame by frame, so two copies
holding the same entries have the same digest without reading them again.

:func:`plan_append` decides what an append does against what the node holds durable:

- frames from the node's end (or from ``first_offset`` for a new ledger): write them all;
- frames starting past the end: :class:`AppendGap` naming the node's end;
- frames starting inside what is stored (a retry): the overlapping bytes must equal the stored
  ones (the caller compares them, :attr:`AppendPlan.compare_at`) and only the tail after the
  node's end is written; an overlap that does not start on a stored entry's boundary, or a
  different first offset, is :class:`OverlapMismatch`;
- frames before the ledger's first offset: :class:`BadFrames`.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import pairwise

import google_crc32c

from pubsubd.storage.framing import FrameInfo, scan_frames
from pubsubd.storagenode.errors import AppendGap, BadFrames, BadRead, OverlapMismatch

_CRC = struct.Struct("<I")
CRC_FIELD = 4  # the frame's CRC field is bytes [4, 8) of its header


def frame_crc(buf: bytes | memoryview, position: int) -> int:
    """The CRC field of the frame at ``position``."""
    return int(_CRC.unpack_from(buf, position + CRC_FIELD)[0])


def extend_digest(digest: int, crcs: list[int]) -> int:
    """``digest`` extended by these frames' CRC fields (little-endian, as stored)."""
    if not crcs:
        return digest
    return int(google_crc32c.extend(digest, struct.pack(f"<{len(crcs)}I", *crcs)))


@dataclass(frozen=True, slots=True)
class Frames:
    """Consecutive valid frames of a buffer: positions relative to it, their CRC fields."""

    frames: list[FrameInfo]
    crcs: list[int]
    size: int  # bytes of the frames (the whole buffer when parsed by parse_frames)

    @property
    def first_offset(self) -> int:
        return self.frames[0].base_offset

    @property
    def end_offset(self) -> int:
        return self.frames[-1].next_offset

    def tail(self, position: int) -> Frames:
        """The frames from byte ``position`` on (a frame boundary), rebased to it."""
        start = next(i for i, f in enumerate(self.frames) if f.position == position)
        frames = [
            FrameInfo(f.position - position, f.length, f.base_offset, f.count, f.publish_time_us)
            for f in self.frames[start:]
        ]
        return Frames(frames, self.crcs[start:], self.size - position)


def parse_frames(ledger_id: int, buf: bytes) -> Frames:
    """Every frame of ``buf``, checked: framing, CRC, consecutive offsets. Raise
    :class:`BadFrames` naming the first problem."""
    scan = scan_frames(buf)
    if scan.problem is not None:
        raise BadFrames(ledger_id, f"frame at byte {scan.valid_end}: {scan.problem}")
    frames = scan.frames
    for prev, frame in pairwise(frames):
        if frame.base_offset != prev.next_offset:
            raise BadFrames(
                ledger_id,
                f"offsets are not consecutive: the frame at byte {frame.position} starts at"
                f" offset {frame.base_offset}, expected {prev.next_offset}",
            )
    return Frames(frames, [frame_crc(buf, f.position) for f in frames], len(buf))


@dataclass(frozen=True, slots=True)
class ScannedCopy:
    """What start-up recovery finds in one disk's copy of a ledger file."""

    frames: Frames
    file_size: int
    problem: str | None  # why the valid prefix ends before the file does (None: it does not)
    torn: bool  # the invalid bytes are an incomplete frame at the end (a crash mid-write)

    @property
    def valid_end(self) -> int:
        return self.frames.size


def scan_copy(buf: bytes | memoryview) -> ScannedCopy:
    """The longest prefix of ``buf`` made of valid frames with consecutive offsets."""
    scan = scan_frames(buf)
    frames = scan.frames
    problem, torn, valid_end = scan.problem, scan.torn, scan.valid_end
    for i in range(1, len(frames)):
        if frames[i].base_offset != frames[i - 1].next_offset:
            valid_end = frames[i].position
            problem = (
                f"offset {frames[i].base_offset} where {frames[i - 1].next_offset} was expected"
            )
            torn = False
            frames = frames[:i]
            break
    crcs = [frame_crc(buf, f.position) for f in frames]
    return ScannedCopy(Frames(frames, crcs, valid_end), len(buf), problem, torn)


def common_prefix(a: Frames, b: Frames) -> int:
    """How many leading frames ``a`` and ``b`` share (same offsets, lengths and CRCs)."""
    n = 0
    for fa, fb, ca, cb in zip(a.frames, b.frames, a.crcs, b.crcs, strict=False):
        if (fa.base_offset, fa.length, ca) != (fb.base_offset, fb.length, cb):
            break
        n += 1
    return n


class LedgerIndex:
    """The durable entries of one ledger on this node (at least one)."""

    __slots__ = ("_bases", "_positions", "digest", "end_offset", "first_offset", "size")

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self.end_offset = first_offset
        self.size = 0
        self.digest = 0
        self._bases = array("q")
        self._positions = array("q")

    @property
    def count(self) -> int:
        return len(self._bases)

    def add(self, frames: Frames) -> None:
        """Record ``frames`` (positions relative to their buffer) written at the end."""
        if not frames.frames:
            return
        if frames.first_offset != self.end_offset:
            raise ValueError(
                f"frames from {frames.first_offset}, the index ends at {self.end_offset}"
            )
        at = self.size
        self._bases.extend(f.base_offset for f in frames.frames)
        self._positions.extend(at + f.position for f in frames.frames)
        self.end_offset = frames.end_offset
        self.size = at + frames.size
        self.digest = extend_digest(self.digest, frames.crcs)

    def frame_index(self, offset: int) -> int | None:
        """Which frame starts at ``offset``, or None."""
        i = bisect_left(self._bases, offset)
        if i < len(self._bases) and self._bases[i] == offset:
            return i
        return None

    def position(self, i: int) -> int:
        """Byte position of frame ``i`` (``count`` gives the size)."""
        return self._positions[i] if i < len(self._positions) else self.size

    def read_span(self, ledger_id: int, start: int, end: int, max_bytes: int) -> tuple[int, int]:
        """The bytes ``[from, to)`` of whole frames from offset ``start``, with base offsets
        below ``end`` (0: no bound), at most ``max_bytes`` but at least one frame."""
        if start >= self.end_offset or (end > 0 and end <= start):
            return self.size, self.size
        i = self.frame_index(start)
        if i is None:
            if start < self.first_offset:
                raise BadRead(
                    f"ledger {ledger_id}: offset {start} is before its first offset"
                    f" {self.first_offset}"
                )
            raise BadRead(f"ledger {ledger_id}: offset {start} is not an entry's base offset")
        count = len(self._bases)
        begin = self._positions[i]
        limit = begin + max_bytes
        # Frames i..t-1 end at position(t); the largest t with position(t) <= limit.
        e = bisect_right(self._positions, limit, i + 1, count)
        t = count if e == count and self.size <= limit else e - 1
        t = max(t, i + 1)
        if end > 0:
            t = min(t, bisect_left(self._bases, end, i + 1, count))
        return begin, self.position(t)


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """What to do with an append that passed the rules."""

    compare_at: int  # stored position the request's first ``compare_bytes`` must equal
    compare_bytes: int  # 0: nothing overlaps
    tail_start: int  # the request's bytes from here on are new
    tail: Frames  # the new frames, positions relative to tail_start


def plan_append(
    ledger_id: int, index: LedgerIndex | None, first_offset: int, frames: Frames
) -> AppendPlan:
    """Check an append of ``frames`` (non-empty, parsed) against the durable ``index``."""
    base = frames.first_offset
    everything = AppendPlan(0, 0, 0, frames)
    if index is None:
        if base < first_offset:
            raise BadFrames(
                ledger_id, f"frames start at offset {base}, before first_offset {first_offset}"
            )
        if base > first_offset:
            raise AppendGap(ledger_id, base, first_offset)
        return everything
    if first_offset != index.first_offset:
        raise OverlapMismatch(
            ledger_id,
            f"the ledger starts at offset {index.first_offset} on this node, not {first_offset}",
            index.end_offset,
        )
    if base < index.first_offset:
        raise BadFrames(
            ledger_id,
            f"frames start at offset {base}, before the ledger's first offset {first_offset}",
        )
    if base > index.end_offset:
        raise AppendGap(ledger_id, base, index.end_offset)
    if base == index.end_offset:
        return everything
    i = index.frame_index(base)
    if i is None:
        raise OverlapMismatch(
            ledger_id,
            f"the append starts at offset {base}, inside a stored entry",
            index.end_offset,
        )
    stored_from = index.position(i)
    stored = index.size - stored_from
    if stored >= frames.size:
        return AppendPlan(stored_from, frames.size, frames.size, Frames([], [], 0))
    if not any(f.position == stored for f in frames.frames):
        raise OverlapMismatch(
            ledger_id,
            f"the append's entries from offset {base} differ from the stored ones",
            index.end_offset,
        )
    return AppendPlan(stored_from, stored, stored, frames.tail(stored))
