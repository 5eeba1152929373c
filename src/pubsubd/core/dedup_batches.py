"""The messages of a PublishDeduplicated request as the dedup window and the log take them (pure).

A deduplicated message is stored as a PubsubMessage carrying its dedup ID as the reserved
attribute ``pubsubd.dedup_id`` (``data/publish/dedup.py`` says why), so every stored message is
a new encoding of what the client sent. Two forms of a request's messages give the same bytes:

* :class:`MessageBatch`, the general form: parsed ``DeduplicatedMessage``s, copied message by
  message into a ``PublishRequest`` (~2 µs per message in Python).
* :class:`FlatBatch`, the form of the Spark sink's requests (every message a dedup ID and
  non-empty data, nothing else, encoded canonically), read by :func:`flat_request` straight from
  the wire bytes: the IDs and payloads come out of one protobuf parse as two lists (the merge
  rule ``core/flat_views.py`` relies on: ``messages`` read as a *singular* field merges every
  message into one, whose repeated fields are then the concatenation of all messages' fields),
  and the stored batch is spliced together from those lists and a few header bytes per distinct
  (ID length, data length) pair, with no Python loop over the messages.

The flat reading proves what it assumes: it re-encodes the request from the two lists and takes
the fast path only when that equals the received bytes, so a request with any other field, a
field repeated inside one message, an empty value or a non-canonical encoding takes the general
path and its checks (and errors). Both forms store byte-identical batches (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any, Protocol

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from pubsubd.core import pb
from pubsubd.core.validation import (
    DEDUP_ID_ATTRIBUTE,
    MAX_DEDUP_ID_BYTES,
    MAX_MESSAGES_PER_PUBLISH,
    MAX_PUBLISH_REQUEST_BYTES,
)

# (stored payload: a serialized PublishRequest, first index, end index in the messages passed
# to ``stored``, the batch's ordering key)
StoredBatch = tuple[bytes, int, int, str]

_HEADERS_CACHED = 4096  # distinct (ID length, data length) pairs kept; a request has a few


class DedupBatch(Protocol):
    """A request's messages: their dedup IDs, and their stored form."""

    @property
    def dedup_ids(self) -> Sequence[str]: ...

    def stored(self, indices: Sequence[int]) -> list[StoredBatch]:
        """The messages at ``indices`` (increasing) as stored batches, one per run of one
        ordering key (a stored batch has one key); first/end index into ``indices``."""
        ...


def ordering_runs(messages: Sequence[Any]) -> list[tuple[int, int]]:
    """Split messages into runs of one ordering key: [start, stop) each."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(messages) + 1):
        if i == len(messages) or messages[i].ordering_key != messages[start].ordering_key:
            runs.append((start, i))
            start = i
    return runs


class MessageBatch:
    """The general form: (dedup ID, message) pairs; a message is anything with ``data``,
    ``attributes`` and ``ordering_key`` (a PubsubMessage or the API's DeduplicatedMessage),
    without the reserved attribute."""

    __slots__ = ("dedup_ids", "messages")

    def __init__(self, messages: Sequence[tuple[str, Any]]) -> None:
        self.messages = messages
        self.dedup_ids: Sequence[str] = [dedup_id for dedup_id, _ in messages]

    def stored(self, indices: Sequence[int]) -> list[StoredBatch]:
        chosen = [self.messages[i] for i in indices]
        out: list[StoredBatch] = []
        for start, stop in ordering_runs([m for _, m in chosen]):
            request = pb.PublishRequest()
            add = request.messages.add
            for dedup_id, m in chosen[start:stop]:
                copy = add(data=m.data, ordering_key=m.ordering_key)
                attributes = copy.attributes
                if m.attributes:
                    attributes.update(m.attributes)
                attributes[DEDUP_ID_ATTRIBUTE] = dedup_id
            key = request.messages[0].ordering_key
            out.append((request.SerializeToString(), start, stop, key))
        return out


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int32 is sign-extended to ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# The reserved attribute's map entry up to its value's length: key (field 1) and value's tag.
_ENTRY_HEAD = b"\x0a" + _varint(len(DEDUP_ID_ATTRIBUTE)) + DEDUP_ID_ATTRIBUTE.encode() + b"\x12"


class _Headers(dict[tuple[int, int], tuple[bytes, bytes, bytes, bytes]]):
    """(ID length, data length) -> the bytes around a message's ID and data:
    in the request ``[head] id [middle] data``, stored ``[head] data [middle] id``."""

    def __missing__(self, key: tuple[int, int]) -> tuple[bytes, bytes, bytes, bytes]:
        id_len, data_len = key
        id_field = b"\x0a" + _varint(id_len)  # DeduplicatedMessage.dedup_id = 1
        data_field = b"\x12" + _varint(data_len)  # DeduplicatedMessage.data = 2
        sent = len(id_field) + id_len + len(data_field) + data_len
        entry = len(_ENTRY_HEAD) + len(_varint(id_len)) + id_len
        stored_data = b"\x0a" + _varint(data_len)  # PubsubMessage.data = 1
        attribute = b"\x12" + _varint(entry) + _ENTRY_HEAD + _varint(id_len)  # attributes = 2
        stored = len(stored_data) + data_len + len(attribute) + id_len
        value = (
            b"\x12" + _varint(sent) + id_field,  # PublishDeduplicatedRequest.messages = 2
            data_field,
            b"\x12" + _varint(stored) + stored_data,  # PublishRequest.messages = 2
            attribute,
        )
        if len(self) >= _HEADERS_CACHED:
            self.clear()
        self[key] = value
        return value


_HEADERS = _Headers()


def _interleave(
    a: Sequence[bytes], b: Sequence[bytes], c: Sequence[bytes], d: Sequence[bytes]
) -> bytes:
    parts: list[bytes] = [b""] * (4 * len(a))
    parts[0::4] = a
    parts[1::4] = b
    parts[2::4] = c
    parts[3::4] = d
    return b"".join(parts)


class FlatBatch:
    """The flat form (see the module docstring): IDs and payloads as parallel lists."""

    __slots__ = ("_data", "_headers", "_ids", "dedup_ids")

    def __init__(
        self,
        dedup_ids: list[str],
        ids: list[bytes],
        data: list[bytes],
        headers: list[tuple[bytes, bytes, bytes, bytes]],
    ) -> None:
        self.dedup_ids: Sequence[str] = dedup_ids
        self._ids = ids
        self._data = data
        self._headers = headers

    def stored(self, indices: Sequence[int]) -> list[StoredBatch]:
        if not indices:
            return []
        if len(indices) == len(self._ids):  # every message (indices are increasing and distinct)
            ids, data, headers = self._ids, self._data, self._headers
        else:
            pick = itemgetter(*indices) if len(indices) > 1 else None
            if pick is None:
                i = indices[0]
                ids, data, headers = [self._ids[i]], [self._data[i]], [self._headers[i]]
            else:
                ids, data, headers = pick(self._ids), pick(self._data), pick(self._headers)
        payload = _interleave(
            list(map(itemgetter(2), headers)), data, list(map(itemgetter(3), headers)), ids
        )
        return [(payload, 0, len(indices), "")]


_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "pubsubd.flat_dedup"


def _view_class() -> Any:
    proto = descriptor_pb2.FileDescriptorProto(
        name="pubsubd/flat_dedup.proto", package=_PACKAGE, syntax="proto3"
    )
    merged = proto.message_type.add(name="AllMessages")
    merged.field.add(name="dedup_id", number=1, type=_F.TYPE_BYTES, label=_F.LABEL_REPEATED)
    merged.field.add(name="data", number=2, type=_F.TYPE_BYTES, label=_F.LABEL_REPEATED)
    view = proto.message_type.add(name="RequestView")
    view.field.add(name="topic", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    view.field.add(
        name="messages",
        number=2,
        type=_F.TYPE_MESSAGE,
        label=_F.LABEL_OPTIONAL,
        type_name=f".{_PACKAGE}.AllMessages",
    )
    source = view.field.add(
        name="source", number=3, type=_F.TYPE_INT32, label=_F.LABEL_OPTIONAL, oneof_index=0
    )
    source.proto3_optional = True
    view.oneof_decl.add(name="_source")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.RequestView"))


_RequestView = _view_class()


def _encode(
    topic: str,
    ids: Sequence[bytes],
    data: Sequence[bytes],
    headers: Sequence[tuple[bytes, bytes, bytes, bytes]],
    source: int | None,
) -> bytes:
    topic_bytes = topic.encode()
    parts = [b"\x0a" + _varint(len(topic_bytes)) + topic_bytes if topic_bytes else b""]
    parts.append(
        _interleave(list(map(itemgetter(0), headers)), ids, list(map(itemgetter(1), headers)), data)
    )
    if source is not None:
        parts.append(b"\x18" + _varint(source))
    return b"".join(parts)


def encode_request(
    topic: str, ids: Sequence[bytes], data: Sequence[bytes], source: int | None = None
) -> bytes:
    """A ``PublishDeduplicatedRequest`` of messages with these dedup IDs and data (UTF-8 IDs),
    byte for byte as protobuf serializes it, without a message object per row (the Spark
    sink's and the Pulsar front's requests; an empty ID or data is sent as an explicit empty
    field); ``source``: the request's publish message source, None for none."""
    keys = zip(map(len, ids), map(len, data), strict=True)
    return _encode(topic, ids, data, list(map(_HEADERS.__getitem__, keys)), source)


@dataclass(frozen=True, slots=True)
class FlatRequest:
    topic: str
    source: int | None
    batch: FlatBatch


def flat_request(raw: bytes) -> FlatRequest | None:
    """The request in the flat form, already within every limit the general path checks; None
    when it is not in that form (or breaks a limit): parse and check it the general way."""
    if len(raw) > MAX_PUBLISH_REQUEST_BYTES:
        return None
    try:
        view = _RequestView.FromString(raw)
    except DecodeError:
        return None
    ids: list[bytes] = list(view.messages.dedup_id)
    data: list[bytes] = list(view.messages.data)
    n = len(ids)
    if not 0 < n <= MAX_MESSAGES_PER_PUBLISH or len(data) != n:
        return None
    id_lengths = list(map(len, ids))
    data_lengths = list(map(len, data))
    if min(id_lengths) == 0 or max(id_lengths) > MAX_DEDUP_ID_BYTES or min(data_lengths) == 0:
        return None
    headers = list(map(_HEADERS.__getitem__, zip(id_lengths, data_lengths, strict=True)))
    source = view.source if view.HasField("source") else None
    if _encode(view.topic, ids, data, headers, source) != raw:
        return None
    try:
        dedup_ids = list(map(bytes.decode, ids, repeat("utf-8")))
    except UnicodeDecodeError:
        return None  # a string field must be UTF-8: the general parse rejects it
    return FlatRequest(view.topic, source, FlatBatch(dedup_ids, ids, data, headers))
