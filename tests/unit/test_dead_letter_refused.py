"""In-process tests of dead-letter copies the dead-letter topic refuses (issue 14): a copy is
held to a client's Publish's limits and to the dead-letter topic's schema, with the four
CloudPubSubDeadLetter* attributes (and the three googclient_schema* ones) counted. A refused copy
is never dropped: the message stays in its subscription, comes back after the retry pause,
and each refusal is counted (``pubsubd_dead_letter_failures{reason="refused"}``).

Catalog, forwarders, dispatcher, schema registry and storage are real (one node,
``pubsubd.node``); time is a ManualClock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pubsubd.core import pb
from pubsubd.core.clock import ManualClock
from pubsubd.core.schemas import AVRO, JSON
from pubsubd.data.subscribe.planner import DEAD_LETTER_RETRY_S
from pubsubd.node import Node
from tests.support.inproc import running_node

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/source"
DLQ = "projects/p/topics/dlq"
DLQ_SUB = "projects/p/subscriptions/dlq-reader"
SUB = "projects/p/subscriptions/sub"
SCHEMA = "projects/p/schemas/text"
ATTEMPTS = 5


async def _turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _settled(node: Node) -> None:
    """Until no dead-letter publish is under way (it writes the log: real time)."""
    d = node.subscribing.dispatchers[SUB]
    for _ in range(500):
        await asyncio.sleep(0.01)
        if not d.planner._dead_lettering:
            return
    raise AssertionError("a dead-letter publish did not end")


def _refused_metric() -> float:
    return (
        REGISTRY.get_sample_value("pubsubd_dead_letter_failures_total", {"reason": "refused"})
        or 0.0
    )


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[Node, ManualClock]]:
    clock = ManualClock()
    async with running_node(tmp_path, clock=clock) as n:
        yield n, clock


def _topology(node: Node, *, schema: bool) -> None:
    catalog = node.catalog
    catalog.create_topic(pb.Topic(name=TOPIC))
    dlq = pb.Topic(name=DLQ)
    if schema:
        catalog.schemas.create("projects/p", "text", pb.Schema(type_=AVRO, definition='"string"'))
        dlq.schema_settings.schema, dlq.schema_settings.encoding = SCHEMA, JSON
    catalog.create_topic(dlq)
    policy = pb.Subscription().dead_letter_policy.__class__(
        dead_letter_topic=DLQ, max_delivery_attempts=ATTEMPTS
    )
    catalog.create_subscription(
        pb.Subscription(name=SUB, topic=TOPIC, ack_deadline_seconds=60, dead_letter_policy=policy)
    )
    catalog.create_subscription(pb.Subscription(name=DLQ_SUB, topic=DLQ))


async def _publish(node: Node, attributes: dict[str, str]) -> None:
    uid = node.catalog.topic(TOPIC).record.uid
    request = pb.PublishRequest(
        topic=TOPIC, messages=[pb.PubsubMessage(data=b'"x"', attributes=attributes)]
    )
    await node.routes.publishing(uid).publish(uid, request.SerializeToString(), 1)


async def _pull(node: Node, name: str) -> list[Any]:
    pulled = await node.subscribing.pull(name, 100, 0.0)
    return list(pb.PullResponse.FromString(b"".join(pulled.messages)).received_messages)


async def _fail_every_delivery(node: Node) -> None:
    """Nack the one message until it reaches its dead-letter attempt."""
    d = node.subscribing.dispatchers[SUB]
    for attempt in range(1, ATTEMPTS + 1):
        [got] = await _pull(node, SUB)
        assert got.delivery_attempt == attempt
        d.modify_deadline([d.decode(got.ack_id)], 0)
    await _settled(node)


def _attributes(n: int) -> dict[str, str]:
    return {f"a{i}": "v" for i in range(n)}


@pytest.mark.parametrize(
    ("schema", "fits"),
    [(False, 96), (True, 93)],  # + 4 dead-letter attributes (+ 3 schema ones) = 100
)
async def test_a_copy_within_the_limit_is_dead_lettered(
    setup: tuple[Node, ManualClock], schema: bool, fits: int
) -> None:
    node, _ = setup
    _topology(node, schema=schema)
    await _publish(node, _attributes(fits))
    await _fail_every_delivery(node)
    d = node.subscribing.dispatchers[SUB]
    assert (d.dead_lettered, d.dead_letter_failures) == (1, 0)
    [copy] = await _pull(node, DLQ_SUB)
    assert len(copy.message.attributes) == 100
    assert await _pull(node, SUB) == []


@pytest.mark.parametrize(("schema", "over"), [(False, 97), (True, 94)])
async def test_a_refused_copy_stays_in_its_subscription_and_is_counted(
    setup: tuple[Node, ManualClock], schema: bool, over: int
) -> None:
    node, clock = setup
    _topology(node, schema=schema)
    await _publish(node, _attributes(over))
    before = _refused_metric()
    await _fail_every_delivery(node)
    d = node.subscribing.dispatchers[SUB]
    assert (d.dead_lettered, d.dead_letter_failures) == (0, 1)
    assert _refused_metric() == before + 1
    assert await _pull(node, DLQ_SUB) == []
    assert await _pull(node, SUB) == []  # held for the retry pause
    clock.advance(DEAD_LETTER_RETRY_S)
    await _turns()
    [again] = await _pull(node, SUB)  # back in its subscription, never dropped
    assert again.message.data == b'"x"' and len(again.message.attributes) == over
    d.modify_deadline([d.decode(again.ack_id)], 0)  # its next failure: refused again
    await _settled(node)
    assert (d.dead_lettered, d.dead_letter_failures) == (0, 2)
    assert _refused_metric() == before + 2
    assert await _pull(node, DLQ_SUB) == []
