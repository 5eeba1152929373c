"""The delay index (SQLite rows by due time) and the per-topic delay tracker over a real log:
indexing on commit, handing out due positions once and in due order, paging, pressure, the
``done`` contract with dispatchers, and the rebuild after a crash."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from pubsubd.core import ids, pb
from pubsubd.data.decoding import decode
from pubsubd.data.publish import delays as delays_mod
from pubsubd.data.publish.delays import DueListener
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.storage.delay_index import FILE_NAME, DelayIndex
from pubsubd.storage.log import FsyncPolicy, SourceLog

pytestmark = pytest.mark.unit

UID = "topic-uid"


def _request(n: int, **attrs: str) -> bytes:
    msgs = [pb.PubsubMessage(data=str(i).encode(), attributes=attrs) for i in range(n)]
    return pb.PublishRequest(messages=msgs).SerializeToString()


class Collector:
    def __init__(self) -> None:
        self.got: list[int] = []
        self.times: list[float] = []
        self.held = 0

    def listener(self) -> DueListener:
        return DueListener(self.on_due, lambda: self.held)

    def on_due(self, positions: list[int]) -> None:
        self.got += positions
        self.times += [time.time()] * len(positions)


async def _wait(predicate: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_index_rows_come_back_in_due_order_and_progress_is_atomic(tmp_path: Path) -> None:
    index = DelayIndex.open(tmp_path)
    index.add("t", [(30, 3, 1), (10, 1, 1), (20, 2, 1), (10, 0, 1)], {0: 4})
    index.add("u", [(5, 9, 1000)], {0: 1})
    assert index.due("t", 20, 10) == [(10, 0, 1), (10, 1, 1), (20, 2, 1)]
    assert index.due("t", 100, 2) == [(10, 0, 1), (10, 1, 1)]
    assert index.next_due("t") == 10 and index.next_due("nothing") is None
    index.delete_through("t", 10, 1)
    assert index.due("t", 100, 10) == [(20, 2, 1), (30, 3, 1)]
    index.delete_due("t", 20)
    assert index.due("t", 100, 10) == [(30, 3, 1)] and index.count("u") == 1000
    assert index.progress("t") == {0: 4} and index.topics() == {"t", "u"}
    index.close()
    reopened = DelayIndex.open(tmp_path)  # on disk
    assert reopened.due("t", 100, 10) == [(30, 3, 1)] and reopened.progress("u") == {0: 1}
    reopened.drop("t")
    assert reopened.count("t") == 0 and reopened.progress("t") == {}
    assert reopened.count("u") == 1000
    reopened.close()


def test_runs_group_consecutive_messages_due_together() -> None:
    assert delays_mod._runs([5, 5, None, 5, 7, 7]) == [(5, 0, 2), (5, 3, 1), (7, 4, 2)]
    assert delays_mod._runs([None, None]) == [] and delays_mod._runs([]) == []


async def test_delayed_messages_wait_on_disk_and_fall_due_once(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        tracker = publishing.delay_tracker(UID)
        seen = Collector()
        tracker.add_listener(1, seen.listener())
        published = time.time()
        await publishing.publish(UID, _request(3, **{"pubsubd.deliver_after": "0.5"}), 3)
        await publishing.publish(UID, _request(2), 2)  # not delayed: never indexed
        await publishing.publish(UID, _request(1, **{"pubsubd.deliver_after": "0.2"}), 1)
        assert tracker.pending_rows() == 4
        # A dispatcher reading them now must skip them: they are above ``done``.
        at = decode(0, publishing.read(UID, 0, 0, 1, 1 << 20)[0])
        assert at.deliver_at is not None and at.deliver_at[0] is not None
        assert not tracker.is_due(at.deliver_at[0], ids.position(0, 0))
        await _wait(lambda: len(seen.got) == 4)
        assert seen.got == [5, 0, 1, 2]  # due order: the 0.2 s one first
        assert all(t >= published + 0.19 for t in seen.times)
        assert min(seen.times[1:]) >= published + 0.49
        assert tracker.pending_rows() == 0
        assert tracker.is_due(at.deliver_at[0], ids.position(0, 0))  # read now: delivered
        await asyncio.sleep(0.3)
        assert len(seen.got) == 4  # never twice
    finally:
        await publishing.close()


async def test_a_message_indexed_below_done_is_handed_out_at_once(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        tracker = publishing.delay_tracker(UID)
        seen = Collector()
        tracker.add_listener(1, seen.listener())
        past = "2020-01-01T00:00:00Z"  # due long ago: at = its publish time
        tracker.done = (time.time_ns() // 1000 + 10_000_000, delays_mod.MAX_POSITION)
        await publishing.publish(UID, _request(2, **{"pubsubd.deliver_at": past}), 2)
        assert seen.got == [0, 1] and tracker.pending_rows() == 0
    finally:
        await publishing.close()


async def test_paging_and_pressure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delays_mod, "PAGE_ROWS", 3)  # 10 rows (one per batch): 4 pages
    monkeypatch.setattr(delays_mod, "MAX_PENDING_DUE", 250)
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        tracker = publishing.delay_tracker(UID)
        seen = Collector()
        tracker.add_listener(1, seen.listener())
        for _ in range(10):
            await publishing.publish(UID, _request(100, **{"pubsubd.deliver_after": "0.2"}), 100)
        seen.held = 300  # a subscription still holding many due messages: paging waits
        await asyncio.sleep(0.5)
        assert seen.got == [] and tracker.pending_rows() == 1000
        seen.held = 0
        await _wait(lambda: len(seen.got) == 1000)
        assert sorted(seen.got) == list(range(1000)) and len(set(seen.got)) == 1000
        assert tracker.pending_rows() == 0
    finally:
        await publishing.close()


async def test_rows_survive_a_crash_and_missing_rows_are_rebuilt_from_the_log(
    tmp_path: Path,
) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    tracker = publishing.delay_tracker(UID)
    await publishing.publish(UID, _request(3, **{"pubsubd.deliver_after": "60"}), 3)
    assert tracker.pending_rows() == 3
    # Simulate a crash that lost the index file's newest transactions: forget the rows and the
    # progress, as if they had never been written.
    assert publishing.delay_index is not None
    publishing.delay_index.drop(UID)
    tracker._closed = True  # the crash: nothing more is written
    publishing.delays.clear()
    await publishing.close()
    assert (tmp_path / FILE_NAME).exists()

    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    try:
        tracker = publishing.delay_tracker(UID)
        assert tracker.pending_rows() == 3  # re-indexed from the log
        assert publishing.delay_index is not None
        assert publishing.delay_index.progress(UID) == {0: 3}
        await publishing.publish(UID, _request(1, **{"pubsubd.deliver_after": "60"}), 1)
        assert tracker.pending_rows() == 4
    finally:
        await publishing.close()


async def test_progress_is_saved_so_a_restart_reads_only_the_rest(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    tracker = publishing.delay_tracker(UID)
    for _ in range(5):
        await publishing.publish(UID, _request(10), 10)
    tracker.flush_progress()
    assert publishing.delay_index is not None
    assert publishing.delay_index.progress(UID) == {0: 50}
    await publishing.close()


async def test_dropping_a_topic_drops_its_rows(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        tracker = publishing.delay_tracker(UID)
        await publishing.publish(UID, _request(2, **{"pubsubd.deliver_after": "60"}), 2)
        assert tracker.pending_rows() == 2
        await publishing.drop_topic(UID)
        assert publishing.delay_index is not None
        assert publishing.delay_index.count(UID) == 0
    finally:
        await publishing.close()


async def test_messages_published_due_skip_the_index(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        tracker = publishing.delay_tracker(UID)
        seen = Collector()
        tracker.add_listener(1, seen.listener())
        await publishing.publish(UID, _request(3, **{"pubsubd.deliver_after": "0"}), 3)
        assert tracker.pending_rows() == 0 and seen.got == [0, 1, 2]
        entry = publishing.read(UID, 0, 0, 1, 1 << 20)[0]
        at = decode(0, entry).deliver_at
        assert at is not None and at[0] is not None and tracker.is_due(at[0], 0)
        # While a row is due but not handed out yet, ``done`` stays put.
        await publishing.publish(UID, _request(1, **{"pubsubd.deliver_after": "0.3"}), 1)
        await asyncio.sleep(0.35)
        tracker._earliest = 0  # as if the due row were still waiting (e.g. paging paused)
        done = tracker.done
        await publishing.publish(UID, _request(1, **{"pubsubd.deliver_after": "0"}), 1)
        assert tracker.done == done
    finally:
        await publishing.close()


async def test_only_topics_with_delayed_messages_get_a_tracker(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    await publishing.publish("plain", _request(5), 5)
    await publishing.drop_topic("gone")
    assert publishing.delays == {} and not (tmp_path / FILE_NAME).exists()
    await publishing.publish(UID, _request(2, **{"pubsubd.deliver_after": "60"}), 2)
    assert set(publishing.delays) == {UID} and publishing.delays[UID].pending_rows() == 2
    await publishing.close()
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        publishing.open_topic("plain")
        publishing.open_topic(UID)  # it had delayed messages: its tracker opens with it
        assert set(publishing.delays) == {UID} and publishing.delays[UID].pending_rows() == 2
    finally:
        await publishing.close()


async def test_first_delayed_publish_does_not_read_the_topics_older_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        for _ in range(50):
            await publishing.publish(UID, _request(10), 10)
        reads: list[int] = []
        read = SourceLog.read

        def counting_read(self: SourceLog, offset: int, **kw: Any) -> Any:
            reads.append(offset)
            return read(self, offset, **kw)

        monkeypatch.setattr(SourceLog, "read", counting_read)
        await publishing.publish(UID, _request(2, **{"pubsubd.deliver_after": "60"}), 2)
        tracker = publishing.delays[UID]
        assert tracker.pending_rows() == 2 and reads and min(reads) == 500
        assert publishing.delay_index is not None
        assert publishing.delay_index.progress(UID) == {0: 502}
    finally:
        await publishing.close()


async def test_a_crash_between_the_first_delayed_commit_and_its_row_loses_nothing(
    tmp_path: Path,
) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    await publishing.publish(UID, _request(10), 10)
    tracker = publishing.delay_tracker(UID, first_delay=True)  # as a delayed publish does
    tracker.close()  # the crash: the commit below never reaches the tracker
    del publishing.delays[UID]
    payload = _request(3, **{"pubsubd.deliver_after": "60"})
    await publishing.open_topic(UID).logs[0].append(payload, 3, time.time_ns() // 1000)
    await publishing.close()
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        publishing.open_topic(UID)  # the index knew the topic: its tracker re-reads from 10
        assert publishing.delays[UID].pending_rows() == 3
    finally:
        await publishing.close()
