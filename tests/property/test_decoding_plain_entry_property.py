"""Property: what ``DecodedEntry.plain`` hands a raw stream is what ``messages`` says.

Entries as publish stores them (core/validation.py: a message has data or an attribute of its
own; PublishDeduplicated writes the reserved attribute itself) with data of any length,
attributes, an ordering key, the reserved attribute, and stored bytes a gRPC client may add
(a message ID, a publish time, an unknown field, ``data`` twice; in the request, the topic
again or an unknown field): whenever ``plain`` answers,
each message's data, ID, publish time and size are those of the serialized message the
framed path delivers, with no attribute and no ordering key; and an entry of plain messages
is always answered (the fast path is taken) unless its IDs cross a power of ten.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pubsubd.core import ids, pb
from pubsubd.core.dedup_batches import MessageBatch
from pubsubd.core.records import Entry
from pubsubd.core.wire import varint
from pubsubd.data.decoding import decode

pytestmark = pytest.mark.property

# What a client's stored bytes may carry after a message's own fields: a message ID (3), a
# publish time (4), an unknown field (15), data again (1), an ordering key (5).
_EXTRAS = [
    b"",
    b"",
    b"",
    b"\x1a\x019",
    b"\x22\x02\x08\x01",
    b"\x7a\x01x",
    b"\x0a\x01z",
    b"\x2a\x01k",
]

_message = st.builds(
    pb.PubsubMessage,
    data=st.one_of(st.binary(min_size=1, max_size=20), st.binary(max_size=300)),
    attributes=st.one_of(
        st.just({}),
        st.just({}),
        st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=2),
    ),
    ordering_key=st.sampled_from(["", "", "", "k"]),
).filter(lambda m: bool(m.data or m.attributes))  # publish refuses an empty message


# What a client's request may carry besides its topic and messages: the topic again, an empty
# topic, an unknown field. Such an entry need not take the fast path.
_REQUEST_EXTRAS = [b"", b"", b"", b"\x0a\x13projects/p/topics/t", b"\x0a\x00", b"\x1a\x01x"]


def _request(messages: list[bytes], extra: bytes = b"") -> bytes:
    out = b"\x0a\x13projects/p/topics/t"
    for m in messages:
        out += b"\x12" + varint(len(m)) + m
    return out + extra


@st.composite
def _entries(draw: st.DrawFn) -> tuple[bytes, bool]:
    """(a stored PublishRequest, whether every message in it is plain)."""
    messages = draw(st.lists(_message, min_size=1, max_size=6))
    key = messages[0].ordering_key
    for m in messages:
        m.ordering_key = key  # publish refuses a request with several keys
    if draw(st.booleans()):  # PublishDeduplicated: written by the server
        for m in messages:
            m.attributes.pop("", None)
        batch = MessageBatch(
            [(draw(st.sampled_from(["d", "pulsar/i/p/7" * 3])), m) for m in messages]
        )
        [(payload, _, _, _)] = batch.stored(range(len(messages)))
        plain = all(m.data and not m.attributes and not m.ordering_key for m in messages)
        return payload, plain
    stored = []
    plain = True
    for m in messages:
        extra = draw(st.sampled_from(_EXTRAS))
        stored.append(m.SerializeToString() + extra)
        plain = plain and bool(m.data) and not m.attributes and not m.ordering_key and not extra
    outside = draw(st.sampled_from(_REQUEST_EXTRAS))
    return _request(stored, outside), plain and not outside


@settings(max_examples=500, deadline=None)
@given(
    _entries(),
    st.integers(0, 3),
    st.sampled_from([0, 1, 7, 95, 999_998, 2**40]),
    st.integers(0, 2**52),
)
def test_plain_says_what_the_serialized_messages_say(
    stored: tuple[bytes, bool], source: int, offset: int, time_us: int
) -> None:
    payload, all_plain = stored
    count = len(pb.PublishRequest.FromString(payload).messages)
    entry = Entry(offset, count, time_us, payload)
    found = decode(source, entry).plain()
    decoded = decode(source, entry)  # a fresh entry: no form made before
    messages = decoded.messages
    base = ids.position(source, offset)
    event(f"plain: {found is not None}")
    if found is None:
        crosses = len(str(base)) != len(str(base + count - 1))
        assert not all_plain or crosses, "a plain entry takes the fast path"
        return
    assert all_plain
    assert len(found.data) == len(found.sizes) == count
    for i, m in enumerate(messages):
        parsed = pb.PubsubMessage.FromString(m)
        assert parsed.data == found.data[i] == decoded.parsed[i].data
        assert not parsed.attributes and not parsed.ordering_key
        assert parsed.message_id == str(base + i)
        assert parsed.publish_time.SerializeToString() == found.stamp
        assert found.sizes[i] == len(m)
