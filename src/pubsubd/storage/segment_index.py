"""Index files of sealed segments, so that recovery does not read every segment.

Recovery rebuilds each segment's in-memory index (entry offsets, file positions, publish
times) by scanning the segment: ~1.7 s per GB on this project's reference machine, so minutes
for a large log. A segment stops changing when the log rolls past it, so at that moment the
log writes the index it already holds next to the segment, as ``{base:020d}.idx``; recovery
loads that file instead of scanning, and scans only the active (last) segment, the one that
can have a torn tail.

The file is a cache, never the truth: it carries the segment's size and a CRC32C of its own
bytes, and recovery uses it only if both check out (the segment file has exactly that size),
else it scans the segment as before and writes the file again. So it needs no fsync and no
atomic rename: a torn, stale or missing index file only costs a scan. The log's own checks
still guard the data: every read verifies the frames' CRCs against the index, so corruption
inside a sealed segment is reported when it is read instead of at start-up.

Layout (little-endian): magic ``PSDSIDX1``, base, end offset, segment size, entry count (int64
each), then the offsets, file positions and publish times (int64 per entry each), then the
CRC32C of everything before it (u32).
"""

from __future__ import annotations

import logging
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

logger = logging.getLogger(__name__)

SUFFIX = ".idx"
MAGIC = b"PSDSIDX1"
_HEADER = struct.Struct("<8sqqqq")
_CRC = struct.Struct("<I")


def index_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    """What a scan of a sealed segment yields."""

    base: int
    end_offset: int
    size: int
    offsets: array[int]
    positions: array[int]
    times: array[int]


def _little(values: array[int]) -> bytes:
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array("q", values)
    swapped.byteswap()
    return swapped.tobytes()


def _from_little(data: bytes) -> array[int]:
    values = array("q")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def encode(index: SegmentIndex) -> bytes:
    n = len(index.offsets)
    if not len(index.positions) == len(index.times) == n:
        raise ValueError("offsets, positions and times must have one value per entry")
    body = b"".join(
        (
            _HEADER.pack(MAGIC, index.base, index.end_offset, index.size, n),
            _little(index.offsets),
            _little(index.positions),
            _little(index.times),
        )
    )
    return body + _CRC.pack(google_crc32c.value(body))


def decode(data: bytes, base: int) -> SegmentIndex | None:
    """The index in ``data`` if it is whole and describes segment ``base``, else None."""
    if len(data) < _HEADER.size + _CRC.size:
        return None
    body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
    if google_crc32c.value(body) != crc:
        return None
    magic, found_base, end_offset, size, n = _HEADER.unpack_from(body)
    if magic != MAGIC or found_base != base or n < 0 or len(body) != _HEADER.size + 24 * n:
        return None
    start = _HEADER.size
    columns = [_from_little(body[start + 8 * n * k : start + 8 * n * (k + 1)]) for k in range(3)]
    return SegmentIndex(base, end_offset, size, *columns)


def load(directory: Path, base: int, segment_size: int) -> SegmentIndex | None:
    """The index file of segment ``base`` if present, valid and for a segment of exactly
    ``segment_size`` bytes."""
    try:
        data = (directory / index_file_name(base)).read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        logger.warning("%s: index file unreadable", directory, exc_info=True)
        return None
    index = decode(data, base)
    if index is None or index.size != segment_size:
        return None
    return index


def write(directory: Path, index: SegmentIndex) -> None:
    """Write (or replace) the index file of a sealed segment; failures are only logged."""
    try:
        (directory / index_file_name(index.base)).write_bytes(encode(index))
    except OSError:
        logger.warning("%s: writing the index of segment %d failed", directory, index.base)


def delete(directory: Path, base: int) -> None:
    """Remove the index file of a deleted segment; failures are only logged (a leftover file
    describes no segment and is never loaded)."""
    try:
        (directory / index_file_name(base)).unlink(missing_ok=True)
    except OSError:
        logger.warning("%s: deleting the index of segment %d failed", directory, base)
