"""Background work never fails silently (observability/background.py): exceptions are counted,
logged once per kind, loops go on, and a failed delivery pump answers its consumers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pubsubd.core import pb
from pubsubd.core.errors import InternalError
from pubsubd.data.subscribe.planner import DeliveryPlanner
from pubsubd.node import Node
from pubsubd.observability import background, metrics
from tests.support.inproc import running_node

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/topic"
SUB = "projects/p/subscriptions/sub"


def _count(task: str) -> float:
    value = metrics.BACKGROUND_ERRORS.labels(task=task)._value.get()
    return float(value)


def test_report_counts_every_failure_and_logs_the_first_and_powers_of_ten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = "test report"
    with caplog.at_level(logging.ERROR, logger="pubsubd.observability.background"):
        for _ in range(12):
            background.report(task, ValueError("boom"))
        background.report(task, KeyError("other kind"))
    assert _count(task) == 13
    assert background.failures(task) == 13
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3  # ValueError 1st and 10th, KeyError 1st
    assert caplog.records[0].exc_info is not None  # the first has its traceback
    assert "10 times" in lines[1]


async def test_every_goes_on_after_a_failing_step() -> None:
    calls: list[int] = []
    third = asyncio.Event()

    def step() -> None:
        calls.append(len(calls))
        if len(calls) == 3:
            third.set()
        if len(calls) == 1:
            raise RuntimeError("first pass fails")

    task = asyncio.create_task(background.every("test every", 0.001, step))
    await asyncio.wait_for(third.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert background.failures("test every") == 1


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path) as n:
        n.catalog.create_topic(pb.Topic(name=TOPIC))
        n.catalog.create_subscription(
            pb.Subscription(name=SUB, topic=TOPIC, ack_deadline_seconds=10)
        )
        yield n


async def test_a_failing_pump_ends_its_consumers_instead_of_stalling_them(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    subscribing = node.subscribing
    stream = subscribing.open_stream(SUB, 10, 100, 0, "client")
    puller = asyncio.create_task(subscribing.pull(SUB, 5, 30.0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(subscribing.dispatchers[SUB].consumers) == 2  # the stream and the waiting Pull

    def broken(self: DeliveryPlanner, now: float) -> None:
        if self.consumers:  # with nobody to deliver to, delivery does nothing
            raise RuntimeError("a bug in delivery")

    monkeypatch.setattr(DeliveryPlanner, "plan", broken)  # slots: patch the class
    before = background.failures("subscription pump")
    uid = node.catalog.topic(TOPIC).record.uid
    request = pb.PublishRequest(topic=TOPIC, messages=[pb.PubsubMessage(data=b"x")])
    await node.routes.publishing(uid).publish(uid, request.SerializeToString(), 1)  # a pump
    for _ in range(10):
        await asyncio.sleep(0)
    assert background.failures("subscription pump") == before + 1
    ended = await asyncio.wait_for(stream.next_response(), 5)
    assert isinstance(ended, InternalError) and "a bug in delivery" in str(ended)
    with pytest.raises(InternalError):
        await asyncio.wait_for(puller, 5)
    assert not subscribing.in_use(SUB)
    assert not subscribing.dispatchers[SUB].consumers
