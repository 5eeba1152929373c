"""Consistent hashing with bounded loads (control/assignment.py), as issue 11 states it: the
busiest member holds at most ceil((1+eps)*average); a member leaving moves only its own units;
a member joining moves the excess over the new capacity plus its own share, and is not left
idle; nothing moves twice within the hysteresis window unless its owner went away."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.control.assignment import Assignment, Member
from pubsubd.control.routing_store import decode_shard, encode_shard
from pubsubd.control.routing_table import Constraints, Forwarder, RoutingTable, TopicUnits

pytestmark = pytest.mark.property

EPSILONS = st.sampled_from([0.1, 0.25, 0.5, 1.0])


def _members(n: int, zones: int = 2) -> list[Member]:
    return [Member(f"f{i}", zone=f"z{i % zones}") for i in range(n)]


def _units(n: int) -> list[str]:
    return [f"projects/p/topics/t{i // 4}/{i % 4}" for i in range(n)]


@settings(max_examples=60, deadline=None)
@given(units=st.integers(0, 400), members=st.integers(1, 9), epsilon=EPSILONS)
def test_every_unit_has_an_owner_and_no_member_holds_more_than_the_bound(
    units: int, members: int, epsilon: float
) -> None:
    a = Assignment(epsilon=epsilon)
    a.update(_members(members), _units(units), now=0.0)
    loads = a.loads()
    assert sorted(a.owners) == sorted(_units(units))
    assert max(loads.values()) <= math.ceil((1 + epsilon) * units / members)
    assert sum(loads.values()) == units


@settings(max_examples=60, deadline=None)
@given(
    units=st.integers(1, 400),
    members=st.integers(2, 9),
    epsilon=EPSILONS,
    leaving=st.integers(0, 8),
)
def test_a_member_leaving_moves_only_its_own_units(
    units: int, members: int, epsilon: float, leaving: int
) -> None:
    a = Assignment(epsilon=epsilon)
    everyone = _members(members)
    a.update(everyone, _units(units), now=0.0)
    gone = everyone[leaving % members].member_id
    held = {u for u, owner in a.owners.items() if owner == gone}
    moves = a.update([m for m in everyone if m.member_id != gone], _units(units), now=1.0)
    assert {m.unit for m in moves} == held
    assert all(m.forced and m.source == gone for m in moves)
    assert max(a.loads().values()) <= a.capacity


@settings(max_examples=60, deadline=None)
@given(units=st.integers(1, 400), members=st.integers(1, 8), epsilon=EPSILONS)
def test_a_member_joining_takes_its_share_and_only_the_bounded_extra_moves(
    units: int, members: int, epsilon: float
) -> None:
    """What the others hold over the new capacity moves, and the newcomer fills up to about
    its fair share (it must not stay idle); nothing else moves, and nothing is forced."""
    a = Assignment(epsilon=epsilon)
    before = _members(members)
    a.update(before, _units(units), now=0.0)
    loads = a.loads()
    after = [*before, Member("new", zone="z9")]
    mean = units / len(after)
    capacity = math.ceil((1 + epsilon) * mean)
    excess = sum(max(0, n - capacity) for n in loads.values())
    moves = a.update(after, _units(units), now=1000.0)
    assert not any(m.forced for m in moves)
    assert len(moves) <= excess + math.floor(mean)
    assert len({m.unit for m in moves}) == len(moves)  # no unit moves twice in a pass
    assert all(m.target == "new" for m in moves if loads[m.source or ""] <= capacity)
    assert a.loads()["new"] >= math.floor(mean / (1 + epsilon))
    assert max(a.loads().values()) <= capacity


def test_with_four_forwarders_the_busiest_holds_at_most_the_bound() -> None:
    a = Assignment(epsilon=0.25)
    a.update(_members(4), _units(1000), now=0.0)
    assert a.capacity == math.ceil(1.25 * 1000 / 4) == 313
    assert max(a.loads().values()) <= 313


def test_nothing_moves_twice_within_the_hysteresis_window_unless_forced() -> None:
    a = Assignment(epsilon=0.1, hysteresis_s=60.0)
    units = _units(400)
    members = _members(3)
    a.update(members, units, now=0.0)
    first = a.update([*members, Member("f3")], units, now=100.0)
    moved = {m.unit for m in first}
    assert moved
    # Another member joins 10 s later: what moved at t=100 stays put (its new owner may stay
    # over the capacity until the window passes); the others even out.
    second = a.update([*members, Member("f3"), Member("f4")], units, now=110.0)
    assert not moved & {m.unit for m in second}
    # Once the window has passed every member is within the bound again.
    a.update([*members, Member("f3"), Member("f4")], units, now=200.0)
    assert max(a.loads().values()) <= a.capacity
    # A forced move ignores the window: f3 leaves at once.
    held = {u for u, o in a.owners.items() if o == "f3"}
    third = a.update([*members, Member("f4")], units, now=201.0)
    assert held <= {m.unit for m in third}


def test_drained_members_own_nothing_and_come_last() -> None:
    a = Assignment()
    units = _units(200)
    members = _members(4)
    a.update(members, units, now=0.0)
    drained = [Member(m.member_id, m.zone, drained=m.member_id == "f1") for m in members]
    moves = a.update(drained, units, now=1.0)
    assert "f1" not in a.loads() or a.loads()["f1"] == 0
    assert all(m.forced for m in moves if m.source == "f1")
    unit = units[0]
    assert a.ranked(unit)[-1] == "f1"
    assert a.ranked(unit)[0] == a.owners[unit]


def test_pins_and_zones() -> None:
    a = Assignment()
    units = _units(100)
    members = _members(4)  # f0, f2 in z0; f1, f3 in z1
    a.update(members, units, now=0.0, pins={units[5]: "f3"})
    assert a.owners[units[5]] == "f3"
    ranked = a.ranked(units[7], zone="z1")
    owner = a.owners[units[7]]
    rest = ranked[1:]
    assert ranked[0] == owner and sorted(ranked) == sorted(m.member_id for m in members)
    in_zone = [m for m in rest if m in {"f1", "f3"}]
    assert rest[: len(in_zone)] == in_zone  # the caller's zone first
    # A pin to a member that is not there is ignored; every unit still has an owner.
    a.update(members, units, now=1.0, pins={units[5]: "gone"})
    assert set(a.owners) == set(units)


def test_no_members_no_owners_and_bad_settings() -> None:
    a = Assignment()
    assert a.update([], _units(10), now=0.0) == []
    assert a.owners == {}
    with pytest.raises(ValueError):
        Assignment(epsilon=0)
    with pytest.raises(ValueError):
        Assignment(hysteresis_s=-1)


# --- weights (a topic weighs 1 plus its load's points, core/load.py) ----------------------------


WEIGHTS = st.lists(st.integers(1, 30), min_size=1, max_size=200)


@settings(max_examples=80, deadline=None)
@given(weights=WEIGHTS, members=st.integers(1, 9), epsilon=EPSILONS)
def test_weighted_no_member_holds_more_than_the_bound_but_for_one_unit_too_heavy(
    weights: list[int], members: int, epsilon: float
) -> None:
    """The weighted bound: ceil((1+eps) * total weight / members). A unit that fits nowhere
    goes to the least loaded member, so a member can exceed the bound by less than its
    heaviest unit, and never when every unit is light enough to fit."""
    units = _units(len(weights))
    by_unit = dict(zip(units, weights, strict=True))
    a = Assignment(epsilon=epsilon)
    a.update(_members(members), units, now=0.0, weights=by_unit)
    loads = a.weighted_loads()
    bound = math.ceil((1 + epsilon) * sum(weights) / members)
    assert a.capacity == bound
    assert sorted(a.owners) == sorted(units)
    assert sum(loads.values()) == sum(weights)
    assert max(loads.values()) < bound + max(weights)
    if max(weights) <= bound - math.ceil(sum(weights) / members):  # always fits somewhere
        assert max(loads.values()) <= bound


@settings(max_examples=60, deadline=None)
@given(
    weights=WEIGHTS,
    members=st.integers(2, 6),
    epsilon=EPSILONS,
    hot=st.integers(0, 199),
    heat=st.integers(2, 60),
)
def test_a_unit_growing_heavier_moves_units_at_most_once_a_window(
    weights: list[int], members: int, epsilon: float, hot: int, heat: int
) -> None:
    """Loads change all the time; within the hysteresis window a unit moves at most once, and
    after it the busiest member is back within the bound (a unit too heavy aside)."""
    units = _units(len(weights))
    by_unit = dict(zip(units, weights, strict=True))
    a = Assignment(epsilon=epsilon, hysteresis_s=60.0)
    everyone = _members(members)
    a.update(everyone, units, now=0.0, weights=by_unit)
    hotter = {**by_unit, units[hot % len(units)]: heat}
    moved = [m.unit for m in a.update(everyone, units, now=100.0, weights=hotter)]
    again = [m.unit for m in a.update(everyone, units, now=110.0, weights=by_unit)]
    assert len(moved) == len(set(moved))
    assert not set(moved) & set(again), "moved twice within the window"
    a.update(everyone, units, now=200.0, weights=hotter)
    assert max(a.weighted_loads().values()) < a.capacity + max(hotter.values())


def test_a_hot_topic_leaves_room_on_its_forwarder() -> None:
    """Twenty idle topics and one at weight 20 over two forwarders: the hot one's owner holds
    it and at most capacity - 20 idle ones; the idle ones move from it, nothing else does."""
    units = [f"p/t{i}/0" for i in range(21)]
    a = Assignment(epsilon=0.25)
    members = _members(2)
    a.update(members, units, now=0.0)
    assert a.capacity == 14
    hot = units[0]
    owner = a.owners[hot]
    held = a.loads()[owner]
    moves = a.update(members, units, now=1000.0, weights={hot: 20})
    assert a.capacity == math.ceil(1.25 * 40 / 2) == 25
    assert a.owners[hot] == owner and a.weighted_loads()[owner] <= 25
    assert all(m.source == owner and m.unit != hot and not m.forced for m in moves)
    assert len(moves) == max(0, 20 + held - 1 - 25)  # what it must shed, no more
    # Quiet again (after the window): only what is over the bound of 14 moves back.
    before = a.loads()
    back = a.update(members, units, now=2000.0)
    assert a.capacity == 14 and max(a.loads().values()) <= 14
    assert len(back) == sum(max(0, n - 14) for n in before.values())


# --- a router taking over (router/main.py seeds from the published assignment) ------------------


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("drain"), st.integers(0, 3)),
        st.tuples(st.just("undrain"), st.integers(0, 3)),
        st.tuples(st.just("heat"), st.integers(0, 39), st.integers(2, 30)),
        st.tuples(st.just("cool"), st.integers(0, 39)),
        st.tuples(st.just("wait"), st.integers(1, 100)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(before=STEPS, after=STEPS)
def test_a_router_seeded_from_the_published_assignment_decides_as_the_one_that_wrote_it(
    before: list[tuple[int | str, ...]], after: list[tuple[int | str, ...]]
) -> None:
    """Routes and their last move times go through the published shards (encode_shard,
    decode_shard, RoutingTable.restore); from then on, the router that took over moves
    exactly what the one before would have (hysteresis windows included)."""
    forwarders = [Forwarder(f"f{i}", f"a:{i}") for i in range(4)]
    topics = [TopicUnits(f"projects/p/topics/t{i}", f"u{i}", 1) for i in range(40)]
    state: dict[str, Any] = {"drained": set(), "weights": {}, "now": 0.0}

    def apply(step: tuple[int | str, ...]) -> None:
        action = step[0]
        if action == "drain":
            state["drained"] = state["drained"] | {f"f{step[1]}"}
        elif action == "undrain":
            state["drained"] = state["drained"] - {f"f{step[1]}"}
        elif action == "heat":
            state["weights"] = {**state["weights"], f"u{step[1]}": step[2]}
        elif action == "cool":
            state["weights"] = {k: w for k, w in state["weights"].items() if k != f"u{step[1]}"}
        else:
            state["now"] += float(step[1])
        state["now"] += 10.0

    def run(table: RoutingTable) -> dict[str, str]:
        constraints = Constraints(drained=frozenset(state["drained"]))
        table.update(forwarders, constraints, topics, [], state["now"], state["weights"])
        return dict(table.publishing.owners)

    first = RoutingTable(colocate=True, hysteresis_s=60.0)
    for step in before:
        apply(step)
        run(first)
    shards = {
        name: decode_shard(encode_shard(routes, 1, "r", first.last_moved))
        for name, routes in first.shards.items()
    }
    second = RoutingTable(colocate=True, hysteresis_s=60.0)
    for decoded in shards.values():
        for unit, (route, moved_at) in decoded.items():
            second.restore(unit, route[0], moved_at)
    state["now"] += 10.0  # the new router's first pass: nothing else changed
    assert run(second) == run(first)
    for step in after:
        apply(step)
        assert run(second) == run(first), step


@settings(max_examples=80, deadline=None)
@given(weights=WEIGHTS, members=st.integers(1, 6), epsilon=EPSILONS)
def test_weighted_placement_settles_no_unit_goes_round_every_window(
    weights: list[int], members: int, epsilon: float
) -> None:
    """Steady weights: after two passes (the second sheds what a unit too heavy to fit
    anywhere pushed over the bound), later passes move nothing, window after window; a unit
    heavier than the bound is never moved to even out loads."""
    units = _units(len(weights))
    by_unit = dict(zip(units, weights, strict=True))
    a = Assignment(epsilon=epsilon, hysteresis_s=60.0)
    everyone = _members(members)
    a.update(everyone, units, now=0.0)  # by count first, as a router without reports
    a.update(everyone, units, now=100.0, weights=by_unit)
    a.update(everyone, units, now=200.0, weights=by_unit)
    for window in range(3, 6):
        moves = a.update(everyone, units, now=100.0 * window, weights=by_unit)
        assert moves == [], window


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    others=st.integers(0, 40),
    members=st.integers(1, 8),
    epsilon=EPSILONS,
)
def test_units_of_a_group_go_to_members_of_their_own_while_there_are_enough(
    groups: list[int], others: int, members: int, epsilon: float
) -> None:
    """A spread subscription's heads (one group) are kept apart: each group of ``k`` units is
    on min(k, members) members, as long as the bound leaves room (every group here fits in
    the bound: each member's load stays at most the bound all the same)."""
    units = _units(others)
    grouped = {f"s/g{g}/{i}": f"g{g}" for g, k in enumerate(groups) for i in range(k)}
    a = Assignment(epsilon=epsilon)
    a.update(_members(members), [*units, *grouped], now=0.0, groups=grouped)
    loads = a.loads()
    assert max(loads.values()) <= math.ceil((1 + epsilon) * len(a.owners) / members)
    for g, k in enumerate(groups):
        owners = {a.owners[f"s/g{g}/{i}"] for i in range(k)}
        # Bounded loads may fill a member before a group reaches it: nearly always apart.
        assert len(owners) >= min(k, members) - (1 if members > 2 else 0)


def test_a_group_widening_lands_on_free_members_and_a_returning_member_takes_a_doubled_unit() -> (
    None
):
    everyone = _members(4)
    units = ["s/cold/0", "s/warm/0", "s/warm/1"]  # room on every member (the bound first)
    warm = {"s/warm/0": "warm", "s/warm/1": "warm"}
    a = Assignment(epsilon=0.5, hysteresis_s=30.0)
    heads = {f"s/hot/{i}": "hot" for i in range(2)}
    a.update(everyone, [*units, *heads], now=0.0, groups=heads | warm)
    first = dict(a.owners)
    assert len({a.owners[u] for u in heads}) == 2
    heads = {f"s/hot/{i}": "hot" for i in range(4)}  # widened: two more heads
    heads |= warm
    moves = a.update(everyone, [*units, *heads], now=10.0, groups=heads)
    assert len({a.owners[f"s/hot/{i}"] for i in range(4)}) == 4
    assert a.owners["s/warm/0"] != a.owners["s/warm/1"]
    assert all(a.owners[u] == first[u] for u in first)  # nothing else moved
    assert {m.unit for m in moves} == {"s/hot/2", "s/hot/3"}
    # One member goes: its head doubles up on another; back, a doubled head moves to it once
    # outside the hysteresis window, and only that.
    hot = [f"s/hot/{i}" for i in range(4)]
    gone = a.owners["s/hot/3"]
    left = [m for m in everyone if m.member_id != gone]
    a.update(left, [*units, *heads], now=20.0, groups=heads)
    assert len({a.owners[u] for u in hot}) == 3
    a.update(everyone, [*units, *heads], now=200.0, groups=heads)
    assert len({a.owners[u] for u in hot}) == 4
    settled = dict(a.owners)
    assert not a.update(everyone, [*units, *heads], now=300.0, groups=heads)
    assert a.owners == settled
