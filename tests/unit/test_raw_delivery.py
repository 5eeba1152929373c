"""A raw consumer (an in-process stream, the Pulsar front's) gets what a framed one gets.

Two planners over the same topic and the same steps, one serving a framed consumer (framed
ReceivedMessages with ack IDs) and one a raw one (stored messages or a plain entry's data,
positions, first lease generation, attempts): every response holds the same messages (data,
ID, publish time, attributes, key), leased at the same positions and generations (the ack
ID's), with the same delivery attempts, counted as the same bytes by flow control; acks and
nacks given as (position, generation) act as the ack IDs do.
"""

from __future__ import annotations

from typing import Any

import pytest

from pubsubd.core import pb, queue_settings
from pubsubd.data.subscribe.consumers import Consumer
from pubsubd.data.subscribe.planner import DeliveryPlanner
from tests.support.planner import MemoryTopic, Recorder, planner, run, subscription

pytestmark = pytest.mark.unit

Seen = tuple[int, int, int, Any]  # position, generation, attempt, message


class RawRecorder(Consumer):
    raw = True

    def __init__(self, max_messages: int) -> None:
        super().__init__(10.0, max_messages, 0)
        self.received: list[Seen] = []

        self.plain = 0  # messages handed over as a plain entry's data

    def deliver(self, messages: list[bytes], positions: list[int]) -> None:
        raise AssertionError("a raw consumer is handed raw deliveries only")

    def deliver_raw(self, delivery: Any) -> None:
        count = len(delivery.positions)
        attempts = delivery.attempts or [0] * count
        stamps = delivery.stamps or [None] * count
        for i, (pos, stored, stamp) in enumerate(
            zip(delivery.positions, delivery.received, stamps, strict=True)
        ):
            if stamp is None:  # a serialized PubsubMessage
                message = pb.PubsubMessage.FromString(stored)
            else:  # a plain message's data; its ID is its position, its time the stamp
                message = pb.PubsubMessage(data=stored, message_id=str(pos))
                message.publish_time.MergeFromString(stamp)
                self.plain += 1
            self.received.append((pos, delivery.first_generation + i, attempts[i], message))


class FramedRecorder(Recorder):
    """A framed consumer that keeps each ReceivedMessage's PubsubMessage too."""

    def __init__(self, max_messages: int) -> None:
        super().__init__(max_messages=max_messages)
        self.messages: list[Any] = []

    def deliver(self, messages: list[bytes], positions: list[int]) -> None:
        super().deliver(messages, positions)
        response = pb.PullResponse.FromString(b"".join(messages))
        self.messages += [r.message for r in response.received_messages]


def _framed(p: DeliveryPlanner, c: FramedRecorder) -> list[Seen]:
    """(position, generation, attempt, message) of each message, from its ack ID."""
    out: list[Seen] = []
    for (ack_id, pos, attempt), message in zip(c.received, c.messages, strict=True):
        decoded_pos, generation = p.decode(ack_id)
        assert decoded_pos == pos
        out.append((pos, generation, attempt, message))
    return out


@pytest.mark.parametrize("attempts", ["always", ""])
def test_raw_and_framed_deliveries_match_through_acks_nacks_and_redeliveries(
    attempts: str,
) -> None:
    labels = {queue_settings.DELIVERY_ATTEMPTS_LABEL: attempts} if attempts else {}
    topic = MemoryTopic()
    framed_p = planner(topic, subscription(labels=labels))
    raw_p = planner(topic, subscription(labels=labels))
    framed, raw = FramedRecorder(max_messages=4), RawRecorder(max_messages=4)
    framed_p.add_consumer(framed)
    raw_p.add_consumer(raw)
    topic.publish(b"a", b"b", b"c")
    topic.publish(b"d", attributes={"k": "v"}, key="")
    topic.publish(b"e", b"f")
    topic.publish_deduplicated(b"g", b"h" * 200)
    now = 0.0
    for step in range(6):
        run(framed_p, now)
        run(raw_p, now)
        assert raw.received, "every step delivers"
        assert _framed(framed_p, framed) == raw.received
        assert raw_p.outstanding_bytes == framed_p.outstanding_bytes
        assert raw.outstanding_bytes == framed.outstanding_bytes
        counted = [a for _, _, a, _ in raw.received]
        assert min(counted) >= 1 if attempts else set(counted) == {0}
        if attempts and step:
            assert max(counted) == step + 1  # nacked every step since the first
        deliveries = [(pos, gen) for pos, gen, _, _ in raw.received]
        framed.received.clear()
        framed.messages.clear()
        raw.received.clear()
        if step % 2:  # nack: redelivered, another attempt
            framed_p.modify_deadline(deliveries, 0, now)
            raw_p.modify_deadline(deliveries, 0, now)
        else:  # ack the first, nack the rest
            framed_p.acknowledge([pos for pos, _ in deliveries[:1]])
            raw_p.acknowledge([pos for pos, _ in deliveries[:1]])
            framed_p.modify_deadline(deliveries[1:], 0, now)
            raw_p.modify_deadline(deliveries[1:], 0, now)
        now += 1.0
    assert framed_p.cursors[0].mark_delete == raw_p.cursors[0].mark_delete > 0
    assert raw.plain, "plain entries reach the raw consumer as their data"


@pytest.mark.parametrize("max_bytes", [1, 150, 400])
def test_plain_entries_are_split_into_responses_by_the_same_bytes(max_bytes: int) -> None:
    """Flow control counts a plain message handed over as its data as the serialized message
    a framed consumer gets: under a byte cap both planners cut the same responses."""
    topic = MemoryTopic()
    framed_p, raw_p = planner(topic), planner(topic)
    framed, raw = FramedRecorder(max_messages=100), RawRecorder(max_messages=100)
    framed.max_bytes = raw.max_bytes = max_bytes
    framed_p.add_consumer(framed)
    raw_p.add_consumer(raw)
    topic.publish(*[b"p"] * 8)
    topic.publish(b"x" * 130, b"y")
    topic.publish_deduplicated(*[b"m%d" % i * (i * 7) for i in range(1, 12)])
    topic.publish(b"z", key="k")  # not plain (an ordering key)
    for now in range(40):
        run(framed_p, float(now))
        run(raw_p, float(now))
        assert _framed(framed_p, framed) == raw.received
        assert raw_p.outstanding_bytes == framed_p.outstanding_bytes
        deliveries = [(pos, gen) for pos, gen, _, _ in raw.received]
        framed.received.clear()
        framed.messages.clear()
        raw.received.clear()
        framed_p.acknowledge([pos for pos, _ in deliveries])
        raw_p.acknowledge([pos for pos, _ in deliveries])
    assert raw_p.cursors[0].mark_delete == framed_p.cursors[0].mark_delete == 22
    assert raw.plain == 8 + 2 + 11
