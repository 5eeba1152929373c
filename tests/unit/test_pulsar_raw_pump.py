"""The Pulsar consumer over an in-process stream writes what it writes over gRPC.

The same stored messages (``data/decoding.py``'s form: plain ones, ones with attributes, an
ordering key, the reserved dedup attribute, data of 128 bytes and more, several publish times
and attempts; with ``plain-entries`` the plain entries' messages as their data and publish
time, as the planner hands them to a raw stream) go to two consumers: one fed
ReceivedMessages as the gRPC stream delivers them (``_pump``), one fed the raw form an
in-process stream delivers (``_pump_raw``). Under the same FLOW permits, acks and nacks they
write the same bytes, and settle the same deliveries (an ack ID against the (position,
generation) it names).
"""

from __future__ import annotations

import pytest

from pubsubd.core import ids as core_ids
from pubsubd.core import pb
from pubsubd.core.records import Entry
from pubsubd.core.validation import DEDUP_ID_ATTRIBUTE
from pubsubd.data.decoding import decode
from pubsubd.pulsar.api import BaseCommand, CommandAck
from pubsubd.pulsar.consumers import Consumer
from pubsubd.pulsar.deliveries import RawDeliveries
from tests.support.pulsar_legs import INCARNATION, RecordingLeg, recording_consumer

pytestmark = pytest.mark.unit


def _stored(plain: bool = False) -> list[tuple[int, bytes, bytes | None]]:
    """(position, stored message, stamp) of entries as the subscribing forwarder decodes them:
    serialized PubsubMessages (stamp None), or with ``plain`` a plain entry's data and publish
    time as the planner hands them to a raw stream (``DecodedEntry.plain``)."""
    entries = [
        ([pb.PubsubMessage(data=b"p%d" % i) for i in range(5)], 1_700_000_000_123_000),
        ([pb.PubsubMessage(data=b"x" * 300), pb.PubsubMessage(data=b"")], 1_700_000_000_123_000),
        (
            [
                pb.PubsubMessage(data=b"a", attributes={"k": "v"}),
                pb.PubsubMessage(data=b"b", attributes={DEDUP_ID_ATTRIBUTE: "d1"}),
                pb.PubsubMessage(data=b"c", ordering_key="key"),
            ],
            1_700_000_000_123_000,
        ),
        ([pb.PubsubMessage(data=b"q%d" % i) for i in range(4)], 1_700_000_001_000_000),
    ]
    out: list[tuple[int, bytes, bytes | None]] = []
    offset = 0
    for messages, time_us in entries:
        payload = pb.PublishRequest(topic="projects/p/topics/t", messages=messages)
        entry = Entry(offset, len(messages), time_us, payload.SerializeToString())
        decoded = decode(0, entry)
        found = decoded.plain() if plain else None
        for i, m in enumerate(decoded.messages):
            pos = core_ids.position(0, offset + i)
            out.append((pos, m, None) if found is None else (pos, found.data[i], found.stamp))
        offset += len(messages)
    if plain:
        assert sum(stamp is not None for _, _, stamp in out) == 9  # the first and last entries
    return out


def _fill(framed: Consumer, raw: Consumer, attempts: dict[int, int], plain: bool) -> None:
    serialized = _stored()
    for generation, (pos, item, stamp) in enumerate(_stored(plain), 40):
        attempt = attempts.get(pos, 1)
        framed._buffer.append(
            pb.ReceivedMessage(
                ack_id=core_ids.encode_ack_id(INCARNATION, pos, generation),
                message=pb.PubsubMessage.FromString(serialized[generation - 40][1]),
                delivery_attempt=attempt,
            )
        )
        raw._buffered_more([RawDeliveries([pos], generation, [attempt], [item], [stamp])])


@pytest.mark.parametrize("plain", [False, True], ids=["serialized", "plain-entries"])
@pytest.mark.parametrize("auto_ack", [False, True])
def test_raw_and_framed_consumers_write_the_same_frames_and_settle_the_same(
    auto_ack: bool, plain: bool
) -> None:
    framed_out: list[bytes] = []
    raw_out: list[bytes] = []
    framed = recording_consumer(False, framed_out, auto_ack=auto_ack)
    raw = recording_consumer(True, raw_out, read_ahead=False, auto_ack=auto_ack)
    _fill(framed, raw, attempts={3: 2, 4: 2}, plain=plain)
    for permits in (2, 1, 4, 3, 100):
        framed.flow(permits)
        raw.flow(permits)
        assert raw_out == framed_out
        assert raw._sent.keys() == framed._sent.keys()
    assert len(framed_out) == 5 and not raw._buffer
    # Acks: a whole batch, a batch-index ack, a position inside a batch, then a cumulative
    # ack and a nack of what is left.
    for consumer in (framed, raw):
        cmd = CommandAck(consumer_id=3)
        cmd.message_id.add(ledgerId=0, entryId=0)
        cmd.message_id.add(ledgerId=0, entryId=5, ack_set=[0b10])
        cmd.message_id.add(ledgerId=0, entryId=11)
        consumer.ack(cmd)
        cumulative = CommandAck(consumer_id=3, ack_type=CommandAck.Cumulative)
        cumulative.message_id.add(ledgerId=0, entryId=9)
        consumer.ack(cumulative)
        consumer.redeliver(BaseCommand().redeliverUnacknowledgedMessages)
    framed_leg, raw_leg = framed._leg, raw._leg
    assert isinstance(framed_leg, RecordingLeg) and isinstance(raw_leg, RecordingLeg)
    assert raw_leg.calls == framed_leg.calls
    assert any(names for _, names, _ in raw_leg.calls)
