"""Several publish message sources per topic: the label rules, the routing of publishes (keys
never move as sources are added, unkeyed publishes spread over all), and growing a topic's
sources under attached subscriptions (cursors, listeners, reopen)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pubsubd.core import pb
from pubsubd.core import publish_sources as ps
from pubsubd.core.errors import FailedPrecondition, InvalidArgument
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.publish.routing import Balancer, key_source, route
from pubsubd.storage.log import FsyncPolicy

pytestmark = pytest.mark.unit

KEYS = [f"key-{i}" for i in range(2000)]


# --- routing ----------------------------------------------------------------------------------


def test_same_key_same_source_for_a_fixed_topic() -> None:
    rr = Balancer()
    for key in KEYS[:200]:
        first = route(key, 4, 4, rr, 1)
        assert all(route(key, 4, 4, rr, 1) == first for _ in range(5))
        assert 0 <= first < 4


def test_adding_sources_never_moves_a_key() -> None:
    for key_sources in (1, 2, 4):
        before = {k: route(k, key_sources, key_sources, Balancer(), 1) for k in KEYS}
        for count in range(key_sources, ps.MAX_SOURCES + 1):
            after = {k: route(k, key_sources, count, Balancer(), 1) for k in KEYS}
            assert after == before, f"keys moved going from {key_sources} to {count} sources"
        # Keys only ever use the sources that took keys when the topic was created.
        assert set(before.values()) == set(range(key_sources))


def test_keys_spread_over_the_key_sources() -> None:
    counts = Counter(key_source(k, 4) for k in KEYS)
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > len(KEYS) / 4 * 0.8


def test_unkeyed_publishes_spread_over_every_source() -> None:
    rr = Balancer()
    got = [route("", 2, 4, rr, 1) for _ in range(400)]
    assert Counter(got) == {0: 100, 1: 100, 2: 100, 3: 100}
    assert got[:8] == [0, 1, 2, 3, 0, 1, 2, 3]  # one-message publishes: round-robin
    # A source added mid-stream joins at once, level with the others (no catch-up burst).
    got = [route("", 2, 5, rr, 1) for _ in range(500)]
    assert Counter(got) == dict.fromkeys(range(5), 100)


def test_unkeyed_batches_of_any_size_balance_by_messages() -> None:
    rr = Balancer()
    per_source: Counter[int] = Counter()
    sizes = [1, 7, 3, 1000, 2, 50, 1, 1, 999, 4] * 30
    for n in sizes:
        per_source[route("", 1, 3, rr, n)] += n
    assert set(per_source) == {0, 1, 2}
    assert max(per_source.values()) - min(per_source.values()) <= 1000


def test_one_source_takes_everything() -> None:
    rr = Balancer()
    assert {route(k, 1, 1, rr, 1) for k in [*KEYS[:50], "", ""]} == {0}


# --- labels -----------------------------------------------------------------------------------


def test_create_defaults_and_fixes_the_key_sources() -> None:
    labels: dict[str, str] = {}
    assert ps.on_create(labels) == ps.SourceCounts(1, 1)
    assert labels == {}  # a one-source topic carries no extra label
    labels = {ps.SOURCES_LABEL: "4"}
    assert ps.on_create(labels) == ps.SourceCounts(4, 4)
    assert labels[ps.KEY_SOURCES_LABEL] == "4"
    labels = {ps.SOURCES_LABEL: "4", ps.KEY_SOURCES_LABEL: "2"}
    assert ps.on_create(labels) == ps.SourceCounts(4, 2)
    assert ps.parse(labels) == ps.SourceCounts(4, 2)


@pytest.mark.parametrize(
    "labels",
    [
        {ps.SOURCES_LABEL: "0"},
        {ps.SOURCES_LABEL: "17"},
        {ps.SOURCES_LABEL: "two"},
        {ps.SOURCES_LABEL: "-1"},
        {ps.SOURCES_LABEL: "2", ps.KEY_SOURCES_LABEL: "3"},
        {ps.KEY_SOURCES_LABEL: "0"},
    ],
)
def test_bad_values_are_invalid_argument(labels: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument, match="labels"):
        ps.on_create(dict(labels))


def test_update_only_grows_and_keeps_the_key_sources() -> None:
    current = {ps.SOURCES_LABEL: "2", ps.KEY_SOURCES_LABEL: "2"}
    grown = {ps.SOURCES_LABEL: "4", "team": "a"}
    assert ps.on_update(current, grown) == ps.SourceCounts(4, 2)
    assert grown[ps.KEY_SOURCES_LABEL] == "2"  # put back
    kept = {"team": "b"}  # a client replacing its own labels keeps the server's
    assert ps.on_update(current, kept) == ps.SourceCounts(2, 2)
    assert kept == {"team": "b", ps.SOURCES_LABEL: "2", ps.KEY_SOURCES_LABEL: "2"}
    with pytest.raises(FailedPrecondition, match="cannot lower"):
        ps.on_update(current, {ps.SOURCES_LABEL: "1"})
    with pytest.raises(FailedPrecondition, match="fixed at 2"):
        ps.on_update(current, {ps.SOURCES_LABEL: "4", ps.KEY_SOURCES_LABEL: "4"})
    with pytest.raises(InvalidArgument):
        ps.on_update(current, {ps.SOURCES_LABEL: "99"})
    # A topic created with one source keeps its keys in source 0 when it grows.
    assert ps.on_update({}, {ps.SOURCES_LABEL: "3"}) == ps.SourceCounts(3, 1)
    with pytest.raises(FailedPrecondition):
        ps.on_update({}, {ps.SOURCES_LABEL: "3", ps.KEY_SOURCES_LABEL: "3"})


# --- growing a topic's sources ----------------------------------------------------------------


def _request(key: str = "", n: int = 1) -> bytes:
    request = pb.PublishRequest(
        messages=[pb.PubsubMessage(data=b"x", ordering_key=key) for _ in range(n)]
    )
    return bytes(request.SerializeToString())


async def test_grow_gives_journals_cursors_and_logs_listeners(tmp_path: Path) -> None:
    fwd = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        fwd.configure_topic("t", 2, 2)
        assert set(fwd.attach("t", "s", fwd.end_offsets("t"))) == {0, 1}
        commits: list[int] = []
        fwd.add_commit_listener("t", commits.append)
        assert fwd.configure_topic("t", 4, 2) == [2, 3]
        assert fwd.configure_topic("t", 3, 2) == []  # never shrinks
        sources = fwd.topics["t"]
        assert len(sources.logs) == 4
        cursors = fwd.cursor_states("t", "s")
        assert {s: c.mark_delete for s, c in cursors.items()} == {0: 0, 1: 0, 2: 0, 3: 0}
        placed = [await fwd.publish("t", _request(), 1) for _ in range(8)]
        assert Counter(s for s, _ in placed) == {0: 2, 1: 2, 2: 2, 3: 2}
        assert len(commits) == 8  # the listener hears the new sources too
        # Keys stay in sources 0 and 1 (the sources the topic was created with).
        keyed = {await fwd.publish("t", _request(k, 3), 3) for k in KEYS[:40]}
        assert {s for s, _ in keyed} == {0, 1}
        # The subscription holds the new sources' messages: nothing is trimmable there.
        assert sources.trim_point(2) == 0 and sources.trim_point(3) == 0
        fwd.remove_commit_listener("t", commits.append)
        await fwd.publish("t", _request(), 1)
        assert len(commits) == 48
    finally:
        await fwd.close()


async def test_publish_reads_the_key_from_the_payload_when_not_given(tmp_path: Path) -> None:
    fwd = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        fwd.configure_topic("t", 4, 4)
        for key in KEYS[:30]:
            given, _ = await fwd.publish("t", _request(key), 1, ordering_key=key)
            parsed, _ = await fwd.publish("t", _request(key), 1)
            assert given == parsed == key_source(key, 4)
    finally:
        await fwd.close()


async def test_a_publish_into_a_named_source_goes_there_whatever_its_key(tmp_path: Path) -> None:
    fwd = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    try:
        fwd.configure_topic("t", 3, 3)
        for key in KEYS[:10]:
            source, _ = await fwd.publish("t", _request(key), 1, key, source=2)
            assert source == 2
        with pytest.raises(InvalidArgument, match="not a source"):
            await fwd.publish("t", _request(""), 1, "", source=3)
    finally:
        await fwd.close()


async def test_sources_reopen_from_disk_and_new_subscription_cursors(tmp_path: Path) -> None:
    fwd = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    fwd.configure_topic("t", 3, 1)
    for _ in range(6):
        await fwd.publish("t", _request(), 1)
    await fwd.close()
    # Without the label (e.g. a deleted topic's storage) every source with data reopens.
    fwd = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    try:
        sources = fwd.open_topic("t")
        assert [log.committed_offset for log in sources.logs] == [2, 2, 2]
        # A subscription whose sync point predates a source reads that source from 0.
        cursors = fwd.attach("t", "old-sub", {0: 1})
        assert {s: c.mark_delete for s, c in cursors.items()} == {0: 1, 1: 0, 2: 0}
        assert fwd.cursor_states("t", "old-sub") == cursors
    finally:
        await fwd.close()


async def test_a_cursor_opens_its_source_even_without_a_directory(tmp_path: Path) -> None:
    fwd = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    fwd.configure_topic("t", 4, 1)
    sync_point = fwd.end_offsets("t")
    fwd.attach("t", "s", sync_point)
    for _ in range(3):  # sources 0-2 get one message each; source 3 stays without files
        await fwd.publish("t", _request(), 1)
    await fwd.close()
    assert not (tmp_path / "topics" / "t" / "source-3").exists()
    # The topic is gone from the catalog (no labels), a subscription still reads its storage.
    fwd = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    try:
        assert len(fwd.open_topic("t").logs) == 3
        assert set(fwd.attach("t", "s", sync_point)) == {0, 1, 2, 3}
        assert len(fwd.topics["t"].logs) == 4
    finally:
        await fwd.close()


def test_the_stream_sources_header_names_sources_or_is_invalid() -> None:
    assert ps.stream_sources("2") == frozenset({2})
    assert ps.stream_sources("0, 3,3") == frozenset({0, 3})
    for bad in ("", "x", "-1", "16", "1;2"):
        with pytest.raises(InvalidArgument, match="pubsubd-sources"):
            ps.stream_sources(bad)


# --- active sources (source growth) -----------------------------------------------------------


def test_unkeyed_publishes_go_to_the_active_sources_keys_stay_put() -> None:
    rr = Balancer()
    got = [route("", 2, 6, rr, 1, active=3) for _ in range(300)]
    assert Counter(got) == {0: 100, 1: 100, 2: 100}
    before = {k: route(k, 2, 6, Balancer(), 1) for k in KEYS[:300]}
    assert {k: route(k, 2, 6, Balancer(), 1, active=2) for k in KEYS[:300]} == before
    # Growing back: every active source starts level (no burst into the ones that rested).
    got = [route("", 2, 6, rr, 1, active=6) for _ in range(600)]
    assert Counter(got) == dict.fromkeys(range(6), 100)
    assert {route("", 2, 6, rr, 1, active=1) for _ in range(10)} == {0}


def test_the_active_label_is_validated_and_dropped_when_sources_are_raised() -> None:
    labels = {ps.SOURCES_LABEL: "4", ps.KEY_SOURCES_LABEL: "2", ps.ACTIVE_SOURCES_LABEL: "3"}
    assert ps.parse(labels) == ps.SourceCounts(4, 2, 3)
    assert ps.parse(labels).serving == 3
    assert ps.parse({**labels, ps.ACTIVE_SOURCES_LABEL: "4"}).serving == 4
    assert ps.parse({ps.SOURCES_LABEL: "4"}).serving == 4
    with pytest.raises(InvalidArgument, match="fewer than the topic's 2 ordering-key"):
        ps.parse({**labels, ps.ACTIVE_SOURCES_LABEL: "1"})
    with pytest.raises(InvalidArgument):
        ps.parse({**labels, ps.ACTIVE_SOURCES_LABEL: "5"})
    # Left out of an update: kept, unless the update raises the sources (all active again).
    kept = {"team": "a"}
    assert ps.on_update(labels, kept).serving == 3
    assert kept[ps.ACTIVE_SOURCES_LABEL] == "3"
    raised = {ps.SOURCES_LABEL: "6"}
    assert ps.on_update(labels, raised) == ps.SourceCounts(6, 2, 0)
    assert ps.ACTIVE_SOURCES_LABEL not in raised
    lowered = {ps.ACTIVE_SOURCES_LABEL: "2"}
    assert ps.on_update(labels, lowered).serving == 2


async def test_a_topic_configured_with_fewer_active_sources_routes_there(tmp_path: Path) -> None:
    fwd = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    fwd.configure_topic("t", 4, 1, active=2)
    sources = fwd.open_topic("t")
    assert {sources.route("", 1) for _ in range(20)} == {0, 1}
    fwd.configure_topic("t", 4, 1)
    assert {sources.route("", 1) for _ in range(20)} == {0, 1, 2, 3}
    await fwd.close()
