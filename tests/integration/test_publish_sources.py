"""Topics with several publish message sources (label ``pubsubd-publish-sources``), end to end
with the official client: routing, exactly-once-per-subscription delivery, per-key order while
sources are added, the Replay API's ranges, snapshots across growth and restarts."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support.replay_client import ReplayClient
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.integration

SOURCES = "pubsubd-publish-sources"
KEY_SOURCES = "pubsubd-ordering-key-sources"


def _ordered_publisher(endpoint: str) -> pubsub_v1.PublisherClient:
    return make_publisher(
        endpoint,
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=5, max_latency=0.002),
    )


def _source_of(message_id: str) -> int:
    return int(message_id) >> 48


def _set_sources(pub: Any, topic: str, labels: dict[str, str]) -> Any:
    return pub.update_topic(
        request={"topic": {"name": topic, "labels": labels}, "update_mask": {"paths": ["labels"]}}
    )


class Collector:
    """Subscribe and record (data, message_id, ordering_key) of every delivery, acking each."""

    def __init__(self, endpoint: str, subscription: str) -> None:
        self.sub = make_subscriber(endpoint)
        self.lock = threading.Lock()
        self.got: list[tuple[str, str, str]] = []
        self.future = self.sub.subscribe(subscription, self._callback)

    def _callback(self, message: Any) -> None:
        with self.lock:
            self.got.append((message.data.decode(), message.message_id, message.ordering_key))
        message.ack()

    def count(self) -> int:
        with self.lock:
            return len(self.got)

    def wait(self, n: int, timeout: float = 60) -> list[tuple[str, str, str]]:
        wait_for(lambda: self.count() >= n, timeout, f"{n} deliveries")
        time.sleep(0.5)  # a negative check, so a fixed wait: any duplicate would show up
        with self.lock:
            return list(self.got)

    def close(self) -> None:
        self.future.cancel()
        self.sub.close()


def _check_key_order(got: list[tuple[str, str, str]]) -> dict[str, list[int]]:
    by_key: dict[str, list[int]] = defaultdict(list)
    for data, _, key in got:
        if key:
            by_key[key].append(int(data.split(":")[1]))
    for key, seq in by_key.items():
        assert seq == sorted(seq), f"key {key} out of order: {seq[:20]}"
    return by_key


def test_four_sources_deliver_every_message_once_and_keys_in_order(
    shared_server: ServerProcess, names: Any
) -> None:
    pub = _ordered_publisher(shared_server.endpoint)
    sub = make_subscriber(shared_server.endpoint)
    replay = ReplayClient(shared_server.endpoint)
    topic, name = names.topic(), names.subscription()
    created = pub.create_topic(request={"name": topic, "labels": {SOURCES: "4"}})
    assert dict(created.labels) == {SOURCES: "4", KEY_SOURCES: "4"}
    assert dict(pub.get_topic(topic=topic).labels)[KEY_SOURCES] == "4"
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True})
    keys = [f"key{i}" for i in range(8)]
    futures = [
        pub.publish(topic, f"{k}:{i}".encode(), ordering_key=k) for i in range(40) for k in keys
    ]
    futures += [pub.publish(topic, f"plain:{i}".encode()) for i in range(200)]
    ids = [f.result(timeout=30) for f in futures]
    assert len(set(ids)) == len(ids) == 520
    # Unkeyed messages spread over all four sources; each key lives in exactly one.
    plain_sources = [_source_of(i) for i in ids[320:]]
    assert set(plain_sources) == {0, 1, 2, 3}
    key_sources: dict[str, set[int]] = defaultdict(set)
    for j, message_id in enumerate(ids[:320]):
        key_sources[keys[j % 8]].add(_source_of(message_id))
    assert all(len(s) == 1 for s in key_sources.values())

    ranges = replay.GetTopicRanges(topic=topic).sources
    assert [r.source for r in ranges] == [0, 1, 2, 3]
    assert sum(r.latest_offset for r in ranges) == 520
    read = [m.message_id for s in range(4) for m in replay.read_all(topic, source=s)]
    assert sorted(read) == sorted(ids)

    collector = Collector(shared_server.endpoint, name)
    try:
        got = collector.wait(520)
    finally:
        collector.close()
    assert len(got) == 520, "a message was delivered more than once"
    assert sorted(m for _, m, _ in got) == sorted(ids)
    by_key = _check_key_order(got)
    assert all(by_key[k] == list(range(40)) for k in keys)
    replay.close()


def test_source_labels_are_validated_and_only_grow(
    shared_server: ServerProcess, names: Any
) -> None:
    pub = make_publisher(shared_server.endpoint)
    for bad in ("0", "17", "four", "-2"):
        with pytest.raises(exceptions.InvalidArgument, match=SOURCES):
            pub.create_topic(request={"name": names.topic(f"bad{bad}"), "labels": {SOURCES: bad}})
    with pytest.raises(exceptions.InvalidArgument, match=KEY_SOURCES):
        pub.create_topic(
            request={"name": names.topic("k"), "labels": {SOURCES: "2", KEY_SOURCES: "3"}}
        )
    topic = names.topic()
    pub.create_topic(request={"name": topic, "labels": {SOURCES: "2"}})
    with pytest.raises(exceptions.FailedPrecondition, match="cannot lower"):
        _set_sources(pub, topic, {SOURCES: "1"})
    with pytest.raises(exceptions.FailedPrecondition, match=KEY_SOURCES):
        _set_sources(pub, topic, {SOURCES: "3", KEY_SOURCES: "3"})
    with pytest.raises(exceptions.InvalidArgument, match=SOURCES):
        _set_sources(pub, topic, {SOURCES: "20"})
    # Labels that leave the source labels out keep them.
    updated = _set_sources(pub, topic, {"team": "blue"})
    assert dict(updated.labels) == {"team": "blue", SOURCES: "2", KEY_SOURCES: "2"}
    updated = _set_sources(pub, topic, {SOURCES: "5", "team": "blue"})
    assert dict(updated.labels) == {"team": "blue", SOURCES: "5", KEY_SOURCES: "2"}
    assert len(ReplayClient(shared_server.endpoint).GetTopicRanges(topic=topic).sources) == 5


def test_adding_sources_mid_stream_keeps_key_order_and_loses_nothing(
    shared_server: ServerProcess, names: Any
) -> None:
    pub = _ordered_publisher(shared_server.endpoint)
    sub = make_subscriber(shared_server.endpoint)
    replay = ReplayClient(shared_server.endpoint)
    topic, name = names.topic(), names.subscription()
    pub.create_topic(request={"name": topic, "labels": {SOURCES: "2"}})
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True})
    collector = Collector(shared_server.endpoint, name)
    keys = [f"k{i}" for i in range(12)]
    published: list[Any] = []
    lock = threading.Lock()
    stop = threading.Event()

    def publish_loop() -> None:
        i = 0
        while not stop.is_set() and i < 150:
            batch = [pub.publish(topic, f"{k}:{i}".encode(), ordering_key=k) for k in keys]
            batch.append(pub.publish(topic, f"plain:{i}".encode()))
            with lock:
                published.extend(batch)
            i += 1
            time.sleep(0.02)  # pacing: publishes go on while the sources change

    def published_count() -> int:
        with lock:
            return len(published)

    t = threading.Thread(target=publish_loop, daemon=True)
    t.start()
    try:
        wait_for(lambda: published_count() >= 13 * 40, 60, "publishes before the growth")
        _set_sources(pub, topic, {SOURCES: "3"})
        wait_for(lambda: published_count() >= 13 * 80, 60, "publishes after the first growth")
        _set_sources(pub, topic, {SOURCES: "4"})
        # A subscription created now starts at the sync point of all four sources.
        late = names.subscription("late")
        sub.create_subscription(
            request={"name": late, "topic": topic, "enable_message_ordering": True}
        )
        late_collector = Collector(shared_server.endpoint, late)
        t.join(60)
        assert not t.is_alive()
        ids = [f.result(timeout=30) for f in published]
        assert len(ids) == 150 * 13
        got = collector.wait(len(ids))
        late_got = late_collector.wait(13 * 10, timeout=30)
    finally:
        stop.set()
        collector.close()
    late_collector.close()
    assert len(got) == len(ids)
    assert sorted(m for _, m, _ in got) == sorted(ids)
    by_key = _check_key_order(got)
    assert all(by_key[k] == list(range(150)) for k in keys)
    # The late subscription gets everything published after it was created: a suffix of
    # every key, in order.
    late_by_key = _check_key_order(late_got)
    assert set(late_by_key) == set(keys)
    for k in keys:
        seq = late_by_key[k]
        assert seq == list(range(seq[0], 150)), f"late subscription lost messages of {k}"
    # Keys stayed in the two sources the topic was created with; the new sources took
    # unkeyed messages.
    keyed_sources = {_source_of(m) for _, m, key in got if key}
    plain_sources = {_source_of(m) for _, m, key in got if not key}
    assert keyed_sources <= {0, 1}
    assert {2, 3} <= plain_sources
    ranges = replay.GetTopicRanges(topic=topic).sources
    assert [r.source for r in ranges] == [0, 1, 2, 3]
    assert sum(r.latest_offset for r in ranges) == len(ids)
    replay.close()


def test_seek_to_a_snapshot_taken_before_sources_were_added(
    shared_server: ServerProcess, names: Any
) -> None:
    pub = make_publisher(shared_server.endpoint)
    sub = make_subscriber(shared_server.endpoint)
    topic, name = names.topic(), names.subscription()
    snapshot = f"projects/{PROJECT}/snapshots/grow-{names.suffix}"
    pub.create_topic(name=topic)
    sub.create_subscription(name=name, topic=topic)
    sub.create_snapshot(name=snapshot, subscription=name)
    _set_sources(pub, topic, {SOURCES: "3"})
    ids = {pub.publish(topic, f"m{i}".encode()).result(timeout=30) for i in range(30)}
    assert {_source_of(i) for i in ids} == {0, 1, 2}
    collector = Collector(shared_server.endpoint, name)
    try:
        assert {m for _, m, _ in collector.wait(30)} == ids
        # Seek back: everything published after the snapshot, in every source, comes back.
        sub.seek(request={"subscription": name, "snapshot": snapshot})
        wait_for(lambda: collector.count() >= 60, 30, "redelivery after Seek")
        with collector.lock:
            again = {m for _, m, _ in collector.got[30:]}
    finally:
        collector.close()
    assert again == ids


def test_restart_reopens_every_source_and_delivers_the_unacked(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        pub = _ordered_publisher(server.endpoint)
        sub = make_subscriber(server.endpoint)
        topic = f"projects/{PROJECT}/topics/restart"
        name = f"projects/{PROJECT}/subscriptions/restart"
        pub.create_topic(request={"name": topic, "labels": {SOURCES: "3"}})
        sub.create_subscription(
            request={
                "name": name,
                "topic": topic,
                "enable_message_ordering": True,
                "ack_deadline_seconds": 60,  # what is pulled and not acked stays leased
            }
        )
        keys = ["a", "b", "c", "d"]
        futures = [
            pub.publish(topic, f"{k}:{i}".encode(), ordering_key=k) for i in range(30) for k in keys
        ]
        futures += [pub.publish(topic, f"plain:{i}".encode()) for i in range(60)]
        ids = [f.result(timeout=30) for f in futures]
        assert {_source_of(i) for i in ids} == {0, 1, 2}
        # Ack the unkeyed messages of source 1 only; the rest stays unacked.
        to_ack = {i for i in ids[120:] if _source_of(i) == 1}
        assert to_ack
        acked: set[str] = set()
        deadline = time.monotonic() + 60
        while acked != to_ack:
            assert time.monotonic() < deadline, "the unkeyed messages of source 1 not pulled"
            resp = sub.pull(subscription=name, max_messages=100, timeout=10)
            take = [m for m in resp.received_messages if m.message.message_id in to_ack]
            if take:
                sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in take])
                acked.update(m.message.message_id for m in take)
        # Grow to 4 (source 3 stays empty, so it has no directory) and restart.
        _set_sources(pub, topic, {SOURCES: "4"})
        sub.close()
        pub.stop()
        port = server.port
        assert server.stop() == 0
        server.start(port=port)
        pub = _ordered_publisher(server.endpoint)
        replay = ReplayClient(server.endpoint)
        ranges = replay.GetTopicRanges(topic=topic).sources
        assert [r.source for r in ranges] == [0, 1, 2, 3]
        assert [r.latest_offset for r in ranges][3] == 0
        assert sum(r.latest_offset for r in ranges) == len(ids)
        assert dict(pub.get_topic(topic=topic).labels) == {SOURCES: "4", KEY_SOURCES: "3"}
        more = [pub.publish(topic, f"plain:{i}".encode()).result(timeout=30) for i in range(60, 68)]
        assert 3 in {_source_of(i) for i in more}
        collector = Collector(server.endpoint, name)
        expected = (set(ids) - acked) | set(more)
        try:
            wait_for(
                lambda: {m for _, m, _ in list(collector.got)} >= expected,
                60,
                "every unacked message after the restart",
            )
            got = list(collector.got)
        finally:
            collector.close()
        _check_key_order(got)
        replay.close()
    finally:
        server.kill()


def test_a_busy_topic_grows_its_sources_by_itself_and_shrinks_when_quiet(
    tmp_path: Path, names: Any
) -> None:
    """Source growth (core/source_growth.py) with a small capacity and short windows: a topic
    published to faster than one source takes gets more sources by itself (unkeyed messages
    land in several, each key stays in source 0 and in order, nothing lost or duplicated);
    once quiet, its active sources go back down to one."""
    server = ServerProcess(
        tmp_path / "data",
        env={
            "PUBSUBD_SOURCE_CAPACITY": "300",
            "PUBSUBD_SOURCE_GROW_AFTER_S": "1",
            "PUBSUBD_SOURCE_SHRINK_AFTER_S": "1",
            "PUBSUBD_SOURCE_SAMPLE_S": "0.25",
        },
    ).start()
    try:
        pub = _ordered_publisher(server.endpoint)
        sub = make_subscriber(server.endpoint)
        topic, name = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        sub.create_subscription(
            request={"name": name, "topic": topic, "enable_message_ordering": True}
        )
        collector = Collector(server.endpoint, name)
        keys = [f"key{i}" for i in range(4)]

        def sources() -> int:
            return int(dict(pub.get_topic(topic=topic).labels).get(SOURCES, "1"))

        futures: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        grown_at = None
        i = 0
        while time.monotonic() < deadline and len(futures) < 60_000:
            for _ in range(50):  # about 2,000 messages/s
                k = keys[i % len(keys)]
                futures[f"{k}:{i}"] = pub.publish(topic, f"{k}:{i}".encode(), ordering_key=k)
                futures[f"plain:{i}"] = pub.publish(topic, f"plain:{i}".encode())
                i += 1
            time.sleep(0.05)
            if grown_at is None and i % 500 == 0 and sources() > 1:
                grown_at = time.monotonic()
            if grown_at is not None and time.monotonic() - grown_at > 1.5:
                break
        assert grown_at is not None, f"the topic never grew ({len(futures)} published)"
        ids = {data: f.result(timeout=60) for data, f in futures.items()}
        plain = {_source_of(m) for d, m in ids.items() if d.startswith("plain:")}
        keyed = {_source_of(m) for d, m in ids.items() if not d.startswith("plain:")}
        assert len(plain) > 1, f"unkeyed messages all in sources {plain}"
        assert keyed == {0}, "an ordering key left the topic's one ordering-key source"
        got = collector.wait(len(ids))
        collector.close()
        assert len(got) == len(ids), "a message was delivered more than once"
        assert sorted(m for _, m, _ in got) == sorted(ids.values())
        _check_key_order(got)
        # Quiet now: the active sources come back down to the ordering-key source.
        wait_for(
            lambda: (
                dict(pub.get_topic(topic=topic).labels).get("pubsubd-active-publish-sources") == "1"
            ),
            60,
            "the active sources back to 1",
        )
        after = pub.publish(topic, b"plain:after").result(timeout=30)
        assert _source_of(after) == 0
        assert "active publish message sources" in server.log()
    finally:
        server.stop()
