"""A Pulsar consumer settles a large grouped ACK in slices, one per turn of the loop, in order
before anything that must find it settled.

The C++ client reports acks every 100 ms, so a fast consumer's ACK names tens of thousands of
messages; settled at once they held the server's loop 9-21 ms, and FLOWs read meanwhile waited
(BENCHMARKS.md, PC4). The consumer here runs on a recording leg (nothing under it) with the
loop's ``call_soon`` replaced by a list the test runs by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pubsubd.core import ids as core_ids
from pubsubd.pulsar import consumers
from pubsubd.pulsar.api import BaseCommand, CommandAck
from pubsubd.pulsar.consumers import Consumer
from pubsubd.pulsar.deliveries import RawDeliveries
from tests.support.pulsar_frames import written_messages
from tests.support.pulsar_legs import RecordingLeg, recording_consumer

pytestmark = pytest.mark.unit

STAMP = b"\x08\x01"  # a plain entry's publish time (Timestamp seconds=1)


def _delivered(count: int, batch: int = 1000) -> tuple[Consumer, list[Callable[[], None]]]:
    """A consumer that was sent ``count`` messages (batches of ``batch``), deferring to a list."""
    written: list[bytes] = []
    consumer = recording_consumer(True, written)
    turns: list[Callable[[], None]] = []
    consumer._defer = turns.append
    positions = [core_ids.position(0, o) for o in range(count)]
    consumer._buffered_more(
        [RawDeliveries(positions, 1, [1] * count, [b"m"] * count, [STAMP] * count)]
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(consumers, "MAX_BATCH", batch)
        consumer.flow(count)
    assert sum(n for _, _, n, _ in written_messages(written)) == count
    return consumer, turns


def _ack_batches(consumer: Consumer, entries: range, request_id: int | None = None) -> None:
    cmd = CommandAck(consumer_id=3)
    for entry in entries:
        cmd.message_id.add(ledgerId=0, entryId=entry)
    if request_id is not None:
        cmd.request_id = request_id
    consumer.ack(cmd)


def _settled(leg: Any) -> list[int]:
    """How many deliveries each settle call named."""
    assert isinstance(leg, RecordingLeg)
    return [len(names) for kind, names, _ in leg.calls if kind == "settle"]


def _run(turns: list[Callable[[], None]]) -> None:
    """Run the deferred callbacks, one turn at a time (a turn may schedule the next)."""
    while turns:
        turns.pop(0)()


def test_a_large_ack_is_settled_in_slices_one_per_turn() -> None:
    consumer, turns = _delivered(20_000)
    _ack_batches(consumer, range(0, 20_000, 1000))
    assert _settled(consumer._leg) == []  # nothing in the ACK's own step
    assert len(turns) == 1
    turns.pop(0)()
    assert _settled(consumer._leg) == [5000]  # whole batches up to ACK_SLICE or just past it
    assert len(turns) == 1  # the rest in a later turn
    _run(turns)
    assert _settled(consumer._leg) == [5000, 5000, 5000, 5000]
    assert consumer._held_count == 0


def test_until_settled_acked_messages_count_as_held_so_a_flow_widens_by_its_permits() -> None:
    consumer, turns = _delivered(10_000)
    leg = consumer._leg
    assert isinstance(leg, RecordingLeg)
    _ack_batches(consumer, range(0, 10_000, 1000))
    consumer.flow(500)
    # held 10,000 + 500 permits, and 1,000 read ahead (the largest FLOW, test_pulsar_read_ahead)
    assert leg.calls[-1] == ("window", [], 11_500)
    _run(turns)
    # Each slice narrows the window by what it settled: 500 permits remain.
    assert [w for kind, _, w in leg.calls if kind == "settle"] == [6500, 1500]


def test_a_nack_a_receipt_and_closing_find_the_acks_due_settled_first() -> None:
    consumer, turns = _delivered(12_000)
    _ack_batches(consumer, range(0, 10_000, 1000))
    consumer.redeliver(BaseCommand().redeliverUnacknowledgedMessages)
    # All 10,000 acks at once, then the nack of the rest; the scheduled turn has nothing left.
    assert _settled(consumer._leg) == [10_000, 2000]
    _run(turns)
    assert _settled(consumer._leg) == [10_000, 2000]

    consumer, turns = _delivered(9000)
    _ack_batches(consumer, range(0, 9000, 1000), request_id=7)  # a receipt is asked for
    assert _settled(consumer._leg) == [9000]


def test_slices_settle_acks_in_the_order_read() -> None:
    consumer, turns = _delivered(9000, batch=1)
    _ack_batches(consumer, range(8999, -1, -1))  # 9000 single messages, last first
    _run(turns)
    leg = consumer._leg
    assert isinstance(leg, RecordingLeg)
    named = [pos for kind, names, _ in leg.calls if kind == "settle" for pos, _ in names]
    assert named == [core_ids.position(0, o) for o in range(8999, -1, -1)]
    assert _settled(leg) == [4096, 4096, 808]
