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

A raw stream (the Pulsar front's in-process one) takes a *plain* entry (every message data
only, perhaps with the reserved attribute) as ``DecodedEntry.plain``: the data list, each
message's size and the publish time, from two flat reads of the payload (~0.3 µs per
message) instead of the splice (~1 µs with the reserved attribute to cut). Each form of a
cached entry is made when first asked for, so readers of one form never pay for another; a
property test checks that ``plain`` says what ``messages`` says.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import repeat
from operator import add
from typing import Any, NamedTuple

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
# A reserved map entry whose value is shorter than this has one-byte lengths throughout.
_SHORT_DEDUP_VALUE = 0x80 - len(_DEDUP_ENTRY_KEY) - 2

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


class PlainEntry(NamedTuple):
    """A *plain* entry as a raw (in-process) stream takes it (:meth:`DecodedEntry.plain`):
    every message's data, the size of its delivered form (``len(messages[i])``, what flow
    control counts) and the entry's publish time as a serialized Timestamp (``messages[i]``
    ends with it as field 4; the same object for every message of the entry)."""

    data: list[bytes]
    sizes: list[int]
    stamp: bytes


class DecodedEntry:
    """One stored entry's messages, each form made on first use and kept (the cache holds one
    per entry for every reader of the topic): ``messages`` (serialized PubsubMessages with ID
    and publish time, framed consumers and the replay API), ``parsed`` (attributes, filters,
    dead letters), :meth:`plain_data` (a columnar Read) and :meth:`plain` (a raw stream).
    Nothing is decoded before it is asked for: a reader of one form never pays for another."""

    __slots__ = (
        "_messages",
        "_ordering_key",
        "_parsed",
        "_plain",
        "_plain_entry",
        "_ready",
        "deliver_at",
        "entry",
        "source",
    )

    def __init__(
        self,
        entry: Entry,
        source: int = 0,
        parsed: Any = None,
        deliver_at: list[int | None] | None = None,
    ) -> None:
        self.entry = entry
        self.source = source
        # epoch microseconds before which each message must not be delivered; None if none is
        # delayed
        self.deliver_at = deliver_at
        # the parsed messages (None until first needed); ``_ready`` once their ID, publish time
        # and attributes are set as in ``messages``
        self._parsed = parsed
        self._ready = False
        self._messages: list[bytes] | None = None
        self._ordering_key: str | None = None
        # memos of plain_data() and plain(): empty until first asked
        self._plain: list[list[bytes] | None] = []
        self._plain_entry: list[PlainEntry | None] = []

    @property
    def messages(self) -> list[bytes]:
        """Serialized PubsubMessage per offset, message_id and publish_time set, the reserved
        dedup attribute stripped."""
        messages = self._messages
        if messages is None:
            messages = _spliced(self.source, self.entry)
            if messages is None:
                messages = [m.SerializeToString() for m in self.parsed]
            self._messages = messages
        return messages

    @property
    def ordering_key(self) -> str:
        """One per entry: every message of a PublishRequest shares it."""
        key = self._ordering_key
        if key is None:
            messages = self._raw_parsed()
            key = self._ordering_key = messages[0].ordering_key if messages else ""
        return key

    def _raw_parsed(self) -> Any:
        parsed = self._parsed
        if parsed is None:
            parsed = self._parsed = pb.PublishRequest.FromString(self.entry.payload).messages
        return parsed

    @property
    def parsed(self) -> Any:
        """The parsed PubsubMessages (repeated field), for attributes and filters: message ID
        and publish time set, the reserved dedup attribute removed, as in ``messages``."""
        parsed = self._raw_parsed()
        if not self._ready:
            _complete(parsed, self.source, self.entry)
            self._ready = True
        return parsed

    def plain_data(self) -> list[bytes] | None:
        """Every message's data in one list when no message has an attribute but the reserved
        one (so a columnar Read needs no parsed message), else None: read ``parsed``."""
        memo = self._plain
        if not memo:
            memo.append(_plain_data(self.entry.payload, self.entry.count))
        return memo[0]

    def plain(self) -> PlainEntry | None:
        """The entry as a raw stream takes it when every message is *plain* (data, and perhaps
        the reserved attribute, nothing else), else None: read ``messages``. What it holds is
        exactly what ``messages`` says of each message (data, publish time, size); no
        ``messages`` is made for it (:func:`_plain_entry`)."""
        memo = self._plain_entry
        if not memo:
            memo.append(_plain_entry(self.source, self.entry))
        return memo[0]


def decode(source: int, entry: Entry) -> DecodedEntry:
    """An entry's messages, decoded on first use (:class:`DecodedEntry`); the reserved dedup
    attribute is stripped (stored for the dedup window only, never delivered). Only delays
    are read here (a delayed message's due time is every reader's concern)."""
    payload = entry.payload
    if MARKER not in payload:
        return DecodedEntry(entry, source)
    parsed = pb.PublishRequest.FromString(payload).messages
    return DecodedEntry(entry, source, parsed, due_times(parsed, entry.publish_time_us))


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
    stamp = _stamp(entry.publish_time_us)
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


def _stamp(publish_time_us: int) -> bytes:
    """The publish time as a serialized Timestamp (the value of a message's field 4)."""
    seconds, micros = divmod(publish_time_us, 1_000_000)
    return (b"\x08" + varint(seconds) if seconds else b"") + (
        b"\x10" + varint(micros * 1000) if micros else b""
    )


def _plain_entry(source: int, entry: Entry) -> PlainEntry | None:
    """:meth:`DecodedEntry.plain`: one flat read of the payload instead of a pass over each
    message. The entry is plain when (1) it holds as many ``data`` fields as messages, (2) its
    attribute keys are none, or one reserved key per message with as many values, and (3) the
    payload's bytes add up to exactly those data fields and reserved map entries, each written
    as protobuf writes it (one-byte tags, shortest lengths), each message's tag and length in
    the request, and the request's topic field: no byte is left for any other field (an
    ordering key, an attribute, a message ID or publish time of the client's, an unknown
    field, another field of the request), and each message's delivered form (``_spliced``:
    its bytes less the reserved entry, then ID and time) is its data field, the ID field and
    the time field, whose sizes are known. What publish checks (core/validation.py) makes
    this exact: a stored message has non-empty data or an attribute of the client's (so with
    (2) each message has a data field, and with (1) exactly one: its data, in order), no empty
    attribute key, and the reserved attribute only as the server writes it (so each reserved
    key is in its own entry with its value, at most one per message). Any other byte, or a
    longer encoding, makes the payload longer than that sum. The sizes of the messages'
    lengths are known when the shortest and the longest message such an entry can hold have
    lengths of one size; else each message is read to count its bytes. A message ID's digits
    differ within an entry only across a power of ten; such an entry is not plain (its
    ``messages`` serve)."""
    payload = entry.payload
    n = entry.count
    topic, data, keys, values = flat_views.topic_data_keys_values(payload)
    if not n or len(data) != n:
        return None
    lengths = list(map(len, data))
    shortest, longest = min(lengths), max(lengths)
    short = longest < 0x80
    stored = sum(lengths)
    stored += 2 * n if short else sum(1 + len(varint(length)) for length in lengths)
    # The shortest and longest message: a data field, then any reserved entry.
    smallest = shortest + 1 + len(varint(shortest))
    largest = longest + 1 + len(varint(longest))
    if keys:
        if len(keys) != n or len(values) != n or keys.count(_DEDUP_KEY) != n:
            return None
        value_bytes = list(map(len, values))
        if max(value_bytes) >= _SHORT_DEDUP_VALUE:
            return None  # a long dedup ID: not worth the general case
        # per entry: tag, length, key field, value tag, value length, value
        fixed = 4 + len(_DEDUP_ENTRY_KEY)
        stored += n * fixed + sum(value_bytes)
        smallest += fixed + min(value_bytes)
        largest += fixed + max(value_bytes)
    framing = len(varint(smallest))
    if framing == len(varint(largest)):  # in the request, each message's tag and length
        request = 1 + len(varint(len(topic))) + len(topic) if topic else 0  # the topic field
        if len(payload) != request + stored + n * (1 + framing):
            return None
    elif sum(map(len, _RawMessages.FromString(payload).messages)) != stored:
        return None
    base = ids.position(source, entry.base_offset)
    digits = len(b"%d" % base)
    if digits != len(b"%d" % (base + n - 1)):
        return None
    stamp = _stamp(entry.publish_time_us)
    # the ID field (tag, length, digits) and the time field (tag, length, Timestamp)
    extra = 2 + digits + 2 + len(stamp)
    if short:  # the data field: tag, one-byte length, data
        sizes = list(map(add, lengths, repeat(2 + extra)))
    else:
        sizes = [length + 1 + len(varint(length)) + extra for length in lengths]
    return PlainEntry(data, sizes, stamp)


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
