"""The subscribing forwarder's stored messages read without a protobuf object (pure).

An in-process stream (streams.py) hands the front each message as ``data/decoding.py`` makes
it: a serialized PubsubMessage, the client's stored fields followed by the message ID (field 3)
and the publish time (field 4). Most messages are *plain*: data (field 1, or none: empty),
then ID and time, nothing else: no attributes, no ordering key. :func:`plain` reads such a one
by slicing (data, and the publish time's serialized Timestamp as the batch key); anything else
(attributes, an ordering key, a field in another order, a length over one varint byte where
one is expected) is None, and the caller parses it with protobuf. A property test checks that
whatever :func:`plain` reads is what protobuf reads. :func:`plain_at` is the check of the
next message of a batch: its data if it is plain with a given publish time (as ``plain``
would say), with fewer steps for the common short message. A plain entry's messages reach a
raw stream as their data and the entry's publish time already (``DecodedEntry.plain``), read
once per entry; these read the others.
"""

from __future__ import annotations

import functools

from google.protobuf import timestamp_pb2

from pubsubd.core.wire import varint

_DATA = 0x0A  # PubsubMessage.data: field 1, length-delimited
_MESSAGE_ID = 0x1A  # field 3, length-delimited
_PUBLISH_TIME = 0x22  # field 4, length-delimited


def plain(m: bytes) -> tuple[bytes, bytes] | None:
    """(data, the publish time's serialized Timestamp) of a plain message, else None."""
    n = len(m)
    if n < 4:
        return None
    if m[0] == _DATA:
        size = m[1]
        p = 2
        if size & 0x80:  # a multi-byte varint (data of 128 bytes or more)
            size &= 0x7F
            shift = 7
            while True:
                if p >= n or shift > 28:
                    return None
                b = m[p]
                p += 1
                size |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
                shift += 7
        end = p + size
        data = m[p:end]
    else:
        data = b""
        end = 0
    # Then exactly the message ID and the publish time, each with a one-byte length.
    if end + 4 > n or m[end] != _MESSAGE_ID or m[end + 1] & 0x80:
        return None
    at = end + 2 + m[end + 1]
    if at + 2 > n or m[at] != _PUBLISH_TIME or m[at + 1] & 0x80 or at + 2 + m[at + 1] != n:
        return None
    return data, m[at + 2 :]


def time_field(stamp: bytes) -> bytes:
    """The publish time field (tag, length, Timestamp) that ends a plain message whose publish
    time is ``stamp`` (``plain``'s second value), for :func:`plain_at`."""
    return bytes((_PUBLISH_TIME, len(stamp))) + stamp


def plain_at(m: bytes, time: bytes) -> bytes | None:
    """The data of ``m`` if it is plain and ends with ``time`` (:func:`time_field` of its
    publish time), else None: exactly ``plain(m)[0]`` when ``plain(m)[1]`` is that time."""
    n = len(m)
    if n > 2 and m[0] == _DATA:
        end = m[1] + 2  # the data's end, for a one-byte length (checked below)
        rest = n - len(time)
        # data, then the ID with a one-byte length taking the bytes up to the time field
        if (
            end < 0x82
            and end + 1 < rest
            and m[end] == _MESSAGE_ID
            and m[end + 1] < 0x80
            and end + 2 + m[end + 1] == rest
            and m.endswith(time)
        ):
            return m[2:end]
    found = plain(m)
    if found is None or time_field(found[1]) != time:
        return None
    return found[0]


def message(data: bytes, stamp: bytes) -> bytes:
    """The serialized PubsubMessage holding ``data`` and the publish time ``stamp`` (a plain
    message as ``plain`` reads it, without its ID)."""
    head = bytes((_DATA,)) + varint(len(data)) if data else b""
    return head + data + time_field(stamp)


@functools.lru_cache(maxsize=256)
def publish_ms(stamp: bytes) -> int:
    """Milliseconds of a serialized Timestamp (``plain``'s second value); an entry's messages
    share one, so the last few are kept."""
    ts = timestamp_pb2.Timestamp.FromString(stamp)
    return int(ts.seconds * 1000 + ts.nanos // 1_000_000)
