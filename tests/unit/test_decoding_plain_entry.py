"""A raw stream's form of a decoded entry (``DecodedEntry.plain``): a plain entry's data,
sizes and publish time, made without the serialized messages; anything else is not plain."""

from __future__ import annotations

import pytest

from pubsubd.core import pb
from pubsubd.core.dedup_batches import MessageBatch
from pubsubd.core.records import Entry
from pubsubd.data.decoding import decode

pytestmark = pytest.mark.unit

TIME_US = 1_700_000_000_123_456


def _publish(*messages: pb.PubsubMessage) -> bytes:
    return pb.PublishRequest(topic="projects/p/topics/t", messages=messages).SerializeToString()


def _deduplicated(*data: bytes, dedup_id: str = "pulsar/i/p/") -> bytes:
    batch = MessageBatch([(f"{dedup_id}{i}", pb.PubsubMessage(data=d)) for i, d in enumerate(data)])
    [(payload, _, _, _)] = batch.stored(range(len(data)))
    return payload


def _entry(payload: bytes, offset: int = 100) -> Entry:
    count = len(pb.PublishRequest.FromString(payload).messages)
    return Entry(offset, count, TIME_US, payload)


@pytest.mark.parametrize(
    "payload",
    [
        _deduplicated(b"a", b"b" * 127, b"c" * 128, b"d" * 20000),
        _publish(pb.PubsubMessage(data=b"x"), pb.PubsubMessage(data=b"y" * 300)),
    ],
    ids=["deduplicated", "published"],
)
def test_a_plain_entry_is_its_data_sizes_and_time_without_its_messages(payload: bytes) -> None:
    decoded = decode(2, _entry(payload))
    plain = decoded.plain()
    assert plain is not None
    assert decoded._messages is None  # the serialized messages were not made for it
    messages = decoded.messages
    assert plain.sizes == [len(m) for m in messages]
    for i, m in enumerate(messages):
        parsed = pb.PubsubMessage.FromString(m)
        assert parsed.data == plain.data[i]
        assert parsed.publish_time.SerializeToString() == plain.stamp
        assert not parsed.attributes
    assert decoded.plain() is plain  # kept


def test_reading_the_serialized_messages_does_not_parse_the_entry() -> None:
    decoded = decode(0, _entry(_deduplicated(b"a", b"b")))
    assert len(decoded.messages) == 2
    assert decoded._parsed is None
    assert decoded.ordering_key == ""
    assert [m.data for m in decoded.parsed] == [b"a", b"b"]
    assert all(not m.attributes for m in decoded.parsed)


@pytest.mark.parametrize(
    ("payload", "offset"),
    [
        (_publish(pb.PubsubMessage(data=b"a", ordering_key="k")), 100),
        (_publish(pb.PubsubMessage(data=b"a", attributes={"k": "v"})), 100),
        (
            MessageBatch([("d", pb.PubsubMessage(data=b"a", attributes={"k": "v"}))]).stored([0])[
                0
            ][0],
            100,
        ),
        # a message ID of the client's in the stored bytes
        (_publish(pb.PubsubMessage(data=b"a", message_id="7")), 100),
        # an unknown field (15)
        (_publish() + b"\x12\x06\x0a\x01a\x7a\x01x", 100),
        # data twice in one message
        (_publish() + b"\x12\x06\x0a\x01a\x0a\x01b", 100),
        # a dedup ID too long for one-byte lengths
        (_deduplicated(b"a", dedup_id="p" * 120), 100),
        # message IDs 99 and 100: their lengths differ
        (_deduplicated(b"a", b"b"), 99),
    ],
    ids=[
        "ordering-key",
        "attribute",
        "dedup-with-attribute",
        "client-message-id",
        "unknown-field",
        "data-twice",
        "long-dedup-id",
        "ids-cross-a-power-of-ten",
    ],
)
def test_anything_else_is_not_plain(payload: bytes, offset: int) -> None:
    assert decode(0, _entry(payload, offset)).plain() is None
