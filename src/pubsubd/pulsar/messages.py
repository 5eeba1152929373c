"""Pulsar message metadata <-> Pub/Sub messages (pure).

Publish: a SEND's payload (decompressed; a batch split into its messages) becomes one Pub/Sub
message per Pulsar message: properties are attributes, the partition key (or the ordering key
when it is UTF-8) is the ordering key, the event time is the attribute ``pulsar.event_time``
(milliseconds), ``deliver_at_time`` is ``pubsubd.deliver_at`` (core/delays.py), and the dedup
ID ``pulsar/PRODUCER/SEQUENCE_ID`` de-duplicates a producer's retried sends (the Replay API's
PublishDeduplicated). Deliver: the reverse, never compressed: one MESSAGE per Pub/Sub message
(``message_frame``), or several consecutive messages as one Pulsar batch (``batch_frame``: the
client splits it; message i of a batch at entry E is position E + i, ids.py).
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass, field
from typing import Any

from pubsubd.core import delays
from pubsubd.core.wire import read_varint
from pubsubd.pulsar import compression, frames
from pubsubd.pulsar.api import MessageMetadata, SingleMessageMetadata, Type

EVENT_TIME_ATTRIBUTE = "pulsar.event_time"
DEFAULT_PRODUCER = "pubsubd"
_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">II")  # totalSize, commandSize
_CHECKSUM = struct.Struct(">HI")  # magic, crc32c


class BadPayload(Exception):
    """A SEND whose metadata or payload cannot be read (answered with SEND_ERROR)."""


@dataclass(slots=True)
class OutMessage:
    """One Pulsar message as a Pub/Sub message to publish."""

    data: bytes
    attributes: dict[str, str] = field(default_factory=dict)
    ordering_key: str = ""
    dedup_id: str = ""


def _attributes(props: Any, event_time: int, deliver_at_ms: int) -> dict[str, str]:
    attrs = {kv.key: kv.value for kv in props}
    if event_time:
        attrs[EVENT_TIME_ATTRIBUTE] = str(event_time)
    if deliver_at_ms > 0:
        try:
            at = dt.datetime.fromtimestamp(deliver_at_ms / 1000, dt.UTC)
        except (OverflowError, ValueError, OSError):
            raise BadPayload(f"deliver_at_time {deliver_at_ms} is not a time") from None
        attrs[delays.DELIVER_AT] = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return attrs


def _check_text(meta: Any, what: str) -> None:
    """Refuse properties or a partition key that are not UTF-8 (proto2 parsing hands them
    over as ``bytes``; a Pub/Sub attribute or ordering key is text)."""
    if isinstance(meta.partition_key, bytes):
        raise BadPayload(f"{what}: the partition key is not UTF-8")
    for kv in meta.properties:
        if isinstance(kv.key, bytes) or isinstance(kv.value, bytes):
            raise BadPayload(f"{what}: property {kv.key!r} is not UTF-8")


def _ordering_key(partition_key: str, ordering_key: bytes) -> str:
    if ordering_key:
        try:
            return ordering_key.decode()
        except UnicodeDecodeError:
            pass
    return partition_key


def unpack_send(
    producer: str,
    sequence_id: int,
    metadata: bytes,
    payload: bytes,
    dedup_prefix: str = "",
    *,
    plain_fast: bool = True,
) -> list[OutMessage]:
    """The messages of one SEND (its metadata and payload as they came in the frame); each
    message's dedup ID is ``{dedup_prefix}pulsar/{producer}/{sequence ID}``. A batch of plain
    messages is read without a protobuf parse each (``_plain_batch``; ``plain_fast=False``
    reads every batch the general way, for tests that compare the two)."""
    meta = MessageMetadata()
    try:
        meta.ParseFromString(metadata)
    except Exception as e:  # protobuf's DecodeError and friends
        raise BadPayload(f"message metadata does not parse: {e}") from e
    if meta.encryption_algo or meta.num_chunks_from_msg > 1:
        raise BadPayload("encrypted and chunked messages are not supported")
    try:
        body = compression.decompress(meta.compression, payload, meta.uncompressed_size)
    except compression.CompressionError as e:
        raise BadPayload(str(e)) from e
    deliver_at = meta.deliver_at_time if meta.HasField("deliver_at_time") else 0
    first_seq = meta.sequence_id if meta.HasField("sequence_id") else sequence_id
    if not meta.HasField("num_messages_in_batch"):
        _check_text(meta, "message metadata")
        return [
            OutMessage(
                body,
                _attributes(meta.properties, meta.event_time, deliver_at),
                _ordering_key(meta.partition_key, meta.ordering_key),
                f"{dedup_prefix}pulsar/{producer}/{first_seq}",
            )
        ]
    id_prefix = f"{dedup_prefix}pulsar/{producer}/"
    plain = _plain_batch(body, meta.num_messages_in_batch) if plain_fast else None
    if plain is not None:
        delay = _attributes((), 0, deliver_at) if deliver_at > 0 else {}
        return [
            OutMessage(
                body[start:end], dict(delay), "", f"{id_prefix}{first_seq + i if seq < 0 else seq}"
            )
            for i, (start, end, seq) in enumerate(plain)
        ]
    out = []
    at = 0
    for i in range(meta.num_messages_in_batch):
        if at + 4 > len(body):
            raise BadPayload(f"batch ends before message {i} of {meta.num_messages_in_batch}")
        (size,) = _U32.unpack_from(body, at)
        single = SingleMessageMetadata()
        try:
            single.ParseFromString(body[at + 4 : at + 4 + size])
        except Exception as e:
            raise BadPayload(f"batch message {i}: metadata does not parse: {e}") from e
        start = at + 4 + size
        end = start + single.payload_size
        if size > len(body) or end > len(body) or single.payload_size < 0:
            raise BadPayload(f"batch message {i} runs past the payload")
        _check_text(single, f"batch message {i}")
        at = end
        if single.compacted_out:
            continue
        seq = single.sequence_id if single.HasField("sequence_id") else first_seq + i
        properties, event_time = single.properties, single.event_time
        out.append(
            OutMessage(
                body[start:end],
                _attributes(properties, event_time, deliver_at)
                if properties or event_time or deliver_at > 0
                else {},
                _ordering_key(single.partition_key, single.ordering_key),
                f"{id_prefix}{seq}",
            )
        )
    return out


def _plain_batch(body: bytes, count: int) -> list[tuple[int, int, int]] | None:
    """A batch whose every message's metadata is its payload size and maybe its sequence ID,
    nothing else (what the official client sends for a message without properties, keys or
    times), read without a protobuf parse per message: (payload start, end, sequence ID or -1)
    each; None for any other batch (read it the general way, with its checks and errors).

    Those two fields are the bytes ``0x18 varint [0x40 varint]`` (``payload_size = 3``,
    ``sequence_id = 8``; a serializer writes fields in number order). A payload size past the
    batch's end (an int32 protobuf would read otherwise) is left to the general reader."""
    out = []
    at = 0
    end_of_body = len(body)
    for _ in range(count):
        if at + 6 > end_of_body:
            return None
        (size,) = _U32.unpack_from(body, at)
        pos = at + 4
        meta_end = pos + size
        if meta_end > end_of_body or size < 2 or body[pos] != 0x18:
            return None
        read = read_varint(body, pos + 1, meta_end)
        if read is None:
            return None
        payload_size, pos = read
        seq = -1
        if pos < meta_end:
            if body[pos] != 0x40:
                return None
            read = read_varint(body, pos + 1, meta_end)
            if read is None or read[0] >= 1 << 64:
                return None
            seq, pos = read
        if pos != meta_end:
            return None
        end = meta_end + payload_size
        if end > end_of_body:
            return None
        out.append((meta_end, end, seq))
        at = end
    return out


def pack_batch(entries: list[tuple[Any, bytes]]) -> bytes:
    """A batch payload from (SingleMessageMetadata, payload) pairs (the client's format)."""
    parts = []
    for single, payload in entries:
        single.payload_size = len(payload)
        raw = single.SerializeToString()
        parts.append(_U32.pack(len(raw)) + raw + payload)
    return b"".join(parts)


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]
_V = _varint
# Fixed parts of the MESSAGE frame, encoded by hand (the hot path of every delivery; the unit
# tests parse the result with the generated classes): BaseCommand.type = MESSAGE (field 1),
# then CommandMessage as field 9; MessageMetadata.producer_name (field 1).
_MESSAGE_TYPE = b"\x08" + _varint(Type.Value("MESSAGE")) + b"\x4a"
_PRODUCER = b"\x0a" + _varint(len(DEFAULT_PRODUCER)) + DEFAULT_PRODUCER.encode()


def _command(consumer_id: int, ledger: int, entry: int, redelivery: int, partition: int) -> bytes:
    """BaseCommand{type = MESSAGE, message = CommandMessage{consumer_id, message_id{ledger,
    entry, partition when >= 0}, redelivery_count when > 0}}, serialized."""
    mid = b"\x08" + _V(ledger) + b"\x10" + _V(entry)
    if partition >= 0:
        mid += b"\x18" + _V(partition)
    body = b"\x08" + _V(consumer_id) + b"\x12" + _V(len(mid)) + mid
    if redelivery:
        body += b"\x18" + _V(redelivery)
    return _MESSAGE_TYPE + _V(len(body)) + body


def _frame(command: bytes, tail: bytes) -> bytes:
    """A payload frame: ``tail`` is [metadataSize][MessageMetadata][payload], checksummed."""
    return (
        _HEAD.pack(10 + len(command) + len(tail), len(command))
        + command
        + _CHECKSUM.pack(frames.MAGIC_CHECKSUM, frames.crc32c(tail))
        + tail
    )


def _publish_ms(message: Any) -> int:
    pt = message.publish_time
    return int(pt.seconds * 1000 + pt.nanos // 1_000_000)


# Tags (field << 3 | wire type) of properties, partition_key and event_time in
# MessageMetadata (fields 4, 6, 12) and SingleMessageMetadata (fields 1, 2, 5).
_META_TAGS = (b"\x22", b"\x32", b"\x60")
_SINGLE_TAGS = (b"\x0a", b"\x12", b"\x28")


def _properties(message: Any, tags: tuple[bytes, bytes, bytes]) -> bytes:
    """The attributes as properties, the ordering key as partition key and the event time
    attribute as event time, serialized with ``tags``; empty for a message with neither."""
    attributes = message.attributes
    key = message.ordering_key
    if not attributes and not key:
        return b""
    prop_tag, key_tag, event_time_tag = tags
    parts: list[bytes] = []
    event_time = 0
    for name, value in attributes.items():
        if name == EVENT_TIME_ATTRIBUTE and value.isdigit():
            event_time = int(value)
            continue
        k, v = name.encode(), value.encode()
        kv = b"\x0a" + _V(len(k)) + k + b"\x12" + _V(len(v)) + v
        parts += (prop_tag, _V(len(kv)), kv)
    if key:
        key_bytes = key.encode()
        parts += (key_tag, _V(len(key_bytes)), key_bytes)
    if event_time:
        parts += (event_time_tag, _V(event_time))
    return b"".join(parts)


def message_frame(
    consumer_id: int,
    ledger: int,
    entry: int,
    redelivery_count: int,
    message: Any,
    partition: int = -1,
) -> bytes:
    """The MESSAGE frame delivering a Pub/Sub ``message`` (a PubsubMessage) to a consumer:
    CommandMessage{consumer_id, message_id{ledger, entry, partition when >= 0},
    redelivery_count} and MessageMetadata{producer_name, sequence_id = entry, publish_time (ms),
    properties = attributes, partition_key = ordering key, event_time}, with its checksum.
    Written out in one piece (``frames.encode_payload_command``'s layout)."""
    command = _command(consumer_id, ledger, entry, redelivery_count, partition)
    meta = _PRODUCER + b"\x10" + _V(entry) + b"\x18" + _V(_publish_ms(message))
    if message.attributes or message.ordering_key:
        meta += _properties(message, _META_TAGS)
    return _frame(command, _U32.pack(len(meta)) + meta + message.data)


def batch_frame(
    consumer_id: int,
    ledger: int,
    entry: int,
    redelivery_count: int,
    batch: list[Any],
    partition: int = -1,
) -> bytes:
    """One MESSAGE frame delivering the PubsubMessages ``batch`` (positions ``entry``,
    ``entry`` + 1, ...) as a Pulsar batch: MessageMetadata{producer_name, sequence_id = entry,
    publish_time (ms) of the first message, num_messages_in_batch} and the payload
    ``n x ([size:u32][SingleMessageMetadata{properties, partition_key, payload_size,
    event_time}][data])``, the client's own batch format. The caller puts in one batch only
    messages with the same publish time and redelivery count (the batch carries one of each).
    """
    return stored_batch_frame(
        consumer_id, ledger, entry, redelivery_count, _publish_ms(batch[0]), batch, partition
    )


def _data_head(size: int) -> bytes:
    """A batch message's size and SingleMessageMetadata{payload_size = size} (a message with
    nothing but data), kept for sizes up to ``_DATA_HEADS_MAX``."""
    single = b"\x18" + _V(size)
    head = _U32.pack(len(single)) + single
    if size <= _DATA_HEADS_MAX:
        _DATA_HEADS[size] = head
    return head


# The heads of data-only batch messages by data size (at most _DATA_HEADS_MAX + 1 entries).
_DATA_HEADS: dict[int, bytes] = {}
_DATA_HEADS_MAX = 65536


def stored_batch_frame(
    consumer_id: int,
    ledger: int,
    entry: int,
    redelivery_count: int,
    publish_ms: int,
    batch: list[Any],
    partition: int = -1,
) -> bytes:
    """:func:`batch_frame` with the publish time given, each item a PubsubMessage or, for a
    message with nothing but data (``stored.plain``), its data bytes."""
    command = _command(consumer_id, ledger, entry, redelivery_count, partition)
    meta = _PRODUCER + b"\x10" + _V(entry) + b"\x18" + _V(publish_ms) + b"\x58" + _V(len(batch))
    parts = [_U32.pack(len(meta)), meta]
    pack = _U32.pack
    heads = _DATA_HEADS
    for message in batch:  # once per delivered message: kept lean
        if type(message) is bytes:
            head = heads.get(len(message))
            if head is None:
                head = _data_head(len(message))
            parts += (head, message)
            continue
        data: bytes = message.data
        single = b"\x18" + _V(len(data))
        if message.attributes or message.ordering_key:
            single = _properties(message, _SINGLE_TAGS) + single
        parts += (pack(len(single)), single, data)
    return _frame(command, b"".join(parts))
