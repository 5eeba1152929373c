"""The flat reading of PublishDeduplicated requests (core/dedup_batches.py): it takes only the
requests it can prove are IDs and data alone, and stores the same bytes as the general form."""

from __future__ import annotations

from typing import Any

import pytest

from pubsubd._gen.pubsubd.v1 import replay_pb2 as r
from pubsubd.core import pb
from pubsubd.core.dedup_batches import FlatBatch, MessageBatch, flat_request
from pubsubd.core.validation import DEDUP_ID_ATTRIBUTE
from pubsubd.data.publish.dedup_window import as_run

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/t"


def _request(rows: list[tuple[str, bytes]], **fields: Any) -> r.PublishDeduplicatedRequest:
    req = r.PublishDeduplicatedRequest(topic=TOPIC, **fields)
    for dedup_id, data in rows:
        req.messages.add(dedup_id=dedup_id, data=data)
    return req


def _general(raw: bytes) -> MessageBatch:
    req = r.PublishDeduplicatedRequest.FromString(raw)
    return MessageBatch([(m.dedup_id, m) for m in req.messages])


def test_a_sink_request_is_read_flat_and_stored_like_the_general_form() -> None:
    rows = [(f"query:3:1:{n}", b"x" * (n % 300 + 1)) for n in range(995, 1995)]
    raw = _request(rows).SerializeToString()
    flat = flat_request(raw)
    assert flat is not None and isinstance(flat.batch, FlatBatch)
    assert flat.topic == TOPIC and flat.source is None
    general = _general(raw)
    assert list(flat.batch.dedup_ids) == list(general.dedup_ids)
    for indices in (list(range(1000)), [0], [3, 4, 999], list(range(1, 1000, 2))):
        assert flat.batch.stored(indices) == general.stored(indices)
    [(payload, start, stop, key)] = flat.batch.stored([7, 8])
    stored = pb.PublishRequest.FromString(payload)
    assert (start, stop, key) == (0, 2, "")
    assert [m.data for m in stored.messages] == [rows[7][1], rows[8][1]]
    assert [dict(m.attributes) for m in stored.messages] == [
        {DEDUP_ID_ATTRIBUTE: "query:3:1:1002"},
        {DEDUP_ID_ATTRIBUTE: "query:3:1:1003"},
    ]


@pytest.mark.parametrize("source", [0, 3, -1])
def test_the_source_field_is_read(source: int) -> None:
    flat = flat_request(_request([("a", b"1"), ("b", b"2")], source=source).SerializeToString())
    assert flat is not None and flat.source == source


def test_long_ids_and_data_and_utf8_ids_are_read_flat() -> None:
    rows = [("é" * 128, b"d" * 20_000), ("i" * 256, b"e" * 130)]
    raw = _request(rows).SerializeToString()
    flat = flat_request(raw)
    assert flat is not None
    assert list(flat.batch.dedup_ids) == [rows[0][0], rows[1][0]]
    assert flat.batch.stored([0, 1]) == _general(raw).stored([0, 1])


def _with_message(extra: bytes) -> bytes:
    """A valid request plus one hand-encoded DeduplicatedMessage."""
    return _request([("a", b"1")]).SerializeToString() + b"\x12" + bytes([len(extra)]) + extra


@pytest.mark.parametrize(
    "raw",
    [
        _request([]).SerializeToString(),  # no message
        _request([("a", b"")]).SerializeToString(),  # no data: the general path refuses it
        _request([("", b"x")]).SerializeToString(),  # no ID
        _request([("x" * 257, b"x")]).SerializeToString(),  # ID too long
        _request([("é" * 129, b"x")]).SerializeToString(),  # 258 bytes
        _request([(str(n), b"x") for n in range(1001)]).SerializeToString(),  # too many
        _with_message(b"\x0a\x01b\x12\x00"),  # an explicitly empty data
        _with_message(b"\x0a\x00\x12\x01x"),  # an explicitly empty ID
        _with_message(b"\x12\x01x\x0a\x01b"),  # data before the ID: not canonical
        _with_message(b"\x0a\x01b\x12\x01x\x12\x01y"),  # data twice in one message
        _with_message(b"\x0a\x01b"),  # no data
        # as many IDs as data, but one message has two data and the other none
        b"\x0a\x01t\x12\x09\x0a\x01a\x12\x01x\x12\x01y\x12\x03\x0a\x01b",
        _with_message(b"\x0a\x01b\x12\x01x\x22\x01k"),  # an ordering key
        _with_message(b"\x0a\x01b\x12\x01x\x1a\x06\x0a\x01k\x12\x01v"),  # an attribute
        _with_message(b"\x0a\x01\xff\x12\x01x"),  # an ID that is not UTF-8
        _request([("a", b"1")]).SerializeToString() + b"\x28\x01",  # an unknown field
        _request([("a", b"1")]).SerializeToString() + b"\x12",  # truncated
    ],
)
def test_anything_else_takes_the_general_path(raw: bytes) -> None:
    assert flat_request(raw) is None


def test_attributes_or_keys_are_read_the_general_way() -> None:
    req = _request([("a", b"1")])
    req.messages.add(dedup_id="b", data=b"2", attributes={"k": "v"})
    assert flat_request(req.SerializeToString()) is None
    req = _request([("a", b"1")])
    req.messages[0].ordering_key = "key"
    assert flat_request(req.SerializeToString()) is None


@pytest.mark.parametrize(
    ("ids", "run"),
    [
        (["q:1:0:5", "q:1:0:6", "q:1:0:7"], ("q:1:0", 5)),
        (["p:9", "p:10"], ("p", 9)),
        ([":0", ":1"], ("", 0)),
        (["p:1"], None),  # one ID is not a run
        (["p:1", "p:3"], None),
        (["p:1", "q:2"], None),
        (["p:1", "p:02"], None),
        (["p:1", "p:2\x00p:3"], None),  # the separator inside an ID
        (["p\x00:1", "p\x00:2"], None),
        (["p:x", "p:y"], None),
        ([f"p:{10**18 - 1}", f"p:{10**18}"], None),
    ],
)
def test_window_recognises_runs_of_ids(ids: list[str], run: tuple[str, int] | None) -> None:
    assert as_run(ids) == run
