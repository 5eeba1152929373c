"""In-process tests of giving back deliveries that never reached a client (issue 8, part 3):
a cancelled Pull, a Pull response that could not be sent, a stream's unsent responses.

Catalog, forwarders, dispatcher and storage are real (one node, ``pubsubd.node``); the event
loop is the test's, so each step happens in a chosen loop turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.core import pb
from pubsubd.data.subscribe.consumers import StreamConsumer
from pubsubd.data.subscribe.dispatcher import SubscriptionDispatcher
from pubsubd.node import Node
from tests.support.inproc import running_node

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/topic"
DLQ_TOPIC = "projects/p/topics/dlq"
SUB = "projects/p/subscriptions/sub"


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path) as n:
        n.catalog.create_topic(pb.Topic(name=TOPIC))
        n.catalog.create_topic(pb.Topic(name=DLQ_TOPIC))
        yield n


def _subscribe(node: Node, **fields: Any) -> SubscriptionDispatcher:
    node.catalog.create_subscription(
        pb.Subscription(
            name=SUB,
            topic=TOPIC,
            ack_deadline_seconds=60,
            dead_letter_policy=pb.Subscription().dead_letter_policy.__class__(
                dead_letter_topic=DLQ_TOPIC, max_delivery_attempts=5
            ),
            **fields,
        )
    )
    return node.subscribing.dispatchers[SUB]


async def _publish(node: Node, *data: bytes, key: str = "") -> None:
    uid = node.catalog.topic(TOPIC).record.uid
    for d in data:
        request = pb.PublishRequest(
            topic=TOPIC, messages=[pb.PubsubMessage(data=d, ordering_key=key)]
        )
        await node.routes.publishing(uid).publish(uid, request.SerializeToString(), 1, key)


def _received(messages: list[bytes]) -> list[Any]:
    return list(pb.PullResponse.FromString(b"".join(messages)).received_messages)


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _pull(node: Node, wait_s: float = 0.0) -> list[Any]:
    pulled = await node.subscribing.pull(SUB, 100, wait_s)
    return _received(pulled.messages)


async def test_cancelled_pull_is_unregistered_at_once(node: Node) -> None:
    d = _subscribe(node)
    tasks = [asyncio.create_task(node.subscribing.pull(SUB, 10, 30.0)) for _ in range(20)]
    await _turns()
    assert len(d.consumers) == 20
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(t.cancelled() for t in tasks)
    assert d.consumers == {}
    await _publish(node, b"a", b"b")
    got = await _pull(node, 5.0)
    assert [m.message.data for m in got] == [b"a", b"b"]
    assert [m.delivery_attempt for m in got] == [1, 1]


async def test_pull_cancelled_after_it_was_filled_gives_the_messages_back(
    node: Node,
) -> None:
    d = _subscribe(node)
    await _publish(node, b"a", b"b", b"c")
    # A stream takes the messages first; they sit in its queue, never written.
    stream = StreamConsumer(60, 0, 0)
    d.add_consumer(stream)
    assert len(d.leases) == 3
    puller = asyncio.create_task(node.subscribing.pull(SUB, 10, 30.0))
    await _turns()
    assert len(d.consumers) == 2  # the stream and the waiting Pull
    # The stream ends: its unsent responses come back; in the same loop turn the waiting Pull
    # takes them and is cancelled before its task runs again.
    d.remove_consumer(stream)
    assert d.give_back(stream.id, stream.unsent()) == 3
    d.pump()
    assert len(d.leases) == 3 and d.consumers == {}
    puller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await puller
    assert len(d.leases) == 0
    assert d.delivered == 0  # neither delivery happened
    got = await _pull(node)
    assert [m.message.data for m in got] == [b"a", b"b", b"c"]
    assert [m.delivery_attempt for m in got] == [1, 1, 1]
    assert d.delivered == 3


async def test_unsent_pull_response_given_back_without_counting(node: Node) -> None:
    d = _subscribe(node)
    await _publish(node, b"a", b"b")
    for _ in range(7):  # more than max_delivery_attempts (5)
        pulled = await node.subscribing.pull(SUB, 10, 0.0)
        got = _received(pulled.messages)
        assert [m.delivery_attempt for m in got] == [1, 1]
        assert len(d.leases) == 2
        assert pulled.give_back() == 2  # e.g. the client vanished before the write
        assert len(d.leases) == 0
        assert d.planner.outstanding_bytes == 0
        assert pulled.give_back() == 0  # once only
    assert d.dead_lettered == 0
    got = await _pull(node)
    assert [m.message.data for m in got] == [b"a", b"b"]
    assert [m.delivery_attempt for m in got] == [1, 1]
    # A real failure still counts.
    d.modify_deadline([d.decode(m.ack_id) for m in got], 0)
    assert [m.delivery_attempt for m in await _pull(node)] == [2, 2]


async def test_give_back_leaves_leases_that_moved_on(node: Node) -> None:
    d = _subscribe(node)
    await _publish(node, b"a")
    first = await node.subscribing.pull(SUB, 10, 0.0)
    [m] = _received(first.messages)
    d.modify_deadline([d.decode(m.ack_id)], 0)  # nacked: counted, requeued
    again = await _pull(node)
    assert [x.delivery_attempt for x in again] == [2]
    assert first.give_back() == 0  # the lease is another Pull's now
    assert len(d.leases) == 1
    d.acknowledge([d.decode(again[0].ack_id)[0]])
    assert first.give_back() == 0
    assert await _pull(node) == []


async def test_given_back_ordering_key_keeps_its_order(node: Node) -> None:
    d = _subscribe(node, enable_message_ordering=True)
    await _publish(node, b"k1", b"k2", key="k")
    await _publish(node, b"free")
    pulled = await node.subscribing.pull(SUB, 10, 0.0)
    assert [m.message.data for m in _received(pulled.messages)] == [b"k1", b"k2", b"free"]
    await _publish(node, b"k3", key="k")  # the key is busy: k3 waits behind k1, k2
    assert pulled.give_back() == 3
    got = await _pull(node)
    assert sorted(m.message.data for m in got) == [b"free", b"k1", b"k2", b"k3"]
    assert [m.message.data for m in got if m.message.ordering_key] == [b"k1", b"k2", b"k3"]
    assert all(m.delivery_attempt == 1 for m in got)
    assert await _pull(node) == []  # k's batch is outstanding: nothing more
    d.acknowledge([d.decode(m.ack_id)[0] for m in got])
    assert len(d.leases) == 0
