"""The process-wide bound on outstanding deliveries (data/subscribe/budget.py) alone and
inside delivery planners that share it: no plan delivers past it, acks free room and wake the
subscriptions that found it full."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.core.records import CursorState
from pubsubd.data.subscribe.budget import DeliveryBudget
from pubsubd.data.subscribe.planner import DeliveryPlanner
from tests.support.planner import MemoryTopic, Recorder, ack_ids, run, subscription

pytestmark = pytest.mark.unit


def _planner(topic: MemoryTopic, budget: DeliveryBudget, name: str) -> DeliveryPlanner:
    sub = subscription()
    sub.name = f"projects/p/subscriptions/{name}"
    return DeliveryPlanner(sub, "incarn01", {0: CursorState(0)}, topic, budget)


def _settle(budget: DeliveryBudget, p: DeliveryPlanner) -> None:
    """What the dispatcher does after every change of a planner."""
    budget.settle(p, len(p.leases), p.outstanding_bytes)
    if p.budget_limited:
        p.budget_limited = False
        budget.wait(p, lambda: woken.append(p))


woken: list[DeliveryPlanner] = []


def test_the_budget_counts_shares_and_wakes_waiters_when_room_frees() -> None:
    budget = DeliveryBudget(max_messages=10, max_bytes=1000)
    calls: list[str] = []
    budget.taken("a", 6, 100)
    budget.taken("b", 4, 100)
    assert budget.full and budget.room() == (0, 0)
    budget.wait("b", lambda: calls.append("b"))
    budget.settle("a", 6, 100)  # no change: still full, nobody woken
    assert calls == []
    budget.settle("a", 5, 90)
    assert calls == ["b"] and budget.room() == (1, 810)
    budget.leave("b")
    assert (budget.messages, budget.bytes) == (5, 90)
    assert budget.status()["peak_messages"] == 10 and budget.status()["paused"] == 1
    with pytest.raises(ValueError):
        DeliveryBudget(0, 1)


def test_a_byte_bound_stops_delivery_too() -> None:
    budget = DeliveryBudget(max_messages=100, max_bytes=50)
    budget.taken("a", 1, 50)
    assert budget.full
    budget.wait("a", lambda: None)
    budget.settle("a", 0, 0)
    assert not budget.full


def test_planners_sharing_a_budget_stop_at_it_and_resume_after_acks() -> None:
    woken.clear()
    topic = MemoryTopic()
    topic.publish(*[b"m%d" % i for i in range(30)])
    budget = DeliveryBudget(max_messages=8)
    a, b = _planner(topic, budget, "a"), _planner(topic, budget, "b")
    ca, cb = Recorder(), Recorder()
    a.add_consumer(ca)
    b.add_consumer(cb)
    run(a, 0.0)
    _settle(budget, a)
    run(b, 0.0)
    _settle(budget, b)
    assert len(ca.received) == 8 and cb.received == []  # a took the whole budget
    assert budget.messages == 8 and a.budget_limited is False and woken == []
    # a's consumer acks three: the room they free wakes b, which takes exactly three.
    a.acknowledge([pos for pos, _ in ack_ids(a, ca)[:3]])
    a.effects()
    _settle(budget, a)
    assert woken == [a, b]  # both found it full (a wanted more than 8 too), in that order
    run(b, 1.0)
    _settle(budget, b)
    assert len(cb.received) == 3 and len(a.leases) + len(b.leases) == 8
    assert budget.full


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["plan", "ack"]), st.integers(0, 2), st.integers(1, 5)),
        max_size=40,
    ),
    st.integers(1, 12),
)
def test_outstanding_deliveries_never_pass_the_bound(
    steps: list[tuple[str, int, int]], bound: int
) -> None:
    """Any interleaving of plans and acks over three subscriptions: the leases of all of them
    together never exceed the bound, and nothing is delivered twice while leased."""
    topic = MemoryTopic()
    topic.publish(*[b"m%d" % i for i in range(60)])
    budget = DeliveryBudget(max_messages=bound)
    planners = [_planner(topic, budget, f"s{i}") for i in range(3)]
    consumers = [Recorder() for _ in planners]
    for p, c in zip(planners, consumers, strict=True):
        p.add_consumer(c)
    acked: list[int] = [0, 0, 0]
    for action, which, count in steps:
        p, c = planners[which], consumers[which]
        if action == "plan":
            run(p, 0.0)
        else:
            ids_ = ack_ids(p, c)[acked[which] : acked[which] + count]
            acked[which] += len(ids_)
            p.acknowledge([pos for pos, _ in ids_])
            p.effects()
        budget.settle(p, len(p.leases), p.outstanding_bytes)
        assert sum(len(q.leases) for q in planners) <= bound
        assert budget.messages == sum(len(q.leases) for q in planners)


def test_an_idle_subscription_holds_no_share() -> None:
    """A subscription with nothing outstanding is not kept by the budget (a closed one's
    planner must not stay referenced)."""
    budget = DeliveryBudget(max_messages=10)
    budget.taken("a", 2, 20)
    budget.settle("a", 0, 0)
    budget.settle("b", 0, 0)
    assert budget._shares == {} and (budget.messages, budget.bytes) == (0, 0)
