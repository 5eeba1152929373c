"""Decoded entries carry their messages' data as one list when no message has an attribute but
the reserved dedup one (the columnar Read's fast path), and only then."""

from __future__ import annotations

import pytest

from pubsubd.core import pb
from pubsubd.core.dedup_batches import MessageBatch
from pubsubd.core.records import Entry
from pubsubd.data.decoding import decode

pytestmark = pytest.mark.unit


def _entry(payload: bytes, count: int) -> Entry:
    return Entry(base_offset=10, count=count, publish_time_us=1, payload=payload)


def _publish(*messages: object) -> bytes:
    return pb.PublishRequest(topic="projects/p/topics/t", messages=messages).SerializeToString()


def test_messages_without_attributes_give_their_data_in_one_list() -> None:
    payload = _publish(pb.PubsubMessage(data=b"a"), pb.PubsubMessage(data=b"bc", ordering_key="k"))
    decoded = decode(0, _entry(payload, 2))
    assert decoded.plain_data() == [b"a", b"bc"]
    assert decoded.plain_data() == [m.data for m in decoded.parsed]


def test_a_deduplicated_batch_gives_its_data_in_one_list() -> None:
    batch = MessageBatch(
        [("q:0", pb.PubsubMessage(data=b"x")), ("q:1", pb.PubsubMessage(data=b"y"))]
    )
    [(payload, _, _, _)] = batch.stored([0, 1])
    decoded = decode(0, _entry(payload, 2))
    assert decoded.plain_data() == [b"x", b"y"]
    assert all(not m.attributes for m in decoded.parsed)  # the reserved attribute stripped


@pytest.mark.parametrize(
    "payload",
    [
        # an attribute (and a message with an attribute but no data)
        _publish(pb.PubsubMessage(data=b"a", attributes={"k": "v"}), pb.PubsubMessage(data=b"b")),
        _publish(pb.PubsubMessage(attributes={"k": "v"}), pb.PubsubMessage(data=b"b")),
        # a deduplicated message with an attribute of its own
        MessageBatch([("q:0", pb.PubsubMessage(data=b"x", attributes={"k": "v"}))]).stored([0])[0][
            0
        ],
        # data twice on the wire in one message (parsed: the last one)
        _publish() + b"\x12\x06\x0a\x01a\x0a\x01b",
    ],
    # Named, not by their bytes: a map's order on the wire differs between processes (hash
    # seeds), and pytest-xdist's workers must collect the same test IDs.
    ids=["attribute", "attribute-no-data", "dedup-with-attribute", "data-twice"],
)
def test_anything_else_is_read_from_the_parsed_messages(payload: bytes) -> None:
    count = len(pb.PublishRequest.FromString(payload).messages)
    assert decode(0, _entry(payload, count)).plain_data() is None
