"""Stateful property test of the delivery planner against a model of what was published,
delivered and acked: random publishes, consumers, plans, acks, nacks, give-backs and time."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pubsubd.acks.cursor import Cursor
from pubsubd.data.subscribe.planner import DeliveryPlanner
from tests.support.planner import MemoryTopic, Recorder, planner, subscription

pytestmark = pytest.mark.property


class PlannerMachine(RuleBasedStateMachine):
    @initialize(ordered=st.booleans(), sources=st.integers(1, 3))
    def setup(self, ordered: bool, sources: int) -> None:
        self.topic = MemoryTopic(sources=[[] for _ in range(sources)])
        self.p: DeliveryPlanner = planner(
            self.topic, subscription(enable_message_ordering=ordered), sources=sources
        )
        self.now = 0.0
        self.consumers: list[Recorder] = []
        self.published: set[int] = set()
        self.acked: set[int] = set()
        self.mirror = {s: Cursor(0) for s in range(sources)}  # what the effects recorded
        self.live: dict[str, int] = {}  # ack ID -> position, as the clients hold them

    def _carry_out(self) -> None:
        fx = self.p.effects()
        for source, ranges in fx.acks.items():
            for start, end in ranges:
                self.mirror[source].ack_range(start, end)
        for d in fx.deliveries:
            before = len(d.consumer.received)  # type: ignore[attr-defined]
            d.consumer.deliver(d.received, d.positions)
            for ack_id, pos, _ in d.consumer.received[before:]:  # type: ignore[attr-defined]
                assert pos not in self.acked, f"acked position {pos} delivered again"
                assert pos in self.published
                self.live[ack_id] = pos
        assert not fx.ended and not fx.dead_letters

    @rule(
        count=st.integers(1, 5),
        key=st.sampled_from(["", "", "a", "b"]),
        source=st.integers(0, 2),
    )
    def publish(self, count: int, key: str, source: int) -> None:
        source %= len(self.topic.sources)
        positions = self.topic.publish(*[b"x" * (1 + source)] * count, key=key, source=source)
        self.published.update(positions)

    @rule(max_messages=st.integers(0, 4), deadline=st.sampled_from([10.0, 30.0]))
    def add_consumer(self, max_messages: int, deadline: float) -> None:
        c = Recorder(max_messages=max_messages, deadline_s=deadline)
        self.consumers.append(c)
        self.p.add_consumer(c)
        self._carry_out()

    @rule()
    def plan(self) -> None:
        self.p.plan(self.now)
        self._carry_out()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, max_size=6))
        positions = []
        for ack_id in set(chosen):
            pos, generation = self.p.decode(ack_id)
            if self.p.current(pos, generation):
                positions.append(pos)
                self.acked.add(pos)
            del self.live[ack_id]
        self.p.acknowledge(positions)
        self._carry_out()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        ack_id = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[ack_id]
        self.p.modify_deadline([self.p.decode(ack_id)], 0, self.now)
        self._carry_out()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        ack_id = data.draw(st.sampled_from(sorted(self.live)))
        pos, generation = self.p.decode(ack_id)
        lease = self.p.leases.get(pos)
        if lease is not None and lease.generation == generation:
            attempts = self.p.leases.attempts(pos)
            self.p.give_back(lease.consumer, [pos])
            assert self.p.leases.attempts(pos) == attempts - 1
        del self.live[ack_id]
        self._carry_out()

    @rule(seconds=st.sampled_from([1.0, 9.0, 11.0, 31.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.p.tick(self.now)
        self._carry_out()

    @invariant()
    def outstanding_counts_agree_with_the_leases(self) -> None:
        consumers = self.p.consumers.values()
        assert sum(c.outstanding for c in consumers) == len(self.p.leases)
        assert sum(c.outstanding_bytes for c in consumers) == self.p.outstanding_bytes

    @invariant()
    def the_effects_recorded_exactly_the_planners_acks(self) -> None:
        for source, cursor in self.mirror.items():
            assert cursor == self.p.cursors[source]
        for pos in self.acked:
            source, offset = divmod(pos, 1 << 48)
            assert self.p.cursors[source].is_acked(offset)

    def teardown(self) -> None:
        """Liveness: with a consumer that acks everything, every message is delivered."""
        if not hasattr(self, "p"):
            return
        drain = Recorder()
        self.p.add_consumer(drain)
        for c in self.consumers:
            c.stalled = False
        for _ in range(200):
            if self.acked == self.published:
                break
            self.now += 31.0
            self.p.tick(self.now)
            self.p.plan(self.now)
            self._carry_out()
            for ack_id in list(self.live):
                pos, generation = self.p.decode(ack_id)
                if self.p.current(pos, generation):
                    self.p.acknowledge([pos])
                    self.acked.add(pos)
                del self.live[ack_id]
            self._carry_out()
        assert self.acked == self.published


PlannerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPlanner = PlannerMachine.TestCase
