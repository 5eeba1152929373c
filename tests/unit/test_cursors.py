"""Named cursors of the replay API: pure checks, and Cursors in a node over the SQLite store
(persisted; the publishing forwarder pins the log from their records)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pubsubd.control.cursors import check_offsets, lag, topic_cursors
from pubsubd.core import pb
from pubsubd.core.errors import CursorNotFound, InvalidArgument, NotFound, OutOfRange
from pubsubd.data.reconcile import cursor_pin
from pubsubd.node import Node
from pubsubd.storage.metadata import CursorRecord, SqliteMetadataStore
from tests.support.inproc import running_node

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/topic"


def test_check_offsets() -> None:
    ranges = {0: (10, 20)}
    check_offsets({0: 10}, ranges)
    check_offsets({0: 20}, ranges)
    check_offsets({0: 3}, ranges)  # behind the retained range: allowed
    with pytest.raises(OutOfRange, match="offset 21 is above the latest position 20"):
        check_offsets({0: 21}, ranges)
    with pytest.raises(InvalidArgument, match="source 1 does not exist"):
        check_offsets({1: 0}, ranges)
    with pytest.raises(InvalidArgument, match="negative"):
        check_offsets({0: -1}, ranges)


def test_lag() -> None:
    assert lag({0: 15}, {0: (10, 20)}) == {0: 5}
    assert lag({}, {0: (10, 20)}) == {0: 10}  # never committed: from the earliest
    assert lag({0: 3}, {0: (10, 20)}) == {0: 10}  # behind what is kept
    assert lag({0: 20}, {0: (10, 20)}) == {0: 0}


def test_topic_cursors_one_incarnation_by_name() -> None:
    records = [
        CursorRecord("uid-1", "b", TOPIC, {0: 1}, 10),
        CursorRecord("uid-0", "a", TOPIC, {0: 2}, 11),  # an older incarnation of the topic
        CursorRecord("uid-1", "a", TOPIC, {0: 3}, 12),
        CursorRecord("uid-1", "C", TOPIC, {}, 13),
    ]
    assert [(r.topic_uid, r.name) for r in topic_cursors(records, "uid-1")] == [
        ("uid-1", "C"),
        ("uid-1", "a"),
        ("uid-1", "b"),
    ]
    assert topic_cursors(records, "uid-2") == []


@contextlib.asynccontextmanager
async def _node(data: Path) -> AsyncIterator[Node]:
    """A node over the SQLite store in ``data`` (what a restart opens again)."""
    store = SqliteMetadataStore(data)
    try:
        async with running_node(data, store=store) as n:
            yield n
    finally:
        store.close()


async def _topic_with_five_messages(node: Node) -> tuple[Any, str]:
    node.catalog.create_topic(pb.Topic(name=TOPIC))
    entry = node.catalog.topic(TOPIC)
    uid = entry.record.uid
    raw = pb.PublishRequest(messages=[pb.PubsubMessage(data=b"x")] * 5).SerializeToString()
    await node.routes.publishing(uid).publish(uid, raw, 5)
    return entry, uid


async def test_commit_get_persist_and_pin(tmp_path: Path) -> None:
    async with _node(tmp_path) as node:
        cursors = node.cursors
        entry, uid = await _topic_with_five_messages(node)
        empty = cursors.get(entry, "q")
        assert empty.offsets == {} and empty.commit_time_us == 0
        sources = node.publishing.open_topic(uid)
        assert cursor_pin("q") not in node.publishing.pin_owners(uid)
        rec = cursors.commit(entry, "q", {0: 3})
        assert rec.offsets == {0: 3} and rec.commit_time_us > 0
        assert sources.pins[cursor_pin("q")] == {0: 3}
        assert sources.trim_point(0) == 3  # no subscription, yet the cursor keeps [3, 5)
        # Snapshots' pin refresh leaves the cursor's pin alone.
        node.snapshots.refresh_pins(uid)
        assert sources.pins[cursor_pin("q")] == {0: 3}
        assert cursors.status() == {
            TOPIC: {
                "q": {
                    "offsets": {"0": 3},
                    "commit_time_us": rec.commit_time_us,
                    "lag": 2,
                    "lag_by_source": {"0": 2},
                }
            }
        }
        with pytest.raises(InvalidArgument, match="name"):
            cursors.commit(entry, "", {0: 1})
        with pytest.raises(OutOfRange):
            cursors.commit(entry, "q", {0: 6})
    # Restart: the cursor and its pin come back.
    async with _node(tmp_path) as again:
        cursors = again.cursors
        assert cursors.get(again.catalog.topic(TOPIC), "q").offsets == {0: 3}
        assert again.publishing.open_topic(uid).pins[cursor_pin("q")] == {0: 3}
        # Deleting the topic drops its cursors (rows, records, gauges) at once; a re-created
        # topic is a new incarnation: no cursors.
        assert _lag_gauge("q") == 2
        await again.catalog.delete_topic(TOPIC)
        assert cursors.records == {} and list(again.store.load_cursors()) == []
        assert _lag_gauge("q") is None
        again.catalog.create_topic(pb.Topic(name=TOPIC))
        assert cursors.get(again.catalog.topic(TOPIC), "q").offsets == {}
        assert cursors.status() == {}


def _lag_gauge(cursor: str) -> float | None:
    return REGISTRY.get_sample_value(
        "pubsubd_cursor_lag_messages", {"topic": TOPIC, "cursor": cursor}
    )


async def test_list_and_delete_release_the_pin_durably(tmp_path: Path) -> None:
    async with _node(tmp_path) as node:
        cursors = node.cursors
        entry, uid = await _topic_with_five_messages(node)
        assert cursors.for_topic(entry) == []
        cursors.commit(entry, "z", {0: 4})
        cursors.commit(entry, "a", {0: 1})
        assert [(r.name, r.offsets) for r in cursors.for_topic(entry)] == [
            ("a", {0: 1}),
            ("z", {0: 4}),
        ]
        sources = node.publishing.open_topic(uid)
        assert sources.trim_point(0) == 1
        assert _lag_gauge("a") == 4

        cursors.delete(entry, "a")
        assert cursor_pin("a") not in node.publishing.pin_owners(uid)
        assert sources.trim_point(0) == 4  # only "z" holds the log now
        assert [r.name for r in cursors.for_topic(entry)] == ["z"]
        assert set(cursors.status()[TOPIC]) == {"z"}
        assert _lag_gauge("a") is None and _lag_gauge("z") == 1
        assert cursors.get(entry, "a").offsets == {}  # as if never committed
        with pytest.raises(CursorNotFound, match="name=a") as e:
            cursors.delete(entry, "a")
        assert isinstance(e.value, NotFound) and TOPIC in str(e.value)
        with pytest.raises(NotFound):
            cursors.delete(entry, "never-committed")
        with pytest.raises(InvalidArgument, match="name"):
            cursors.delete(entry, "")
        with pytest.raises(InvalidArgument, match="longer than 256 bytes"):
            cursors.delete(entry, "x" * 257)

        cursors.delete(entry, "z")
        assert not any(p.startswith("cursor:") for p in node.publishing.pin_owners(uid))
        assert sources.trim_point(0) == 5  # no subscription, no cursor: nothing is kept
        assert cursors.status() == {}
    # The rows are gone from the store: a restart brings neither cursor nor pin back.
    async with _node(tmp_path) as again:
        assert again.cursors.for_topic(again.catalog.topic(TOPIC)) == []
        assert list(again.store.load_cursors()) == []
        pins = again.publishing.open_topic(uid).pins
        assert not any(p.startswith("cursor:") for p in pins)
