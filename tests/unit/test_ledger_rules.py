"""Ledger lists, recovery plans and placement (storage/ledgers: meta, recovery, placement)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.storage.ledgers.meta import LedgerList, LedgerMeta, LedgerState, StoragePolicy
from pubsubd.storage.ledgers.placement import NodeInfo, NotEnoughNodes, choose_nodes
from pubsubd.storage.ledgers.recovery import FenceReply, NotEnoughReplies, plan_recovery


def _ledger(ledger_id: int, first: int, end: int | None = None) -> LedgerMeta:
    meta = LedgerMeta(ledger_id, first, ("a", "b", "c"), 2)
    return meta if end is None else meta.closed(end)


def test_ledger_list_round_trips_through_json() -> None:
    ledgers = LedgerList((_ledger(1, 0, 10), _ledger(2, 10)), version=4, start_offset=0)
    back = LedgerList.decode(ledgers.encode(), 4)
    assert back == ledgers
    assert back.needs_recovery() and back.end_offset is None
    assert LedgerList.decode(b"", 0) == LedgerList(version=0)


def test_a_new_ledger_starts_where_the_closed_list_ends() -> None:
    ledgers = LedgerList((_ledger(1, 0, 10),))
    assert ledgers.appended(_ledger(2, 10)).last == _ledger(2, 10)
    with pytest.raises(ValueError, match="not at 10"):
        ledgers.appended(_ledger(2, 11))
    with pytest.raises(ValueError, match="closed"):
        ledgers.appended(_ledger(2, 10)).appended(_ledger(3, 10))


def test_trim_drops_only_closed_ledgers_wholly_below_the_point() -> None:
    ledgers = LedgerList((_ledger(1, 0, 10), _ledger(2, 10, 20), _ledger(3, 20)))
    kept, dropped = ledgers.trimmed(15)
    assert [m.ledger_id for m in dropped] == [1]
    assert kept.start_offset == 10 and [m.ledger_id for m in kept.ledgers] == [2, 3]
    kept, dropped = ledgers.trimmed(10**9)
    assert [m.ledger_id for m in dropped] == [1, 2]  # the open ledger stays
    assert kept.start_offset == 20
    assert ledgers.trimmed(5) == (ledgers, ())


def test_ledger_at_finds_the_holder_of_an_offset() -> None:
    ledgers = LedgerList((_ledger(1, 0, 10), _ledger(2, 10)))
    assert ledgers.ledger_at(9) == _ledger(1, 0, 10)
    assert ledgers.ledger_at(10) == _ledger(2, 10)
    assert ledgers.ledger_at(10**6) == _ledger(2, 10)
    assert LedgerList((_ledger(1, 5, 10),), start_offset=5).ledger_at(3) is None


def test_recovery_closes_at_the_largest_end_and_copies_to_the_laggards() -> None:
    plan = plan_recovery(0, [FenceReply("a", 7), FenceReply("c", 9)], 3, 2)
    assert plan.end_offset == 9 and plan.source == "c" and plan.copies == (("a", 7),)
    with pytest.raises(NotEnoughReplies):
        plan_recovery(0, [FenceReply("a", 7)], 3, 2)
    empty = plan_recovery(40, [FenceReply("a", 0), FenceReply("b", 40)], 3, 2)
    assert empty.end_offset == 40 and empty.copies == ()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.frozensets(st.sampled_from("abc")), min_size=1, max_size=30),
    st.sets(st.sampled_from("abc"), min_size=2, max_size=3),
)
def test_recovery_never_loses_an_acknowledged_entry(
    deliveries: list[frozenset[str]], answering: set[str]
) -> None:
    """A writer sends entries 0, 1, 2, ... to nodes a, b, c; a node that misses one gets
    nothing after it (a node holds a prefix). An entry is acknowledged once 2 nodes hold it
    and every entry before it is acknowledged. Whichever 2 nodes answer the fence, the
    recovered end covers every acknowledged entry."""
    ends = {"a": 0, "b": 0, "c": 0}
    acked_end = 0
    for offset, reached in enumerate(deliveries):
        for node in reached:
            if ends[node] == offset:  # a node that missed an entry refuses the ones after it
                ends[node] = offset + 1
        if acked_end == offset and sum(1 for e in ends.values() if e > offset) >= 2:
            acked_end = offset + 1
    plan = plan_recovery(0, [FenceReply(n, ends[n]) for n in sorted(answering)], 3, 2)
    assert plan.end_offset >= acked_end
    holders = {n for n in answering if ends[n] >= plan.end_offset} | {c[0] for c in plan.copies}
    assert len(holders) >= 2


def _nodes(*zones: str) -> list[NodeInfo]:
    return [NodeInfo(f"n{i}", f"127.0.0.1:{9000 + i}", z) for i, z in enumerate(zones)]


def test_placement_spreads_over_zones_first() -> None:
    nodes = _nodes("z1", "z1", "z2", "z3")
    for spread in range(8):
        chosen = choose_nodes(nodes, StoragePolicy(), count=3, spread=spread)
        assert len(set(chosen)) == 3
        assert {n.zone for n in nodes if n.node_id in chosen} == {"z1", "z2", "z3"}


def test_placement_honours_allowed_zones_and_exclusions() -> None:
    nodes = _nodes("z1", "z1", "z2", "z3")
    policy = StoragePolicy(replicas=2, allowed_zones=frozenset({"z1"}))
    assert set(choose_nodes(nodes, policy, count=2)) == {"n0", "n1"}
    with pytest.raises(NotEnoughNodes, match="z1"):
        choose_nodes(nodes, policy, count=2, exclude=frozenset({"n0"}))


def test_placement_rotates_between_ledgers() -> None:
    nodes = _nodes("z1", "z1", "z1", "z1")
    firsts = {choose_nodes(nodes, StoragePolicy(), count=1, spread=s)[0] for s in range(4)}
    assert firsts == {"n0", "n1", "n2", "n3"}


def test_states_serialise() -> None:
    meta = _ledger(3, 5).recovering()
    assert meta.state is LedgerState.IN_RECOVERY
    assert LedgerMeta.from_json(meta.to_json()) == meta
