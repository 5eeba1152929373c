"""Unit tests for pubsubd.data.subscribe.leases.LeaseTable."""

from __future__ import annotations

import pytest

from pubsubd.data.subscribe import leases
from pubsubd.data.subscribe.leases import LeaseTable

pytestmark = pytest.mark.unit


def test_empty_table() -> None:
    t = LeaseTable()
    assert len(t) == 0
    assert 1 not in t
    assert t.get(1) is None
    assert t.expired(1e9) == []
    assert t.next_deadline() is None
    assert t.attempts(1) == 0
    assert t.extend(1, 0.0, 10.0) is None
    assert t.release(1) is None
    t.forget(1)  # no error


def test_grant_records_lease() -> None:
    t = LeaseTable()
    lease = t.grant(7, now=100.0, deadline_s=10.0, consumer=3, size=42)
    assert lease.deadline == 110.0
    assert lease.consumer == 3
    assert lease.size == 42
    assert lease.confirmed is False
    assert 7 in t
    assert len(t) == 1
    assert t.get(7) == lease  # leases are values
    assert t.attempts(7) == 1
    assert t.next_deadline() == 110.0


def test_generations_strictly_increase() -> None:
    t = LeaseTable()
    gens = [t.grant(p % 3, 0.0, 10.0, 1, 1).generation for p in range(10)]
    assert gens == sorted(gens)
    assert len(set(gens)) == len(gens)
    assert gens[0] >= 1


def test_generations_keep_increasing_after_clear() -> None:
    t = LeaseTable()
    g1 = t.grant(1, 0.0, 10.0, 1, 1).generation
    t.clear()
    assert len(t) == 0
    assert t.attempts(1) == 0
    assert t.next_deadline() is None
    g2 = t.grant(1, 0.0, 10.0, 1, 1).generation
    assert g2 > g1


def test_regrant_gets_new_generation_and_counts_attempt() -> None:
    t = LeaseTable()
    first = t.grant(5, 0.0, 10.0, 1, 1)
    assert t.release(5) == first
    assert 5 not in t
    assert t.attempts(5) == 1  # survives the lease end
    second = t.grant(5, 1.0, 10.0, 2, 1)
    assert second.generation > first.generation
    assert t.attempts(5) == 2


def test_extend_keeps_generation_and_confirms() -> None:
    t = LeaseTable()
    lease = t.grant(1, 0.0, 10.0, 1, 1)
    gen = lease.generation
    extended = t.extend(1, now=5.0, seconds=30.0)
    assert extended is not None
    assert extended.generation == gen
    assert extended.deadline == 35.0
    assert extended.confirmed is True
    assert t.attempts(1) == 1  # extending is not a delivery


def test_extended_lease_does_not_expire_at_old_deadline() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, 1, 1)
    t.extend(1, 5.0, 30.0)
    assert t.expired(10.0) == []
    assert t.expired(34.9) == []
    assert 1 in t
    out = t.expired(35.0)
    assert [p for p, _ in out] == [1]
    assert 1 not in t


def test_extend_shortens_deadline() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 60.0, 1, 1)
    t.extend(1, 1.0, 0.0)  # nack-like: deadline now
    assert t.next_deadline() == 1.0
    assert [p for p, _ in t.expired(1.0)] == [1]
    assert t.expired(60.0) == []  # the old heap item is stale


def test_extend_to_same_deadline_expires_once() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, 1, 1)
    t.extend(1, 0.0, 10.0)
    t.extend(1, 5.0, 5.0)
    out = t.expired(100.0)
    assert [p for p, _ in out] == [1]
    assert t.expired(100.0) == []


def test_expired_in_deadline_order_each_once() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 30.0, 1, 1)
    t.grant(2, 0.0, 10.0, 1, 1)
    t.grant(3, 0.0, 20.0, 1, 1)
    t.grant(4, 0.0, 40.0, 1, 1)
    out = t.expired(30.0)
    assert [p for p, _ in out] == [2, 3, 1]
    assert [lease.deadline for _, lease in out] == [10.0, 20.0, 30.0]
    assert t.expired(30.0) == []
    assert len(t) == 1
    assert t.next_deadline() == 40.0
    assert [p for p, _ in t.expired(1000.0)] == [4]
    assert t.next_deadline() is None


def test_expiry_ends_lease_but_keeps_attempts() -> None:
    t = LeaseTable()
    t.grant(9, 0.0, 10.0, 1, 1)
    t.expired(10.0)
    assert 9 not in t
    assert t.attempts(9) == 1
    assert t.extend(9, 11.0, 10.0) is None  # an expired lease cannot be extended
    t.grant(9, 11.0, 10.0, 1, 1)
    assert t.attempts(9) == 2


def test_released_lease_does_not_expire() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, 1, 1)
    t.grant(2, 0.0, 10.0, 1, 1)
    t.release(1)
    assert [p for p, _ in t.expired(10.0)] == [2]


def test_regranted_lease_does_not_expire_at_old_deadline() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, 1, 1)
    t.release(1)
    new = t.grant(1, 5.0, 100.0, 2, 1)
    assert t.expired(50.0) == []
    assert t.next_deadline() == 105.0
    out = t.expired(105.0)
    assert out == [(1, new)]


def test_regrant_without_release_replaces_lease() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, 1, 1)
    new = t.grant(1, 0.0, 50.0, 2, 1)
    assert len(t) == 1
    assert t.get(1) == new
    assert t.expired(10.0) == []
    assert t.expired(50.0) == [(1, new)]


def test_forget_drops_attempts() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, 1, 1)
    t.release(1)
    t.grant(1, 0.0, 10.0, 1, 1)
    assert t.attempts(1) == 2
    t.forget(1)
    assert 1 not in t
    assert t.attempts(1) == 0
    assert t.expired(1000.0) == []


def test_next_deadline_skips_stale_items() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 5.0, 1, 1)
    t.grant(2, 0.0, 20.0, 1, 1)
    t.extend(1, 0.0, 50.0)
    assert t.next_deadline() == 20.0
    t.release(2)
    assert t.next_deadline() == 50.0
    t.release(1)
    assert t.next_deadline() is None


def test_held_by() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, consumer=1, size=1)
    t.grant(2, 0.0, 10.0, consumer=2, size=1)
    t.grant(3, 0.0, 10.0, consumer=1, size=1)
    assert sorted(t.held_by(1)) == [1, 3]
    assert t.held_by(2) == [2]
    assert t.held_by(3) == []


def test_ties_all_returned() -> None:
    t = LeaseTable()
    for p in (5, 3, 8):
        t.grant(p, 0.0, 10.0, 1, 1)
    out = t.expired(10.0)
    assert sorted(p for p, _ in out) == [3, 5, 8]
    assert len(t) == 0


def test_stale_heap_items_are_compacted_away() -> None:
    t = LeaseTable()
    for round_ in range(20):  # a fast drain: deliver 1000, ack them all, long deadlines
        base = round_ * 1000
        for pos in range(base, base + 1000):
            t.grant(pos, float(round_), 600.0, consumer=1, size=10)
        for pos in range(base, base + 1000):
            t.forget(pos)
    t.grant(10**6, 0.0, 5.0, consumer=1, size=10)
    _check_bounded(t)
    assert t.next_deadline() == 5.0
    assert [p for p, _ in t.expired(1000.0)] == [10**6]


def _check_bounded(t: LeaseTable) -> None:
    entries = sum(len(run.positions) for _, _, run in t._heap)
    assert entries == t._entries
    assert entries <= 2 * len(t) + leases.COMPACT_SLACK


def test_stale_runs_are_compacted_away() -> None:
    t = LeaseTable()
    for round_ in range(20):  # the same drain, each response's 1000 leases granted as a run
        run = list(range(round_ * 1000, round_ * 1000 + 1000))
        t.grant_run(run, [10] * 1000, float(round_), 600.0, consumer=1)
        for pos in run[:-1]:  # one left outstanding per run
            t.forget(pos)
    _check_bounded(t)
    assert len(t) == 20
    assert t.next_deadline() == 600.0
    assert [p for p, _ in t.expired(700.0)] == [r * 1000 + 999 for r in range(20)]
    assert t.next_deadline() is None


def test_give_back_ends_lease_without_counting_the_attempt() -> None:
    t = LeaseTable()
    first = t.grant(4, 0.0, 10.0, consumer=1, size=7)
    t.release(4)  # nacked: the first delivery counts
    second = t.grant(4, 1.0, 60.0, consumer=2, size=7)
    assert t.attempts(4) == 2
    assert t.give_back(4, consumer=2) == second
    assert 4 not in t
    assert t.attempts(4) == 1  # consumer 2 never had it
    assert t.next_deadline() is None  # its heap item is stale
    assert t.expired(1000.0) == []
    third = t.grant(4, 2.0, 60.0, consumer=3, size=7)
    assert t.attempts(4) == 2
    assert third.generation > second.generation > first.generation


def test_give_back_of_only_delivery_forgets_the_count() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, consumer=1, size=1)
    assert t.give_back(1, consumer=1) is not None
    assert t.attempts(1) == 0
    assert len(t) == 0
    t.grant(1, 0.0, 10.0, consumer=2, size=1)
    assert t.attempts(1) == 1


def test_give_back_only_by_the_holder() -> None:
    t = LeaseTable()
    lease = t.grant(1, 0.0, 10.0, consumer=1, size=1)
    assert t.give_back(1, consumer=2) is None  # someone else's lease
    assert t.give_back(2, consumer=1) is None  # not leased
    assert t.get(1) == lease
    assert t.attempts(1) == 1
    t.release(1)
    assert t.give_back(1, consumer=1) is None  # already ended (ack, nack, expiry)
    assert t.attempts(1) == 1


def test_given_back_lease_does_not_expire() -> None:
    t = LeaseTable()
    t.grant(1, 0.0, 10.0, consumer=1, size=1)
    t.grant(2, 0.0, 20.0, consumer=1, size=1)
    t.give_back(1, consumer=1)
    assert t.next_deadline() == 20.0
    assert [p for p, _ in t.expired(30.0)] == [2]


def test_a_run_grant_is_the_same_as_granting_one_by_one() -> None:
    """grant_run (built in bulk) leases and counts exactly as grant per position, for fresh
    positions and for positions delivered before (the attempts then count up)."""
    import random

    rng = random.Random(13)
    bulk, single = LeaseTable(), LeaseTable()
    granted = dict.fromkeys(range(60), 0)  # deliveries since the last ack, counted here
    for round_ in range(30):
        positions = rng.sample(range(60), rng.randint(1, 12))
        sizes = [rng.randint(1, 500) for _ in positions]
        consumer = rng.randint(1, 3)
        first = bulk.grant_run(positions, sizes, float(round_), 10.0, consumer)
        assert first == single.next_generation
        for pos, size in zip(positions, sizes, strict=True):
            single.grant(pos, float(round_), 10.0, consumer, size)
            granted[pos] += 1
        assert {p: bulk.get(p) for p in bulk.leased} == {p: single.get(p) for p in single.leased}
        assert [bulk.generation(p) for p in positions] == list(range(first, first + len(positions)))
        assert bulk.attempts_of(list(range(60))) == list(granted.values())
        for pos in rng.sample(range(60), 5):  # some acked: their counts start again
            bulk.forget(pos)
            single.forget(pos)
            granted[pos] = 0
    with pytest.raises(ValueError):
        bulk.grant_run([1, 2], [10], 0.0, 10.0, 1)


def test_extending_one_position_of_a_run_leaves_the_others_deadline() -> None:
    """A run's positions share their hold; an extension moves only the positions it names."""
    t = LeaseTable()
    first = t.grant_run([1, 2, 3], [10, 20, 30], 0.0, 10.0, consumer=1)
    assert t.extend_all([(2, first + 1)], 5.0, 60.0) == {1}
    assert [t.get(p).deadline for p in (1, 2, 3)] == [10.0, 65.0, 10.0]  # type: ignore[union-attr]
    assert [t.get(p).confirmed for p in (1, 2, 3)] == [False, True, False]  # type: ignore[union-attr]
    assert [p for p, _ in t.expired(10.0)] == [1, 3]
    assert t.next_deadline() == 65.0
    assert t.get(2) == leases.Lease(first + 1, 65.0, 1, 20, True)


def test_extend_all_names_the_consumers_and_skips_stale_deliveries() -> None:
    t = LeaseTable()
    a = t.grant_run([1, 2], [1, 1], 0.0, 10.0, consumer=7)
    b = t.grant_run([3], [1], 0.0, 10.0, consumer=8)
    assert t.extend_all([(1, a), (2, a), (3, b + 5)], 1.0, 30.0) == {7}  # (2, a) is stale
    assert t.get(2).deadline == 10.0  # type: ignore[union-attr]
    assert t.extend_all([(2, a + 1), (3, b)], 1.0, 30.0) == {7, 8}
    assert t.is_current(3, b) and not t.is_current(3, b + 1) and not t.is_current(9, b)


def test_forget_all_says_what_each_consumer_held() -> None:
    t = LeaseTable()
    t.grant_run([1, 2, 3], [10, 20, 30], 0.0, 10.0, consumer=1)
    t.grant_run([4, 5], [1, 2], 0.0, 10.0, consumer=2)
    t.grant_run([6], [100], 0.0, 10.0, consumer=1)
    assert t.forget_all([1, 2]) == {1: [2, 30]}  # one run's
    assert t.forget_all([3, 6, 99]) == {1: [2, 130]}  # two runs of one consumer, a miss
    t.grant_run([7], [5], 0.0, 10.0, consumer=1)
    assert t.forget_all([4, 99, 7, 5]) == {2: [2, 3], 1: [1, 5]}
    assert t.forget_all([4, 5]) == {}
    assert len(t) == 0 and not t.leased
    assert t.attempts_of([1, 4, 7]) == [0, 0, 0]
