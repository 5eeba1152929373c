"""Property test: LeaseTable against a naive model (a dict of pos -> (generation, deadline,
confirmed), with each lease's holder and size)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pubsubd.data.subscribe.leases import LeaseTable

pytestmark = pytest.mark.property

positions = st.integers(min_value=0, max_value=15)
# Small integer-valued durations so that deadlines collide often.
durations = st.integers(min_value=0, max_value=20).map(float)
steps = st.integers(min_value=0, max_value=15).map(float)
sizes = st.integers(min_value=0, max_value=1000)


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = LeaseTable()
        self.now = 0.0
        self.model: dict[int, tuple[int, float, bool]] = {}  # pos -> (gen, deadline, confirmed)
        self.attempts: dict[int, int] = {}
        self.holders: dict[int, int] = {}  # pos -> consumer of its current lease
        self.sizes: dict[int, int] = {}  # pos -> size of its current lease
        self.last_generation = 0

    @rule(pos=positions, d=durations, consumer=st.integers(0, 3), size=sizes)
    def grant(self, pos: int, d: float, consumer: int, size: int) -> None:
        lease = self.table.grant(pos, self.now, d, consumer, size)
        assert (lease.consumer, lease.size) == (consumer, size)
        self.sizes[pos] = size
        assert lease.generation > self.last_generation
        self.last_generation = lease.generation
        assert lease.deadline == self.now + d
        assert not lease.confirmed
        self.model[pos] = (lease.generation, self.now + d, False)
        self.holders[pos] = consumer
        self.attempts[pos] = self.attempts.get(pos, 0) + 1

    @rule(
        run=st.lists(st.tuples(positions, sizes), max_size=6, unique_by=lambda t: t[0]),
        d=durations,
        consumer=st.integers(0, 3),
    )
    def grant_run(self, run: list[tuple[int, int]], d: float, consumer: int) -> None:
        first = self.table.grant_run(
            [p for p, _ in run], [size for _, size in run], self.now, d, consumer
        )
        self.sizes.update(run)
        if not run:
            return
        assert first > self.last_generation
        self.last_generation = first + len(run) - 1
        for k, (pos, _) in enumerate(run):
            self.model[pos] = (first + k, self.now + d, False)
            self.holders[pos] = consumer
            self.attempts[pos] = self.attempts.get(pos, 0) + 1

    @rule(
        start=positions,
        run_sizes=st.lists(sizes, min_size=1, max_size=8),
        d=durations,
        consumer=st.integers(0, 3),
    )
    def grant_consecutive(self, start: int, run_sizes: list[int], d: float, consumer: int) -> None:
        """A run of consecutive positions (the usual response: its hold needs no index)."""
        run = list(range(start, min(start + len(run_sizes), 16)))
        self.grant_run(list(zip(run, run_sizes, strict=False)), d, consumer)

    @rule(
        picks=st.lists(st.tuples(positions, st.booleans()), max_size=6, unique_by=lambda t: t[0]),
        d=durations,
    )
    def extend_all(self, picks: list[tuple[int, bool]], d: float) -> None:
        """Extend deliveries named by (position, generation); a stale generation extends
        nothing."""
        deliveries = [
            (pos, self.model[pos][0] if current and pos in self.model else 10**9)
            for pos, current in picks
        ]
        extended = self.table.extend_all(deliveries, self.now, d)
        expected = [
            pos for pos, gen in deliveries if pos in self.model and self.model[pos][0] == gen
        ]
        assert extended == {self.holders[p] for p in expected}
        for pos in expected:
            self.model[pos] = (self.model[pos][0], self.now + d, True)

    @rule(pos=positions, d=durations)
    def extend(self, pos: int, d: float) -> None:
        lease = self.table.extend(pos, self.now, d)
        if pos not in self.model:
            assert lease is None
            return
        assert lease is not None
        gen = self.model[pos][0]
        assert lease.generation == gen
        assert lease.confirmed
        self.model[pos] = (gen, self.now + d, True)

    @rule(pos=positions)
    def release(self, pos: int) -> None:
        lease = self.table.release(pos)
        expected = self.model.pop(pos, None)
        if expected is None:
            assert lease is None
        else:
            assert lease is not None
            assert lease.generation == expected[0]

    @rule(pos=positions, consumer=st.integers(0, 3))
    def give_back(self, pos: int, consumer: int) -> None:
        lease = self.table.give_back(pos, consumer)
        if pos not in self.model or self.holders[pos] != consumer:
            assert lease is None
            return
        assert lease is not None
        assert lease.generation == self.model.pop(pos)[0]
        self.attempts[pos] -= 1  # never received: the delivery does not count
        if not self.attempts[pos]:
            del self.attempts[pos]

    @rule(picks=st.lists(positions, max_size=8, unique=True))
    def forget_all(self, picks: list[int]) -> None:
        returned = self.table.forget_all(picks)
        expected: dict[int, list[int]] = {}
        for pos in picks:
            self.attempts.pop(pos, None)
            if self.model.pop(pos, None) is not None:
                counts = expected.setdefault(self.holders[pos], [0, 0])
                counts[0] += 1
                counts[1] += self.sizes[pos]
        assert returned == expected

    @rule(pos=positions)
    def forget(self, pos: int) -> None:
        self.table.forget(pos)
        self.model.pop(pos, None)
        self.attempts.pop(pos, None)

    @rule(step=steps)
    def advance_and_expire(self, step: float) -> None:
        self.now += step
        out = self.table.expired(self.now)
        due = {p for p, (_, deadline, _) in self.model.items() if deadline <= self.now}
        got = [p for p, _ in out]
        assert len(got) == len(set(got)), "a lease expired twice"
        assert set(got) == due
        deadlines = [lease.deadline for _, lease in out]
        assert deadlines == sorted(deadlines)
        for p, lease in out:
            gen, deadline, confirmed = self.model.pop(p)
            assert (lease.generation, lease.deadline, lease.confirmed) == (gen, deadline, confirmed)

    @rule()
    def peek_next_deadline(self) -> None:
        expected = min((d for _, d, _ in self.model.values()), default=None)
        assert self.table.next_deadline() == expected

    @invariant()
    def same_leases(self) -> None:
        assert len(self.table) == len(self.model)
        for p, (gen, deadline, confirmed) in self.model.items():
            lease = self.table.get(p)
            assert lease is not None
            assert (lease.generation, lease.deadline, lease.confirmed) == (gen, deadline, confirmed)
            assert (lease.consumer, lease.size) == (self.holders[p], self.sizes[p])
            assert self.table.is_current(p, gen) and not self.table.is_current(p, gen + 1)
            assert self.table.generation(p) == gen
        assert self.table.leased == self.model.keys()
        held = sorted(p for p in self.model if self.holders[p] == 0)
        assert sorted(self.table.held_by(0)) == held

    @invariant()
    def each_hold_counts_its_positions_and_has_its_run(self) -> None:
        """The table's own bookkeeping: a hold's ``live`` is the count of positions whose
        lease it is, and the heap has a run of its holding all of them (else they would never
        expire)."""
        held: dict[int, list[int]] = {}
        for pos, hold in self.table._holds.items():
            held.setdefault(id(hold), []).append(pos)
        runs = {id(run.hold): run for _, _, run in self.table._heap}
        for hold in self.table._holds.values():
            assert hold.live == len(held[id(hold)])
            assert set(held[id(hold)]) <= set(runs[id(hold)].positions)

    @invariant()
    def same_attempts(self) -> None:
        for p in range(16):
            assert self.table.attempts(p) == self.attempts.get(p, 0)


LeaseMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestLeaseTable = LeaseMachine.TestCase
