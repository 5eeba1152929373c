"""Retention, Seek, snapshots, DetachSubscription and expiration_policy with the official clients
(docs/GOOGLE_API.md §3, §4, §6, §7.9, §7.10, §7.12)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.protobuf import duration_pb2, field_mask_pb2, timestamp_pb2

from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support.clients import pull_until, setup
from tests.support.server import ServerProcess, wait_for
from tests.support.status import FAST_TRIM_INTERVAL_S, wait_trim_passes
from tests.support.storage import segments

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]

EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def snapshot_name(names: Any, tag: str = "snap") -> str:
    return f"projects/{PROJECT}/snapshots/{tag}-{names.suffix}"


def _publish_each(pub: pubsub_v1.PublisherClient, topic: str, *datas: bytes) -> list[str]:
    """One Publish per message, in order: each gets its own entry and publish time."""
    return [pub.publish(topic, d).result(timeout=60) for d in datas]


def _drain(
    sub: pubsub_v1.SubscriberClient, name: str, expected: int, ack: bool = True, timeout: float = 20
) -> list[Any]:
    """Pull until ``expected`` messages arrived (acking them unless told not to), and no more."""
    got = pull_until(sub, name, expected, ack=ack, timeout=timeout)
    assert len(got) == expected, [m.message.data for m in got]
    return got


def _empty(sub: pubsub_v1.SubscriberClient, name: str) -> None:
    resp = sub.pull(
        request={"subscription": name, "max_messages": 100, "return_immediately": True},
        timeout=10,
    )
    assert list(resp.received_messages) == []


def _datas(msgs: list[Any]) -> list[bytes]:
    return sorted(m.message.data for m in msgs)


# --- Seek to a time ---------------------------------------------------------------------------


def test_seek_to_time_replays_acked_messages_with_retain_acked(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names, retain_acked_messages=True)
    _publish_each(pub, topic, b"m0", b"m1", b"m2", b"m3", b"m4")
    got = _drain(sub, name, 5)
    _empty(sub, name)
    by_data = {m.message.data: m for m in got}
    # Seek to m2's publish time: m0, m1 stay acked (published before), m2..m4 come back.
    sub.seek(request={"subscription": name, "time": by_data[b"m2"].message.publish_time})
    assert _datas(_drain(sub, name, 3)) == [b"m2", b"m3", b"m4"]
    _empty(sub, name)
    # Back to before everything: all five again.
    sub.seek(request={"subscription": name, "time": EPOCH})
    assert _datas(_drain(sub, name, 5)) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_seek_back_without_retention_restores_only_unacked(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names)
    _publish_each(pub, topic, b"a", b"b", b"c", b"d")
    got = _drain(sub, name, 4, ack=False)
    sub.acknowledge(
        subscription=name, ack_ids=[m.ack_id for m in got if m.message.data in (b"a", b"b")]
    )
    # c and d are leased (60 s deadline by default here); Seek drops the leases and the
    # acked messages are not retained, so exactly c and d come back, at once.
    sub.seek(request={"subscription": name, "time": EPOCH})
    again = _drain(sub, name, 2)
    assert _datas(again) == [b"c", b"d"]
    _empty(sub, name)
    # The old ack IDs lease nothing any more: the new ones were acked above, nothing comes back.
    assert all(m.ack_id not in {g.ack_id for g in got} for m in again)


def test_seek_to_future_time_purges_backlog(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names)
    _publish_each(pub, topic, b"x", b"y", b"z")
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    sub.seek(request={"subscription": name, "time": future})
    _empty(sub, name)
    # Later messages are delivered as usual.
    _publish_each(pub, topic, b"after")
    assert _datas(_drain(sub, name, 1)) == [b"after"]


def test_seek_errors(clients: Any, names: Any) -> None:
    _, sub = clients
    _, name = setup(clients, names)
    with pytest.raises(exceptions.NotFound):
        sub.seek(request={"subscription": names.subscription("missing"), "time": EPOCH})
    with pytest.raises(exceptions.InvalidArgument):
        sub.seek(request={"subscription": f"projects/{PROJECT}/subscriptions/1x", "time": EPOCH})
    with pytest.raises(exceptions.InvalidArgument):
        sub.seek(request={"subscription": name})  # neither time nor snapshot
    with pytest.raises(exceptions.NotFound):
        sub.seek(request={"subscription": name, "snapshot": snapshot_name(names, "none")})
    with pytest.raises(exceptions.InvalidArgument):
        sub.seek(request={"subscription": name, "snapshot": f"projects/{PROJECT}/snapshots/x"})


# --- topic retention ----------------------------------------------------------------------------


def test_topic_retention_lets_a_later_subscription_seek_back(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(
        request={"name": topic, "message_retention_duration": duration_pb2.Duration(seconds=3600)}
    )
    _publish_each(pub, topic, b"old1", b"old2", b"old3")
    name = names.subscription()
    created = sub.create_subscription(request={"name": name, "topic": topic})
    assert created.topic_message_retention_duration == dt.timedelta(hours=1)
    _empty(sub, name)  # a new subscription does not see earlier messages...
    sub.seek(request={"subscription": name, "time": EPOCH})  # ...until it seeks back
    assert _datas(_drain(sub, name, 3)) == [b"old1", b"old2", b"old3"]
    # Acked messages stay retained by the topic: seeking back replays them again.
    sub.seek(request={"subscription": name, "time": EPOCH})
    assert len(_drain(sub, name, 3)) == 3

    # Without topic retention a later subscription finds nothing before its creation.
    plain = names.topic("plain")
    pub.create_topic(name=plain)
    _publish_each(pub, plain, b"gone")
    late = names.subscription("late")
    sub.create_subscription(request={"name": late, "topic": plain})
    sub.seek(request={"subscription": late, "time": EPOCH})
    _empty(sub, late)


# --- snapshots ---------------------------------------------------------------------------------


def test_snapshot_create_get_list_update_delete(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names)
    snaps = [snapshot_name(names, f"s{i}") for i in range(3)]
    before = dt.datetime.now(dt.UTC)
    created = sub.create_snapshot(
        request={"name": snaps[0], "subscription": name, "labels": {"team": "a", "env": "test"}}
    )
    assert created.name == snaps[0]
    assert created.topic == topic
    assert dict(created.labels) == {"team": "a", "env": "test"}
    # Nothing unacked: expires 7 days from now.
    week = dt.timedelta(days=7)
    assert before + week - dt.timedelta(seconds=5) <= created.expire_time
    assert created.expire_time <= dt.datetime.now(dt.UTC) + week
    got = sub.get_snapshot(snapshot=snaps[0])
    assert got.name == snaps[0] and dict(got.labels) == {"team": "a", "env": "test"}

    for s in snaps[1:]:
        sub.create_snapshot(request={"name": s, "subscription": name})
    with pytest.raises(exceptions.AlreadyExists):
        sub.create_snapshot(request={"name": snaps[0], "subscription": name})
    with pytest.raises(exceptions.NotFound):
        sub.create_snapshot(
            request={"name": snapshot_name(names, "x"), "subscription": names.subscription("no")}
        )
    with pytest.raises(exceptions.InvalidArgument):
        sub.create_snapshot(
            request={"name": f"projects/{PROJECT}/snapshots/9", "subscription": name}
        )
    with pytest.raises(exceptions.InvalidArgument):
        sub.create_snapshot(
            request={"name": snapshot_name(names, "l"), "subscription": name, "labels": {"A": "b"}}
        )

    # Paging through the project's snapshots, one per page.
    listed: list[str] = []
    pages = sub.list_snapshots(request={"project": f"projects/{PROJECT}", "page_size": 1})
    for page in pages.pages:
        assert len(page.snapshots) <= 1
        listed.extend(s.name for s in page.snapshots)
    assert set(snaps) <= set(listed)
    assert listed == sorted(listed)
    # The topic's snapshots (Publisher service): names only.
    assert sorted(pub.list_topic_snapshots(request={"topic": topic})) == sorted(snaps)
    with pytest.raises(exceptions.NotFound):
        list(pub.list_topic_snapshots(request={"topic": names.topic("missing")}))

    # Update labels and expire_time through a mask.
    new_expiry = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    updated = sub.update_snapshot(
        request={
            "snapshot": {"name": snaps[0], "labels": {"team": "b"}, "expire_time": new_expiry},
            "update_mask": field_mask_pb2.FieldMask(paths=["labels", "expire_time"]),
        }
    )
    assert dict(updated.labels) == {"team": "b"}
    assert abs((updated.expire_time - new_expiry).total_seconds()) < 1
    assert dict(sub.get_snapshot(snapshot=snaps[0]).labels) == {"team": "b"}
    with pytest.raises(exceptions.InvalidArgument):
        sub.update_snapshot(
            request={
                "snapshot": {"name": snaps[0], "topic": "projects/p/topics/other"},
                "update_mask": field_mask_pb2.FieldMask(paths=["topic"]),
            }
        )
    with pytest.raises(exceptions.InvalidArgument):
        sub.update_snapshot(request={"snapshot": {"name": snaps[0]}, "update_mask": {}})
    with pytest.raises(exceptions.NotFound):
        sub.update_snapshot(
            request={
                "snapshot": {"name": snapshot_name(names, "nope"), "labels": {"a": "b"}},
                "update_mask": field_mask_pb2.FieldMask(paths=["labels"]),
            }
        )

    sub.delete_snapshot(snapshot=snaps[1])
    with pytest.raises(exceptions.NotFound):
        sub.get_snapshot(snapshot=snaps[1])
    with pytest.raises(exceptions.NotFound):
        sub.delete_snapshot(snapshot=snaps[1])
    assert sorted(pub.list_topic_snapshots(request={"topic": topic})) == [snaps[0], snaps[2]]
    # The name is reusable.
    sub.create_snapshot(request={"name": snaps[1], "subscription": name})


def test_nameless_snapshot_gets_a_name_in_the_subscription_project(
    clients: Any, names: Any
) -> None:
    _, sub = clients
    _, name = setup(clients, names)
    created = sub.create_snapshot(request={"subscription": name})
    assert created.name.startswith(f"projects/{PROJECT}/snapshots/")
    assert sub.get_snapshot(snapshot=created.name).name == created.name


def test_snapshot_expire_time_follows_oldest_unacked_message(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names)
    _publish_each(pub, topic, b"first")
    [msg] = _drain(sub, name, 1, ack=False)
    snap = sub.create_snapshot(request={"name": snapshot_name(names), "subscription": name})
    expected = msg.message.publish_time + dt.timedelta(days=7)
    assert abs((snap.expire_time - expected).total_seconds()) < 0.01


def test_seek_to_snapshot_restores_backlog(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names)
    _publish_each(pub, topic, b"s0", b"s1", b"s2")
    # s0 acked before the snapshot: not captured.
    [first] = [m for m in _drain(sub, name, 3, ack=False) if m.message.data == b"s0"]
    sub.acknowledge(subscription=name, ack_ids=[first.ack_id])
    snap = snapshot_name(names)
    sub.create_snapshot(request={"name": snap, "subscription": name})
    sub.seek(request={"subscription": name, "time": EPOCH})  # drop the leases of s1, s2
    _drain(sub, name, 2)
    _publish_each(pub, topic, b"s3", b"s4")
    _drain(sub, name, 2)
    _empty(sub, name)
    # The snapshot: its unacked backlog (s1, s2) plus everything published after it.
    sub.seek(request={"subscription": name, "snapshot": snap})
    assert _datas(_drain(sub, name, 4)) == [b"s1", b"s2", b"s3", b"s4"]
    _empty(sub, name)


def test_seek_to_snapshot_of_another_topic_fails(clients: Any, names: Any) -> None:
    pub, sub = clients
    _, name = setup(clients, names)
    other_topic, other_sub = names.topic("other"), names.subscription("other")
    pub.create_topic(name=other_topic)
    sub.create_subscription(request={"name": other_sub, "topic": other_topic})
    snap = snapshot_name(names)
    sub.create_snapshot(request={"name": snap, "subscription": other_sub})
    with pytest.raises(exceptions.FailedPrecondition) as e:
        sub.seek(request={"subscription": name, "snapshot": snap})
    assert "different" in str(e.value)


def test_snapshot_of_deleted_and_recreated_topic_is_another_topic(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names)
    snap = snapshot_name(names)
    sub.create_snapshot(request={"name": snap, "subscription": name})
    pub.delete_topic(topic=topic)
    assert sub.get_snapshot(snapshot=snap).topic == "_deleted-topic_"
    pub.create_topic(name=topic)
    again = names.subscription("again")
    sub.create_subscription(request={"name": again, "topic": topic})
    with pytest.raises(exceptions.FailedPrecondition):
        sub.seek(request={"subscription": again, "snapshot": snap})
    # The old subscription still reads the old topic's storage: seeking it works.
    sub.seek(request={"subscription": name, "snapshot": snap})


# --- detach ------------------------------------------------------------------------------------


def test_detach_subscription(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names)
    keep = names.subscription("keep")
    sub.create_subscription(request={"name": keep, "topic": topic})
    _publish_each(pub, topic, b"d0", b"d1")
    received = threading.Event()
    future = sub.subscribe(name, lambda m: received.set())
    try:
        assert received.wait(20)
        pub.detach_subscription(request={"subscription": name})
        # The open stream ends with FAILED_PRECONDITION (terminal for the client).
        with pytest.raises(exceptions.FailedPrecondition):
            future.result(timeout=20)
    finally:
        future.cancel()
    assert sub.get_subscription(subscription=name).detached
    with pytest.raises(exceptions.FailedPrecondition):
        sub.pull(request={"subscription": name, "max_messages": 1}, timeout=10)
    with pytest.raises(exceptions.FailedPrecondition):
        sub.acknowledge(subscription=name, ack_ids=["x-0-0-1"])
    with pytest.raises(exceptions.FailedPrecondition):
        sub.seek(request={"subscription": name, "time": EPOCH})
    assert list(pub.list_topic_subscriptions(topic=topic)) == [keep]
    # Detaching again is harmless; a missing subscription is NOT_FOUND.
    pub.detach_subscription(request={"subscription": name})
    with pytest.raises(exceptions.NotFound):
        pub.detach_subscription(request={"subscription": names.subscription("missing")})
    # The other subscription is unaffected, and the detached one can be deleted.
    assert _datas(_drain(sub, keep, 2)) == [b"d0", b"d1"]
    sub.delete_subscription(subscription=name)
    with pytest.raises(exceptions.NotFound):
        sub.get_subscription(subscription=name)


# --- restarts ----------------------------------------------------------------------------------


def _restart(server: ServerProcess) -> None:
    port = server.port
    server.stop()
    server.start(port=port)


def test_snapshots_seek_and_detach_survive_restart(server: ServerProcess, names: Any) -> None:
    pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
    topic, name, gone = names.topic(), names.subscription(), names.subscription("gone")
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": name, "topic": topic})
    sub.create_subscription(request={"name": gone, "topic": topic})
    _publish_each(pub, topic, b"r0", b"r1", b"r2")
    snap = snapshot_name(names)
    created = sub.create_snapshot(
        request={"name": snap, "subscription": name, "labels": {"k": "v"}}
    )
    _drain(sub, name, 3)
    pub.detach_subscription(request={"subscription": gone})
    _restart(server)

    got = sub.get_snapshot(snapshot=snap)
    assert dict(got.labels) == {"k": "v"} and got.expire_time == created.expire_time
    assert list(pub.list_topic_snapshots(request={"topic": topic})) == [snap]
    _empty(sub, name)  # the acks survived
    sub.seek(request={"subscription": name, "snapshot": snap})
    _restart(server)  # the Seek's state survives too
    assert _datas(_drain(sub, name, 3)) == [b"r0", b"r1", b"r2"]
    # A seek to the future survives as well.
    _publish_each(pub, topic, b"r3")
    sub.seek(
        request={"subscription": name, "time": dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)}
    )
    _restart(server)
    _empty(sub, name)
    # The detached subscription is still detached: FAILED_PRECONDITION, not NOT_FOUND.
    assert sub.get_subscription(subscription=gone).detached
    with pytest.raises(exceptions.FailedPrecondition):
        sub.pull(request={"subscription": gone, "max_messages": 1}, timeout=10)
    assert list(pub.list_topic_subscriptions(topic=topic)) == [name]


def test_snapshot_and_retain_acked_keep_segments_from_trimming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: Any
) -> None:
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")  # tiny segments: trimming really happens
    monkeypatch.setenv("PUBSUBD_TRIM_INTERVAL_S", FAST_TRIM_INTERVAL_S)
    server = ServerProcess(tmp_path / "data").start()
    try:
        pub = make_publisher(
            server.endpoint, batch_settings=pubsub_v1.types.BatchSettings(max_messages=10)
        )
        sub = make_subscriber(server.endpoint)
        topic, name = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        sub.create_subscription(request={"name": name, "topic": topic})
        for f in [pub.publish(topic, b"%04d" % i + b"x" * 200) for i in range(200)]:
            f.result(timeout=30)
        snap = snapshot_name(names)
        sub.create_snapshot(request={"name": snap, "subscription": name})
        before = len(segments(server.data_dir))
        assert before > 5
        _drain(sub, name, 200)
        wait_trim_passes(server)  # a whole trim pass: the snapshot still needs every segment
        assert len(segments(server.data_dir)) == before
        sub.seek(request={"subscription": name, "snapshot": snap})
        assert len({m.message.data for m in _drain(sub, name, 200)}) == 200
        sub.delete_snapshot(snapshot=snap)
        wait_for(lambda: len(segments(server.data_dir)) <= 2, 15, "segments to be trimmed")
    finally:
        server.kill()


# --- expiration_policy ---------------------------------------------------------------------------


def test_expiration_policy_deletes_idle_subscriptions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: Any
) -> None:
    # Test-only scaling: a 1-day ttl lasts 1 s; expiry is checked every 0.2 s.
    monkeypatch.setenv("PUBSUBD_TEST_TTL_DIVISOR", "86400")
    monkeypatch.setenv("PUBSUBD_EXPIRY_CHECK_S", "0.2")
    server = ServerProcess(tmp_path / "data").start()
    try:
        pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
        topic = names.topic()
        pub.create_topic(name=topic)
        day = duration_pb2.Duration(seconds=86400)
        idle, streamed, never, default, polled = (
            names.subscription(t) for t in ("idle", "streamed", "never", "default", "polled")
        )
        for s in (idle, streamed, polled):
            sub.create_subscription(
                request={"name": s, "topic": topic, "expiration_policy": {"ttl": day}}
            )
        sub.create_subscription(request={"name": never, "topic": topic, "expiration_policy": {}})
        sub.create_subscription(request={"name": default, "topic": topic})
        stored = sub.get_subscription(subscription=never)._pb
        assert stored.HasField("expiration_policy") and not stored.expiration_policy.HasField("ttl")
        with pytest.raises(exceptions.InvalidArgument):
            sub.create_subscription(
                request={
                    "name": names.subscription("short"),
                    "topic": topic,
                    "expiration_policy": {"ttl": duration_pb2.Duration(seconds=3600)},
                }
            )
        future = sub.subscribe(streamed, lambda m: m.ack())  # an open stream is activity
        try:
            # Pulls are activity too. A negative check, so it takes its time: for 3.5 ttls the
            # polled and streamed subscriptions must not expire.
            deadline = time.monotonic() + 3.5
            while time.monotonic() < deadline:
                sub.pull(
                    request={"subscription": polled, "max_messages": 1, "return_immediately": True},
                    timeout=10,
                )
                time.sleep(0.2)

            def gone() -> bool:
                try:
                    sub.get_subscription(subscription=idle)
                except exceptions.NotFound:
                    return True
                return False

            wait_for(gone, 10, "the idle subscription to expire")
            for s in (streamed, never, default, polled):
                sub.get_subscription(subscription=s)
        finally:
            future.cancel()
        assert idle not in list(pub.list_topic_subscriptions(topic=topic))
    finally:
        server.kill()


def test_expired_snapshot_is_deleted(clients: Any, names: Any) -> None:
    _, sub = clients
    _, name = setup(clients, names)
    snap = snapshot_name(names)
    sub.create_snapshot(request={"name": snap, "subscription": name})
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    sub.update_snapshot(
        request={
            "snapshot": {"name": snap, "expire_time": soon},
            "update_mask": field_mask_pb2.FieldMask(paths=["expire_time"]),
        }
    )
    with pytest.raises(exceptions.InvalidArgument):  # not in the past
        sub.update_snapshot(
            request={
                "snapshot": {"name": snap, "expire_time": timestamp_pb2.Timestamp(seconds=1)},
                "update_mask": field_mask_pb2.FieldMask(paths=["expire_time"]),
            }
        )

    def expired() -> bool:
        try:
            sub.get_snapshot(snapshot=snap)
        except exceptions.NotFound:
            return True
        return False

    wait_for(expired, 10, "the snapshot to expire")
    listed = sub.list_snapshots(request={"project": f"projects/{PROJECT}"})
    assert snap not in [s.name for s in listed]
