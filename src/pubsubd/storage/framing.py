"""Encoding and decoding of log entries as self-checking frames (pure, no I/O).

A segment file is a plain concatenation of frames. Every integer is little-endian.

Frame layout:

=========  ====  ==============  ===================================================
offset     size  field           meaning
=========  ====  ==============  ===================================================
0          4     body_length     u32, number of body bytes that follow the header
4          4     body_crc32c     u32, CRC32C (Castagnoli) of the body bytes
8          1     entry_type      u8, ``1`` = data entry (no other type exists yet)
9          8     base_offset     u64, offset of the first message in the entry
17         4     count           u32, number of messages in the entry (>= 1)
21         8     publish_time    i64, publish time in microseconds since the epoch
29         n     payload         opaque bytes (``n = body_length - 21``)
=========  ====  ==============  ===================================================

An entry covers the offsets ``[base_offset, base_offset + count)``. A frame is valid when
its whole body is present, ``21 <= body_length <= MAX_BODY_BYTES``, the CRC matches,
the entry type is known and ``count >= 1``. Scanning stops at the first invalid frame:
recovery uses that position to cut a torn tail off the last segment, or, when a valid frame
follows it (:func:`find_next_frame`), to mark the bytes in between as damaged and go on.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from pubsubd.core.records import Entry
from pubsubd.storage.errors import CorruptEntry

__all__ = [
    "FRAME_OVERHEAD",
    "Entry",
    "FrameInfo",
    "ScanResult",
    "decode_entry",
    "decode_frame_at",
    "decode_frames",
    "encode_entry",
    "find_next_frame",
    "frame_length",
    "scan_frames",
]

_HEADER = struct.Struct("<II")
_BODY_PREFIX = struct.Struct("<BQIq")

HEADER_SIZE = _HEADER.size  # 8
BODY_PREFIX_SIZE = _BODY_PREFIX.size  # 21
FRAME_OVERHEAD = HEADER_SIZE + BODY_PREFIX_SIZE  # bytes a frame adds around its payload

ENTRY_TYPE_DATA = 1

# Largest accepted body: bigger than any publish batch (Pub/Sub caps requests at 10 MB),
# small enough that a garbage length field is recognised as corruption, not a huge read.
MAX_BODY_BYTES = 64 << 20
MAX_PAYLOAD_BYTES = MAX_BODY_BYTES - BODY_PREFIX_SIZE

_MAX_U32 = (1 << 32) - 1
_MAX_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """A valid frame's position and entry metadata, without its payload."""

    position: int
    length: int
    base_offset: int
    count: int
    publish_time_us: int

    @property
    def end(self) -> int:
        """The buffer position just after this frame."""
        return self.position + self.length

    @property
    def next_offset(self) -> int:
        """The first offset after this frame's entry."""
        return self.base_offset + self.count


@dataclass(frozen=True, slots=True)
class ScanResult:
    """Outcome of scanning a buffer: the valid prefix and why it ended."""

    frames: list[FrameInfo]
    valid_end: int  # position just after the last valid frame
    problem: str | None  # why the frame at valid_end is invalid; None if none is there
    torn: bool  # the invalid frame is incomplete: it runs past the end of the buffer


class _BadFrame(Exception):
    def __init__(self, problem: str, *, torn: bool) -> None:
        super().__init__(problem)
        self.problem = problem
        self.torn = torn


def frame_length(payload_length: int) -> int:
    """Size on disk of a frame carrying ``payload_length`` payload bytes."""
    return FRAME_OVERHEAD + payload_length


def encode_entry(entry: Entry) -> bytes:
    """Serialize ``entry`` into one frame (header + body)."""
    if entry.count < 1 or entry.count > _MAX_U32:
        raise ValueError(f"entry count must be in [1, {_MAX_U32}], got {entry.count}")
    if entry.base_offset < 0 or entry.base_offset > _MAX_U64:
        raise ValueError(f"base_offset out of range: {entry.base_offset}")
    if len(entry.payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload of {len(entry.payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    prefix = _BODY_PREFIX.pack(
        ENTRY_TYPE_DATA, entry.base_offset, entry.count, entry.publish_time_us
    )
    crc = google_crc32c.extend(google_crc32c.value(prefix), entry.payload)
    header = _HEADER.pack(BODY_PREFIX_SIZE + len(entry.payload), crc)
    return b"".join((header, prefix, entry.payload))


def _body_at(buf: bytes | memoryview, pos: int) -> tuple[bytes, int]:
    """Return the checked body of the frame at ``pos`` and the frame's total length."""
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise _BadFrame(f"incomplete header ({available} of {HEADER_SIZE} bytes)", torn=True)
    body_length, crc = _HEADER.unpack_from(buf, pos)
    if body_length < BODY_PREFIX_SIZE or body_length > MAX_BODY_BYTES:
        raise _BadFrame(f"invalid body length {body_length}", torn=False)
    if available - HEADER_SIZE < body_length:
        have = available - HEADER_SIZE
        raise _BadFrame(f"incomplete body ({have} of {body_length} bytes)", torn=True)
    body = bytes(buf[pos + HEADER_SIZE : pos + HEADER_SIZE + body_length])
    actual = google_crc32c.value(body)
    if actual != crc:
        raise _BadFrame(f"CRC mismatch (stored {crc:#010x}, computed {actual:#010x})", torn=False)
    entry_type, _, count, _ = _BODY_PREFIX.unpack_from(body)
    if entry_type != ENTRY_TYPE_DATA:
        raise _BadFrame(f"unknown entry type {entry_type}", torn=False)
    if count < 1:
        raise _BadFrame("entry count is 0", torn=False)
    return body, HEADER_SIZE + body_length


def _entry_from_body(body: bytes) -> Entry:
    _, base_offset, count, publish_time_us = _BODY_PREFIX.unpack_from(body)
    return Entry(base_offset, count, publish_time_us, body[BODY_PREFIX_SIZE:])


def decode_entry(frame: bytes | memoryview) -> Entry:
    """Decode exactly one frame; raise :class:`CorruptEntry` if it is invalid or has extra bytes."""
    try:
        body, length = _body_at(frame, 0)
    except _BadFrame as exc:
        raise CorruptEntry(exc.problem) from None
    if length != len(frame):
        raise CorruptEntry(f"{len(frame) - length} unexpected bytes after the frame")
    return _entry_from_body(body)


def decode_frame_at(buf: bytes | memoryview, pos: int) -> tuple[Entry, int]:
    """Decode the frame at ``pos`` of ``buf``; return it and its length. Raise
    :class:`CorruptEntry` naming the problem if it is invalid or incomplete."""
    try:
        body, length = _body_at(buf, pos)
    except _BadFrame as exc:
        raise CorruptEntry(exc.problem) from None
    return _entry_from_body(body), length


def scan_frames(buf: bytes | memoryview, start: int = 0) -> ScanResult:
    """Walk the frames of ``buf`` from ``start`` (metadata only) until the first invalid one."""
    frames: list[FrameInfo] = []
    pos = start
    while pos < len(buf):
        try:
            body, length = _body_at(buf, pos)
        except _BadFrame as exc:
            return ScanResult(frames, pos, exc.problem, exc.torn)
        _, base_offset, count, publish_time_us = _BODY_PREFIX.unpack_from(body)
        frames.append(FrameInfo(pos, length, base_offset, count, publish_time_us))
        pos += length
    return ScanResult(frames, pos, None, False)


def decode_frames(
    buf: bytes | memoryview, start: int = 0
) -> tuple[list[tuple[Entry, int, int]], int]:
    """Decode consecutive valid frames of ``buf`` from ``start``.

    Returns ``([(entry, position, frame_length), ...], valid_end)``; decoding stops at
    the first incomplete or corrupt frame, so ``valid_end < len(buf)`` means the bytes
    from ``valid_end`` on are a torn tail or corruption (use :func:`scan_frames` for why).
    """
    decoded: list[tuple[Entry, int, int]] = []
    pos = start
    while pos < len(buf):
        try:
            body, length = _body_at(buf, pos)
        except _BadFrame:
            break
        decoded.append((_entry_from_body(body), pos, length))
        pos += length
    return decoded, pos


# Resynchronisation after a damaged frame accepts a frame only if its base offset is at most
# this far past the expected one: a random match in damaged bytes is then ~2^-32 (CRC) times
# this window's share of the offset space, and a real gap is never near this large.
MAX_RESYNC_OFFSET_GAP = 1 << 32


def find_next_frame(buf: bytes, start: int, min_offset: int) -> FrameInfo | None:
    """The first valid frame starting after ``start`` whose base offset is in
    ``[min_offset, min_offset + MAX_RESYNC_OFFSET_GAP)``, or None.

    Used after an invalid frame that is not a torn tail. Candidates are the positions 8 bytes
    before each entry-type byte; cheap header checks come before the CRC, so resynchronising
    over a damaged megabyte costs well under a second."""
    limit = len(buf) - FRAME_OVERHEAD
    type_byte = bytes((ENTRY_TYPE_DATA,))
    pos = start + 1
    while pos <= limit:
        found = buf.find(type_byte, pos + HEADER_SIZE)
        if found < 0:
            return None
        pos = found - HEADER_SIZE
        if pos > limit:
            return None
        body_length, _ = _HEADER.unpack_from(buf, pos)
        if BODY_PREFIX_SIZE <= body_length <= min(MAX_BODY_BYTES, len(buf) - pos - HEADER_SIZE):
            _, base_offset, count, _ = _BODY_PREFIX.unpack_from(buf, pos + HEADER_SIZE)
            if count >= 1 and min_offset <= base_offset < min_offset + MAX_RESYNC_OFFSET_GAP:
                try:
                    body, length = _body_at(buf, pos)
                except _BadFrame:
                    pass
                else:
                    _, base_offset, count, publish_time_us = _BODY_PREFIX.unpack_from(body)
                    return FrameInfo(pos, length, base_offset, count, publish_time_us)
        pos += 1
    return None
