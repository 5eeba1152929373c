"""A Pulsar consumer's FLOW is answered in its own step, within the Shared window.

Over a real node and in-process streams (``SubscriberServicer.open_in_process``, as
``pubsubd serve`` opens them): a FLOW that widens a consumer's window makes the dispatcher
plan at once and the consumer write what it delivered before the FLOW's handler returns
(``Stream.take_ready``), not two loop turns later. The window is still what the consumer
holds plus its permits: a second consumer of the Shared subscription gets the rest, nobody
gets a message twice, and a consumer with no permits left gets nothing more. A stream's
queue hands over only the responses at its head: a notice or the ending error stays, in
order, for the stream's reader (``Responses.take_responses``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pubsubd.api.grpc.replay import ReplayServicer
from pubsubd.api.grpc.subscriber import SubscriberServicer
from pubsubd.core import pb
from pubsubd.core.active_notices import ActiveNotice
from pubsubd.data.subscribe.consumers import Responses
from pubsubd.node import Node
from pubsubd.pulsar.api import CommandAck
from pubsubd.pulsar.consumers import Consumer
from pubsubd.pulsar.gateway import Gateway
from pubsubd.pulsar.messages import OutMessage
from tests.support.inproc import running_node
from tests.support.pulsar_frames import written_messages

pytestmark = pytest.mark.unit

TOPIC = "projects/proj/topics/top"
SUB = "projects/proj/subscriptions/sub"
NOWHERE = "127.0.0.1:9"  # never dialled: publishes and streams are made in process


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path) as n:
        n.catalog.create_topic(pb.Topic(name=TOPIC))
        n.catalog.create_subscription(
            pb.Subscription(name=SUB, topic=TOPIC, labels={"pubsubd-delivery-attempts": "always"})
        )
        servicer = ReplayServicer(n.catalog, n.routes, n.cursors, n.snapshots, n.clock)
        gateway = Gateway(NOWHERE, servicer.publish_in_process)
        for start in (0, 1000):  # two stored entries of 1000 plain messages
            await gateway.publish(
                TOPIC,
                [
                    OutMessage(b"m%d" % i, {}, "", f"pulsar/i/p/{i}")
                    for i in range(start, start + 1000)
                ],
            )
        await gateway.close()
        yield n


def _consumer(node: Node, consumer_id: int, written: list[bytes]) -> Consumer:
    servicer = SubscriberServicer(node.catalog, node.snapshots, node.routes)
    return Consumer(
        gateway=None,  # type: ignore[arg-type]  # never called: the stream is in process
        write=written.append,
        consumer_id=consumer_id,
        subscription=SUB,
        client_id=f"consumer-{consumer_id}",
        cumulative_ok=False,
        open_in_process=servicer.open_in_process,
    )


def _taken(written: list[bytes]) -> list[tuple[int, int, int]]:
    """(ledger, entry, messages in it) of each MESSAGE written since the last call."""
    return [m[:3] for m in written_messages(written)]


def _positions(taken: list[tuple[int, int, int]]) -> list[int]:
    return [entry + i for _, entry, n in taken for i in range(n)]


def _ack_all(consumer: Consumer, taken: list[tuple[int, int, int]]) -> None:
    cmd = CommandAck(consumer_id=consumer.consumer_id, ack_type=0)
    for ledger, entry, _ in taken:
        cmd.message_id.add(ledgerId=ledger, entryId=entry)
    consumer.ack(cmd)


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_flow_is_written_in_its_own_step_and_the_rest_goes_to_the_other_consumer(
    node: Node,
) -> None:
    written_a: list[bytes] = []
    written_b: list[bytes] = []
    a, b = _consumer(node, 1, written_a), _consumer(node, 2, written_b)
    await a.open()
    await b.open()
    try:
        a.flow(500)
        first_a = _taken(written_a)  # no await since the FLOW: written in its step
        assert len(_positions(first_a)) == 500
        b.flow(300)
        first_b = _taken(written_b)
        assert len(_positions(first_b)) == 300
        await _turns()  # the scheduled pumps and the readers find nothing more to send
        assert _taken(written_a) == [] and _taken(written_b) == []

        _ack_all(a, first_a)  # A holds nothing and has no permits: at most one ahead
        await _turns()
        assert _taken(written_a) == []
        a.flow(500)
        second_a = _taken(written_a)
        assert len(_positions(second_a)) == 500
        seen = _positions(first_a) + _positions(first_b) + _positions(second_a)
        assert len(set(seen)) == len(seen) == 1300  # no message to two consumers
    finally:
        await a.close()
        await b.close()


async def test_a_flow_on_a_consumer_at_its_window_writes_nothing_more(node: Node) -> None:
    written: list[bytes] = []
    a = _consumer(node, 1, written)
    await a.open()
    try:
        a.flow(200)
        assert len(_positions(_taken(written))) == 200
        a.flow(0)  # no wider window: nothing planned, nothing written
        await _turns()
        assert _taken(written) == []
        a.flow(100)  # holds 200 unacked: 100 more, no more
        assert len(_positions(_taken(written))) == 100
        await _turns()
        assert _taken(written) == []
    finally:
        await a.close()


async def test_a_streams_queue_hands_over_its_leading_responses_only() -> None:
    queue = Responses()
    r1 = ([b"1"], [1], 1, None, None)
    r2 = ([b"2"], [2], 2, None, None)
    r3 = ([b"3"], [3], 3, None, None)
    notice = ActiveNotice(True)
    for item in (r1, r2, notice, r3):
        queue.put_nowait(item)
    assert queue.take_responses() == [r1, r2]
    assert queue.take_responses() == []  # the notice leads: left for the reader
    assert await queue.get() is notice
    assert queue.take_responses() == [r3]
    assert queue.empty()
    waiter = asyncio.ensure_future(queue.get())  # a reader waiting on an empty queue...
    await _turns(2)
    queue.put_nowait(r1)
    assert queue.take_responses() == [r1]  # ...taken from under it: it keeps waiting
    await _turns(2)
    assert not waiter.done()
    error = RuntimeError("ended")
    queue.put_nowait(error)
    assert await waiter is error
