"""Reading ahead (pulsar/consumers.py) never sends a client more than its permits, and every
delivery an in-process consumer was handed is accounted for exactly once: sent (then acked,
nacked, or given back counted when the consumer closes) or given back unsent, uncounted.

Any sequence of FLOWs, deliveries from the stream, acks of whole MESSAGEs, redeliver-alls,
failover notices and firings of the idle timer, then close, on a recording leg.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.core import ids as core_ids
from pubsubd.pulsar.api import BaseCommand, CommandAck
from pubsubd.pulsar.consumers import settled_count
from pubsubd.pulsar.deliveries import RawDeliveries
from tests.support.pulsar_frames import written_messages
from tests.support.pulsar_legs import RecordingLeg, recording_consumer

pytestmark = pytest.mark.property

STAMP = b"\x08\x01"  # a plain entry's publish time (Timestamp seconds=1)

_op = st.one_of(
    st.tuples(st.just("flow"), st.integers(0, 40)),
    st.tuples(st.just("feed"), st.integers(1, 30)),
    st.tuples(st.just("idle"), st.just(0)),  # the idle timer ends reading ahead
    st.tuples(st.just("ack"), st.integers(0, 20)),  # a whole MESSAGE the client holds
    st.tuples(st.just("redeliver_all"), st.just(0)),
    st.tuples(st.just("told"), st.integers(0, 1)),  # a failover notice: inactive, active
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_never_more_than_the_permits_and_each_delivery_named_once(
    ops: list[tuple[str, int]],
) -> None:
    written: list[bytes] = []
    consumer = recording_consumer(True, written)
    leg = consumer._leg
    assert isinstance(leg, RecordingLeg)
    fed: list[tuple[int, int]] = []
    sent: set[int] = set()
    permits = 0
    offset = generation = 1

    def record_sent() -> None:
        for ledger, entry, n, _ in written_messages(written):
            for k in range(n):
                sent.add(core_ids.position(ledger, entry + k))

    for kind, arg in ops:
        if kind == "flow":
            permits += arg
            consumer.flow(arg)
        elif kind == "feed":
            positions = [core_ids.position(0, o) for o in range(offset, offset + arg)]
            consumer._buffered_more(
                [RawDeliveries(positions, generation, [1] * arg, [b"m"] * arg, [STAMP] * arg)]
            )
            consumer._pump()
            fed += zip(positions, range(generation, generation + arg), strict=True)
            offset, generation = offset + arg, generation + arg
        elif kind == "idle":
            consumer.stop_reading_ahead()
        elif kind == "ack":
            keys = sorted(consumer._sent)
            if keys:
                ledger, entry = keys[arg % len(keys)]
                cmd = CommandAck(consumer_id=3)
                cmd.message_id.add(ledgerId=ledger, entryId=entry)
                consumer.ack(cmd)
        elif kind == "redeliver_all":
            consumer.redeliver(BaseCommand().redeliverUnacknowledgedMessages)
        else:
            consumer.told(bool(arg))
            written.pop()  # the ACTIVE_CONSUMER_CHANGE frame
        record_sent()
        assert len(sent) <= permits  # never more than the client asked for
        unsent = {pos for k, names, _ in leg.calls if k == "unsent" for pos, _ in names}
        assert not unsent & sent  # given back uncounted only what was never sent
        assert consumer._held_count == settled_count(consumer._delivered())
    asyncio.run(consumer.close())
    named: list[Any] = [d for k, names, _ in leg.calls if k != "window" for d in names]
    assert sorted(named) == sorted(fed)
