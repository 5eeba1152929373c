"""Unit tests for pubsubd.control.router: rendezvous hashing (rank), the router's addresses and
their resolution to forwarders (Routes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pubsubd.control.router import Router, Routes, rank

pytestmark = pytest.mark.unit

MEMBERS = [(f"fwd-{i}", i) for i in range(4)]
KEYS = [f"uid-{i:05d}" for i in range(10_000)]


def test_rank_is_deterministic() -> None:
    for key in KEYS[:200]:
        assert rank(key, MEMBERS) == rank(key, MEMBERS)
        # the input order of members does not matter
        assert rank(key, list(reversed(MEMBERS))) == rank(key, MEMBERS)


def test_rank_is_a_permutation() -> None:
    for key in KEYS[:200]:
        assert sorted(rank(key, MEMBERS)) == [m for _, m in MEMBERS]


def test_rank_of_no_members_and_one_member() -> None:
    assert rank("k", []) == []
    assert rank("k", [("only", "x")]) == ["x"]


def test_removing_a_member_keeps_relative_order() -> None:
    for key in KEYS[:500]:
        full = rank(key, MEMBERS)
        for removed in range(len(MEMBERS)):
            rest = [m for m in MEMBERS if m[1] != removed]
            assert rank(key, rest) == [m for m in full if m != removed]


def test_adding_a_member_moves_only_keys_it_wins() -> None:
    bigger = [*MEMBERS, ("fwd-new", 99)]
    moved = 0
    for key in KEYS[:2000]:
        before = rank(key, MEMBERS)[0]
        after = rank(key, bigger)[0]
        if after != before:
            assert after == 99
            moved += 1
    assert 0.1 * 2000 < moved < 0.3 * 2000


def test_keys_spread_evenly() -> None:
    firsts = Counter(rank(key, MEMBERS)[0] for key in KEYS)
    assert set(firsts) == {m for _, m in MEMBERS}
    for member, n in firsts.items():
        assert 0.15 * len(KEYS) <= n <= 0.35 * len(KEYS), (member, n)


def test_ranking_depends_on_key() -> None:
    orders = {tuple(rank(key, MEMBERS)) for key in KEYS[:1000]}
    assert len(orders) == 24  # all permutations of 4 members occur


def test_router_requires_forwarders() -> None:
    with pytest.raises(ValueError):
        Router([], ["s"])
    with pytest.raises(ValueError):
        Router(["p"], [])


def test_router_ranks_addresses_best_first() -> None:
    pubs = [f"p{i}" for i in range(3)]
    subs = [f"s{i}" for i in range(3)]
    r = Router(pubs, subs)
    for key in KEYS[:100]:
        assert r.publishing_for(key) == rank(key, [(a, a) for a in pubs])
        assert r.subscribing_for(key) == rank(key, [(a, a) for a in subs])
    single = Router(["p"], ["s"])
    assert single.publishing_for("anything") == ["p"]
    assert single.subscribing_for("anything") == ["s"]


def test_routes_resolve_the_rank_winner() -> None:
    pubs: dict[str, Any] = {f"p{i}": object() for i in range(3)}  # stand-ins for forwarders
    subs: dict[str, Any] = {f"s{i}": object() for i in range(3)}
    routes = Routes(Router(list(pubs), list(subs)), pubs, subs)
    for key in KEYS[:100]:
        assert routes.publishing(key) is rank(key, list(pubs.items()))[0]
        assert routes.subscribing(key) is rank(key, list(subs.items()))[0]
    assert {id(routes.publishing(key)) for key in KEYS[:100]} == {id(p) for p in pubs.values()}
    assert routes.all_publishing() == list(pubs.values())
    assert routes.all_subscribing() == list(subs.values())
