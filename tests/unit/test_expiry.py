"""In-process test of the expiry pass (pubsubd.control.expiry.Maintenance) with an injected clock:
catalog, forwarders and storage are real (one node, ``pubsubd.node``), time is not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pubsubd.control.expiry import Maintenance
from pubsubd.core import pb
from pubsubd.core.clock import ManualClock
from pubsubd.core.errors import FailedPrecondition, InvalidArgument
from pubsubd.node import Node
from tests.support.inproc import running_node

pytestmark = pytest.mark.unit

DAY = 24 * 3600.0
TOPIC = "projects/p/topics/topic"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def node(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Node]:
    async with running_node(tmp_path, clock=clock) as n:
        n.catalog.create_topic(pb.Topic(name=TOPIC))
        yield n


def _maintenance(node: Node, **settings: Any) -> Maintenance:
    return Maintenance(node.catalog, node.snapshots, node.routes, clock=node.clock, **settings)


def _create(node: Node, sid: str, **fields: Any) -> str:
    name = f"projects/p/subscriptions/{sid}"
    node.catalog.create_subscription(pb.Subscription(name=name, topic=TOPIC, **fields))
    return name


async def test_idle_subscriptions_expire_after_their_ttl(node: Node, clock: ManualClock) -> None:
    catalog = node.catalog
    m = _maintenance(node)
    two_days = {"ttl": pb.Duration(seconds=int(2 * DAY))}
    short = _create(node, "short", expiration_policy=two_days)
    default = _create(node, "default")
    never = _create(node, "never", expiration_policy=pb.Subscription().expiration_policy)
    used = _create(node, "used", expiration_policy=two_days)
    streamed = _create(node, "streamed", expiration_policy=two_days)
    stream = node.subscribing.open_stream(streamed, 60, 0, 0)

    assert await m.check() == []
    clock.advance(1.5 * DAY)
    catalog.subscription(used)  # any use by name is activity (at the clock's "now")
    assert await m.check() == []
    clock.advance(1.0 * DAY)  # 2.5 d
    assert await m.check() == [short]
    assert short not in catalog.subscriptions
    assert not node.subscribing.serves(short)
    clock.advance(1.1 * DAY)  # 3.6 d: "used" was last used at 1.5 d
    assert await m.check() == [used]
    clock.advance(36.4 * DAY)  # 40 d: the 31-day default; the stream keeps "streamed" alive
    assert await m.check() == [default]
    assert set(catalog.subscriptions) == {never, streamed}
    stream.close()
    clock.advance(1.0 * DAY)  # 41 d
    assert await m.check() == []  # idle for a day only since the stream went away
    clock.advance(1.1 * DAY)  # 42.1 d
    assert await m.check() == [streamed]
    assert set(catalog.subscriptions) == {never}


async def test_ttl_divisor_scales_ttls(node: Node, clock: ManualClock) -> None:
    m = _maintenance(node, ttl_divisor=DAY)
    name = _create(node, "fast", expiration_policy={"ttl": pb.Duration(seconds=int(DAY))})
    assert await m.check() == []
    clock.advance(1.01)
    assert await m.check() == [name]


def _request(data: bytes) -> bytes:
    return bytes(
        pb.PublishRequest(topic=TOPIC, messages=[pb.PubsubMessage(data=data)]).SerializeToString()
    )


async def _publish_aged(node: Node, clock: ManualClock, ages_days: list[float]) -> None:
    """One message per age, oldest first, published as time goes by: the last one now."""
    uid = node.catalog.topic(TOPIC).record.uid
    publishing = node.routes.publishing(uid)
    for i, age in enumerate(ages_days):
        if i:
            clock.advance((ages_days[i - 1] - age) * DAY)
        await publishing.publish(uid, _request(b"%g days" % age), 1)


def _journaled_mark_delete(node: Node, name: str) -> int:
    """The mark-delete of source 0 as the publishing forwarder journals it (and as the
    subscription's dispatcher sees it: the two must agree)."""
    rec = node.catalog.subscriptions[name].record
    journaled = node.publishing.cursor_states(rec.topic_uid, rec.uid)[0].mark_delete
    assert node.subscribing.cursor_states(name)[0].mark_delete == journaled
    return journaled


async def test_old_unacked_messages_leave_the_backlog_and_pins_follow_retention(
    node: Node, clock: ManualClock
) -> None:
    catalog, snapshots, subscribing = node.catalog, node.snapshots, node.subscribing
    name = _create(node, "retained", retain_acked_messages=True)
    short = _create(node, "short", message_retention_duration=pb.Duration(seconds=int(DAY)))
    uid = catalog.topic(TOPIC).record.uid
    await _publish_aged(node, clock, [9, 8, 3, 0])
    assert subscribing.status(name)["backlog"] == 4
    assert snapshots.expire_unacked() == 2
    # Default retention 7 days: the 9- and 8-day-old messages are dropped; 1 day: all but one.
    assert _journaled_mark_delete(node, name) == 2
    assert _journaled_mark_delete(node, short) == 3
    assert subscribing.status(name)["backlog"] == 2
    assert subscribing.status(short)["backlog"] == 1
    assert snapshots.expire_unacked() == 0

    sources = node.publishing.topics[uid]
    snapshots.refresh_pins()
    assert sources.pins == {f"retain-acked:{catalog.subscription(name).record.uid}": {0: 2}}
    catalog.update_topic(
        pb.Topic(name=TOPIC, message_retention_duration=pb.Duration(seconds=int(8.5 * DAY))),
        pb.FieldMask(paths=["message_retention_duration"]),
    )
    assert sources.pins["topic-retention"] == {0: 1}
    assert sources.trim_point(0) == 1
    await catalog.delete_subscription(name)
    assert set(sources.pins) == {"topic-retention"}


async def test_snapshot_of_an_almost_expired_backlog_is_refused(
    node: Node, clock: ManualClock
) -> None:
    name = _create(node, "old")
    await _publish_aged(node, clock, [0])
    clock.advance((7 * 24 - 0.5) * 3600)  # the message expires in 30 minutes
    now_us = clock.time_us()
    request = pb.CreateSnapshotRequest(name="projects/p/snapshots/snap", subscription=name)
    with pytest.raises(FailedPrecondition):
        node.snapshots.create(request)
    # Once that message is acked the backlog is young again: 7 days from now.
    node.subscribing.dispatchers[name].acknowledge([0])
    snap = node.snapshots.create(request)
    expire_us = snap.expire_time.seconds * 1_000_000 + snap.expire_time.nanos // 1000
    assert expire_us >= now_us + 7 * 24 * 3600 * 1_000_000
    assert [r.name for r in node.store.load_snapshots()] == [request.name]


async def test_retention_bytes_label_pins_the_topic_and_combines_with_time(
    node: Node, clock: ManualClock
) -> None:
    catalog = node.catalog
    uid = catalog.topic(TOPIC).record.uid
    await _publish_aged(node, clock, [9, 3, 0])
    sources = node.publishing.topics[uid]  # white-box: the pins and the log
    log = sources.logs[0]
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


async def test_a_subscription_served_by_another_forwarder_is_left_to_it(
    node: Node, clock: ManualClock
) -> None:
    """In a cluster a subscription may be served by another forwarder than its topic's
    (spread subscriptions): the pass here skips it, and still expires the others' messages
    (it raised NotServedHere and stopped, CI 2026-11-28)."""
    mine = _create(node, "mine", message_retention_duration=pb.Duration(seconds=int(DAY)))
    elsewhere = _create(node, "elsewhere")
    other = node.catalog.subscription(elsewhere).record.uid
    topic_uid = node.catalog.topic(TOPIC).record.uid
    node.routes.restrict(
        serves=lambda uid: uid == topic_uid,
        topic_of=lambda _: topic_uid,
        serves_subscription=lambda uid: uid != other,
    )
    await _publish_aged(node, clock, [9, 3, 0])
    assert node.snapshots.expire_unacked() == 1
    assert _journaled_mark_delete(node, mine) == 2
    assert node.subscribing.cursor_states(elsewhere)[0].mark_delete == 0
