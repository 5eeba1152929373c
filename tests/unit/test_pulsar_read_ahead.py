"""An in-process Pulsar consumer reads ahead of its client's permits, and gives back what it
read ahead, never sent, without counting a delivery attempt.

The stream may lease such a consumer up to its client's largest FLOW (at most READ_AHEAD_MAX)
more than the permits, so the next FLOW is answered from messages already planned. What waits in
the buffer goes back uncounted when no FLOW came for READ_AHEAD_IDLE_S, on a redeliver-all
and on close; what was sent is nacked (counted) as before. The consumer runs on a recording
leg (nothing under it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pubsubd._gen.pubsubd.pulsar import api_pb2
from pubsubd.core import ids as core_ids
from pubsubd.pulsar import consumers
from pubsubd.pulsar.consumers import READ_AHEAD_MAX, Consumer
from pubsubd.pulsar.deliveries import RawDeliveries
from tests.support.pulsar_frames import written_messages
from tests.support.pulsar_legs import RecordingLeg, recording_consumer

pytestmark = pytest.mark.unit

STAMP = b"\x08\x01"  # a plain entry's publish time (Timestamp seconds=1)


def _deliveries(first: int, count: int, generation: int) -> RawDeliveries:
    positions = [core_ids.position(0, o) for o in range(first, first + count)]
    return RawDeliveries(positions, generation, [1] * count, [b"m"] * count, [STAMP] * count)


def _pairs(first: int, count: int, generation: int) -> list[tuple[int, int]]:
    return [(core_ids.position(0, first + k), generation + k) for k in range(count)]


def _leg(consumer: Consumer) -> RecordingLeg:
    leg = consumer._leg
    assert isinstance(leg, RecordingLeg)
    return leg


def _calls(consumer: Consumer, kind: str) -> list[Any]:
    return [(names, window) for k, names, window in _leg(consumer).calls if k == kind]


def _sent(written: list[bytes]) -> int:
    return sum(n for _, _, n, _ in written_messages(written))


def test_a_flow_widens_the_window_by_the_read_ahead_of_the_largest_flow() -> None:
    written: list[bytes] = []
    consumer = recording_consumer(True, written)
    consumer.flow(500)
    assert _calls(consumer, "window") == [([], 500 + 500)]
    consumer.flow(1000)  # the client's receiver queue, as its first FLOW names it
    assert _calls(consumer, "window")[-1] == ([], 1500 + 1000)
    consumer.flow(100)  # a smaller FLOW later: the read-ahead stays the largest's
    assert _calls(consumer, "window")[-1] == ([], 1600 + 1000)
    consumer.flow(5 * READ_AHEAD_MAX)
    assert _calls(consumer, "window")[-1] == ([], 1600 + 5 * READ_AHEAD_MAX + READ_AHEAD_MAX)


def test_a_client_asking_one_message_at_a_time_gets_no_read_ahead() -> None:
    written: list[bytes] = []
    consumer = recording_consumer(True, written)
    consumer.flow(1)
    consumer.flow(1)
    assert _calls(consumer, "window") == [([], 2)]


def test_over_grpc_nothing_is_read_ahead() -> None:
    written: list[bytes] = []
    consumer = recording_consumer(False, written)
    consumer.flow(1000)
    assert _calls(consumer, "window") == [([], 1000)]


def test_stopping_gives_back_only_the_unsent_and_narrows_the_window() -> None:
    written: list[bytes] = []
    consumer = recording_consumer(True, written)
    consumer.flow(10)
    consumer._buffered_more([_deliveries(0, 25, 1)])  # 10 permitted, 15 read ahead
    consumer._pump()
    assert _sent(written) == 10
    consumer.stop_reading_ahead()
    assert _calls(consumer, "unsent") == [(_pairs(10, 15, 11), None)]
    assert _calls(consumer, "window")[-1] == ([], 10)  # what the client holds, no more
    assert not consumer._buffer and consumer._raw_buffered == 0
    assert _calls(consumer, "settle") == []  # nothing sent was nacked
    consumer.flow(10)  # the next FLOW reads ahead again
    assert _calls(consumer, "window")[-1] == ([], 20 + 10)


def test_redeliver_all_nacks_the_sent_and_gives_back_the_unsent() -> None:
    written: list[bytes] = []
    consumer = recording_consumer(True, written)
    consumer.flow(4)
    consumer._buffered_more([_deliveries(0, 9, 1)])
    consumer._pump()
    consumer.redeliver(api_pb2.CommandRedeliverUnacknowledgedMessages(consumer_id=3))
    assert _calls(consumer, "unsent") == [(_pairs(4, 5, 5), None)]
    nacked = [names for names, _ in _calls(consumer, "settle")]
    assert nacked == [_pairs(0, 4, 1)]
    assert consumer._held_count == 0 and not consumer._buffer


def test_close_nacks_the_sent_and_gives_back_the_unsent() -> None:
    written: list[bytes] = []
    consumer = recording_consumer(True, written)
    consumer.flow(3)
    consumer._buffered_more([_deliveries(0, 7, 1)])
    consumer._pump()
    asyncio.run(consumer.close())
    assert _calls(consumer, "unsent") == [(_pairs(3, 4, 4), None)]
    assert _calls(consumer, "give_back") == [(_pairs(0, 3, 1), None)]


def test_no_flow_for_the_idle_time_ends_reading_ahead_and_a_flow_keeps_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(consumers, "READ_AHEAD_IDLE_S", 0.2)

    async def run() -> tuple[list[Any], list[Any], list[Any]]:
        written: list[bytes] = []
        consumer = recording_consumer(True, written)
        consumer._loop = asyncio.get_running_loop()
        consumer.flow(2)
        consumer._buffered_more([_deliveries(0, 4, 1)])
        consumer._pump()
        await asyncio.sleep(0.12)
        consumer.flow(0)  # no permits: not a client's FLOW
        consumer.flow(2)  # the client goes on: the timer waits from here
        consumer._buffered_more([_deliveries(4, 2, 5)])
        await asyncio.sleep(0.12)
        before = _calls(consumer, "unsent")
        await asyncio.sleep(0.25)
        after = _calls(consumer, "unsent")
        windows = _calls(consumer, "window")
        await consumer.close()
        return before, after, windows

    before, after, windows = asyncio.run(run())
    assert before == []
    # Sent: 0..1, then 2..3 (the second FLOW); read ahead and never sent: 4, 5.
    assert after == [(_pairs(4, 2, 5), None)]
    assert windows[-1] == ([], 4)  # the four the client holds


def test_a_failover_consumer_that_stops_being_active_gives_back_what_it_read_ahead() -> None:
    written: list[bytes] = []
    consumer = recording_consumer(True, written)
    consumer.flow(2)
    consumer._buffered_more([_deliveries(0, 5, 1)])
    consumer._pump()
    consumer.told(True)
    assert _calls(consumer, "unsent") == []
    consumer.told(False)
    assert _calls(consumer, "unsent") == [(_pairs(2, 3, 3), None)]
    assert _calls(consumer, "window")[-1] == ([], 2)
    assert len(written) == 3  # the MESSAGE, then both notices
