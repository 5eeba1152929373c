"""The replayable read API (pubsubd.v1.Replay, docs/REPLAY_API.md) against a real server, with
messages published by the official client."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.cloud import pubsub_v1
from google.protobuf import timestamp_pb2

from tests.conftest import make_publisher, make_subscriber
from tests.support.clients import instant_between_publishes, pull_until
from tests.support.replay_client import ReplayClient
from tests.support.server import ServerProcess, wait_for
from tests.support.status import FAST_TRIM_INTERVAL_S, status, wait_trim_passes

pytestmark = pytest.mark.integration


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _code(excinfo: pytest.ExceptionInfo[grpc.RpcError]) -> grpc.StatusCode:
    return excinfo.value.code()  # type: ignore[attr-defined,no-any-return]


def test_ranges_lookup_and_paged_reads_return_what_was_published(
    shared_server: ServerProcess, names: Any
) -> None:
    topic, sub_name = names.topic(), names.subscription()
    pub = make_publisher(
        shared_server.endpoint,
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
    )
    sub = make_subscriber(shared_server.endpoint)
    replay = ReplayClient(shared_server.endpoint)
    pub.create_topic(name=topic)
    sub.create_subscription(name=sub_name, topic=topic)
    assert replay.GetTopicRanges(topic=topic).sources[0].latest_offset == 0

    first = [pub.publish(topic, f"m{i}".encode(), ordering_key="k1", n=str(i)) for i in range(20)]
    first_ids = [f.result(timeout=30) for f in first]
    boundary = instant_between_publishes()
    second = [pub.publish(topic, f"m{i}".encode(), i=str(i)) for i in range(20, 33)]
    ids = first_ids + [f.result(timeout=30) for f in second]

    (rng,) = replay.GetTopicRanges(topic=topic).sources
    assert (rng.source, rng.earliest_offset, rng.latest_offset) == (0, 0, 33)

    offsets = replay.LookupOffsets(topic=topic, time=_ts(boundary)).offsets
    assert dict(offsets) == {0: 20}
    assert dict(replay.LookupOffsets(topic=topic, time=_ts(0)).offsets) == {0: 0}
    assert dict(replay.LookupOffsets(topic=topic, time=_ts(time.time() + 60)).offsets) == {0: 33}

    # What a subscription receives is the reference for every field.
    pulled: dict[str, Any] = {}
    while len(pulled) < 33:
        resp = sub.pull(subscription=sub_name, max_messages=100, timeout=10)
        for m in resp.received_messages:
            pulled[m.message.message_id] = m.message
        sub.acknowledge(subscription=sub_name, ack_ids=[m.ack_id for m in resp.received_messages])

    pages = []
    start = 0
    while True:
        page = replay.Read(topic=topic, source=0, start_offset=start, max_messages=7)
        if not page.messages:
            assert page.next_offset == start == 33
            break
        assert len(page.messages) <= 7
        pages.append(page)
        start = page.next_offset
    assert len(pages) == 5
    read = [m for p in pages for m in p.messages]
    assert [m.message_id for m in read] == ids
    assert [m.offset for m in read] == list(range(33))
    for m in read:
        ref = pulled[m.message_id]
        assert m.data == ref.data
        assert dict(m.attributes) == dict(ref.attributes)
        assert m.ordering_key == ref.ordering_key
        assert m.publish_time.ToNanoseconds() == ref.publish_time.timestamp_pb().ToNanoseconds()
    assert read[0].ordering_key == "k1" and read[25].ordering_key == ""

    # A bounded range, and a byte limit that still returns one message.
    window = replay.Read(topic=topic, source=0, start_offset=5, end_offset=9)
    assert [m.offset for m in window.messages] == [5, 6, 7, 8] and window.next_offset == 9
    one = replay.Read(topic=topic, source=0, start_offset=10, max_bytes=1)
    assert [m.offset for m in one.messages] == [10] and one.next_offset == 11
    replay.close()


def test_errors(shared_server: ServerProcess, names: Any) -> None:
    topic = names.topic()
    replay = ReplayClient(shared_server.endpoint)
    with pytest.raises(grpc.RpcError) as e:
        replay.GetTopicRanges(topic=topic)
    assert _code(e) == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        replay.Read(topic="not-a-topic-name", source=0)
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    make_publisher(shared_server.endpoint).create_topic(name=topic)
    with pytest.raises(grpc.RpcError) as e:
        replay.Read(topic=topic, source=3)
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        replay.Read(topic=topic, source=0, start_offset=5)
    assert _code(e) == grpc.StatusCode.OUT_OF_RANGE
    with pytest.raises(grpc.RpcError) as e:
        replay.PublishDeduplicated(topic=topic, messages=[{"data": b"x"}])
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    assert "dedup_id" in e.value.details()  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as e:
        replay.PublishDeduplicated(
            topic=topic, messages=[{"dedup_id": "a", "data": b"x", "attributes": {"": "v"}}]
        )
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        replay.PublishDeduplicated(
            topic=topic, messages=[{"dedup_id": str(i), "data": b"x"} for i in range(1001)]
        )
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        replay.CommitCursor(topic=topic, name="q", offsets={0: 1})
    assert _code(e) == grpc.StatusCode.OUT_OF_RANGE
    with pytest.raises(grpc.RpcError) as e:
        replay.CommitCursor(topic=topic, name="", offsets={0: 0})
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    # The reserved attribute cannot be set through google.pubsub.v1 Publish.
    with pytest.raises(Exception, match="reserved"):
        make_publisher(shared_server.endpoint).publish(
            topic, b"x", **{"pubsubd.dedup_id": "a"}
        ).result(timeout=30)
    replay.close()


def test_dedup_stores_once_and_answers_original_ids(
    shared_server: ServerProcess, names: Any
) -> None:
    topic, sub_name = names.topic(), names.subscription()
    make_publisher(shared_server.endpoint).create_topic(name=topic)
    sub = make_subscriber(shared_server.endpoint)
    sub.create_subscription(name=sub_name, topic=topic)
    replay = ReplayClient(shared_server.endpoint)
    batch = [
        {"dedup_id": f"id-{i}", "data": f"d{i}".encode(), "attributes": {"a": str(i)}}
        for i in range(10)
    ]
    first = replay.PublishDeduplicated(topic=topic, messages=batch)
    assert first.duplicates == 0 and list(first.message_ids) == [str(i) for i in range(10)]
    again = replay.PublishDeduplicated(
        topic=topic, messages=[*batch[5:], {"dedup_id": "new", "data": b"n"}]
    )
    assert again.duplicates == 5
    assert list(again.message_ids) == [str(i) for i in range(5, 10)] + ["10"]
    assert replay.GetTopicRanges(topic=topic).sources[0].latest_offset == 11
    read = replay.read_all(topic)
    assert [m.data for m in read] == [f"d{i}".encode() for i in range(10)] + [b"n"]
    assert all("pubsubd.dedup_id" not in m.attributes for m in read)
    got: list[Any] = []
    while len(got) < 11:
        resp = sub.pull(subscription=sub_name, max_messages=100, timeout=10)
        got.extend(m.message for m in resp.received_messages)
    assert sorted(m.message_id for m in got) == sorted(str(i) for i in range(11))
    assert all(dict(m.attributes) in ({}, {"a": m.data.decode()[1:]}) for m in got)
    assert status(shared_server)["dedup"]["duplicates"] >= 5
    replay.close()


def test_cursors_survive_restart_and_show_lag(server: ServerProcess, names: Any) -> None:
    topic = names.topic()
    pub = make_publisher(server.endpoint)
    pub.create_topic(name=topic)
    for f in [pub.publish(topic, b"x") for _ in range(12)]:
        f.result(timeout=30)
    replay = ReplayClient(server.endpoint)
    empty = replay.GetCursor(topic=topic, name="query-1")
    assert dict(empty.offsets) == {} and not empty.HasField("commit_time")
    committed = replay.CommitCursor(topic=topic, name="query-1", offsets={0: 4})
    assert dict(committed.offsets) == {0: 4} and committed.HasField("commit_time")
    assert status(server)["cursors"][topic]["query-1"]["lag"] == 8
    replay.close()
    port = server.port
    server.kill()  # kill -9: a commit that was answered is durable
    server.start(port=port)
    replay = ReplayClient(server.endpoint)
    got = replay.GetCursor(topic=topic, name="query-1")
    assert dict(got.offsets) == {0: 4} and got.commit_time == committed.commit_time
    assert status(server)["cursors"][topic]["query-1"]["lag_by_source"] == {"0": 8}
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics") as f:
        metrics = f.read().decode()
    assert f'pubsubd_cursor_lag_messages{{cursor="query-1",topic="{topic}"}} 8.0' in metrics
    replay.close()


def test_read_below_retained_range_fails_and_cursor_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")  # tiny segments: trimmed early
    monkeypatch.setenv("PUBSUBD_TRIM_INTERVAL_S", FAST_TRIM_INTERVAL_S)
    server = ServerProcess(tmp_path / "data").start()
    try:
        topic, sub_name = "projects/trim/topics/replay", "projects/trim/subscriptions/all"
        pub = make_publisher(
            server.endpoint, batch_settings=pubsub_v1.types.BatchSettings(max_messages=10)
        )
        sub = make_subscriber(server.endpoint)
        replay = ReplayClient(server.endpoint)
        pub.create_topic(name=topic)
        sub.create_subscription(name=sub_name, topic=topic)
        for f in [pub.publish(topic, os.urandom(200)) for _ in range(300)]:
            f.result(timeout=30)
        replay.CommitCursor(topic=topic, name="pipeline", offsets={0: 150})
        pull_until(sub, sub_name, 300, ack=True, max_messages=100, timeout=60)

        def earliest() -> int:
            return int(replay.GetTopicRanges(topic=topic).sources[0].earliest_offset)

        wait_for(lambda: earliest() > 0, 15, "acked segments to be trimmed")
        wait_trim_passes(server)  # a whole trim pass more: the cursor's pin holds
        low = earliest()
        assert 0 < low <= 150
        with pytest.raises(grpc.RpcError) as e:
            replay.Read(topic=topic, source=0, start_offset=low - 1)
        assert _code(e) == grpc.StatusCode.OUT_OF_RANGE
        assert f"offset {low - 1} is below the retained range [{low}, 300)" in (
            e.value.details()  # type: ignore[attr-defined]
        )
        assert replay.read_all(topic, start=150)[0].offset == 150
        # Committing to the end releases the pin.
        replay.CommitCursor(topic=topic, name="pipeline", offsets={0: 300})
        wait_for(lambda: earliest() > 150, 15, "the released segments to be trimmed")
        replay.close()
    finally:
        server.kill()


def test_list_and_delete_cursors(shared_server: ServerProcess, names: Any) -> None:
    topic, other = names.topic(), names.topic("other")
    pub = make_publisher(shared_server.endpoint)
    pub.create_topic(name=topic)
    pub.create_topic(name=other)
    for f in [pub.publish(topic, b"x") for _ in range(10)]:
        f.result(timeout=30)
    replay = ReplayClient(shared_server.endpoint)
    assert list(replay.ListCursors(topic=topic).cursors) == []
    committed = {
        name: replay.CommitCursor(topic=topic, name=name, offsets={0: at})
        for name, at in [("b", 5), ("a", 2), ("c", 10)]
    }
    replay.CommitCursor(topic=other, name="elsewhere", offsets={0: 0})
    listed = list(replay.ListCursors(topic=topic).cursors)
    assert [c.name for c in listed] == ["a", "b", "c"]
    for c in listed:  # the same fields GetCursor returns
        assert c == committed[c.name] == replay.GetCursor(topic=topic, name=c.name)
    assert dict(listed[1].offsets) == {0: 5} and listed[1].topic == topic

    assert replay.DeleteCursor(topic=topic, name="b").ByteSize() == 0
    assert [c.name for c in replay.ListCursors(topic=topic).cursors] == ["a", "c"]
    assert set(status(shared_server)["cursors"][topic]) == {"a", "c"}
    # GetCursor answers a deleted cursor as one never committed (documented: not NOT_FOUND).
    gone = replay.GetCursor(topic=topic, name="b")
    assert dict(gone.offsets) == {} and not gone.HasField("commit_time")
    for name in ("b", "never-committed", "elsewhere"):  # deleted, unknown, another topic's
        with pytest.raises(grpc.RpcError) as e:
            replay.DeleteCursor(topic=topic, name=name)
        assert _code(e) == grpc.StatusCode.NOT_FOUND
        assert name in e.value.details()  # type: ignore[attr-defined]
    assert [c.name for c in replay.ListCursors(topic=other).cursors] == ["elsewhere"]
    missing = names.topic("missing")
    with pytest.raises(grpc.RpcError) as e:
        replay.DeleteCursor(topic=missing, name="a")
    assert _code(e) == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        replay.ListCursors(topic=missing)
    assert _code(e) == grpc.StatusCode.NOT_FOUND
    for bad in ("", "x" * 257):
        with pytest.raises(grpc.RpcError) as e:
            replay.DeleteCursor(topic=topic, name=bad)
        assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        replay.ListCursors(topic="not-a-topic-name")
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    # A deleted name can be committed again: a new cursor.
    again = replay.CommitCursor(topic=topic, name="b", offsets={0: 1})
    assert [(c.name, dict(c.offsets)) for c in replay.ListCursors(topic=topic).cursors] == [
        ("a", {0: 2}),
        ("b", {0: 1}),
        ("c", {0: 10}),
    ]
    assert again.commit_time.ToNanoseconds() > committed["b"].commit_time.ToNanoseconds()
    replay.close()


def test_spark_client_lists_and_deletes_cursors(shared_server: ServerProcess, names: Any) -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from pubsubd.spark.client import ReplayClient as SparkReplayClient
    from pubsubd.spark.client import ReplayError

    topic = names.topic()
    make_publisher(shared_server.endpoint).create_topic(name=topic)
    client = SparkReplayClient(shared_server.endpoint)
    try:
        client.commit_cursor(topic, "q2", {0: 0})
        client.commit_cursor(topic, "q1", {0: 0})
        assert client.list_cursors(topic) == {"q1": {0: 0}, "q2": {0: 0}}
        assert list(client.list_cursors(topic)) == ["q1", "q2"]
        client.delete_cursor(topic, "q1")
        assert client.list_cursors(topic) == {"q2": {0: 0}}
        with pytest.raises(ReplayError) as e:
            client.delete_cursor(topic, "q1")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
    finally:
        client.close()


def test_deleting_the_only_cursor_lets_retention_trim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic without subscriptions keeps only what its cursor pins; once the cursor is
    deleted, the next trim pass deletes the segments it held."""
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")  # tiny segments: trimmed early
    monkeypatch.setenv("PUBSUBD_TRIM_INTERVAL_S", FAST_TRIM_INTERVAL_S)
    server = ServerProcess(tmp_path / "data").start()
    try:
        topic = "projects/trim/topics/abandoned"
        pub = make_publisher(
            server.endpoint, batch_settings=pubsub_v1.types.BatchSettings(max_messages=10)
        )
        replay = ReplayClient(server.endpoint)
        pub.create_topic(name=topic)
        # Committed before anything is published: the cursor holds the whole log.
        replay.CommitCursor(topic=topic, name="abandoned-query", offsets={0: 0})
        for f in [pub.publish(topic, os.urandom(200)) for _ in range(300)]:
            f.result(timeout=30)

        def earliest() -> int:
            return int(replay.GetTopicRanges(topic=topic).sources[0].earliest_offset)

        wait_trim_passes(server)  # a whole trim pass after the publishes: the pin holds
        assert earliest() == 0
        assert status(server)["cursors"][topic]["abandoned-query"]["lag"] == 300

        replay.DeleteCursor(topic=topic, name="abandoned-query")
        assert topic not in status(server)["cursors"]
        wait_for(lambda: earliest() > 0, 15, "the released segments to be trimmed")
        assert list(replay.ListCursors(topic=topic).cursors) == []
        replay.close()
    finally:
        server.kill()


Row = tuple[int, str, bytes, dict[str, str], str, int]


def _message_rows(resp: Any) -> list[Row]:
    return [
        (
            m.offset,
            m.message_id,
            m.data,
            dict(m.attributes),
            m.ordering_key,
            m.publish_time.seconds * 1_000_000 + m.publish_time.nanos // 1000,
        )
        for m in resp.messages
    ]


def _column_rows(resp: Any, source: int) -> list[Row]:
    """A columnar page as rows; its message IDs derived as documented."""
    c = resp.columns
    n = len(c.offsets)
    lengths = (len(c.data), len(c.ordering_keys), len(c.publish_time_us), len(c.attribute_counts))
    assert lengths == (n, n, n, n)
    assert sum(c.attribute_counts) == len(c.attribute_keys) == len(c.attribute_values)
    rows, at = [], 0
    for i, offset in enumerate(c.offsets):
        k = c.attribute_counts[i]
        keys, values = c.attribute_keys[at : at + k], c.attribute_values[at : at + k]
        attrs = dict(zip(keys, values, strict=True))
        assert len(attrs) == k
        at += k
        message_id = str(source << 48 | offset)
        rows.append(
            (offset, message_id, c.data[i], attrs, c.ordering_keys[i], c.publish_time_us[i])
        )
    return rows


def _arrow_rows(resp: Any, source: int) -> list[Row]:
    """An Arrow page (ReadRequest.arrow) as rows; its message IDs derived as documented."""
    import pyarrow as pa

    batch = pa.ipc.open_stream(resp.arrow_ipc).read_next_batch()
    assert batch.schema.names == ["offset", "data", "ordering_key", "publish_time", "attributes"]
    assert all(batch.column(name).null_count == 0 for name in ("offset", "data", "attributes"))
    times = batch.column("publish_time").cast("int64").to_pylist()
    return [
        (
            row["offset"],
            str(source << 48 | row["offset"]),
            row["data"],
            dict(row["attributes"]),
            row["ordering_key"] or "",
            micros,
        )
        for row, micros in zip(batch.to_pylist(), times, strict=True)
    ]


def _read_both(replay: ReplayClient, **kw: Any) -> tuple[list[Row], int]:
    """One page read as rows, as columns and as Arrow: the same rows and next_offset, each
    form alone."""
    rows = replay.Read(**kw)
    cols = replay.Read(**kw, columnar=True)
    arrow = replay.Read(**kw, columnar=True, arrow=True)
    assert not rows.HasField("columns") and cols.HasField("columns") and not cols.messages
    assert arrow.arrow_ipc and not arrow.HasField("columns") and not arrow.messages
    got = _message_rows(rows)
    assert _column_rows(cols, kw["source"]) == got
    assert _arrow_rows(arrow, kw["source"]) == got
    assert cols.next_offset == rows.next_offset == arrow.next_offset
    return got, rows.next_offset


def _fail_both(replay: ReplayClient, **kw: Any) -> tuple[grpc.StatusCode, str]:
    outcomes = []
    for form in ({}, {"columnar": True}, {"columnar": True, "arrow": True}):
        with pytest.raises(grpc.RpcError) as e:
            replay.Read(**kw, **form)
        outcomes.append((_code(e), e.value.details()))  # type: ignore[attr-defined]
    assert outcomes[0] == outcomes[1] == outcomes[2]
    return outcomes[0]


def _pages_both(replay: ReplayClient, topic: str, source: int, start: int, **kw: Any) -> Any:
    """Every page from ``start`` to the end, in both forms: (rows, sizes of the pages)."""
    rows: list[Row] = []
    sizes = []
    while True:
        page, nxt = _read_both(replay, topic=topic, source=source, start_offset=start, **kw)
        if not page:
            assert nxt == start
            return rows, sizes
        assert nxt == page[-1][0] + 1
        rows.extend(page)
        sizes.append(len(page))
        start = nxt


def test_columnar_read_returns_what_row_read_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Columnar pages (ReadRequest.columnar) and Arrow pages (ReadRequest.arrow) hold exactly
    the rows of row pages, whatever cuts the page (max_messages, max_bytes, end_offset), on
    both sources of a topic, and fail alike below a retention gap."""
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")  # tiny segments: trimmed early
    server = ServerProcess(tmp_path / "data").start()
    try:
        topic, sub_name = "projects/cols/topics/two-sources", "projects/cols/subscriptions/all"
        pub = make_publisher(
            server.endpoint,
            publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=10, max_latency=0.005),
        )
        sub = make_subscriber(server.endpoint)
        replay = ReplayClient(server.endpoint)
        pub.create_topic(request={"name": topic, "labels": {"pubsubd-publish-sources": "2"}})
        sub.create_subscription(name=sub_name, topic=topic)
        attribute_sets: list[dict[str, str]] = [{}, {"a": "1"}, {"x": "", "y": "2", "z": "é"}]
        futures = []
        for i in range(400):
            attrs = attribute_sets[i % 3]
            data = b"" if attrs and i % 7 == 1 else os.urandom(40 + i % 200)
            key = f"key-{i % 3}" if i % 4 == 0 else ""
            futures.append(pub.publish(topic, data, ordering_key=key, **attrs))
        for f in futures:
            f.result(timeout=30)

        def ranges() -> dict[int, tuple[int, int]]:
            found = replay.GetTopicRanges(topic=topic).sources
            return {s.source: (s.earliest_offset, s.latest_offset) for s in found}

        latest = {s: end for s, (_, end) in ranges().items()}
        assert set(latest) == {0, 1} and min(latest.values()) > 50
        assert sum(latest.values()) == 400
        everything: list[Row] = []
        for source in (0, 1):
            rows, sizes = _pages_both(replay, topic, source, 0)  # default limits: one page
            assert [r[0] for r in rows] == list(range(latest[source])) and len(sizes) == 1
            everything += rows
            by_count, sizes = _pages_both(replay, topic, source, 0, max_messages=7)
            assert by_count == rows and max(sizes) == 7 and len(sizes) > 1
            by_bytes, sizes = _pages_both(replay, topic, source, 0, max_bytes=700)
            assert by_bytes == rows and len(set(sizes)) > 1 and len(sizes) > len(rows) // 10
            one_each, sizes = _pages_both(replay, topic, source, 3, max_bytes=1)
            assert one_each == rows[3:] and set(sizes) == {1}
            for start, end in [(3, 11), (0, 1), (latest[source] - 5, latest[source])]:
                window, nxt = _read_both(
                    replay, topic=topic, source=source, start_offset=start, end_offset=end
                )
                assert window == rows[start:end] and nxt == end
            window, nxt = _read_both(
                replay, topic=topic, source=source, start_offset=5, end_offset=30, max_bytes=900
            )
            assert window == rows[5 : 5 + len(window)] and 1 < len(window) < 25
            assert nxt == 5 + len(window)
            end, nxt = _read_both(replay, topic=topic, source=source, start_offset=latest[source])
            assert end == [] and nxt == latest[source]
            code, _ = _fail_both(
                replay, topic=topic, source=source, start_offset=latest[source] + 1
            )
            assert code == grpc.StatusCode.OUT_OF_RANGE
        # The pages covered what the comparison is about.
        assert {len(r[3]) for r in everything} == {0, 1, 3}
        assert {r[4] for r in everything} == {"", "key-0", "key-1", "key-2"}
        assert any(r[2] == b"" for r in everything)
        assert len({r[5] for r in everything}) > 2
        assert all(int(r[1]) >> 48 == 1 for r in everything[latest[0] :])

        # A retention gap: everything acked, a cursor pins the middle of each source.
        pins = {0: latest[0] // 2, 1: latest[1] // 2}
        replay.CommitCursor(topic=topic, name="pipeline", offsets=pins)
        acked = 0
        while acked < 400:
            resp = sub.pull(subscription=sub_name, max_messages=100, timeout=10)
            sub.acknowledge(
                subscription=sub_name, ack_ids=[m.ack_id for m in resp.received_messages]
            )
            acked += len(resp.received_messages)
        wait_for(lambda: all(start > 0 for start, _ in ranges().values()), 15, "trimmed segments")
        for source, (low, high) in ranges().items():
            assert 0 < low <= pins[source] and high == latest[source]
            for kw in ({"start_offset": low - 1}, {"start_offset": 0, "max_messages": 3}):
                code, details = _fail_both(replay, topic=topic, source=source, **kw)
                assert code == grpc.StatusCode.OUT_OF_RANGE
                assert "is below the retained range" in details
            rows, sizes = _pages_both(replay, topic, source, low, max_bytes=700)
            assert rows == [r for r in everything if int(r[1]) >> 48 == source][low:]
        replay.close()
    finally:
        server.kill()
