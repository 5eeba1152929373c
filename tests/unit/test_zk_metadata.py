"""The ZooKeeper metadata store beyond the contract suite: records as znode data, the layout,
and ``follow()``, which publishes other processes' changes on the store's change feed, once
each, and never a process's own writes a second time."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pubsubd.coordination.ensemble import Ensemble
from pubsubd.core.errors import InternalError
from pubsubd.storage.metadata import (
    Change,
    CursorRecord,
    SnapshotRecord,
    SubscriptionRecord,
    TopicRecord,
)
from pubsubd.storage.zk_metadata import (
    COMPRESSED,
    CURSORS,
    PLAIN,
    TOPICS,
    MetadataLayout,
    ZooKeeperMetadataStore,
    decode,
    encode,
)

pytest_plugins = ["tests.support.zookeeper"]
pytestmark = pytest.mark.unit


# --- pure: data and paths -------------------------------------------------------------------------


def test_records_round_trip_and_big_ones_are_compressed() -> None:
    records: list[tuple[str, Any]] = [
        ("topics", TopicRecord("projects/p/topics/t", "u1", b"\x00\n\xff")),
        (
            "subscriptions",
            SubscriptionRecord("projects/p/subscriptions/s", "u", "t", b"", {3: 1 << 50}),
        ),
        ("snapshots", SnapshotRecord("projects/p/snapshots/n", "t", b"b", {0: (3, [(5, 9)])})),
        ("cursors", CursorRecord("t", "c\n", "projects/p/topics/t", {1: 2}, 1 << 62)),
        ("topics", TopicRecord("projects/p/topics/big", "u", b"x" * 200_000)),
    ]
    for kind, record in records:
        data = encode(record)
        assert decode(kind, data) == record
    assert encode(records[0][1])[0] == PLAIN
    big = encode(records[-1][1])
    assert big[0] == COMPRESSED and len(big) < 10_000
    with pytest.raises(InternalError, match="more than one ZooKeeper znode"):
        encode(TopicRecord("projects/p/topics/huge", "u", random.Random(0).randbytes(1_100_000)))
    with pytest.raises(ValueError):
        decode("topics", b'{"name": "not ours"}')


def test_layout_buckets_names_and_keeps_cursor_keys_apart() -> None:
    layout = MetadataLayout("/c")
    path = layout.record(TOPICS, TopicRecord("projects/p/topics/a/b", "u", b""))
    assert path.startswith("/c/metadata/topics/") and path.endswith(
        "/projects%2Fp%2Ftopics%2Fa%2Fb"
    )
    assert path.count("/") == 5  # root, metadata, kind, bucket, name
    assert layout.classify(path) == (TOPICS, 2)
    assert layout.classify("/c/metadata/cursors") == (CURSORS, 0)
    assert layout.classify("/c/metadata/cursors/ab") == (CURSORS, 1)
    assert layout.classify("/c/other") is None
    # (uid "a/b", name "c") and (uid "a", name "b/c") are different cursors.
    first = layout.record(CURSORS, CursorRecord("a/b", "c", "t"))
    second = layout.record(CURSORS, CursorRecord("a", "b/c", "t"))
    assert first.rsplit("/", 1)[1] != second.rsplit("/", 1)[1]


# --- following other processes --------------------------------------------------------------------


@pytest.fixture
async def pair(
    zookeeper: Ensemble, zk_root: str
) -> AsyncIterator[tuple[ZooKeeperMetadataStore, ZooKeeperMetadataStore]]:
    """Two processes' stores on one root: a writer, and a reader that follows."""
    writer = ZooKeeperMetadataStore.connect(zookeeper.connect_string, zk_root, session_timeout=4.0)
    reader = ZooKeeperMetadataStore.connect(zookeeper.connect_string, zk_root, session_timeout=4.0)
    yield writer, reader
    reader.close()
    writer.close()


def _heard(store: ZooKeeperMetadataStore) -> list[tuple[Any, bool]]:
    heard: list[tuple[Any, bool]] = []

    def listener(change: Change) -> None:
        heard.append((change.record, change.deleted))

    store.changes.watch(listener)
    return heard


async def _until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def _topic(name: str, uid: str, body: bytes = b"") -> TopicRecord:
    return TopicRecord(f"projects/p/topics/{name}", uid, body)


async def test_a_follower_hears_other_processes_changes_once(
    pair: tuple[ZooKeeperMetadataStore, ZooKeeperMetadataStore],
) -> None:
    writer, reader = pair
    before = _topic("before", "u0")
    writer.put_topic(before)
    await reader.follow()
    heard = _heard(reader)

    created = _topic("t", "u1", b"v1")
    writer.put_topic(created)
    await _until(lambda: heard == [(created, False)])
    updated = _topic("t", "u1", b"v2")
    writer.put_topic(updated)
    await _until(lambda: len(heard) == 2)
    writer.delete_topic(created.name)
    await _until(lambda: len(heard) == 3)
    assert heard == [(created, False), (updated, False), (updated, True)]

    subscription = SubscriptionRecord("projects/p/subscriptions/s", "su", "u1", b"s", {0: 7})
    snapshot = SnapshotRecord("projects/p/snapshots/n", "u1", b"n", {0: (1, [(3, 4)])})
    cursor = CursorRecord("u1", "reader", created.name, {0: 5}, 99)
    writer.put_subscription(subscription)
    writer.put_snapshot(snapshot)
    writer.put_cursor(cursor)
    await _until(lambda: len(heard) == 6)
    assert sorted(heard[3:], key=repr) == sorted(
        [(subscription, False), (snapshot, False), (cursor, False)], key=repr
    )
    # The record that existed before follow() was read, not published; nothing else came.
    await asyncio.sleep(0.3)  # negative check: a duplicate would arrive within a round trip
    assert len(heard) == 6 and all(record != before for record, _ in heard)


async def test_a_follower_hears_its_own_writes_once(
    pair: tuple[ZooKeeperMetadataStore, ZooKeeperMetadataStore],
) -> None:
    writer, reader = pair
    await reader.follow()
    heard = _heard(reader)
    own = _topic("own", "u1")
    reader.put_topic(own)  # its watches fire for this too
    reader.put_topic(_topic("own", "u1", b"changed"))
    reader.put_cursor(CursorRecord("u1", "c", own.name, {0: 1}, 1))
    reader.delete_topic(own.name)
    assert len(heard) == 4  # published synchronously, as every store does
    marker = _topic("marker", "u9")
    writer.put_topic(marker)  # another process's write, after ours
    await _until(lambda: (marker, False) in heard)
    await asyncio.sleep(0.3)  # negative check: echoes of our own writes would have come by now
    assert len(heard) == 5


async def test_a_record_deleted_and_created_again_is_heard_as_both(
    pair: tuple[ZooKeeperMetadataStore, ZooKeeperMetadataStore],
) -> None:
    writer, reader = pair
    old = _topic("again", "old-uid")
    writer.put_topic(old)
    await reader.follow()
    heard = _heard(reader)
    writer.delete_topic(old.name)
    new = _topic("again", "new-uid")
    writer.put_topic(new)
    await _until(lambda: bool(heard) and heard[-1] == (new, False))
    assert (old, True) in heard and heard.index((old, True)) < heard.index((new, False))
    assert all(record in (old, new) for record, _ in heard)


async def test_caught_up_returns_once_every_earlier_change_of_others_is_heard(
    pair: tuple[ZooKeeperMetadataStore, ZooKeeperMetadataStore],
) -> None:
    """What a forwarder does before answering a list or a snapshot call: a client that
    changed something through one process reads it back through another."""
    writer, reader = pair
    await reader.follow()
    heard = _heard(reader)
    for i in range(40):
        topic = _topic(f"t{i}", f"u{i}")
        writer.put_topic(topic)  # returns once ZooKeeper has it
        await reader.caught_up()
        assert heard[-1] == (topic, False), i
        writer.delete_topic(topic.name)
        await reader.caught_up()
        assert heard[-1] == (topic, True), i
    assert len(heard) == 80


async def test_a_record_written_here_and_deleted_by_another_process_at_once_is_heard_deleted(
    pair: tuple[ZooKeeperMetadataStore, ZooKeeperMetadataStore],
) -> None:
    """The delete comes before this process's follower has listed the bucket again after its
    own write (no await in between): the listing without the record must still be heard as
    its deletion, or the process would list a deleted subscription until it restarts."""
    writer, reader = pair
    writer.put_topic(_topic("elsewhere", "u0"))  # the bucket exists and is followed
    await reader.follow()
    heard = _heard(reader)
    for i in range(10):
        own = _topic(f"own-{i}", f"u{i}")
        reader.put_topic(own)  # this process's write: published at once
        writer.delete_topic(own.name)  # another process deletes it right after
        await reader.caught_up()
        assert heard[-1] == (own, True), i


async def test_a_record_written_here_then_changed_by_another_process_is_heard_changed(
    pair: tuple[ZooKeeperMetadataStore, ZooKeeperMetadataStore],
) -> None:
    """This process's own write is watched too: another process's changes to it right after
    (before any listing) and later are heard."""
    writer, reader = pair
    writer.put_topic(_topic("elsewhere", "u0"))
    await reader.follow()
    heard = _heard(reader)
    for i in range(10):
        reader.put_topic(_topic(f"mine-{i}", f"u{i}"))
        changed = _topic(f"mine-{i}", f"u{i}", b"changed")
        writer.put_topic(changed)  # at once
        await reader.caught_up()
        assert heard[-1] == (changed, False), i
        again = _topic(f"mine-{i}", f"u{i}", b"again")
        writer.put_topic(again)  # later
        await reader.caught_up()
        assert heard[-1] == (again, False), i
