"""The dedup window of PublishDeduplicated: pure window rules, request checks, and the
Deduplicator over a real log (including the rebuild after a restart)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from pubsubd.core import ids, pb
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.validation import DEDUP_ID_ATTRIBUTE
from pubsubd.data.decoding import decode
from pubsubd.data.publish.dedup import (
    DEDUP_PIN,
    Deduplicator,
    build_batches,
    validate_messages,
)
from pubsubd.data.publish.dedup_window import DedupWindow
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.storage.log import FsyncPolicy

pytestmark = pytest.mark.unit

NOW_S = 1_700_000_000.0  # the time delayed-delivery attributes are checked against

S = 1_000_000
UID = "topic-uid"


def _msg(data: bytes = b"x", key: str = "", **attrs: str) -> Any:
    return pb.PubsubMessage(data=data, ordering_key=key, attributes=attrs)


def test_window_remembers_for_its_length_then_forgets() -> None:
    w = DedupWindow(10 * S)
    w.remember(["a"], 7, 100 * S)
    w.remember(["b"], 8, 105 * S)
    assert w.get("a", 109 * S) == 7 and w.get("nothing", 109 * S) is None
    assert w.get("a", 111 * S) is None  # past the window even before expire()
    assert w.pin(1) == {0: 7}
    assert w.expire(111 * S) == 1
    assert len(w) == 1 and w.pin(1) == {0: 8}
    assert w.expire(200 * S) == 1
    assert w.pin(1) == {}


def test_window_re_remembering_an_expired_id_makes_it_newest() -> None:
    w = DedupWindow(10 * S)
    w.remember(["a"], 1, 100 * S)
    w.remember(["b"], 2, 101 * S)
    w.remember(["a"], 9, 120 * S)
    assert w.expire(112 * S) == 1  # b expired; a is now the newest
    assert w.get("a", 121 * S) == 9


def test_window_remembers_a_batch_at_consecutive_positions_of_its_source() -> None:
    w = DedupWindow(10 * S)
    first = ids.position(3, 1 << 40)  # high offsets and sources survive the packing
    w.remember(["x", "y", "z"], first, 100 * S)
    w.remember(["q"], ids.position(1, 5), 101 * S)
    assert [w.get(d, 100 * S) for d in "xyz"] == [first, first + 1, first + 2]
    assert w.pin(4) == {3: 1 << 40, 1: 5}


def test_build_batches_splits_runs_of_one_ordering_key() -> None:
    msgs = [_msg(key=k) for k in ["", "", "a", "a", "", "b"]]
    assert build_batches(msgs) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert build_batches([]) == []


def test_validate_messages() -> None:
    validate_messages([("id", _msg())], 10, now_s=NOW_S)
    with pytest.raises(InvalidArgument, match="dedup_id: required"):
        validate_messages([("a", _msg()), ("", _msg())], 10, now_s=NOW_S)
    with pytest.raises(InvalidArgument, match="longer than 256"):
        validate_messages([("x" * 257, _msg())], 10, now_s=NOW_S)
    with pytest.raises(InvalidArgument, match="at least one message"):
        validate_messages([], 10, now_s=NOW_S)
    with pytest.raises(InvalidArgument, match="request_size"):
        validate_messages([("a", _msg())], 10_000_001, now_s=NOW_S)
    with pytest.raises(InvalidArgument, match="1001 messages"):
        validate_messages([(str(i), _msg()) for i in range(1001)], 10, now_s=NOW_S)
    with pytest.raises(InvalidArgument, match=r"messages\[2\]: a message must contain"):
        validate_messages([("a", _msg(key="k")), ("b", _msg()), ("c", _msg(b""))], 10, now_s=NOW_S)
    with pytest.raises(InvalidArgument, match="reserved"):
        validate_messages([("a", _msg(**{DEDUP_ID_ATTRIBUTE: "x"}))], 10, now_s=NOW_S)


async def _stored(publishing: PublishingForwarder) -> list[tuple[str, bytes, dict[str, str]]]:
    out = []
    for entry in publishing.read(UID, 0, 0, 1000, 1 << 30):
        d = decode(0, entry)  # as subscriptions and the replay API see it
        for m in d.parsed:
            out.append((m.message_id, m.data, dict(m.attributes)))
    return out


async def test_duplicates_are_acknowledged_with_the_original_ids(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    dedup = Deduplicator(publishing, window_s=600)
    try:
        ids1, dup1 = await dedup.publish(
            UID, [("a", _msg(b"1")), ("b", _msg(b"2", key="k")), ("a", _msg(b"1"))]
        )
        assert ids1 == ["0", "1", "0"] and dup1 == 1
        ids2, dup2 = await dedup.publish(UID, [("b", _msg(b"2")), ("c", _msg(b"3"))])
        assert ids2 == ["1", "2"] and dup2 == 1
        # Stored once each, and the reserved attribute is never delivered.
        assert await _stored(publishing) == [("0", b"1", {}), ("1", b"2", {}), ("2", b"3", {})]
        assert publishing.open_topic(UID).pins[DEDUP_PIN] == {0: 0}
    finally:
        await publishing.close()


async def test_concurrent_publishes_of_one_id_store_it_once(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    dedup = Deduplicator(publishing, window_s=600)
    try:
        results = await asyncio.gather(
            *[dedup.publish(UID, [("same", _msg(b"x")), (f"u{i}", _msg(b"y"))]) for i in range(5)]
        )
        assert {r[0][0] for r in results} == {"0"}
        assert sum(r[1] for r in results) == 4
        assert len(await _stored(publishing)) == 6
    finally:
        await publishing.close()


async def test_window_is_rebuilt_from_the_log_after_a_restart(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    dedup = Deduplicator(publishing, window_s=600)
    await dedup.publish(UID, [("a", _msg(b"1")), ("b", _msg(b"2"))])
    await publishing.close()
    other = "plain-topic"
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    try:
        await publishing.publish(other, pb.PublishRequest(messages=[_msg()]).SerializeToString(), 1)
        dedup = Deduplicator(publishing, window_s=600)
        dedup.recover([UID, other])
        assert set(dedup.windows) == {UID}  # only topics that used dedup are scanned
        assert publishing.open_topic(UID).pins[DEDUP_PIN] == {0: 0}
        ids_, dups = await dedup.publish(UID, [("b", _msg(b"2")), ("c", _msg(b"3"))])
        assert ids_ == ["1", "2"] and dups == 1
        # A window of 0 s remembers nothing across the restart.
        short = Deduplicator(publishing, window_s=0)
        short.recover([UID])
        assert len(short.windows[UID]) == 0
    finally:
        await publishing.close()


async def test_sweep_expires_ids_and_releases_the_pin(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    dedup = Deduplicator(publishing, window_s=1)
    try:
        await dedup.publish(UID, [("a", _msg())])
        sources = publishing.open_topic(UID)
        assert DEDUP_PIN in sources.pins
        dedup.sweep(time.time_ns() // 1000 + 2 * S)
        assert DEDUP_PIN not in sources.pins and len(dedup.windows[UID]) == 0
    finally:
        await publishing.close()


async def test_api_messages_are_stored_as_pubsub_messages(tmp_path: Path) -> None:
    from pubsubd._gen.pubsubd.v1 import replay_pb2

    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.NEVER)
    dedup = Deduplicator(publishing, window_s=600)
    try:
        api = [
            replay_pb2.DeduplicatedMessage(dedup_id="a", data=b"1", attributes={"k": "v"}),
            replay_pb2.DeduplicatedMessage(dedup_id="b", data=b"2", ordering_key="key"),
        ]
        validate_messages([(m.dedup_id, m) for m in api], 10, now_s=NOW_S)
        ids_, dups = await dedup.publish(UID, [(m.dedup_id, m) for m in api])
        assert ids_ == ["0", "1"] and dups == 0
        assert await _stored(publishing) == [("0", b"1", {"k": "v"}), ("1", b"2", {})]
        entries = publishing.open_topic(UID).logs[0].read(0, max_entries=10)
        keys = [pb.PublishRequest.FromString(e.payload).messages[0].ordering_key for e in entries]
        assert keys == ["", "key"]
    finally:
        await publishing.close()


def _sink_request(prefix: str, rows: range) -> Any:
    """A Spark sink's request read flat (core/dedup_batches.py), as the replay API reads it."""
    from pubsubd._gen.pubsubd.v1 import replay_pb2
    from pubsubd.core.dedup_batches import flat_request

    req = replay_pb2.PublishDeduplicatedRequest(topic="projects/p/topics/t")
    for n in rows:
        req.messages.add(dedup_id=f"{prefix}:{n}", data=b"%d" % n)
    flat = flat_request(req.SerializeToString())
    assert flat is not None
    return flat.batch


async def test_sink_runs_are_deduplicated_across_replays_and_restarts(tmp_path: Path) -> None:
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    dedup = Deduplicator(publishing, window_s=600)
    first, dups = await dedup.publish(UID, _sink_request("w:0", range(1000)))
    assert first == [str(n) for n in range(1000)] and dups == 0
    assert dedup.windows[UID].runs == 1
    # A replayed request, and one overlapping the last (a retry with more rows).
    again, dups = await dedup.publish(UID, _sink_request("w:0", range(1000)))
    assert again == first and dups == 1000
    overlap, dups = await dedup.publish(UID, _sink_request("w:0", range(500, 1500)))
    assert overlap == [str(n) for n in range(500, 1500)] and dups == 500
    # Two copies of one request at once (a resend while the first is stored): stored once.
    (a, dup_a), (b, dup_b) = await asyncio.gather(
        dedup.publish(UID, _sink_request("w:1", range(1000))),
        dedup.publish(UID, _sink_request("w:1", range(1000))),
    )
    assert a == b == [str(n) for n in range(1500, 2500)] and dup_a + dup_b == 1000
    await publishing.close()
    publishing = PublishingForwarder(tmp_path, fsync=FsyncPolicy.ALWAYS)
    try:
        dedup = Deduplicator(publishing, window_s=600)
        dedup.recover([UID])
        after, dups = await dedup.publish(UID, _sink_request("w:0", range(1000, 2000)))
        assert after == [str(n) for n in range(1000, 1500)] + [str(n) for n in range(2500, 3000)]
        assert dups == 500
        stored = await _stored(publishing)
        assert [m[0] for m in stored] == [str(n) for n in range(3000)]
        assert all(attrs == {} for _, _, attrs in stored)  # the reserved attribute stripped
        assert stored[1500][1] == b"0" and stored[2999][1] == b"1999"
    finally:
        await publishing.close()
