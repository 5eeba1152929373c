"""The Pulsar consumer's batched delivery and how the client's acks map back to ack IDs.

The consumer is driven without a stream: messages go into its buffer as the StreamingPull
would deliver them, FLOW permits release them, and what it writes (MESSAGE frames) and queues
for the stream (acks, nacks) is read back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pubsubd.core import ids as core_ids
from pubsubd.core import pb
from pubsubd.pulsar.api import BaseCommand, CommandAck
from pubsubd.pulsar.consumers import Consumer
from pubsubd.pulsar.streams import GrpcLeg
from tests.support.pulsar_frames import written_messages


def _consumer(auto_ack: bool = False, cumulative_ok: bool = False) -> tuple[Consumer, list[Any]]:
    written: list[bytes] = []
    consumer = Consumer(
        gateway=None,  # type: ignore[arg-type]  # never called: no stream is opened
        write=written.append,
        consumer_id=7,
        subscription="projects/p/subscriptions/s",
        client_id="c",
        cumulative_ok=cumulative_ok,
        auto_ack=auto_ack,
    )
    return consumer, written


def _received(
    source: int, offset: int, attempt: int = 1, publish_ms: int = 5000
) -> pb.ReceivedMessage:
    r = pb.ReceivedMessage(ack_id=f"a{source}-{offset}", delivery_attempt=attempt)
    r.message.message_id = str(core_ids.position(source, offset))
    r.message.data = f"m{offset}".encode()
    r.message.publish_time.seconds = publish_ms // 1000
    r.message.publish_time.nanos = (publish_ms % 1000) * 1_000_000
    return r


_deliveries = written_messages


def _requests(consumer: Consumer) -> asyncio.Queue[Any]:
    """The StreamingPull requests the consumer queued on its gRPC stream leg."""
    leg = consumer._leg
    assert isinstance(leg, GrpcLeg)
    return leg._requests


def _queued(consumer: Consumer) -> tuple[list[str], list[str]]:
    """(acked, nacked) ack IDs the consumer queued for its stream."""
    acked: list[str] = []
    nacked: list[str] = []
    queue = _requests(consumer)
    while not queue.empty():
        request = queue.get_nowait()
        acked += request.ack_ids
        nacked += request.modify_deadline_ack_ids
    return acked, nacked


def _ack(consumer: Consumer, *ids: tuple[int, int, list[int]], cumulative: bool = False) -> None:
    cmd = CommandAck(consumer_id=7, ack_type=CommandAck.Cumulative if cumulative else 0)
    for ledger, entry, ack_set in ids:
        mid = cmd.message_id.add(ledgerId=ledger, entryId=entry)
        mid.ack_set.extend(ack_set)
    consumer.ack(cmd)


def _redeliver(consumer: Consumer, *ids: tuple[int, int]) -> None:
    cmd = BaseCommand().redeliverUnacknowledgedMessages
    cmd.consumer_id = 7
    for ledger, entry in ids:
        cmd.message_ids.add(ledgerId=ledger, entryId=entry)
    consumer.redeliver(cmd)


def test_consecutive_messages_go_out_as_batches_split_by_gap_attempt_and_time() -> None:
    consumer, written = _consumer()
    consumer._buffer.extend(
        [_received(0, o) for o in (10, 11, 12)]  # one batch
        + [_received(0, 14)]  # a gap: a single message
        + [_received(0, 15, attempt=2), _received(0, 16, attempt=2)]  # another count
        + [_received(0, 17, attempt=2, publish_ms=5001)]  # another publish time
        + [_received(1, 18), _received(1, 19)]  # another source
    )
    consumer.flow(5)  # permits cut the second batch short
    assert _deliveries(written) == [(0, 10, 3, 0), (0, 14, 1, 0), (0, 15, 1, 1)]
    consumer.flow(100)
    assert _deliveries(written) == [(0, 16, 1, 1), (0, 17, 1, 1), (1, 18, 2, 0)]
    assert consumer.permits == 100 - 4


def test_acks_of_a_batch_whole_by_index_set_and_nack_of_the_rest() -> None:
    consumer, written = _consumer()
    consumer._buffer.extend(_received(0, o) for o in range(20, 30))
    consumer.flow(1000)
    assert _deliveries(written) == [(0, 20, 10, 0)]
    # Batch-index acks: bit i set = message i still unacked. 0, 1 and 4 acked, then 2.
    _ack(consumer, (0, 20, [0b1111101100]))
    _ack(consumer, (0, 20, [0b1111101000]))
    assert _queued(consumer) == (["a0-20", "a0-21", "a0-24", "a0-22"], [])
    _redeliver(consumer, (0, 20))  # a nack of the batch gives back only the unacked ones
    acked, nacked = _queued(consumer)
    assert acked == [] and nacked == [f"a0-{o}" for o in (23, 25, 26, 27, 28, 29)]
    assert consumer._sent == {}


def test_a_batch_acked_whole_and_a_nacked_batch_without_batch_index_acks() -> None:
    consumer, written = _consumer()
    consumer._buffer.extend(_received(0, o) for o in range(6))
    consumer.flow(3)
    consumer.flow(3)
    assert _deliveries(written) == [(0, 0, 3, 0), (0, 3, 3, 0)]
    _ack(consumer, (0, 0, []))  # every message of the batch acked (the client's default)
    _redeliver(consumer, (0, 3))  # no batch-index acks: the whole batch comes back
    assert _queued(consumer) == (["a0-0", "a0-1", "a0-2"], ["a0-3", "a0-4", "a0-5"])


def test_cumulative_acks_cover_whole_batches_or_up_to_the_first_unacked_message() -> None:
    consumer, written = _consumer(cumulative_ok=True)
    consumer._buffer.extend(_received(0, o) for o in range(9))
    for _ in range(3):
        consumer.flow(3)
    assert _deliveries(written) == [(0, 0, 3, 0), (0, 3, 3, 0), (0, 6, 3, 0)]
    _ack(consumer, (0, 0, []), cumulative=True)  # the whole first batch
    assert _queued(consumer)[0] == ["a0-0", "a0-1", "a0-2"]
    _ack(consumer, (0, 3, [0b110]), cumulative=True)  # batch-index: up to its message 0
    assert _queued(consumer)[0] == ["a0-3"]
    _ack(consumer, (0, 5, []), cumulative=True)  # without: the entry before a partial batch
    assert _queued(consumer)[0] == ["a0-4", "a0-5"]
    _ack(consumer, (0, 6, []), cumulative=True)
    assert _queued(consumer)[0] == ["a0-6", "a0-7", "a0-8"]
    assert consumer._sent == {}


def test_an_ack_naming_a_position_inside_a_batch_acks_that_message() -> None:
    consumer, _ = _consumer()
    consumer._buffer.extend(_received(0, o) for o in range(40, 44))
    consumer.flow(10)
    cmd = CommandAck(consumer_id=7)
    cmd.message_id.add(ledgerId=0, entryId=40, batch_index=2)
    cmd.message_id.add(ledgerId=0, entryId=43)  # a position, not a delivery's entry
    consumer.ack(cmd)
    assert _queued(consumer)[0] == ["a0-42", "a0-43"]
    _redeliver(consumer)  # everything held
    assert _queued(consumer)[1] == ["a0-40", "a0-41"]


def test_a_readers_messages_go_out_one_per_frame_and_are_acked_at_once() -> None:
    consumer, written = _consumer(auto_ack=True)
    consumer._buffer.extend(_received(0, o) for o in range(3))
    consumer.flow(10)
    assert _deliveries(written) == [(0, 0, 1, 0), (0, 1, 1, 0), (0, 2, 1, 0)]
    assert _queued(consumer) == (["a0-0", "a0-1", "a0-2"], [])


def _windows(consumer: Consumer) -> list[int]:
    """The stream windows (max_outstanding_messages) the consumer queued, in order."""
    out = []
    queue = _requests(consumer)
    while not queue.empty():
        request = queue.get_nowait()
        if request.max_outstanding_messages:
            out.append(request.max_outstanding_messages)
    return out


def test_the_streams_window_is_what_the_consumer_holds_plus_its_unused_permits() -> None:
    """FLOW widens the window; delivering moves permits to held (no change); an ack or nack
    narrows it by what it settles, in the same request; never below 1."""
    consumer, written = _consumer()
    consumer.flow(5)
    assert _windows(consumer) == [5]
    consumer._buffer.extend(_received(0, o) for o in (0, 2, 4))  # three single messages
    consumer.flow(0)
    assert len(_deliveries(written)) == 3
    assert _windows(consumer) == []  # 3 held + 2 permits: still 5
    _ack(consumer, (0, 0, []), (0, 2, []))
    assert _windows(consumer) == [3]  # 1 held + 2 permits
    consumer.flow(4)
    assert _windows(consumer) == [7]
    _redeliver(consumer, (0, 4))
    assert _windows(consumer) == [6]
    shared_nothing, _ = _consumer()
    shared_nothing.flow(0)
    assert _windows(shared_nothing) == []  # 1 (the window at open) already


def test_the_window_stops_at_pulsars_unacked_limit_per_consumer() -> None:
    """Held (acked by the client's ack grouping but not yet told) plus permits, up to 50,000
    (Pulsar's maxUnackedMessagesPerConsumer default); acks open it again."""
    consumer, written = _consumer()
    consumer.flow(30_000)
    consumer._buffer.extend(_received(0, o, publish_ms=o) for o in range(30_000))
    consumer.flow(0)
    assert sum(n for _, _, n, _ in _deliveries(written)) == 30_000
    assert _windows(consumer) == [30_000]
    consumer.flow(15_000)
    assert _windows(consumer) == [45_000]  # 30,000 held + 15,000 permits
    consumer.flow(10_000)
    assert _windows(consumer) == [50_000]  # not 55,000
    consumer.flow(500)
    assert _windows(consumer) == []
    _ack(consumer, *((0, o, []) for o in range(10_000)))
    assert _windows(consumer) == [45_500]  # 20,000 held + 25,500 permits
