"""Stored entries turned back into messages, and a bounded cache of them (pure, no I/O).

A log entry holds a serialized PublishRequest exactly as the client sent it, so the publish path
never re-encodes messages. Readers (the subscribing forwarder's dispatchers, the replay API)
decode an entry once into serialized PubsubMessages with their message ID and publish time set,
ready to frame into responses (``core/wire.py``); :class:`DecodeCache` keeps recent ones for
fan-out to several subscriptions and for redeliveries.

How: each message's stored bytes come out of one protobuf parse as a list (the request read
with ``messages`` declared ``repeated bytes``), and the message ID and publish time are appended
as fields 3 and 4 (a parser keeps the last occurrence of a singular string field, so an ID a
client sent is overridden; the reserved dedup attribute's map entry is cut out of the bytes).
That costs ~0.5 µs per message where parsing, setting and re-serializing each message costs ~3.
A message whose stored bytes already carry a ``publish_time`` (a message field: a second
occurrence would be *merged* with it, not replace it), or whose wire form the cutter does not
read (an unknown field of another wire type, a tag over one byte), sends its entry down the
protobuf path. The parsed messages (``DecodedEntry.parsed``: filters, dead letters, the replay
API) get the same ID, publish time and attributes, set on first use.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from pubsubd.core import flat_views, ids, pb
from pubsubd.core.delays import MARKER, due_times
from pubsubd.core.validation import DEDUP_ID_ATTRIBUTE
from pubsubd.core.wire import varint
from pubsubd.storage.framing import Entry

_DEDUP_KEY = DEDUP_ID_ATTRIBUTE.encode()
# A map entry's key field holding the reserved attribute: field 1, its length, the key.
_DEDUP_ENTRY_KEY = b"\x0a" + bytes([len(_DEDUP_KEY)]) + _DEDUP_KEY
_MESSAGE_ID = b"\x1a"  # PubsubMessage.message_id: field 3, length-delimited
_PUBLISH_TIME = b"\x22"  # PubsubMessage.publish_time: field 4, length-delimited

# Decoded entries kept per topic, bounded by the stored size of the entries (the decoded form
# is about twice that).
DECODE_CACHE_BYTES = 32 << 20


def _views() -> tuple[Any, Any]:
    """``RawMessages``: PublishRequest with ``messages`` (2) as ``repeated bytes``, each
    message's stored bytes. ``PublishTimes``: ``messages`` read as one merged message (the
    merge rule of ``core/flat_views.py``) whose ``publish_time`` (4) is ``repeated bytes``: every
    occurrence of the field in any message."""
    f = descriptor_pb2.FieldDescriptorProto
    package = "pubsubd.decoding"
    proto = descriptor_pb2.FileDescriptorProto(
        name="pubsubd/decoding_views.proto", package=package, syntax="proto3"
    )
    raw = proto.message_type.add(name="RawMessages")
    raw.field.add(name="messages", number=2, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    times = proto.message_type.add(name="Times")
    times.field.add(name="publish_time", number=4, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    view = proto.message_type.add(name="PublishTimes")
    view.field.add(
        name="messages",
        number=2,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_OPTIONAL,
        type_name=f".{package}.Times",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)

    def cls(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))

    return cls("RawMessages"), cls("PublishTimes")


_RawMessages, _PublishTimes = _views()


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    entry: Entry
    messages: list[bytes]  # serialized PubsubMessage per offset, message_id/publish_time set
    ordering_key: str  # one per entry: every message of a PublishRequest shares it
    # epoch microseconds before which each message must not be delivered; None if none is delayed
    deliver_at: list[int | None] | None = None
    source: int = 0
    # the parsed messages; ``_ready`` holds True once their ID, publish time and attributes are
    # set as in ``messages`` (on first use of ``parsed``)
    _parsed: Any = field(default=None, compare=False, repr=False)
    _ready: list[bool] = field(default_factory=list, compare=False, repr=False)
    # memo of plain_data(): empty until first asked (only the replay API's Read asks)
    _plain: list[list[bytes] | None] = field(default_factory=list, compare=False, repr=False)

    @property
    def parsed(self) -> Any:
        """The parsed PubsubMessages (repeated field), for attributes and filters: message ID
        and publish time set, the reserved dedup attribute removed, as in ``messages``."""
        if not self._ready:
            _complete(self._parsed, self.source, self.entry)
            self._ready.append(True)
        return self._parsed

    def plain_data(self) -> list[bytes] | None:
        """Every message's data in one list when no message has an attribute but the reserved
        one (so a columnar Read needs no parsed message), else None: read ``parsed``."""
        memo = self._plain
        if not memo:
            memo.append(_plain_data(self.entry.payload, len(self.messages)))
        return memo[0]


def decode(source: int, entry: Entry) -> DecodedEntry:
    """An entry's messages, serialized with message_id and publish_time set; the reserved dedup
    attribute is stripped (stored for the dedup window only, never delivered)."""
    payload = entry.payload
    request = pb.PublishRequest.FromString(payload)
    parsed = request.messages
    delays = due_times(parsed, entry.publish_time_us) if MARKER in payload else None
    ordering_key = parsed[0].ordering_key if parsed else ""
    messages = _spliced(source, entry)
    if messages is not None:
        return DecodedEntry(entry, messages, ordering_key, delays, source, parsed)
    _complete(parsed, source, entry)
    messages = [m.SerializeToString() for m in parsed]
    return DecodedEntry(entry, messages, ordering_key, delays, source, parsed, [True])


def _complete(parsed: Any, source: int, entry: Entry) -> None:
    """Set the parsed messages' IDs and publish time, and drop the reserved attribute."""
    seconds, micros = divmod(entry.publish_time_us, 1_000_000)
    base = ids.position(source, entry.base_offset)
    for i, m in enumerate(parsed):
        m.message_id = str(base + i)
        m.publish_time.seconds = seconds
        m.publish_time.nanos = micros * 1000
        attrs = m.attributes
        if attrs and DEDUP_ID_ATTRIBUTE in attrs:
            del attrs[DEDUP_ID_ATTRIBUTE]


def _spliced(source: int, entry: Entry) -> list[bytes] | None:
    """Every message's stored bytes with its ID and the publish time appended (and the
    reserved attribute cut out); None when the protobuf path must do it (module docstring)."""
    payload = entry.payload
    if b"\x22" in payload and _PublishTimes.FromString(payload).messages.publish_time:
        return None
    raw = list(_RawMessages.FromString(payload).messages)
    if _DEDUP_KEY in payload:
        cut = [_without_dedup(m) for m in raw]
        if None in cut:
            return None
        raw = cut  # type: ignore[assignment]
    seconds, micros = divmod(entry.publish_time_us, 1_000_000)
    stamp = (b"\x08" + varint(seconds) if seconds else b"") + (
        b"\x10" + varint(micros * 1000) if micros else b""
    )
    stamp_field = _PUBLISH_TIME + varint(len(stamp)) + stamp
    base = ids.position(source, entry.base_offset)
    end = base + len(raw)
    # A message ID is at most 20 digits: its length is one varint byte. When every ID of the
    # entry has as many digits (nearly always), one format string appends ID and time.
    digits = len(b"%d" % base)
    if digits == len(b"%d" % (end - 1)):
        template = b"%b" + _MESSAGE_ID + bytes((digits,)) + b"%d" + stamp_field.replace(b"%", b"%%")
        return [template % (m, p) for m, p in zip(raw, range(base, end), strict=True)]
    return [
        m + _MESSAGE_ID + bytes((len(mid),)) + mid + stamp_field
        for m, mid in zip(raw, [b"%d" % p for p in range(base, end)], strict=True)
    ]


def _without_dedup(m: bytes) -> bytes | None:
    """A stored message's bytes without the reserved attribute's map entries; None if a field
    is not length-delimited with a one-byte tag (PubsubMessage's fields all are) or an entry of
    the reserved key is not exactly key and value."""
    at = m.find(_DEDUP_ENTRY_KEY)
    if at < 0:
        return m
    # The common form first: data, then the reserved attribute's entry, nothing after it (a
    # Pulsar producer's message without properties or key); the entry's lengths one byte each.
    if at >= 4 and m[0] == 0x0A and m[at - 2] == 0x12 and m[at - 1] < 0x80:
        data_length, j = _varint_at(m, 1)
        end = at + m[at - 1]
        value = at + len(_DEDUP_ENTRY_KEY)
        if (
            j + data_length == at - 2
            and end == len(m)
            and value + 1 < end
            and m[value] == 0x12
            and m[value + 1] < 0x80
            and value + 2 + m[value + 1] == end
        ):
            return m[: at - 2]
    parts: list[bytes] = []
    kept = 0  # start of the bytes not yet copied
    i, n = 0, len(m)
    key_length = len(_DEDUP_ENTRY_KEY)
    while i < n:
        tag = m[i]
        if tag & 7 != 2 or tag >= 0x80 or i + 1 >= n:
            return None
        length = m[i + 1]
        if length < 0x80:
            j = i + 2
        else:
            length, j = _varint_at(m, i + 1)
        end = j + length
        if end > n:
            return None
        if tag == 0x12 and m.startswith(_DEDUP_ENTRY_KEY, j):
            k = j + key_length  # the value's tag: field 2, length-delimited
            if k >= end or m[k] != 0x12:
                return None
            value_length, v = _varint_at(m, k + 1)
            if v + value_length != end:
                return None
            parts.append(m[kept:i])
            kept = end
        i = end
    parts.append(m[kept:])
    return b"".join(parts)


def _varint_at(m: bytes, i: int) -> tuple[int, int]:
    """The varint at ``m[i]`` and the index after it (IndexError past the end)."""
    b = m[i]
    if b < 0x80:
        return b, i + 1
    value, shift = b & 0x7F, 7
    while True:
        i += 1
        b = m[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7


def _plain_data(payload: bytes, count: int) -> list[bytes] | None:
    """Every message's data from the wire bytes in one list, when the entry's messages carry no
    attribute but the reserved one; else None. Every stored message has data or an attribute
    (checked at publish), so with no attribute a count of ``data`` fields equal to the number
    of messages means one each; the reserved attribute, added by the server, is one per
    message of a deduplicated batch."""
    entries = flat_views.attribute_entries(payload)
    if entries and not (
        entries == count and flat_views.attribute_keys(payload).count(_DEDUP_KEY) == count
    ):
        return None
    data = flat_views.message_data(payload)
    return data if len(data) == count else None


class DecodeCache:
    """Decoded entries of one topic by (source, base offset), least recently used out first,
    bounded by the entries' stored bytes. Created empty; costs nothing until used."""

    __slots__ = ("_bytes", "_entries", "_max_bytes")

    def __init__(self, max_bytes: int = DECODE_CACHE_BYTES) -> None:
        self._entries: OrderedDict[tuple[int, int], DecodedEntry] | None = None
        self._bytes = 0
        self._max_bytes = max_bytes

    def decoded(self, source: int, entry: Entry) -> DecodedEntry:
        key = (source, entry.base_offset)
        cache = self._entries
        if cache is None:
            cache = self._entries = OrderedDict()
        found = cache.get(key)
        if found is not None:
            cache.move_to_end(key)
            return found
        found = decode(source, entry)
        cache[key] = found
        self._bytes += len(entry.payload)
        while self._bytes > self._max_bytes and len(cache) > 1:
            _, old = cache.popitem(last=False)
            self._bytes -= len(old.entry.payload)
        return found
