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


class CompressionError(Exception):
    """A payload that does not decompress to its declared size."""


def decompress(kind: int, data: bytes, uncompressed_size: int) -> bytes:
    """The payload of a SEND with ``compression`` = kind."""
    if kind == NONE:
        return data
    if uncompressed_size > 64 * 1024 * 1024:
        raise CompressionError(f"uncompressed size {uncompressed_size} is too large")
    try:
        if kind == LZ4:
            out = bytes(cramjam.lz4.decompress_block(data, output_len=uncompressed_size))
        elif kind == ZLIB:
            out = zlib.decompress(data)
        elif kind == ZSTD:
            out = bytes(cramjam.zstd.decompress(data))
        elif kind == SNAPPY:
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:
            raise CompressionError(f"unknown compression type {kind}")
    except (cramjam.DecompressionError, zlib.error, ValueError) as e:
        raise CompressionError(f"payload does not decompress: {e}") from e
    if len(out) != uncompressed_size:
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
