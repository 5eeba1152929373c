"""Decoding by splicing stored bytes gives the messages the protobuf path gives: each delivered
message parses equal to the stored one with its ID and publish time set and the reserved dedup
attribute removed, whatever the client sent (property test), and the parsed messages match."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.core import pb
from pubsubd.core.dedup_batches import MessageBatch
from pubsubd.core.records import Entry
from pubsubd.core.validation import DEDUP_ID_ATTRIBUTE
from pubsubd.data.decoding import _spliced, decode

pytestmark = pytest.mark.unit


def _reference(source: int, entry: Entry) -> list[bytes]:
    """The protobuf path: parse, set ID and publish time, drop the reserved attribute."""
    request = pb.PublishRequest.FromString(entry.payload)
    seconds, micros = divmod(entry.publish_time_us, 1_000_000)
    base = (source << 48) | entry.base_offset
    out = []
    for i, m in enumerate(request.messages):
        m.message_id = str(base + i)
        m.publish_time.seconds = seconds
        m.publish_time.nanos = micros * 1000
        if DEDUP_ID_ATTRIBUTE in m.attributes:
            del m.attributes[DEDUP_ID_ATTRIBUTE]
        out.append(m.SerializeToString())
    return out


_text = st.text(max_size=12)
_message = st.builds(
    lambda data, attributes, key, mid, stamp, dedup: _build(
        data, attributes, key, mid, stamp, dedup
    ),
    st.binary(max_size=300),
    st.dictionaries(_text, _text, max_size=3),
    _text,
    st.sampled_from(["", "42", "client-id"]),
    st.sampled_from([None, (0, 0), (5, 7), (1_700_000_000, 0)]),
    st.one_of(st.none(), st.text(min_size=1, max_size=200)),
)


def _build(
    data: bytes,
    attributes: dict[str, str],
    key: str,
    mid: str,
    stamp: tuple[int, int] | None,
    dedup: str | None,
) -> pb.PubsubMessage:
    m = pb.PubsubMessage(data=data, attributes=attributes, ordering_key=key, message_id=mid)
    if stamp is not None:
        m.publish_time.seconds, m.publish_time.nanos = stamp
    if dedup is not None:
        m.attributes[DEDUP_ID_ATTRIBUTE] = dedup
    return m


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_message, min_size=1, max_size=6),
    st.integers(0, 3),
    st.integers(0, 2**40),
    st.integers(0, 2**53),
)
def test_spliced_messages_parse_as_the_protobuf_path_gives(
    messages: list[pb.PubsubMessage], source: int, base: int, publish_us: int
) -> None:
    payload = pb.PublishRequest(topic="projects/p/topics/t", messages=messages).SerializeToString()
    entry = Entry(
        base_offset=base, count=len(messages), publish_time_us=publish_us, payload=payload
    )
    expected = [pb.PubsubMessage.FromString(b) for b in _reference(source, entry)]
    decoded = decode(source, entry)
    assert [pb.PubsubMessage.FromString(b) for b in decoded.messages] == expected
    assert list(decoded.parsed) == expected
    assert decoded.ordering_key == messages[0].ordering_key


def test_plain_and_deduplicated_batches_take_the_spliced_path() -> None:
    plain = pb.PublishRequest(
        messages=[pb.PubsubMessage(data=b"a", attributes={"k": "v"}, ordering_key="o")]
    ).SerializeToString()
    assert _spliced(0, Entry(0, 1, 1_000_001, plain)) is not None
    batch = MessageBatch([("p:0", pb.PubsubMessage(data=b"x", attributes={"a": "b"}))])
    [(deduplicated, _, _, _)] = batch.stored([0])
    spliced = _spliced(2, Entry(7, 1, 3, deduplicated))
    assert spliced is not None
    assert DEDUP_ID_ATTRIBUTE.encode() not in spliced[0]


def test_a_message_with_a_publish_time_takes_the_protobuf_path() -> None:
    # A second publish_time on the wire would be merged with the client's, not replace it.
    m = pb.PubsubMessage(data=b"a")
    m.publish_time.nanos = 5
    payload = pb.PublishRequest(messages=[m]).SerializeToString()
    entry = Entry(0, 1, 2_000_000, payload)
    assert _spliced(0, entry) is None
    [out] = decode(0, entry).messages
    assert pb.PubsubMessage.FromString(out).publish_time.nanos == 0


@pytest.mark.parametrize("data_size", [1, 100, 127, 128, 5000])
@pytest.mark.parametrize("dedup_size", [1, 40, 107, 108, 300])
@pytest.mark.parametrize("key", ["", "k"])
def test_deduplicated_messages_of_every_length_lose_only_the_reserved_attribute(
    data_size: int, dedup_size: int, key: str
) -> None:
    """The cutter's common form (data, then the reserved entry) and its edges: lengths around
    one-byte varints, an ordering key after the entry."""
    batch = MessageBatch(
        [("d" * dedup_size, pb.PubsubMessage(data=b"\x12" * data_size, ordering_key=key))]
    )
    [(payload, _, _, _)] = batch.stored([0])
    entry = Entry(base_offset=3, count=1, publish_time_us=1_234_567, payload=payload)
    assert _spliced(0, entry) is not None
    expected = [pb.PubsubMessage.FromString(b) for b in _reference(0, entry)]
    assert [pb.PubsubMessage.FromString(b) for b in decode(0, entry).messages] == expected
    assert not expected[0].attributes


def test_message_ids_of_one_entry_may_differ_in_length() -> None:
    messages = [pb.PubsubMessage(data=b"%d" % i) for i in range(5)]
    payload = pb.PublishRequest(messages=messages).SerializeToString()
    entry = Entry(base_offset=98, count=5, publish_time_us=37_000_000, payload=payload)
    decoded = [pb.PubsubMessage.FromString(b) for b in decode(0, entry).messages]
    assert [m.message_id for m in decoded] == ["98", "99", "100", "101", "102"]
    assert decoded == [pb.PubsubMessage.FromString(b) for b in _reference(0, entry)]


def test_a_percent_sign_in_the_publish_time_bytes_is_kept() -> None:
    # 37 = ord("%"): the publish time's varint holds it, inside the per-entry format string.
    payload = pb.PublishRequest(messages=[pb.PubsubMessage(data=b"a")]).SerializeToString()
    entry = Entry(base_offset=0, count=1, publish_time_us=37_000_000, payload=payload)
    [out] = decode(0, entry).messages
    assert pb.PubsubMessage.FromString(out).publish_time.seconds == 37
