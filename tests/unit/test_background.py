"""Background work never fails silently (observability/background.py): exceptions are counted,
logged once per kind, loops go on, and a failed delivery pump answers its consumers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pubsubd.control.catalog import Catalog
from pubsubd.core import pb
from pubsubd.core.errors import InternalError
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe.consumers import PullWaiter, StreamConsumer
from pubsubd.data.subscribe.dispatcher import SubscriptionDispatcher
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.observability import background, metrics
from pubsubd.storage.log import FsyncPolicy
from pubsubd.storage.metadata import MemoryMetadataStore

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
async def catalog(tmp_path: Path) -> AsyncIterator[Catalog]:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    subscribing = SubscribingForwarder(publishing)
    cat = Catalog(MemoryMetadataStore(), publishing, subscribing)
    cat.load()
    cat.create_topic(pb.Topic(name=TOPIC))
    cat.create_subscription(pb.Subscription(name=SUB, topic=TOPIC, ack_deadline_seconds=10))
    yield cat
    await subscribing.close()
    await publishing.close()


async def test_a_failing_pump_ends_its_consumers_instead_of_stalling_them(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = catalog.subscribing.dispatcher(SUB)
    stream = StreamConsumer(10, 100, 0, "client")
    dispatcher.add_consumer(stream)
    waiter = PullWaiter(10, 5)
    dispatcher.add_consumer(waiter)

    def broken(*_args: object) -> list[tuple[int, bytes, int]]:
        raise RuntimeError("a bug in delivery")

    monkeypatch.setattr(SubscriptionDispatcher, "_take", broken)  # slots: patch the class
    before = background.failures("subscription pump")
    uid = catalog.topic(TOPIC).record.uid
    request = pb.PublishRequest(topic=TOPIC, messages=[pb.PubsubMessage(data=b"x")])
    await catalog.publishing.publish(uid, request.SerializeToString(), 1)  # schedules a pump
    for _ in range(10):
        await asyncio.sleep(0)
    assert background.failures("subscription pump") == before + 1
    ended = stream.queue.get_nowait()
    assert isinstance(ended, InternalError) and "a bug in delivery" in str(ended)
    assert isinstance(waiter.future.exception(), InternalError)
    assert not dispatcher.consumers
