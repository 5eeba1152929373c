"""Unit tests for pubsubd.acks.cursor.Cursor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubd.acks.cursor import Cursor, CursorState

pytestmark = pytest.mark.unit


def test_fresh_cursor() -> None:
    c = Cursor(10)
    assert c.mark_delete == 10
    assert c.acked_ranges() == []
    assert c.is_acked(9)
    assert not c.is_acked(10)
    assert c.next_unacked(0) == 10
    assert c.unacked_count(15) == 5
    assert c.unacked_count(5) == 0


def test_ack_45th_of_100_keeps_mark_delete() -> None:
    c = Cursor(0)
    assert c.ack([45]) == [(45, 46)]
    assert c.mark_delete == 0
    assert c.acked_ranges() == [(45, 46)]
    assert c.is_acked(45)
    assert not c.is_acked(44)
    assert c.unacked_count(100) == 99


def test_out_of_order_acks_advance_mark_delete() -> None:
    c = Cursor(0)
    assert c.ack([3, 1, 2]) == [(1, 4)]
    assert c.mark_delete == 0
    assert c.ack([5]) == [(5, 6)]
    assert c.acked_ranges() == [(1, 4), (5, 6)]
    assert c.ack([0]) == [(0, 1)]
    assert c.mark_delete == 4  # 0..3 acked, 4 is not
    assert c.acked_ranges() == [(5, 6)]
    assert c.ack([4]) == [(4, 5)]
    assert c.mark_delete == 6
    assert c.acked_ranges() == []


def test_duplicate_and_old_acks_are_ignored() -> None:
    c = Cursor(10)
    assert c.ack([5, 9]) == []
    assert c.ack([12, 12, 13]) == [(12, 14)]
    assert c.ack([12, 13, 14]) == [(14, 15)]
    assert c.ack([]) == []
    assert c.mark_delete == 10
    assert c.acked_ranges() == [(12, 15)]


def test_new_ranges_include_those_absorbed_by_mark_delete() -> None:
    # Journaling must see every newly acked offset, even ones folded into mark_delete.
    c = Cursor(0)
    c.ack([2])
    assert c.ack([0, 1, 5]) == [(0, 2), (5, 6)]
    assert c.mark_delete == 3


def test_ack_range() -> None:
    c = Cursor(5)
    assert c.ack_range(0, 7) == [(5, 7)]
    assert c.mark_delete == 7
    assert c.ack_range(10, 12) == [(10, 12)]
    assert c.ack_range(9, 13) == [(9, 10), (12, 13)]
    assert c.ack_range(3, 3) == []
    assert c.acked_ranges() == [(9, 13)]


def test_next_unacked() -> None:
    c = Cursor(0)
    c.ack([0, 1, 3, 4, 7])
    assert c.mark_delete == 2
    assert c.next_unacked(0) == 2
    assert c.next_unacked(2) == 2
    assert c.next_unacked(3) == 5
    assert c.next_unacked(6) == 6
    assert c.next_unacked(7) == 8
    assert c.next_unacked(100) == 100


def test_unacked_count() -> None:
    c = Cursor(0)
    c.ack([2, 3, 8])
    assert c.unacked_count(10) == 7
    assert c.unacked_count(3) == 2  # 0, 1 unacked; 2 acked
    assert c.unacked_count(0) == 0
    c.ack([20])  # acked beyond the log end does not reduce the backlog below it
    assert c.unacked_count(10) == 7


def test_reset_moves_both_ways_and_normalizes() -> None:
    c = Cursor(0)
    c.ack(range(50))
    assert c.mark_delete == 50
    c.reset(10)
    assert c.mark_delete == 10
    assert not c.is_acked(10)
    assert c.is_acked(9)
    c.reset(10, [(2, 5), (10, 12), (15, 20)])  # below mark_delete clipped, touching folded
    assert c.mark_delete == 12
    assert c.acked_ranges() == [(15, 20)]
    c.reset(100, [(101, 103)])
    assert c.mark_delete == 100
    assert c.acked_ranges() == [(101, 103)]


def test_snapshot_roundtrip() -> None:
    c = Cursor(3)
    c.ack([5, 6, 9])
    state = c.snapshot()
    assert state == CursorState(3, ((5, 7), (9, 10)))
    restored = Cursor.from_state(state)
    assert restored == c
    assert restored.snapshot() == state
    c.ack([3])
    assert restored != c  # independent copies


def test_from_state_normalizes() -> None:
    c = Cursor.from_state(CursorState(0, ((0, 4), (6, 7))))
    assert c.mark_delete == 4
    assert c.acked_ranges() == [(6, 7)]


def test_invariant_mark_delete_below_every_range() -> None:
    c = Cursor(0)
    for batch in ([9, 7, 5], [0, 1, 2, 3], [4], [6, 8, 10, 12]):
        c.ack(batch)
        assert all(c.mark_delete < s for s, _ in c.acked_ranges())
        assert not c.is_acked(c.mark_delete)
    assert c.mark_delete == 11
    assert c.acked_ranges() == [(12, 13)]


@given(
    st.integers(0, 20),
    st.lists(st.integers(0, 60), max_size=30),
    st.integers(0, 70),
)
def test_unacked_run_agrees_with_is_acked(mark_delete: int, acked: list[int], offset: int) -> None:
    c = Cursor(mark_delete)
    c.ack(acked)
    start, end = c.unacked_run(offset)
    assert start >= offset
    assert not c.is_acked(start)
    assert all(c.is_acked(x) for x in range(offset, start))
    stop = end if end is not None else 200
    assert all(not c.is_acked(x) for x in range(start, stop))
    if end is not None:
        assert c.is_acked(end)
    else:
        assert all(not c.is_acked(x) for x in range(start, 200))
