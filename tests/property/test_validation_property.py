"""Property test: validating a PublishRequest with its wire bytes (the flat-view fast path for
attributes) decides exactly what the map-by-map check decides, with the same error, including
for wire forms the official clients never send (duplicate keys, entries without a key)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.core import pb, validation
from pubsubd.core.errors import InvalidArgument

pytestmark = pytest.mark.property

# At each limit, in bytes; multi-byte characters make byte and character counts differ.
keys = st.one_of(
    st.sampled_from(["", "a", "pubsubd.deliver_after", "pubsubd.deliver_at", "pubsubd.dedup_id"]),
    st.sampled_from(["k" * 255, "k" * 256, "k" * 257, "é" * 128, "é" * 128 + "k"]),
    st.sampled_from(["鍵" * 85 + "k", "鍵" * 86]),  # 256 and 258 bytes
    st.text(min_size=1, max_size=8),
)
values = st.one_of(
    st.sampled_from(["", "v", "0", "5", "-1", "x", "2030-01-01T00:00:00Z"]),
    st.sampled_from(["v" * 1023, "v" * 1024, "v" * 1025, "é" * 512, "é" * 512 + "v"]),
)
extra_entries = st.lists(
    st.tuples(st.booleans(), st.booleans(), keys, values), max_size=2
)  # (omit key, omit value, key, value) appended on the wire


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _entry(omit_key: bool, omit_value: bool, key: str, value: str) -> bytes:
    body = b"" if omit_key else _field(1, key.encode())
    body += b"" if omit_value else _field(2, value.encode())
    return _field(2, body)  # PubsubMessage.attributes


messages = st.tuples(
    st.sampled_from([b"", b"data"]),
    st.dictionaries(keys, values, max_size=4),
    extra_entries,
    st.sampled_from(["", "key"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6))
def test_the_fast_path_decides_like_the_map_by_map_check(
    spec: list[tuple[bytes, dict[str, str], list[tuple[bool, bool, str, str]], str]],
) -> None:
    raw = b""
    for data, attributes, extra, ordering_key in spec:
        m = pb.PubsubMessage(data=data, attributes=attributes, ordering_key=ordering_key)
        body = m.SerializeToString() + b"".join(_entry(*e) for e in extra)
        raw += _field(2, body)  # PublishRequest.messages
    request = pb.PublishRequest.FromString(raw)

    def outcome(wire: bytes | None) -> str | None:
        try:
            validation.publish_request(request, len(raw), wire, now_s=time.time())
        except InvalidArgument as e:
            return str(e)
        return None

    assert outcome(raw) == outcome(None)


def test_the_fast_path_passes_ordinary_requests_and_refuses_nothing_valid() -> None:
    msgs = [pb.PubsubMessage(data=b"x", attributes={"a": "1", "b": "2"}) for _ in range(1000)]
    raw = pb.PublishRequest(messages=msgs).SerializeToString()
    assert validation._attributes_certainly_valid(raw)
    empty_key = pb.PublishRequest(messages=[pb.PubsubMessage(attributes={"": "v"})])
    assert not validation._attributes_certainly_valid(empty_key.SerializeToString())
    long_value = pb.PubsubMessage(data=b"x", attributes={"k": "v" * 1025})
    assert not validation._attributes_certainly_valid(
        pb.PublishRequest(messages=[long_value]).SerializeToString()
    )
