"""Unit tests for pubsubd.acks.ranges.RangeSet."""

from __future__ import annotations

import itertools
import random

import pytest

from pubsubd.acks.ranges import RangeSet, runs

pytestmark = pytest.mark.unit


def _check_invariants(rs: RangeSet) -> None:
    pairs = rs.ranges()
    assert all(s < e for s, e in pairs)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(pairs))
    assert rs.count() == sum(e - s for s, e in pairs)


def test_empty() -> None:
    rs = RangeSet()
    assert len(rs) == 0
    assert rs.count() == 0
    assert rs.ranges() == []
    assert 0 not in rs
    assert rs.first_gap_at_or_after(5) == 5
    assert rs.first() is None
    assert not rs


def test_add_returns_new_pieces_and_coalesces_adjacent() -> None:
    rs = RangeSet()
    assert rs.add(5, 10) == [(5, 10)]
    assert rs.add(10, 12) == [(10, 12)]
    assert rs.ranges() == [(5, 12)]
    assert rs.add(3, 5) == [(3, 5)]
    assert rs.ranges() == [(3, 12)]
    assert len(rs) == 1
    assert rs.count() == 9


def test_add_overlapping_reports_only_gaps() -> None:
    rs = RangeSet([(0, 2), (4, 6), (8, 10)])
    assert rs.add(1, 9) == [(2, 4), (6, 8)]
    assert rs.ranges() == [(0, 10)]
    assert rs.add(3, 7) == []
    assert rs.count() == 10


def test_add_empty_or_inverted_is_noop() -> None:
    rs = RangeSet([(0, 2)])
    assert rs.add(5, 5) == []
    assert rs.add(7, 3) == []
    assert rs.ranges() == [(0, 2)]


def test_add_between_keeps_gaps() -> None:
    rs = RangeSet([(0, 2), (10, 12)])
    assert rs.add(5, 6) == [(5, 6)]
    assert rs.ranges() == [(0, 2), (5, 6), (10, 12)]


def test_add_many_unsorted_with_duplicates() -> None:
    rs = RangeSet([(3, 4)])
    added = rs.add_many([7, 1, 2, 3, 2, 9, 8, 0])
    assert added == [(0, 3), (7, 10)]
    assert rs.ranges() == [(0, 4), (7, 10)]
    assert rs.count() == 7
    assert rs.add_many([]) == []


def test_add_many_merge_path_spanning_existing_ranges() -> None:
    # More than the per-run threshold of runs, with existing ranges that bridge runs.
    rs = RangeSet([(5, 30), (40, 41), (100, 200)])
    batch = list(range(0, 120, 3))
    added = rs.add_many(batch)
    model = set(range(5, 30)) | {40} | set(range(100, 200))
    new = set(batch) - model
    assert added == runs(new)
    assert rs.ranges() == runs(model | new)
    _check_invariants(rs)


def test_runs() -> None:
    assert runs([]) == []
    assert runs([5, 3, 4, 4, 10]) == [(3, 6), (10, 11)]


def test_contains() -> None:
    rs = RangeSet([(2, 4), (6, 7)])
    assert [x for x in range(9) if x in rs] == [2, 3, 6]
    assert "2" not in rs


def test_remove_below() -> None:
    rs = RangeSet([(0, 3), (5, 8), (10, 12)])
    rs.remove_below(6)
    assert rs.ranges() == [(6, 8), (10, 12)]
    assert rs.count() == 4
    rs.remove_below(8)
    assert rs.ranges() == [(10, 12)]
    rs.remove_below(0)
    assert rs.ranges() == [(10, 12)]
    rs.remove_below(100)
    assert rs.ranges() == []
    assert rs.count() == 0


def test_first_gap_at_or_after() -> None:
    rs = RangeSet([(2, 4), (5, 7)])
    assert rs.first_gap_at_or_after(0) == 0
    assert rs.first_gap_at_or_after(2) == 4
    assert rs.first_gap_at_or_after(3) == 4
    assert rs.first_gap_at_or_after(4) == 4
    assert rs.first_gap_at_or_after(5) == 7
    assert rs.first_gap_at_or_after(100) == 100


def test_count_below() -> None:
    rs = RangeSet([(2, 4), (5, 9)])
    assert rs.count_below(0) == 0
    assert rs.count_below(3) == 1
    assert rs.count_below(6) == 3
    assert rs.count_below(9) == 6
    assert rs.count_below(50) == 6


def test_iter_len_clear_eq() -> None:
    rs = RangeSet([(1, 2), (4, 5)])
    assert list(rs) == [(1, 2), (4, 5)]
    assert len(rs) == 2
    assert rs == RangeSet([(4, 5), (1, 2)])
    rs.clear()
    assert rs == RangeSet()
    assert rs.count() == 0


def test_random_against_python_set() -> None:
    rng = random.Random(1234)
    for _ in range(50):
        rs = RangeSet()
        model: set[int] = set()
        for _ in range(40):
            op = rng.random()
            if op < 0.4:
                a = rng.randrange(200)
                b = a + rng.randrange(10)
                added = rs.add(a, b)
                new = set(range(a, b)) - model
                assert {x for s, e in added for x in range(s, e)} == new
                model |= new
            elif op < 0.9:
                batch = [rng.randrange(200) for _ in range(rng.randrange(80))]
                added = rs.add_many(batch)
                new = set(batch) - model
                assert added == runs(new)
                model |= new
            else:
                x = rng.randrange(200)
                rs.remove_below(x)
                model = {y for y in model if y >= x}
            assert rs.ranges() == runs(model)
            assert rs.count() == len(model)
            _check_invariants(rs)
            probe = rng.randrange(210)
            assert (probe in rs) == (probe in model)
            gap = probe
            while gap in model:
                gap += 1
            assert rs.first_gap_at_or_after(probe) == gap
            assert rs.count_below(probe) == len([y for y in model if y < probe])


def test_add_many_batch_of_1000_is_fast() -> None:
    import time

    rs = RangeSet()
    offsets = list(range(0, 200_000, 2))
    random.Random(7).shuffle(offsets)
    t0 = time.perf_counter()
    for i in range(0, len(offsets), 1000):
        rs.add_many(offsets[i : i + 1000])
    elapsed = time.perf_counter() - t0
    assert len(rs) == 100_000
    assert elapsed < 5.0
