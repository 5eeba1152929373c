"""The repair auditor's planning (storage/ledgers/repair.py, pure): which ledgers need what,
which copy is the source and which node the replacement, damaged copies, orphans, the rate."""

from __future__ import annotations

import pytest

from pubsubd.core.records import Entry
from pubsubd.storage.framing import encode_entry
from pubsubd.storage.ledgers.meta import LedgerMeta, LedgerState, StoragePolicy
from pubsubd.storage.ledgers.placement import NodeInfo
from pubsubd.storage.ledgers.repair import (
    CopyInfo,
    Finding,
    Issue,
    LedgerPlan,
    RateLimiter,
    RepairSettings,
    Sightings,
    extend_digest,
    find_orphans,
    plan_ledger,
)
from pubsubd.storagenode.ledger_index import extend_digest as node_digest
from pubsubd.storagenode.ledger_index import parse_frames

ZONES = {"a": "z1", "b": "z2", "c": "z3", "d": "z1", "e": "z2"}
POLICY = StoragePolicy(replicas=3)


def _nodes(*ids: str) -> dict[str, NodeInfo]:
    return {i: NodeInfo(i, f"127.0.0.1:{n}", ZONES[i]) for n, i in enumerate(ids, 1)}


def _closed(ledger_id: int = 7, first: int = 100, end: int = 200, nodes: str = "abc") -> LedgerMeta:
    return LedgerMeta(ledger_id, first, tuple(nodes), 2, epoch=5).closed(end)


def _copy(first: int = 100, end: int = 200, digest: int = 0xD1, fence: int = 5) -> CopyInfo:
    return CopyInfo(first, end, digest, fence, 1000)


def _held(ledger_id: int = 7, **by_node: CopyInfo | None) -> dict[str, dict[int, CopyInfo]]:
    return {n: ({} if c is None else {ledger_id: c}) for n, c in by_node.items()}


def _plan(
    ledger: LedgerMeta,
    copies: dict[str, dict[int, CopyInfo]],
    registered: dict[str, NodeInfo] | None = None,
    lost: frozenset[str] = frozenset(),
    policy: StoragePolicy = POLICY,
) -> LedgerPlan:
    if registered is None:
        registered = _nodes(*copies)
    return plan_ledger(ledger, registered=registered, copies=copies, lost=lost, policy=policy)


def test_a_ledger_whose_copies_agree_needs_nothing() -> None:
    plan = _plan(_closed(), _held(a=_copy(), b=_copy(), c=_copy(), d=None))
    assert not plan.findings and not plan.tasks and not plan.under_replicated
    assert plan.digest == 0xD1 and plan.healthy == ("a", "b", "c")


def test_open_and_recovering_ledgers_are_left_to_their_writer() -> None:
    for ledger in (
        LedgerMeta(7, 100, ("a", "b", "c"), 2),
        LedgerMeta(7, 100, ("a", "b", "c"), 2).recovering(),
    ):
        plan = _plan(ledger, _held(a=None, b=None, d=None), lost=frozenset({"c"}))
        assert not plan.findings and not plan.tasks


def test_a_node_gone_within_its_grace_period_is_waited_for() -> None:
    plan = _plan(_closed(), _held(a=_copy(), b=_copy(), d=None))
    assert plan.findings == (Finding("c", Issue.UNREGISTERED),)
    assert plan.under_replicated and plan.waiting and not plan.tasks


def test_a_lost_node_is_replaced_in_another_zone_from_a_healthy_copy() -> None:
    copies = _held(a=_copy(fence=9), b=_copy(), d=None, e=None)
    plan = _plan(_closed(), copies, lost=frozenset({"c"}))
    assert Finding("c", Issue.LOST) in plan.findings and not plan.blocked
    (task,) = plan.tasks
    assert task.replaces == "c" and task.target in {"d", "e"} and task.source in {"a", "b"}
    assert (task.start, task.end, task.delete_first) == (100, 200, False)
    assert task.epoch == 9  # the highest fence seen on any copy, at least the ledger's epoch
    assert task.expected_digest == 0xD1


def test_the_replacement_prefers_a_zone_the_other_copies_are_not_in() -> None:
    registered = {
        "a": NodeInfo("a", "x", "z1"),
        "b": NodeInfo("b", "x", "z2"),
        "d": NodeInfo("d", "x", "z1"),
        "f": NodeInfo("f", "x", "z3"),
    }
    for ledger_id in range(10):  # whatever the spread, z3 is where no copy is
        held = _held(ledger_id, a=_copy(), b=_copy(), d=None, f=None)
        plan = _plan(_closed(ledger_id), held, registered, frozenset({"c"}))
        assert [t.target for t in plan.tasks] == ["f"]


def test_the_replacement_stays_in_the_allowed_zones() -> None:
    policy = StoragePolicy(replicas=3, allowed_zones=frozenset({"z1", "z2"}))
    registered = {
        "a": NodeInfo("a", "x", "z1"),
        "b": NodeInfo("b", "x", "z2"),
        "d": NodeInfo("d", "x", "z1"),
        "f": NodeInfo("f", "x", "z3"),
    }
    plan = _plan(
        _closed(), _held(a=_copy(), b=_copy(), d=None, f=None), registered, frozenset({"c"}), policy
    )
    assert [t.target for t in plan.tasks] == ["d"]


def test_copies_in_a_zone_the_policy_no_longer_allows_move_to_an_allowed_one() -> None:
    """The topic's storage policy changed: a closed ledger's copy in a zone it no longer
    allows is made again in an allowed zone, which takes its place (the old copy becomes an
    orphan); a missing copy there is not repaired in place first."""
    policy = StoragePolicy(replicas=3, allowed_zones=frozenset({"z1", "z2"}))
    registered = {
        "a": NodeInfo("a", "x", "z1"),
        "b": NodeInfo("b", "x", "z2"),
        "c": NodeInfo("c", "x", "z3"),
        "d": NodeInfo("d", "x", "z1"),
        "f": NodeInfo("f", "x", "z3"),
    }
    for held_by_c in (_copy(), None):
        copies = _held(a=_copy(), b=_copy(), c=held_by_c, d=None, f=None)
        plan = _plan(_closed(), copies, registered, policy=policy)
        assert Finding("c", Issue.MISPLACED) in plan.findings and plan.under_replicated
        (task,) = plan.tasks
        assert (task.target, task.replaces, task.reason) == ("d", "c", Issue.MISPLACED)
        assert task.source in {"a", "b"} and task.expected_digest == 0xD1
    # Nowhere allowed to go: reported, the copy stays where it is.
    del registered["d"]
    plan = _plan(
        _closed(), _held(a=_copy(), b=_copy(), c=_copy(), f=None), registered, policy=policy
    )
    assert not plan.tasks and "allowed zone" in plan.blocked
    # Without zone restrictions nothing is misplaced.
    assert not _plan(_closed(), _held(a=_copy(), b=_copy(), c=_copy()), registered).findings


def test_without_a_node_to_take_its_place_a_lost_copy_is_reported() -> None:
    plan = _plan(_closed(), _held(a=_copy(), b=_copy()), lost=frozenset({"c"}))
    assert plan.under_replicated and not plan.tasks and "replace c" in plan.blocked


def test_a_node_that_did_not_answer_is_neither_judged_nor_a_target() -> None:
    registered = _nodes("a", "b", "c", "d")
    plan = _plan(_closed(), _held(a=_copy(), b=_copy()), registered)
    assert plan.findings == (Finding("c", Issue.UNKNOWN),) and not plan.under_replicated
    # d is registered but did not answer either: it cannot take c's place.
    plan = _plan(_closed(), _held(a=_copy(), b=_copy()), _nodes("a", "b", "d"), frozenset("c"))
    assert not plan.tasks and "replace c" in plan.blocked


def test_a_missing_copy_is_made_again_on_its_node() -> None:
    plan = _plan(_closed(), _held(a=_copy(), b=None, c=_copy()))
    assert plan.findings == (Finding("b", Issue.MISSING),)
    (task,) = plan.tasks
    assert (task.target, task.start, task.delete_first, task.replaces) == ("b", 100, False, None)
    assert task.source in {"a", "c"} and not task.changes_list


def test_a_short_copy_gets_the_missing_tail() -> None:
    plan = _plan(_closed(), _held(a=_copy(), b=_copy(end=150, digest=0x99), c=_copy()))
    assert plan.findings == (Finding("b", Issue.SHORT),)
    (task,) = plan.tasks
    assert (task.target, task.start, task.end, task.delete_first) == ("b", 150, 200, False)
    assert task.reason is Issue.SHORT


def test_a_copy_with_another_digest_is_replaced_by_the_majoritys() -> None:
    plan = _plan(_closed(), _held(a=_copy(), b=_copy(digest=0xBAD), c=_copy()))
    assert plan.findings == (Finding("b", Issue.DIVERGENT),)
    assert plan.digest == 0xD1 and plan.healthy == ("a", "c")
    (task,) = plan.tasks
    assert (task.target, task.start, task.delete_first) == ("b", 100, True)
    assert task.source in {"a", "c"} and task.expected_digest == 0xD1


def test_a_copy_starting_elsewhere_is_divergent() -> None:
    plan = _plan(_closed(), _held(a=_copy(), b=_copy(first=90), c=_copy()))
    assert plan.findings == (Finding("b", Issue.DIVERGENT),)
    assert plan.tasks[0].delete_first


def test_copies_that_disagree_without_a_majority_are_left_alone() -> None:
    plan = _plan(_closed(), _held(a=_copy(), b=_copy(digest=0xBAD), c=_copy(end=120)))
    assert Finding("", Issue.CONFLICT) in plan.findings
    assert plan.under_replicated and not plan.tasks and "disagree" in plan.blocked


def test_a_copy_past_the_closed_end_is_cut_by_copying_it_again() -> None:
    # Never-acknowledged entries past the end: its digest cannot be compared, so it is
    # deleted and copied again from a verified copy, never counted as divergent.
    plan = _plan(_closed(), _held(a=_copy(), b=_copy(end=205, digest=0x55), c=_copy()))
    assert plan.findings == (Finding("b", Issue.LONG),)
    (task,) = plan.tasks
    assert (task.target, task.start, task.end, task.delete_first) == ("b", 100, 200, True)
    assert task.reason is Issue.LONG and task.source in {"a", "c"}


def test_the_only_copy_reaching_the_end_is_the_source_even_if_it_is_longer() -> None:
    plan = _plan(_closed(), _held(a=_copy(end=205, digest=0x55), b=_copy(end=150), c=None))
    assert {f.issue for f in plan.findings} == {Issue.LONG, Issue.SHORT, Issue.MISSING}
    assert sorted((t.target, t.source, t.start) for t in plan.tasks) == [
        ("b", "a", 150),
        ("c", "a", 100),
    ]
    assert all(t.expected_digest is None for t in plan.tasks)  # unverified source


def test_with_no_copy_of_the_whole_ledger_nothing_is_copied() -> None:
    plan = _plan(_closed(), _held(a=_copy(end=150), b=None, c=_copy(end=120)))
    assert plan.under_replicated and not plan.tasks and "whole ledger" in plan.blocked


def test_a_ledger_with_fewer_nodes_than_the_policy_gets_more() -> None:
    plan = _plan(_closed(nodes="ab"), _held(a=_copy(), b=_copy(), c=None, d=None))
    assert Finding("", Issue.TOO_FEW) in plan.findings
    (task,) = plan.tasks
    assert task.adds and task.replaces is None and task.target == "c"  # z3: a new zone


def test_an_empty_closed_ledger_changes_nodes_without_copying() -> None:
    ledger = _closed(first=100, end=100)
    plan = _plan(ledger, _held(a=None, b=None, d=None), lost=frozenset({"c"}))
    (task,) = plan.tasks
    assert (task.source, task.target, task.replaces) == ("", "d", "c")


def test_a_target_holding_a_stale_copy_is_emptied_first() -> None:
    copies = _held(a=_copy(), b=_copy(), d=_copy(end=130, digest=0x1))
    plan = _plan(_closed(), copies, lost=frozenset({"c"}))
    (task,) = plan.tasks
    assert task.target == "d" and task.delete_first


def test_orphans_are_copies_no_list_gives_to_their_node() -> None:
    closed = _closed(1, nodes="abc")
    open_ = LedgerMeta(2, 200, ("a", "b", "c"), 2)
    assert open_.state is LedgerState.OPEN
    held = {"a": [1, 2, 3], "d": [1, 2], "b": []}
    assert find_orphans(held, [closed, open_]) == {("a", 3), ("d", 1)}


def test_sightings_become_due_after_the_grace_period_without_a_break() -> None:
    seen: Sightings[str] = Sightings()
    seen.update(["x", "y"], 0.0)
    seen.update(["x", "y"], 5.0)
    assert seen.due(5.0, 10.0) == set()
    seen.update(["x"], 9.0)  # y came back: its clock starts again
    seen.update(["x", "y"], 10.0)
    assert seen.due(10.0, 10.0) == {"x"}
    assert seen.due(20.0, 10.0) == {"x", "y"}


def test_the_rate_limiter_lets_a_burst_through_then_paces() -> None:
    limiter = RateLimiter(1000.0)
    assert limiter.take(1000, 0.0) == 0.0
    assert limiter.take(500, 0.0) == pytest.approx(0.5)
    assert limiter.take(500, 1.0) == pytest.approx(0.0)  # 1 s refilled 1000, owed 500
    assert limiter.take(1000, 1.0) == pytest.approx(1.0)


def test_the_digest_of_copied_frames_is_the_storage_nodes() -> None:
    frames = b"".join(encode_entry(Entry(10 + i, 1, 7, b"x" * i)) for i in range(5))
    digest, end, valid = extend_digest(0, frames)
    assert end == 15 and valid == len(frames)
    assert digest == node_digest(0, parse_frames(1, frames).crcs)
    # In pages: the same.
    half = len(encode_entry(Entry(10, 1, 7, b""))) + len(encode_entry(Entry(11, 1, 7, b"x")))
    d1, e1, _ = extend_digest(0, frames[:half])
    d2, e2, _ = extend_digest(d1, frames[half:])
    assert (e1, e2, d2) == (12, 15, digest)
    assert extend_digest(0, b"") == (0, None, 0)


def test_settings_refuse_nonsense() -> None:
    assert RepairSettings().rate_bytes == 32 << 20
    for bad in ({"interval_s": 0}, {"grace_s": -1}, {"rate_bytes": 0}):
        with pytest.raises(ValueError):
            RepairSettings(**bad)  # type: ignore[arg-type]
