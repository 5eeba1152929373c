"""Unit tests of retention, Seek states, snapshot expiry and expiration_policy decisions
(pubsubd.core.retention, pubsubd.control.expiry) and of the pins in TopicSources.trim_point."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubd.acks.cursor import Cursor, CursorState
from pubsubd.control import expiry
from pubsubd.core import names, pb, quotas, retention
from pubsubd.core.errors import InvalidArgument, InvalidResourceName
from pubsubd.data.publish.source import TopicSources
from pubsubd.storage.log import FsyncPolicy
from pubsubd.storage.metadata import MemoryMetadataStore, SnapshotRecord, SqliteMetadataStore

pytestmark = pytest.mark.unit

DAY_US = 24 * 3600 * retention.US_PER_S


@dataclass
class FakeLog:
    """Entries of one message each, at offsets start..len(times)-1 with these publish times."""

    times: list[int]
    start_offset: int = 0

    @property
    def committed_offset(self) -> int:
        return len(self.times)

    def offset_for_time(self, publish_time_us: int) -> int:
        for off in range(self.start_offset, len(self.times)):
            if self.times[off] >= publish_time_us:
                return off
        return len(self.times)


def acked_set(state: CursorState, end: int) -> set[int]:
    out = set(range(min(state.mark_delete, end)))
    for s, e in state.ranges:
        out |= set(range(s, min(e, end)))
    return out


# --- seek_state --------------------------------------------------------------------------------


def test_seek_back_without_retained_acks_keeps_acked_messages_acked() -> None:
    current = CursorState(5, ((7, 9),))  # 0-4, 7, 8 acked; 5, 6, 9.. unacked
    new = retention.seek_state(current, target=2, floor=None, start=0)
    assert acked_set(new, 12) == acked_set(current, 12)


def test_seek_back_with_retained_acks_unacks_from_the_floor() -> None:
    current = CursorState(10)
    new = retention.seek_state(current, target=2, floor=4, start=0)
    assert new == CursorState(4)  # 2, 3 are older than retention: they stay acked
    assert retention.seek_state(current, target=6, floor=0, start=0) == CursorState(6)


def test_seek_forward_acks_everything_before_the_target() -> None:
    current = CursorState(1, ((3, 4),))
    assert retention.seek_state(current, target=8, floor=None, start=0) == CursorState(8)
    assert retention.seek_state(current, target=8, floor=0, start=0) == CursorState(8)


def test_seek_never_goes_below_the_log_start() -> None:
    assert retention.seek_state(CursorState(10), target=0, floor=0, start=6) == CursorState(6)


def test_seek_keeps_acked_ranges_below_the_floor() -> None:
    current = CursorState(2, ((4, 6), (8, 12)))
    new = retention.seek_state(current, target=0, floor=10, start=0)
    assert new == CursorState(2, ((4, 6), (8, 10)))  # 0, 1 were acked, below the floor


@given(
    md=st.integers(0, 30),
    ranges=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8)), max_size=5),
    target=st.integers(0, 45),
    floor=st.one_of(st.none(), st.integers(0, 45)),
    start=st.integers(0, 10),
)
def test_seek_state_matches_the_set_model(
    md: int, ranges: list[tuple[int, int]], target: int, floor: int | None, start: int
) -> None:
    start = min(start, md)  # trimming never passes a mark-delete
    cursor = Cursor(md)
    for s, n in ranges:
        cursor.ack_range(s, s + n)
    current = cursor.snapshot()
    end = 60
    new = retention.seek_state(current, target, floor, start)
    old = acked_set(current, end)
    # Before the target (or gone from the log): acked. After it: acked only if it was acked
    # and is not retained (below the floor).
    expected = {
        o
        for o in range(end)
        if o < max(target, start) or (o in old and (floor is None or o < floor))
    }
    assert acked_set(new, end) == expected
    # The result is a valid cursor state: normalized as Cursor.reset leaves it.
    assert Cursor.from_state(new).snapshot() == new


# --- floors, cuts, expiry ------------------------------------------------------------------------


def test_replay_floor() -> None:
    now = 100 * DAY_US
    log = FakeLog([now - 10 * DAY_US, now - 5 * DAY_US, now - 2 * DAY_US, now - DAY_US])
    kw = {"topic_retention_us": None, "retain_acked_us": None, "sync_start": 0}
    assert retention.replay_floor(log, now, **kw) is None  # type: ignore[arg-type]
    kw["retain_acked_us"] = 3 * DAY_US
    assert retention.replay_floor(log, now, **kw) == 2  # type: ignore[arg-type]
    kw["sync_start"] = 3  # retain_acked does not reach before the subscription existed
    assert retention.replay_floor(log, now, **kw) == 3  # type: ignore[arg-type]
    kw["topic_retention_us"] = 6 * DAY_US  # topic retention does
    assert retention.replay_floor(log, now, **kw) == 1  # type: ignore[arg-type]
    log.start_offset = 2  # nothing below the log's start exists
    assert retention.replay_floor(log, now, **kw) == 2  # type: ignore[arg-type]


def test_unacked_expiry_cut() -> None:
    now = 100 * DAY_US
    log = FakeLog([now - 9 * DAY_US, now - 8 * DAY_US, now - DAY_US])
    assert retention.unacked_expiry_cut(log, 7 * DAY_US, now, 0) == 2
    assert retention.unacked_expiry_cut(log, 7 * DAY_US, now, 2) == 2
    assert retention.unacked_expiry_cut(log, 10 * DAY_US, now, 0) == 0
    assert retention.unacked_expiry_cut(log, DAY_US // 2, now, 1) == 3


def test_snapshot_expire_time() -> None:
    now = 100 * DAY_US
    assert retention.snapshot_expire_us(None, now) == now + 7 * DAY_US
    assert retention.snapshot_expire_us(now - 3 * DAY_US, now) == now + 4 * DAY_US


def _sub(**fields: object) -> object:
    return pb.Subscription(name="projects/p/subscriptions/sub", **fields)


def test_effective_ttl() -> None:
    assert expiry.effective_ttl_s(_sub()) == 31 * 24 * 3600
    assert expiry.effective_ttl_s(_sub(expiration_policy=pb.Subscription().expiration_policy)) is (
        None
    )
    policy = {"ttl": pb.Duration(seconds=2 * 24 * 3600)}
    assert expiry.effective_ttl_s(_sub(expiration_policy=policy)) == 2 * 24 * 3600


def test_is_expired() -> None:
    assert expiry.is_expired(10.0, last_active=0.0, now=10.0, in_use=False)
    assert not expiry.is_expired(10.0, last_active=0.0, now=9.9, in_use=False)
    assert not expiry.is_expired(10.0, last_active=0.0, now=99.0, in_use=True)
    assert not expiry.is_expired(None, last_active=0.0, now=1e12, in_use=False)


def test_snapshot_names() -> None:
    assert names.snapshot("projects/p/snapshots/snap-1") == "projects/p/snapshots/snap-1"
    for bad in ("projects/p/snapshots/1ab", "projects/p/topics/abc", "projects/p/snapshots/goog1"):
        with pytest.raises(InvalidResourceName):
            names.snapshot(bad)


# --- storage -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_metadata_store_keeps_snapshots(tmp_path: Path, kind: str) -> None:
    def open_store() -> MemoryMetadataStore | SqliteMetadataStore:
        return MemoryMetadataStore() if kind == "memory" else SqliteMetadataStore(tmp_path)

    store = open_store()
    rec = SnapshotRecord("projects/p/snapshots/s", "uid1", b"body", {0: (5, [(7, 9), (11, 12)])})
    store.put_snapshot(rec)
    store.put_snapshot(SnapshotRecord("projects/p/snapshots/t", "uid2", b"x", {}))
    store.delete_snapshot("projects/p/snapshots/t")
    if kind == "sqlite":
        store.close()
        store = open_store()
    assert list(store.load_snapshots()) == [rec]
    store.close()


async def test_trim_point_honours_pins(tmp_path: Path) -> None:
    sources = TopicSources("t", tmp_path, fsync=FsyncPolicy.NEVER, segment_bytes=1 << 20)
    for i in range(10):
        await sources.logs[0].append(b"p%d" % i, 1, 1000 + i)
    assert sources.trim_point(0) == 10  # no subscription, no pin: everything may go
    sources.pins["topic-retention"] = {0: 6}
    sources.pins["snapshot:s"] = {0: 3}
    assert sources.trim_point(0) == 3
    del sources.pins["snapshot:s"]
    assert sources.trim_point(0) == 6
    await sources.close()


# --- retention by size (pubsubd-retention-bytes) -------------------------------------------------


def test_size_pin_keeps_whole_segments_within_the_limit() -> None:
    segments = [(0, 100), (10, 100), (20, 100), (30, 40)]  # (base, bytes); the last is active
    assert retention.size_pin(segments, 1000, 35) == 0  # all 340 bytes fit
    assert retention.size_pin(segments, 340, 35) == 0  # exactly at the limit
    assert retention.size_pin(segments, 339, 35) == 10  # never above the limit: 240 kept
    assert retention.size_pin(segments, 140, 35) == 20
    assert retention.size_pin(segments, 139, 35) == 30
    assert retention.size_pin(segments, 39, 35) == 35  # the active segment alone is over it


@given(
    sizes=st.lists(st.integers(0, 500), min_size=1, max_size=8),
    limit=st.integers(1, 3000),
)
def test_size_pin_is_the_lowest_segment_start_within_the_limit(
    sizes: list[int], limit: int
) -> None:
    bases = [10 * i for i in range(len(sizes))]
    end = bases[-1] + 5
    pin = retention.size_pin(list(zip(bases, sizes, strict=True)), limit, end)
    fits = [b for i, b in enumerate(bases) if sum(sizes[i:]) <= limit]
    assert pin == (min(fits) if fits else end)


@dataclass
class FakeSizedLog(FakeLog):
    """``FakeLog`` with one segment per entry of ``size`` bytes."""

    size: int = 100

    def segment_sizes(self) -> list[tuple[int, int]]:
        return [(o, self.size) for o in range(self.start_offset, len(self.times))]


def test_topic_pin_keeps_only_what_is_inside_both_limits() -> None:
    now = 100 * DAY_US
    log = FakeSizedLog([now - 5 * DAY_US, now - 4 * DAY_US, now - 3 * DAY_US, now - DAY_US])
    pin = retention.topic_pin
    assert pin(log, now, retention_us=None, retention_bytes=None) is None
    assert pin(log, now, retention_us=6 * DAY_US, retention_bytes=None) == 0
    assert pin(log, now, retention_us=None, retention_bytes=250) == 2  # the newest 2 segments
    # Pulsar: with both set, a message goes as soon as either limit is exceeded.
    assert pin(log, now, retention_us=6 * DAY_US, retention_bytes=250) == 2  # size is stricter
    assert pin(log, now, retention_us=2 * DAY_US, retention_bytes=250) == 3  # time is stricter
    assert pin(log, now, retention_us=6 * DAY_US, retention_bytes=10_000) == 0


def test_replay_floor_with_a_size_limit() -> None:
    now = 100 * DAY_US
    log = FakeSizedLog([now - 5 * DAY_US, now - 4 * DAY_US, now - 3 * DAY_US, now - DAY_US])
    kw = {"topic_retention_us": None, "retain_acked_us": None, "sync_start": 0}
    floor = retention.replay_floor
    assert floor(log, now, topic_retention_bytes=250, **kw) == 2  # type: ignore[arg-type]
    kw["topic_retention_us"] = 6 * DAY_US
    assert floor(log, now, topic_retention_bytes=250, **kw) == 2  # type: ignore[arg-type]
    # retain_acked_messages is the subscription's own: the topic's size limit does not bound it.
    kw["retain_acked_us"] = 6 * DAY_US
    assert floor(log, now, topic_retention_bytes=250, **kw) == 0  # type: ignore[arg-type]


def test_retention_bytes_label() -> None:
    assert quotas.retention_bytes({"team": "x"}) is None
    assert quotas.retention_bytes({"pubsubd-retention-bytes": "1048576"}) == 1 << 20
    for bad in ("0", "-1", "1mb", ""):
        with pytest.raises(InvalidArgument, match="pubsubd-retention-bytes"):
            quotas.retention_bytes({"pubsubd-retention-bytes": bad})


async def test_size_pin_on_a_real_log(tmp_path: Path) -> None:
    """SourceLog.segment_sizes feeds size_pin; trimming to the pin keeps the newest segments
    within the limit."""
    sources = TopicSources("t", tmp_path, fsync=FsyncPolicy.NEVER, segment_bytes=200)
    log_ = sources.logs[0]
    for i in range(40):
        await log_.append(b"x" * 60, 1, 1000 + i)
    segments = log_.segment_sizes()
    assert len(segments) > 4 and [b for b, _ in segments] == sorted(b for b, _ in segments)
    assert sum(s for _, s in segments) == log_.stats()["bytes"]
    limit = 3 * segments[0][1]
    pin = retention.size_pin(segments, limit, log_.committed_offset)
    sources.pins[retention.TOPIC_PIN] = {0: pin}
    sources.trim()  # no subscription: only the pin holds data back
    assert log_.start_offset == pin
    assert 0 < sum(s for _, s in log_.segment_sizes()) <= limit
    await sources.close()
