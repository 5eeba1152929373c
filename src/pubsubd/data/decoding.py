"""Stored entries turned back into messages, and a bounded cache of them (pure, no I/O).

A log entry holds a serialized PublishRequest exactly as the client sent it, so the publish path
never re-encodes messages. Readers (the subscribing forwarder's dispatchers, the replay API)
decode an entry once into serialized PubsubMessages with their message ID and publish time set,
ready to frame into responses (``core/wire.py``); :class:`DecodeCache` keeps recent ones for
fan-out to several subscriptions and for redeliveries.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pubsubd.core import flat_views, ids, pb
from pubsubd.core.delays import MARKER, due_times
from pubsubd.core.validation import DEDUP_ID_ATTRIBUTE
from pubsubd.storage.framing import Entry

_DEDUP_KEY = DEDUP_ID_ATTRIBUTE.encode()

# Decoded entries kept per topic, bounded by the stored size of the entries (the decoded form
# is about twice that).
DECODE_CACHE_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    entry: Entry
    messages: list[bytes]  # serialized PubsubMessage per offset, message_id/publish_time set
    parsed: Any  # the parsed PubsubMessages (repeated field), for attributes and filters
    ordering_key: str  # one per entry: every message of a PublishRequest shares it
    # epoch microseconds before which each message must not be delivered; None if none is delayed
    deliver_at: list[int | None] | None = None
    # memo of plain_data(): empty until first asked (only the replay API's Read asks)
    _plain: list[list[bytes] | None] = field(default_factory=list, compare=False, repr=False)

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
    request = pb.PublishRequest.FromString(entry.payload)
    seconds, micros = divmod(entry.publish_time_us, 1_000_000)
    base = ids.position(source, entry.base_offset)
    messages = []
    for i, m in enumerate(request.messages):
        m.message_id = str(base + i)
        m.publish_time.seconds = seconds
        m.publish_time.nanos = micros * 1000
        attrs = m.attributes
        if attrs and DEDUP_ID_ATTRIBUTE in attrs:
            del attrs[DEDUP_ID_ATTRIBUTE]
        messages.append(m.SerializeToString())
    delays = due_times(request.messages, entry.publish_time_us) if MARKER in entry.payload else None
    ordering_key = request.messages[0].ordering_key if request.messages else ""
    return DecodedEntry(entry, messages, request.messages, ordering_key, delays)


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
