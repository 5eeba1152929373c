"""Unit tests for the entry frame encoding (pubsubd.storage.framing)."""

from __future__ import annotations

import struct

import pytest

from pubsubd.storage.errors import CorruptEntry
from pubsubd.storage.framing import (
    FRAME_OVERHEAD,
    HEADER_SIZE,
    MAX_BODY_BYTES,
    Entry,
    decode_entry,
    decode_frames,
    encode_entry,
    frame_length,
    scan_frames,
)

pytestmark = pytest.mark.unit


def _entries() -> list[Entry]:
    return [
        Entry(0, 1, 1_700_000_000_000_000, b"hello"),
        Entry(1, 3, 1_700_000_000_000_001, b""),
        Entry(4, 2, -5, bytes(range(256)) * 3),
    ]


def test_roundtrip() -> None:
    for entry in _entries():
        frame = encode_entry(entry)
        assert len(frame) == frame_length(len(entry.payload)) == FRAME_OVERHEAD + len(entry.payload)
        assert decode_entry(frame) == entry
        assert decode_entry(memoryview(frame)) == entry
    assert Entry(4, 2, 0, b"").next_offset == 6


def test_decode_frames_walks_a_buffer() -> None:
    frames = [encode_entry(e) for e in _entries()]
    buf = b"".join(frames)
    decoded, end = decode_frames(buf)
    assert end == len(buf)
    assert [d[0] for d in decoded] == _entries()
    assert [d[1] for d in decoded] == [0, len(frames[0]), len(frames[0]) + len(frames[1])]
    assert [d[2] for d in decoded] == [len(f) for f in frames]
    decoded, end = decode_frames(buf, start=len(frames[0]))
    assert [d[0] for d in decoded] == _entries()[1:]
    scan = scan_frames(buf)
    assert scan.problem is None and scan.valid_end == len(buf)
    assert [(f.base_offset, f.count, f.next_offset) for f in scan.frames] == [
        (0, 1, 1),
        (1, 3, 4),
        (4, 2, 6),
    ]


def test_crc_mismatch_is_corrupt() -> None:
    frame = bytearray(encode_entry(Entry(7, 1, 0, b"payload")))
    frame[-1] ^= 0x01
    with pytest.raises(CorruptEntry, match="CRC"):
        decode_entry(bytes(frame))
    scan = scan_frames(bytes(frame))
    assert scan.frames == [] and scan.valid_end == 0 and not scan.torn


def test_bad_length_type_and_trailing_bytes_are_corrupt() -> None:
    frame = encode_entry(Entry(7, 1, 0, b"payload"))
    huge = struct.pack("<I", MAX_BODY_BYTES + 1) + frame[4:]
    with pytest.raises(CorruptEntry, match="length"):
        decode_entry(huge)
    tiny = struct.pack("<I", 3) + frame[4:]
    with pytest.raises(CorruptEntry, match="length"):
        decode_entry(tiny)
    with pytest.raises(CorruptEntry, match="unexpected bytes"):
        decode_entry(frame + b"\x00")


def test_encode_rejects_invalid_entries() -> None:
    with pytest.raises(ValueError):
        encode_entry(Entry(0, 0, 0, b""))
    with pytest.raises(ValueError):
        encode_entry(Entry(-1, 1, 0, b""))


def test_torn_tail_detected_at_every_cut_point() -> None:
    first = encode_entry(Entry(0, 1, 10, b"first entry"))
    second = encode_entry(Entry(1, 2, 11, b"second entry payload"))
    buf = first + second
    for cut in range(len(first) + 1, len(buf)):
        torn = buf[:cut]
        decoded, end = decode_frames(torn)
        assert [d[0].base_offset for d in decoded] == [0]
        assert end == len(first)
        scan = scan_frames(torn)
        assert scan.valid_end == len(first) and scan.torn and scan.problem
        with pytest.raises(CorruptEntry):
            decode_entry(torn[len(first) :])
    for cut in range(1, len(first)):
        assert decode_frames(buf[:cut]) == ([], 0)
    assert scan_frames(buf[: len(first)]).problem is None


def test_corruption_in_the_middle_stops_the_scan() -> None:
    frames = [encode_entry(e) for e in _entries()]
    buf = bytearray(b"".join(frames))
    buf[len(frames[0]) + HEADER_SIZE + 2] ^= 0xFF  # inside the second frame's body
    scan = scan_frames(bytes(buf))
    assert scan.valid_end == len(frames[0])
    assert not scan.torn and scan.problem is not None and "CRC" in scan.problem
