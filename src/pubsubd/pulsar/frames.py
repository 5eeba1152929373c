"""Pulsar frames: encoding and incremental decoding (pure).

Simple command: ``[totalSize:u32][commandSize:u32][BaseCommand]``. A command with a payload
(SEND, MESSAGE) continues with ``[0x0e01:u16][crc32c:u32][metadataSize:u32][MessageMetadata]
[payload]``, the checksum covering everything after it; the magic and checksum are optional.
A MESSAGE may carry ``[0x0e02:u16][size:u32][BrokerEntryMetadata]`` before the checksum, which
this front never sends and skips when reading. All integers are big-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

MAGIC_CHECKSUM = 0x0E01
MAGIC_BROKER_ENTRY = 0x0E02
# The largest message the front accepts (advertised in CONNECTED.max_message_size), and the
# largest frame: the message plus room for the command and metadata.
MAX_MESSAGE_SIZE = 5 * 1024 * 1024
MAX_FRAME_SIZE = MAX_MESSAGE_SIZE + 64 * 1024

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")


class FrameError(Exception):
    """A frame that cannot be read; the connection cannot be resynchronised after it."""


@dataclass(frozen=True, slots=True)
class Frame:
    command: bytes  # the serialized BaseCommand
    metadata: bytes | None = None  # the serialized MessageMetadata (payload frames only)
    payload: bytes = b""
    checksum_ok: bool | None = None  # None: the frame carried no checksum


def crc32c(data: bytes) -> int:
    return int(google_crc32c.value(data))


def encode_command(command: bytes) -> bytes:
    """A simple frame around a serialized BaseCommand."""
    return _U32.pack(4 + len(command)) + _U32.pack(len(command)) + command


def encode_payload_command(
    command: bytes, metadata: bytes, payload: bytes, *, checksum: bool = True
) -> bytes:
    """A frame with a payload: the command, then (checksum) metadata and payload."""
    body = _U32.pack(len(metadata)) + metadata + payload
    tail = _U16.pack(MAGIC_CHECKSUM) + _U32.pack(crc32c(body)) + body if checksum else body
    return _U32.pack(4 + len(command) + len(tail)) + _U32.pack(len(command)) + command + tail


def parse_frame(body: bytes) -> Frame:
    """One frame without its leading totalSize."""
    if len(body) < 4:
        raise FrameError(f"frame of {len(body)} bytes has no command size")
    (command_size,) = _U32.unpack_from(body, 0)
    end = 4 + command_size
    if command_size == 0 or end > len(body):
        raise FrameError(f"command size {command_size} does not fit a frame of {len(body)} bytes")
    command = body[4:end]
    if end == len(body):
        return Frame(command)
    at = end
    if _magic_at(body, at) == MAGIC_BROKER_ENTRY:
        if at + 6 > len(body):
            raise FrameError("truncated broker entry metadata")
        (size,) = _U32.unpack_from(body, at + 2)
        at += 6 + size
    checksum_ok: bool | None = None
    if _magic_at(body, at) == MAGIC_CHECKSUM:
        if at + 6 > len(body):
            raise FrameError("truncated checksum")
        (expected,) = _U32.unpack_from(body, at + 2)
        at += 6
        checksum_ok = crc32c(body[at:]) == expected
    if at + 4 > len(body):
        raise FrameError("payload frame without a metadata size")
    (metadata_size,) = _U32.unpack_from(body, at)
    meta_end = at + 4 + metadata_size
    if meta_end > len(body):
        raise FrameError(f"metadata size {metadata_size} runs past the frame")
    return Frame(command, body[at + 4 : meta_end], body[meta_end:], checksum_ok)


def _magic_at(body: bytes, at: int) -> int | None:
    return _U16.unpack_from(body, at)[0] if at + 2 <= len(body) else None


class FrameDecoder:
    """Splits a byte stream into frames; feed it whatever the socket read."""

    def __init__(self, max_frame: int = MAX_FRAME_SIZE) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by ``data``; FrameError for a frame that cannot be read."""
        buf = self._buffer
        buf += data
        frames: list[Frame] = []
        at = 0
        while len(buf) - at >= 4:
            (total,) = _U32.unpack_from(buf, at)
            if total > self.max_frame:
                raise FrameError(f"frame of {total} bytes is over the {self.max_frame} limit")
            if len(buf) - at - 4 < total:
                break
            frames.append(parse_frame(bytes(buf[at + 4 : at + 4 + total])))
            at += 4 + total
        del buf[:at]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buffer)
