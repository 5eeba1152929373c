"""Property: a Pulsar consumer fed in-process responses (RawDeliveries, several messages each)
writes and settles what one fed the same messages as ReceivedMessages writes and settles.

The messages are entries as the subscribing forwarder decodes them (plain entries handed as
their data and publish time, others serialized; publish times that repeat from one entry to
the next), with positions skipped between and inside entries, delivery attempts that change,
cut into responses of any size. Batch limits are made small so that runs end by count and by
bytes. Under any FLOW permits, acks of every kind (a whole batch, batch-index acks, a batch
index, a position inside a batch, cumulative to a batch or into one), a nack of one delivery,
then a nack of what is left, both consumers write the same bytes and settle the same
(position, generation) deliveries.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.core import ids as core_ids
from pubsubd.core import pb
from pubsubd.core.records import Entry
from pubsubd.data.decoding import decode
from pubsubd.pulsar import consumers
from pubsubd.pulsar.api import BaseCommand, CommandAck
from pubsubd.pulsar.deliveries import RawDeliveries
from tests.support.pulsar_legs import INCARNATION, RecordingLeg, recording_consumer

pytestmark = pytest.mark.property

_entry = st.tuples(
    st.sampled_from([1_700_000_000_123_000, 1_700_000_000_123_000, 1_700_000_001_000_000]),
    st.lists(
        # data size, has an attribute (rare: one makes the whole entry serialized)
        st.tuples(st.integers(0, 120), st.integers(0, 15).map(lambda r: r == 0)),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from([0, 0, 0, 1, 2]),  # offsets skipped before the entry
)


def _messages(
    entries: list[tuple[int, list[tuple[int, bool]], int]], kept: list[bool]
) -> list[tuple[int, bytes, Any, bytes | None]]:
    """(position, serialized message, raw form, stamp) of each delivered message."""
    out: list[tuple[int, bytes, Any, bytes | None]] = []
    offset = 0
    n = 0
    for time_us, shapes, skip in entries:
        offset += skip
        messages = [
            pb.PubsubMessage(data=b"d" * size, attributes={"k": "v"} if attr else {})
            for size, attr in shapes
        ]
        payload = pb.PublishRequest(topic="projects/p/topics/t", messages=messages)
        decoded = decode(0, Entry(offset, len(messages), time_us, payload.SerializeToString()))
        found = decoded.plain()
        for i, m in enumerate(decoded.messages):
            n += 1
            if not kept[n % len(kept)]:
                continue  # acked or leased: not in this delivery
            pos = core_ids.position(0, offset + i)
            if found is None:
                out.append((pos, m, m, None))
            else:
                out.append((pos, m, found.data[i], found.stamp))
        offset += len(messages)
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_entry, min_size=1, max_size=6),
    # which messages are delivered (cycled): most
    st.lists(st.sampled_from([True, True, True, False]), min_size=1, max_size=9).map(
        lambda k: [True, *k]
    ),
    st.lists(st.integers(1, 3), min_size=1, max_size=5),  # attempts, cycled by runs
    st.lists(st.integers(1, 30), min_size=1, max_size=5),  # response sizes, cycled
    st.lists(st.integers(1, 25), min_size=1, max_size=8),  # FLOW permits
    st.integers(2, 12),  # MAX_BATCH
    st.integers(1, 400),  # MAX_BATCH_BYTES
    st.lists(
        st.tuples(
            st.sampled_from(
                ["whole", "ack_set", "batch_index", "inside", "cumulative", "cumulative_index"]
            ),
            st.integers(0, 50),  # which delivery
            st.integers(0, 50),  # which message in it
        ),
        max_size=6,
    ),
)
def test_raw_responses_write_and_settle_as_received_messages(
    entries: list[tuple[int, list[tuple[int, bool]], int]],
    kept: list[bool],
    attempts: list[int],
    cuts: list[int],
    permits: list[int],
    max_batch: int,
    max_bytes: int,
    acks: list[tuple[str, int, int]],
) -> None:
    delivered = _messages(entries, kept)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(consumers, "MAX_BATCH", max_batch)
        mp.setattr(consumers, "MAX_BATCH_BYTES", max_bytes)
        framed_out: list[bytes] = []
        raw_out: list[bytes] = []
        framed = recording_consumer(False, framed_out)
        raw = recording_consumer(True, raw_out, read_ahead=False)
        # Attempts change every few messages; responses are cut anywhere.
        attempt_of = [attempts[(k // 7) % len(attempts)] for k in range(len(delivered))]
        generation = 40
        k = 0
        cut = 0
        while k < len(delivered):
            size = cuts[cut % len(cuts)]
            cut += 1
            part = delivered[k : k + size]
            part_attempts = attempt_of[k : k + size]
            for j, (pos, serialized, _, _) in enumerate(part):
                framed._buffer.append(
                    pb.ReceivedMessage(
                        ack_id=core_ids.encode_ack_id(INCARNATION, pos, generation + j),
                        message=pb.PubsubMessage.FromString(serialized),
                        delivery_attempt=part_attempts[j],
                    )
                )
            raw._buffered_more(
                [
                    RawDeliveries(
                        [pos for pos, _, _, _ in part],
                        generation,
                        part_attempts,
                        [item for _, _, item, _ in part],
                        [stamp for _, _, _, stamp in part],
                    )
                ]
            )
            generation += len(part)
            k += len(part)
        for p in permits:
            framed.flow(p)
            raw.flow(p)
            assert raw_out == framed_out
            assert raw._sent.keys() == framed._sent.keys()
        # The client's acks of what it holds, of every kind, then a nack of one delivery.
        for kind, pick, index in acks:
            keys = sorted(framed._sent)
            if not keys:
                break
            ledger, entry = keys[pick % len(keys)]
            size = len(framed._sent[(ledger, entry)])
            cmd = CommandAck(consumer_id=3)
            if kind.startswith("cumulative"):
                cmd.ack_type = CommandAck.Cumulative
            mid = cmd.message_id.add(ledgerId=ledger, entryId=entry)
            if kind == "ack_set":  # batch-index acks: bits set are the unacked messages
                mid.ack_set.append(((1 << size) - 1) & ~(1 << (index % size)))
            elif kind in ("batch_index", "cumulative_index"):
                mid.batch_index = index % size
                mid.batch_size = size
            elif kind == "inside":  # an ID the client built: the position itself
                mid.entryId = entry + index % size
            for consumer in (framed, raw):
                consumer.ack(cmd)
            assert raw._sent.keys() == framed._sent.keys()
        if framed._sent:
            ledger, entry = sorted(framed._sent)[0]
            for consumer in (framed, raw):
                nack = BaseCommand().redeliverUnacknowledgedMessages
                nack.message_ids.add(ledgerId=ledger, entryId=entry)
                consumer.redeliver(nack)
        framed.redeliver(BaseCommand().redeliverUnacknowledgedMessages)
        raw.redeliver(BaseCommand().redeliverUnacknowledgedMessages)
        framed_leg, raw_leg = framed._leg, raw._leg
        assert isinstance(framed_leg, RecordingLeg) and isinstance(raw_leg, RecordingLeg)
        assert raw_leg.calls == framed_leg.calls
        # Every delivery is named once: sent (then acked or nacked) or buffered (given back
        # unsent).
        named = [
            d for kind, names, _ in raw_leg.calls if kind in ("settle", "unsent") for d in names
        ]
        assert sorted(named) == sorted((pos, 40 + k) for k, (pos, _, _, _) in enumerate(delivered))


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # position step from the previous (1: consecutive)
            st.sampled_from([b"\x08\x01", b"\x08\x02"]),  # stamp
            st.integers(1, 2),  # attempt
        ),
        min_size=1,
        max_size=40,
    ),
    st.data(),
)
def test_a_run_is_the_longest_prefix_with_one_stamp_attempt_and_consecutive_positions(
    shape: list[tuple[int, bytes, int]], data: st.DataObject
) -> None:
    positions = []
    p = 1000
    for step, _, _ in shape:
        p += step
        positions.append(p)
    stamps: list[bytes | None] = [bytes(stamp) for _, stamp, _ in shape]  # equal, not one object
    attempts = [a for _, _, a in shape]
    chunk = RawDeliveries(positions, 7, attempts, [b""] * len(shape), stamps)
    i = data.draw(st.integers(0, len(shape) - 1))
    limit = data.draw(st.integers(1, len(shape) - i))
    k = 1
    while (
        k < limit
        and positions[i + k] == positions[i] + k
        and stamps[i + k] == stamps[i]
        and attempts[i + k] == attempts[i]
    ):
        k += 1
    assert chunk.run(i, limit) == k
    assert chunk.refs(i, i + k) == [(positions[i + t], 7 + i + t) for t in range(k)]
