"""In-process test of the expiry pass (pubsubd.control.expiry.Maintenance) with an injected clock:
catalog, forwarders and storage are real, time is not."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.control.catalog import Catalog
from pubsubd.control.expiry import Maintenance
from pubsubd.core import pb
from pubsubd.core.errors import FailedPrecondition, InvalidArgument
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe.consumers import StreamConsumer
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.storage.log import FsyncPolicy
from pubsubd.storage.metadata import MemoryMetadataStore

pytestmark = pytest.mark.unit

DAY = 24 * 3600.0
TOPIC = "projects/p/topics/topic"


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture
async def catalog(tmp_path: Path) -> AsyncIterator[Catalog]:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    subscribing = SubscribingForwarder(publishing)
    cat = Catalog(MemoryMetadataStore(), publishing, subscribing)
    cat.load()
    cat.create_topic(pb.Topic(name=TOPIC))
    yield cat
    await subscribing.close()
    await publishing.close()


def _create(catalog: Catalog, sid: str, **fields: Any) -> str:
    name = f"projects/p/subscriptions/{sid}"
    catalog.create_subscription(pb.Subscription(name=name, topic=TOPIC, **fields))
    return name


async def test_idle_subscriptions_expire_after_their_ttl(catalog: Catalog) -> None:
    clock = Clock()
    m = Maintenance(catalog, clock=clock)
    two_days = {"ttl": pb.Duration(seconds=int(2 * DAY))}
    short = _create(catalog, "short", expiration_policy=two_days)
    default = _create(catalog, "default")
    never = _create(catalog, "never", expiration_policy=pb.Subscription().expiration_policy)
    used = _create(catalog, "used", expiration_policy=two_days)
    streamed = _create(catalog, "streamed", expiration_policy=two_days)
    stream = StreamConsumer(60, 0, 0)
    catalog.subscribing.dispatcher(streamed).add_consumer(stream)

    assert await m.check() == []
    clock.offset = 1.5 * DAY
    catalog.subscription(used)  # any use by name is activity (here: at real "now")
    catalog.activity[used] = clock()
    assert await m.check() == []
    clock.offset = 2.5 * DAY
    assert await m.check() == [short]
    assert short not in catalog.subscriptions
    assert short not in catalog.subscribing.dispatchers
    clock.offset = 3.6 * DAY  # "used" was last used at 1.5 d
    assert await m.check() == [used]
    clock.offset = 40 * DAY  # the 31-day default; the stream keeps "streamed" alive
    assert await m.check() == [default]
    assert set(catalog.subscriptions) == {never, streamed}
    catalog.subscribing.dispatcher(streamed).remove_consumer(stream)
    clock.offset = 41 * DAY
    assert await m.check() == []  # idle for a day only since the stream went away
    clock.offset = 42.1 * DAY
    assert await m.check() == [streamed]
    assert set(catalog.subscriptions) == {never}


async def test_ttl_divisor_scales_ttls(catalog: Catalog) -> None:
    clock = Clock()
    m = Maintenance(catalog, clock=clock, ttl_divisor=DAY)
    name = _create(catalog, "fast", expiration_policy={"ttl": pb.Duration(seconds=int(DAY))})
    assert await m.check() == []
    clock.offset = 1.01
    assert await m.check() == [name]


def _request(data: bytes) -> bytes:
    return bytes(
        pb.PublishRequest(topic=TOPIC, messages=[pb.PubsubMessage(data=data)]).SerializeToString()
    )


async def test_old_unacked_messages_leave_the_backlog_and_pins_follow_retention(
    catalog: Catalog,
) -> None:
    now_us = time.time_ns() // 1000
    day_us = int(DAY) * 1_000_000
    name = _create(catalog, "retained", retain_acked_messages=True)
    short = _create(catalog, "short", message_retention_duration=pb.Duration(seconds=int(DAY)))
    uid = catalog.topic(TOPIC).record.uid
    log = catalog.publishing.topics[uid].logs[0]
    for age_days in (9, 8, 3, 0):  # one message each, oldest first
        await log.append(_request(b"%d days" % age_days), 1, now_us - age_days * day_us)
    dispatchers = catalog.subscribing.dispatchers
    assert dispatchers[name].backlog() == 4
    assert catalog.snapshots.expire_unacked() == 2
    # Default retention 7 days: the 9- and 8-day-old messages are dropped; 1 day: all but one.
    assert dispatchers[name].journal.cursors[0].mark_delete == 2
    assert dispatchers[short].journal.cursors[0].mark_delete == 3
    assert dispatchers[name].backlog() == 2 and dispatchers[short].backlog() == 1
    assert catalog.snapshots.expire_unacked() == 0

    sources = catalog.publishing.topics[uid]
    catalog.snapshots.refresh_pins()
    assert sources.pins == {f"retain-acked:{catalog.subscription(name).record.uid}": {0: 2}}
    catalog.update_topic(
        pb.Topic(name=TOPIC, message_retention_duration=pb.Duration(seconds=int(8.5 * DAY))),
        pb.FieldMask(paths=["message_retention_duration"]),
    )
    assert sources.pins["topic-retention"] == {0: 1}
    assert sources.trim_point(0) == 1
    await catalog.delete_subscription(name)
    assert set(sources.pins) == {"topic-retention"}


async def test_snapshot_of_an_almost_expired_backlog_is_refused(catalog: Catalog) -> None:
    now_us = time.time_ns() // 1000
    name = _create(catalog, "old")
    uid = catalog.topic(TOPIC).record.uid
    log = catalog.publishing.topics[uid].logs[0]
    old = now_us - (7 * 24 - 0.5) * 3600 * 1_000_000  # expires in 30 minutes
    await log.append(_request(b"old"), 1, int(old))
    request = pb.CreateSnapshotRequest(name="projects/p/snapshots/snap", subscription=name)
    with pytest.raises(FailedPrecondition):
        catalog.snapshots.create(request)
    # Once that message is acked the backlog is young again: 7 days from now.
    dispatcher = catalog.subscribing.dispatcher(name)
    dispatcher.acknowledge([0])
    snap = catalog.snapshots.create(request)
    expire_us = snap.expire_time.seconds * 1_000_000 + snap.expire_time.nanos // 1000
    assert expire_us >= now_us + 7 * 24 * 3600 * 1_000_000
    assert [r.name for r in catalog.store.load_snapshots()] == [request.name]


async def test_retention_bytes_label_pins_the_topic_and_combines_with_time(
    catalog: Catalog,
) -> None:
    now_us = time.time_ns() // 1000
    day_us = int(DAY) * 1_000_000
    uid = catalog.topic(TOPIC).record.uid
    sources = catalog.publishing.topics[uid]
    log = sources.logs[0]
    for age_days in (9, 3, 0):
        await log.append(_request(b"%d days" % age_days), 1, now_us - age_days * day_us)
    size = log.stats()["bytes"]  # one segment holds all three

    def update(labels: dict[str, str], **fields: Any) -> None:
        paths = ["labels", *fields]
        catalog.update_topic(
            pb.Topic(name=TOPIC, labels=labels, **fields), pb.FieldMask(paths=paths)
        )

    with pytest.raises(InvalidArgument, match="pubsubd-retention-bytes"):
        update({"pubsubd-retention-bytes": "lots"})
    update({"pubsubd-retention-bytes": str(size)})  # size only: the whole segment fits
    assert sources.pins["topic-retention"] == {0: 0}
    update({"pubsubd-retention-bytes": str(size - 1)})  # over the limit: size keeps nothing
    assert sources.pins["topic-retention"] == {0: 3}
    # With time retention too, a message is kept only while inside both limits.
    week = pb.Duration(seconds=int(7 * DAY))
    update({"pubsubd-retention-bytes": str(size)}, message_retention_duration=week)
    assert sources.pins["topic-retention"] == {0: 1}  # the time limit is the stricter
    update({"pubsubd-retention-bytes": str(size - 1)}, message_retention_duration=week)
    assert sources.pins["topic-retention"] == {0: 3}  # the size limit is the stricter
    update({})  # labels cleared, time retention left: the time pin alone
    assert sources.pins["topic-retention"] == {0: 1}
