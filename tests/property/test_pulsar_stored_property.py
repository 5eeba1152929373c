"""Property: what ``pulsar/stored.plain`` reads from a stored message is what protobuf reads.

Messages as the subscribing forwarder decodes them (any data, attributes, ordering key, with an
ID and publish time appended) and arbitrary bytes: whenever ``plain`` answers, the message
parses to that data, no attributes, no ordering key and that publish time; and a message with
nothing but data, ID and time is always read by it (the fast path is taken).
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pubsubd.core import pb
from pubsubd.core.records import Entry
from pubsubd.data.decoding import decode
from pubsubd.pulsar import stored

pytestmark = pytest.mark.property

_message = st.builds(
    pb.PubsubMessage,
    data=st.binary(max_size=300),
    attributes=st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=2),
    ordering_key=st.sampled_from(["", "k"]),
)


def _agrees(m: bytes) -> None:
    found = stored.plain(m)
    if found is None:
        return
    data, stamp = found
    parsed = pb.PubsubMessage.FromString(m)
    assert parsed.data == data
    assert not parsed.attributes and not parsed.ordering_key
    assert parsed.publish_time.SerializeToString() == stamp
    ts = parsed.publish_time
    assert stored.publish_ms(stamp) == ts.seconds * 1000 + ts.nanos // 1_000_000


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_message, min_size=1, max_size=5),
    st.integers(0, 2**47),
    st.integers(0, 2**52),
)
def test_plain_reads_decoded_messages_as_protobuf_does(
    messages: list[pb.PubsubMessage], offset: int, time_us: int
) -> None:
    payload = pb.PublishRequest(topic="projects/p/topics/t", messages=messages)
    entry = Entry(offset, len(messages), time_us, payload.SerializeToString())
    for original, m in zip(messages, decode(0, entry).messages, strict=True):
        _agrees(m)
        if not original.attributes and not original.ordering_key:
            assert stored.plain(m) is not None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_plain_never_misreads_arbitrary_bytes(m: bytes) -> None:
    try:
        pb.PubsubMessage.FromString(m)
    except Exception:
        # Not a message: plain may still slice it, but nothing is delivered from such bytes
        # (the forwarder only hands over what it decoded).
        return
    _agrees(m)


def _plain_at_agrees(m: bytes, stamp: bytes) -> None:
    """``plain_at`` with ``stamp``'s time field answers exactly what ``plain`` says."""
    found = stored.plain(m)
    expected = found[0] if found is not None and found[1] == stamp else None
    assert stored.plain_at(m, stored.time_field(stamp)) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_message, min_size=1, max_size=5),
    st.integers(0, 2**47),
    st.integers(0, 2**52),
    st.integers(0, 2**52),
)
def test_plain_at_reads_decoded_messages_as_plain_does(
    messages: list[pb.PubsubMessage], offset: int, time_us: int, other_us: int
) -> None:
    payload = pb.PublishRequest(topic="projects/p/topics/t", messages=messages)
    entry = Entry(offset, len(messages), time_us, payload.SerializeToString())
    other = Entry(offset, len(messages), other_us, payload.SerializeToString())
    stamps = {stored.plain(m) for m in decode(0, other).messages + decode(0, entry).messages}
    for m in decode(0, entry).messages:
        for found in stamps:
            if found is not None:
                _plain_at_agrees(m, found[1])


@st.composite
def _near_plain(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A plain message's bytes (data, ID, time) with its lengths and tags mostly right and
    sometimes off by a little: (bytes, the stamp its time field holds)."""

    def length(actual: int) -> int:
        return draw(st.sampled_from([actual, actual, actual, actual + 1, max(0, actual - 1)]))

    data = draw(st.binary(max_size=140))
    mid = draw(st.binary(max_size=22))
    stamp = draw(st.binary(max_size=12))
    m = (
        bytes((draw(st.sampled_from([0x0A, 0x0A, 0x12])), min(0xFF, length(len(data)))))
        + data
        + bytes((draw(st.sampled_from([0x1A, 0x1A, 0x22])), length(len(mid))))
        + mid
        + bytes((draw(st.sampled_from([0x22, 0x22, 0x1A])), length(len(stamp))))
        + stamp
        + draw(st.sampled_from([b"", b"", b"\x00", b"\x22\x00"]))
    )
    return m, stamp


@settings(max_examples=1500, deadline=None)
@given(_near_plain(), st.binary(max_size=12))
def test_plain_at_agrees_with_plain_on_near_plain_bytes(
    case: tuple[bytes, bytes], other: bytes
) -> None:
    m, stamp = case
    _plain_at_agrees(m, stamp)
    event("plain" if stored.plain(m) is not None else "not plain")
    _plain_at_agrees(m, other)
    _plain_at_agrees(m[:-1], stamp)
