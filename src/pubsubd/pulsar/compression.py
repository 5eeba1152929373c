"""Payload compression of Pulsar batches (pure): every codec the official client offers.

LZ4 is the raw block format (no frame, the size travels in ``uncompressed_size``), SNAPPY the raw
format, ZSTD a zstd frame, ZLIB a zlib stream (``cramjam`` for the first three, ``zlib`` for the
last).
"""

from __future__ import annotations

import zlib

import cramjam

from pubsubd.pulsar.api import CompressionType

NONE = CompressionType.Value("NONE")
LZ4 = CompressionType.Value("LZ4")
ZLIB = CompressionType.Value("ZLIB")
ZSTD = CompressionType.Value("ZSTD")
SNAPPY = CompressionType.Value("SNAPPY")


# The largest uncompressed payload a SEND may declare, and so what one decompression may
# allocate: a SEND's messages are published in requests of at most 9 MB (producers.py), and
# the official clients batch 128 KB by default. A zeroed buffer this size costs ~1 ms; one of
# 64 MB (the limit before fuzzing) cost ~100 ms, for a SEND of a few bytes.
MAX_UNCOMPRESSED_BYTES = 16 * 1024 * 1024
# LZ4 cannot expand its input more than ~255 times: a larger declared size is not one of its
# outputs, refused before its buffer is allocated.
_LZ4_MAX_RATIO = 255


# Decompression into a buffer of the declared size (cramjam): it cannot write past it.
_INTO = {
    LZ4: cramjam.lz4.decompress_block_into,
    ZSTD: cramjam.zstd.decompress_into,
    SNAPPY: cramjam.snappy.decompress_raw_into,
}


class CompressionError(Exception):
    """A payload that does not decompress to its declared size."""


def decompress(kind: int, data: bytes, uncompressed_size: int) -> bytes:
    """The payload of a SEND with ``compression`` = kind. The output never exceeds the
    declared size (at most ``MAX_UNCOMPRESSED_BYTES``): a payload that would decompress to
    more is refused without being decompressed whole (a few KB of zstd or zlib can stand for
    gigabytes)."""
    if kind == NONE:
        return data
    if not 0 <= uncompressed_size <= MAX_UNCOMPRESSED_BYTES:
        raise CompressionError(f"uncompressed size {uncompressed_size} is too large")
    if kind == LZ4 and uncompressed_size > _LZ4_MAX_RATIO * len(data) + 16:
        raise CompressionError(
            f"payload of {len(data)} bytes cannot decompress to {uncompressed_size} (LZ4)"
        )
    try:
        if kind == SNAPPY and cramjam.snappy.decompress_raw_len(data) != uncompressed_size:
            raise CompressionError(
                f"payload says it decompresses to {cramjam.snappy.decompress_raw_len(data)}"
                f" bytes, metadata says {uncompressed_size}"
            )
        if kind == ZLIB:
            inflater = zlib.decompressobj()
            out = inflater.decompress(data, uncompressed_size + 1)
            if len(out) <= uncompressed_size and not inflater.eof:
                raise CompressionError("payload does not decompress: truncated zlib stream")
        elif kind in _INTO:
            buffer = bytearray(uncompressed_size)
            out = bytes(memoryview(buffer)[: _INTO[kind](data, buffer)])
        else:
            raise CompressionError(f"unknown compression type {kind}")
    except (cramjam.DecompressionError, zlib.error, ValueError) as e:
        raise CompressionError(f"payload does not decompress: {e}") from e
    if len(out) > uncompressed_size:
        raise CompressionError(
            f"payload decompresses to more than the {uncompressed_size} bytes its metadata says"
        )
    if len(out) < uncompressed_size:
        raise CompressionError(
            f"payload decompressed to {len(out)} bytes, metadata says {uncompressed_size}"
        )
    return out


def compress(kind: int, data: bytes) -> bytes:
    """The inverse of decompress (for tests and any future compressed delivery)."""
    if kind == NONE:
        return data
    if kind == LZ4:
        return bytes(cramjam.lz4.compress_block(data, store_size=False))
    if kind == ZLIB:
        return zlib.compress(data)
    if kind == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    if kind == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise CompressionError(f"unknown compression type {kind}")
