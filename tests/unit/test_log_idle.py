"""Many names, few files: lazy log storage and the release of idle logs' file descriptors.

Covers ``SourceLog`` (``on_disk``, ``release_idle``), ``TopicSources.release_idle`` and the
publishing forwarder's ``stored`` set and trim loop (ARCHITECTURE.md, "Durability and recovery").
File descriptors are counted both in ``/proc/self/fd`` and in the log's own handles.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.publish.source import TopicSources
from pubsubd.storage.framing import Entry
from pubsubd.storage.log import SEGMENT_SUFFIX, FsyncPolicy, SourceLog
from tests.support.fds import open_files

pytestmark = pytest.mark.unit


def _open_fds() -> int:
    return len(open_files())


def _handles(log: SourceLog) -> tuple[int, bool]:
    """(read fds the log holds, whether its local replica holds the active segment open)."""
    return len(log._read_fds), log._replica._fd is not None


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def _read_all(log: SourceLog) -> list[Entry]:
    entries: list[Entry] = []
    offset = log.start_offset
    while batch := log.read(offset, max_entries=3):
        entries.extend(batch)
        offset = batch[-1].next_offset
    return entries


def _expected(n: int, start: int = 0) -> list[Entry]:
    return [Entry(i, 1, 1000 + i, b"payload-%06d" % i) for i in range(start, start + n)]


async def _fill(log: SourceLog, n: int) -> None:
    start = log.end_offset
    for i in range(start, start + n):
        assert await log.append(b"payload-%06d" % i, 1, 1000 + i) == i


async def _until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2.0
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def _release_fully(log: SourceLog) -> None:
    """Two calls (the first only ends the "used" period), then wait for the writer to let go."""
    log.release_idle()
    log.release_idle()
    await _until(lambda: _handles(log) == (0, False), "the log to release its files")


# --- lazy creation ----------------------------------------------------------------------------


async def test_unwritten_topic_with_subscriptions_creates_nothing_on_disk(tmp_path: Path) -> None:
    data = tmp_path / "data"
    forwarder = PublishingForwarder(data, trim_interval_s=0.01)
    forwarder.start()
    try:
        for t in range(20):
            sources = forwarder.open_topic(f"topic-{t}")
            assert not sources.on_disk()
            for s in range(3):  # subscriptions attached at their sync point
                forwarder.attach(f"topic-{t}", f"sub-{t}-{s}", {0: 0})
                await forwarder.flush_acks(f"topic-{t}", f"sub-{t}-{s}")
            forwarder.add_commit_listener(f"topic-{t}", lambda offset: None)
            assert forwarder.end_offsets(f"topic-{t}") == {0: 0}
            assert forwarder.read(f"topic-{t}", 0, 0, 100, 1 << 20) == []
        passes = forwarder.trim_passes
        # Several trim passes (each flushes acks and calls release_idle) create nothing.
        await _until(lambda: forwarder.trim_passes >= passes + 3, "three more trim passes")
        assert forwarder.stored == set()
        assert _tree(data) == []
    finally:
        await forwarder.close()
    assert _tree(data) == []

    # A restart over the same (empty) data dir still creates nothing.
    forwarder = PublishingForwarder(data)
    try:
        assert not forwarder.open_topic("topic-0").on_disk()
        assert forwarder.stored == set()
        # The first publish creates the topic's files, and only that topic's.
        assert await forwarder.publish("topic-0", b"x", 1) == (0, 0)
        assert forwarder.stored == {"topic-0"}
        assert _tree(data / "topics") == [
            "topic-0",
            "topic-0/source-0",
            f"topic-0/source-0/{0:020d}{SEGMENT_SUFFIX}",
        ]
        assert not (data / "topics" / "topic-1").exists()
    finally:
        await forwarder.close()
    forwarder = PublishingForwarder(data)
    try:
        forwarder.open_topic("topic-0")
        forwarder.open_topic("topic-1")
        assert forwarder.stored == {"topic-0"}  # recovered from disk: housekeeping visits it
    finally:
        await forwarder.close()


async def test_unwritten_log_closes_without_files_and_counts_from_zero(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b" / "source-0"
    log = SourceLog.open(directory)
    assert (log.on_disk, log.start_offset, log.end_offset, log.segment_count) == (False, 0, 0, 1)
    assert log.offset_for_time(0) == 0 and log.trim(10) == 0
    log.release_idle()
    log.release_idle()
    await log.close()
    assert not (tmp_path / "a").exists()


# --- releasing idle files ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_release_idle_closes_every_segment_and_reopens_on_demand(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    # Tiny segments, no entry cache: every read is a pread on a segment file.
    log = SourceLog.open(
        tmp_path, fsync=policy, segment_bytes=200, fsync_interval_s=0.01, cache_bytes=0
    )
    baseline = _open_fds()
    await _fill(log, 40)
    segments = log.segment_count
    assert segments > 5
    assert _read_all(log) == _expected(40)
    read_fds, write_open = _handles(log)
    assert read_fds == sum(1 for s in log._segments if s.offsets) and write_open
    assert _open_fds() == baseline + read_fds + 1

    await _release_fully(log)
    assert _open_fds() == baseline
    assert log.segment_count == segments  # releasing never rolls or trims
    # The segments, and the index file of every sealed one (storage/segment_index.py).
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"{s.base:020d}{SEGMENT_SUFFIX}" for s in log._segments]
        + [f"{s.base:020d}.idx" for s in log._segments[:-1]]
    )

    # Reads reopen what they need; appends reopen the active segment and carry on.
    assert log.read(7, max_entries=1) == _expected(1, 7)
    assert _handles(log) == (1, False)
    await _fill(log, 10)
    assert _read_all(log) == _expected(50)
    await _release_fully(log)
    assert _open_fds() == baseline
    await log.close()
    reopened = SourceLog.open(tmp_path, segment_bytes=200)
    assert _read_all(reopened) == _expected(50)
    await reopened.close()


async def test_a_log_used_since_the_last_call_keeps_its_files(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, cache_bytes=0)
    await _fill(log, 5)
    assert log.read(0) == _expected(5)
    assert _handles(log) == (1, True)

    log.release_idle()  # appended and read since the start: keeps everything
    await asyncio.sleep(0.02)
    assert _handles(log) == (1, True)

    log.read(2)  # a read alone counts as use
    log.release_idle()
    await asyncio.sleep(0.02)
    assert _handles(log) == (1, True)

    await _fill(log, 1)  # so does an append alone
    log.release_idle()
    await asyncio.sleep(0.02)
    assert _handles(log) == (1, True)

    log.release_idle()  # nothing since the previous call: idle
    await _until(lambda: _handles(log) == (0, False), "the release")
    await log.close()


async def test_cached_reads_do_not_keep_a_log_busy(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path)  # default cache: recent entries never touch the disk
    await _fill(log, 3)
    log.release_idle()
    assert log.read(0) == _expected(3)  # from the cache
    log.release_idle()
    await _until(lambda: _handles(log) == (0, False), "the release")
    await log.close()


async def test_recovered_log_that_was_only_read_releases_its_files(tmp_path: Path) -> None:
    log = SourceLog.open(tmp_path, segment_bytes=100)
    await _fill(log, 10)
    await log.close()
    baseline = _open_fds()
    log = SourceLog.open(tmp_path, segment_bytes=100)  # no writer task in this process
    assert _read_all(log) == _expected(10)
    assert _handles(log)[0] > 1 and _open_fds() > baseline
    await _release_fully(log)
    assert _open_fds() == baseline
    await _fill(log, 2)
    assert _read_all(log) == _expected(12)
    await log.close()


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_release_while_appends_are_in_flight_loses_nothing(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    log = SourceLog.open(tmp_path, fsync=policy, segment_bytes=500, fsync_interval_s=0.01)
    baseline = _open_fds()
    for round_ in range(5):
        start = log.end_offset
        appends = [
            asyncio.ensure_future(log.append(b"payload-%06d" % i, 1, 1000 + i))
            for i in range(start, start + 30)
        ]
        log.release_idle()
        log.release_idle()  # asks the writer to close the active segment while it is busy
        await asyncio.sleep(0)
        log.release_idle()
        assert await asyncio.gather(*appends) == list(range(start, start + 30)), round_
    assert _read_all(log) == _expected(150)
    await asyncio.sleep(0.05)  # INTERVAL: let the background fsync finish
    await _release_fully(log)
    assert _open_fds() == baseline
    await log.close()
    reopened = SourceLog.open(tmp_path, segment_bytes=500)
    assert _read_all(reopened) == _expected(150)
    await reopened.close()


async def test_append_during_the_release_of_the_active_segment_is_released_later(
    tmp_path: Path,
) -> None:
    """An append that arrives while the writer is closing the idle active segment reopens it;
    the log must still know it holds that file, so the next idle period closes it again."""
    log = SourceLog.open(tmp_path)
    baseline = _open_fds()
    await _fill(log, 3)
    replica = log._replica
    closing, proceed = asyncio.Event(), asyncio.Event()
    original_close = replica.close

    async def slow_close() -> None:
        closing.set()
        await proceed.wait()
        await original_close()

    replica.close = slow_close  # type: ignore[method-assign]
    log.release_idle()
    log.release_idle()
    await closing.wait()  # the writer is releasing the active segment now
    append = asyncio.ensure_future(log.append(b"payload-%06d" % 3, 1, 1003))
    await asyncio.sleep(0)
    proceed.set()
    assert await append == 3
    replica.close = original_close  # type: ignore[method-assign]
    assert _handles(log) == (0, True)  # the append reopened the active segment

    await _release_fully(log)
    assert _open_fds() == baseline
    assert _read_all(log) == _expected(4)
    await log.close()


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_restart_over_an_idle_released_log_recovers_every_entry(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    log = SourceLog.open(tmp_path, fsync=policy, segment_bytes=300, fsync_interval_s=0.01)
    await _fill(log, 25)
    await asyncio.sleep(0.05)  # INTERVAL: the background fsync makes it clean
    await _release_fully(log)
    await _fill(log, 25)  # reopened, written, released again
    await asyncio.sleep(0.05)
    await _release_fully(log)
    # The process "dies" here: the released log is never closed. A new one recovers it.
    restarted = SourceLog.open(tmp_path, segment_bytes=300)
    assert restarted.end_offset == 50 and restarted.segment_count == log.segment_count
    assert _read_all(restarted) == _expected(50)
    await _fill(restarted, 5)  # and carries on where the old one stopped
    await restarted.close()
    again = SourceLog.open(tmp_path, segment_bytes=300)
    assert _read_all(again) == _expected(55)
    await again.close()
    await log.close()  # the abandoned log's tasks end; it has nothing left to write


async def test_topic_sources_release_only_idle_logs(tmp_path: Path) -> None:
    sources = TopicSources(
        "uid", tmp_path / "uid", fsync=FsyncPolicy.ALWAYS, segment_bytes=1 << 20, source_count=2
    )
    busy, idle = sources.logs
    await _fill(busy, 2)
    await _fill(idle, 2)
    sources.release_idle()
    await _fill(busy, 1)
    sources.release_idle()
    await _until(lambda: _handles(idle) == (0, False), "the idle log's release")
    assert _handles(busy) == (0, True)
    await sources.close()


async def test_trim_loop_releases_published_topics_files(tmp_path: Path) -> None:
    forwarder = PublishingForwarder(tmp_path / "data", trim_interval_s=0.02)
    baseline = _open_fds()
    forwarder.start()
    try:
        for t in range(30):
            for i in range(3):
                assert await forwarder.publish(f"t{t}", b"m%d" % i, 1) == (0, i)
        logs = [forwarder.topics[f"t{t}"].logs[0] for t in range(30)]
        assert _handles(logs[-1]) == (0, True)  # just published: holds its active segment
        await _until(
            lambda: all(_handles(log) == (0, False) for log in logs), "idle topics' release"
        )
        assert _open_fds() <= baseline
        # A topic published to meanwhile keeps its file; the others stay closed.
        for _ in range(10):
            await forwarder.publish("t0", b"more", 1)
            await asyncio.sleep(0.01)
        assert _handles(logs[0]) == (0, True)
        assert all(_handles(log) == (0, False) for log in logs[1:])
        assert [e.payload for e in forwarder.read("t5", 0, 0, 100, 1 << 20)] == [
            b"m0",
            b"m1",
            b"m2",
        ]
    finally:
        await forwarder.close()
