"""The pure part of the storage node's ledgers (storagenode/ledger_index.py): parsing and the
append plan, read spans, digests, and the scan of a copy at start-up."""

from __future__ import annotations

import google_crc32c
import pytest

from pubsubd.core.records import Entry
from pubsubd.storage.framing import encode_entry
from pubsubd.storagenode.errors import AppendGap, BadFrames, BadRead, OverlapMismatch
from pubsubd.storagenode.ledger_index import (
    LedgerIndex,
    common_prefix,
    parse_frames,
    plan_append,
    scan_copy,
)

pytestmark = pytest.mark.unit


def frame(offset: int, count: int = 1, payload: bytes = b"") -> bytes:
    return encode_entry(Entry(offset, count, 5, payload or b"p%04d" % offset))


def index_of(data: bytes) -> LedgerIndex:
    parsed = parse_frames(1, data)
    index = LedgerIndex(parsed.first_offset)
    index.add(parsed)
    return index


def test_digest_is_crc32c_of_the_crc_fields() -> None:
    data = frame(0) + frame(1, 3) + frame(4)
    parsed = parse_frames(1, data)
    fields = b"".join(data[f.position + 4 : f.position + 8] for f in parsed.frames)
    assert index_of(data).digest == google_crc32c.value(fields)
    split = LedgerIndex(0)
    split.add(parse_frames(1, frame(0)))
    split.add(parse_frames(1, frame(1, 3) + frame(4)))
    assert split.digest == index_of(data).digest
    assert (split.end_offset, split.count, split.size) == (5, 3, len(data))


def test_plan_append_rules() -> None:
    stored = frame(10) + frame(11, 2) + frame(13)
    index = index_of(stored)
    plan = plan_append(1, index, 10, parse_frames(1, frame(14)))
    assert (plan.compare_bytes, plan.tail_start) == (0, 0)
    with pytest.raises(AppendGap) as gap:
        plan_append(1, index, 10, parse_frames(1, frame(15)))
    assert gap.value.node_end == 14
    with pytest.raises(OverlapMismatch):
        plan_append(1, index, 11, parse_frames(1, frame(14)))
    with pytest.raises(OverlapMismatch):
        plan_append(1, index, 10, parse_frames(1, frame(12)))  # inside the entry [11, 13)
    with pytest.raises(BadFrames):
        plan_append(1, index, 10, parse_frames(1, frame(9)))
    retry = plan_append(1, index, 10, parse_frames(1, frame(11, 2)))
    assert (retry.compare_at, retry.compare_bytes) == (len(frame(10)), len(frame(11, 2)))
    assert retry.tail.frames == []
    more = parse_frames(1, frame(11, 2) + frame(13) + frame(14) + frame(15))
    plan = plan_append(1, index, 10, more)
    assert plan.compare_bytes == len(frame(11, 2) + frame(13))
    assert [f.base_offset for f in plan.tail.frames] == [14, 15]
    assert plan.tail.frames[0].position == 0
    # A new ledger starts exactly at its first offset.
    with pytest.raises(AppendGap) as gap:
        plan_append(1, None, 3, parse_frames(1, frame(4)))
    assert gap.value.node_end == 3


def test_parse_frames_refuses_damage() -> None:
    with pytest.raises(BadFrames, match="consecutive"):
        parse_frames(1, frame(0) + frame(2))
    with pytest.raises(BadFrames, match="incomplete"):
        parse_frames(1, frame(0)[:-1])


def test_read_span() -> None:
    data = frame(0) + frame(1) + frame(2, 3) + frame(5)
    index = index_of(data)
    one = len(frame(0))
    assert index.read_span(1, 0, 0, one) == (0, one)
    assert index.read_span(1, 0, 0, one - 1) == (0, one)  # at least one frame
    assert index.read_span(1, 0, 0, 2 * one) == (0, 2 * one)
    assert index.read_span(1, 0, 0, 1 << 20) == (0, len(data))
    assert index.read_span(1, 1, 5, 1 << 20) == (one, 3 * one)
    assert index.read_span(1, 0, 1, 1 << 20) == (0, one)
    assert index.read_span(1, 6, 0, 100) == (len(data), len(data))
    with pytest.raises(BadRead):
        index.read_span(1, 3, 0, 100)


def test_scan_copy_stops_at_the_first_problem() -> None:
    good = frame(0) + frame(1)
    torn = scan_copy(good + frame(2)[:-2])
    assert torn.torn and torn.valid_end == len(good) and torn.frames.end_offset == 2
    skip = scan_copy(good + frame(5))
    assert not skip.torn and skip.valid_end == len(good) and "expected" in (skip.problem or "")
    assert scan_copy(good).problem is None
    other = scan_copy(frame(0) + frame(1, payload=b"x"))
    assert common_prefix(scan_copy(good).frames, other.frames) == 1
