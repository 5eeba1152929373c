"""The router's routing table (control/routing_table.py, pure): units from topics and
subscriptions, drains and pins, ordered lists, shards that change only where routes did."""

from __future__ import annotations

import math

import pytest

from pubsubd._gen.pubsubd.internal.v1 import routing_pb2
from pubsubd.control.routing_store import decode_constraints, encode_constraints
from pubsubd.control.routing_table import (
    Constraints,
    Forwarder,
    RoutingTable,
    SubscriptionUnits,
    TopicUnits,
    publishing_unit,
    subscribing_unit,
    unit_kind,
)
from pubsubd.control.routing_views import RoutingView
from pubsubd.coordination.paths import bucket
from pubsubd.coordination.zk import Coordinator

pytestmark = pytest.mark.unit

FORWARDERS = [
    Forwarder("f1", "127.0.0.1:1", "z1"),
    Forwarder("f2", "127.0.0.1:2", "z1"),
    Forwarder("f3", "127.0.0.1:3", "z2"),
    Forwarder("f4", "127.0.0.1:4", "z2"),
]
TOPICS = [TopicUnits(f"projects/p/topics/t{i}", f"uid{i}", 1 + i % 3) for i in range(40)]
SUBS = [SubscriptionUnits(f"sub{i}", f"uid{i % 40}") for i in range(60)]


def _table() -> RoutingTable:
    return RoutingTable(epsilon=0.25, hysteresis_s=30.0)


def test_every_source_of_every_topic_and_subscription_is_a_unit_with_an_ordered_list() -> None:
    table = _table()
    done = table.update(FORWARDERS, Constraints(), TOPICS, SUBS, 0.0)
    sources = sum(t.sources for t in TOPICS)
    assert len(table.publishing.owners) == sources
    by_uid = {t.uid: t.sources for t in TOPICS}
    assert len(table.subscribing.owners) == sum(by_uid[s.topic_uid] for s in SUBS)
    route = table.route(publishing_unit("uid5", 2))
    assert route[0] == table.publishing.owners[publishing_unit("uid5", 2)]
    assert sorted(route) == ["f1", "f2", "f3", "f4"]  # the owner, then every fallback
    assert unit_kind(publishing_unit("uid5", 0)) == "publishing"
    assert unit_kind(subscribing_unit("sub1", 0)) == "subscribing"
    # The first pass writes every shard; bounded loads hold.
    assert done.changed_shards == frozenset(table.shards)
    assert max(table.publishing.loads().values()) <= table.publishing.capacity


def test_a_pass_with_nothing_changed_rewrites_no_shard() -> None:
    table = _table()
    table.update(FORWARDERS, Constraints(), TOPICS, SUBS, 0.0)
    again = table.update(FORWARDERS, Constraints(), TOPICS, SUBS, 1.0)
    assert not again.moves and not again.changed_shards


def test_a_new_topic_changes_only_its_shards() -> None:
    table = _table()
    table.update(FORWARDERS, Constraints(), TOPICS, SUBS, 0.0)
    new = TopicUnits("projects/p/topics/new", "uid-new", 1)
    done = table.update(FORWARDERS, Constraints(), [*TOPICS, new], SUBS, 1.0)
    assert [m.unit for m in done.moves] == [publishing_unit("uid-new", 0)]
    assert done.moves[0].source is None  # a first placement, not a move
    # Other routes may gain nothing, but the new unit's shard changes.
    assert bucket(publishing_unit("uid-new", 0)) in done.changed_shards


def test_a_drained_forwarder_or_zone_owns_nothing_but_stays_a_last_fallback() -> None:
    table = _table()
    table.update(FORWARDERS, Constraints(), TOPICS, SUBS, 0.0)
    drained = Constraints().drain("f1")
    done = table.update(FORWARDERS, drained, TOPICS, SUBS, 1.0)
    assert all(m.forced for m in done.moves if m.source == "f1")
    assert "f1" not in table.publishing.owners.values()
    assert "f1" not in table.subscribing.owners.values()
    for unit in table.publishing.owners:
        assert table.route(unit)[-1] == "f1"
    zone = Constraints().drain_zone("z2")
    table.update(FORWARDERS, zone, TOPICS, SUBS, 2.0)
    assert set(table.publishing.owners.values()) <= {"f1", "f2"}


def test_a_pinned_topic_goes_to_its_forwarder_while_that_one_may_own() -> None:
    table = _table()
    table.update(FORWARDERS, Constraints(), TOPICS, SUBS, 0.0)
    topic = TOPICS[2]  # 3 sources
    pinned = Constraints().pin(topic.name, "f4")
    table.update(FORWARDERS, pinned, TOPICS, SUBS, 1.0)
    assert {table.publishing.owners[publishing_unit(topic.uid, s)] for s in range(3)} == {"f4"}
    # Pinned to a drained forwarder: the pin waits, the units go elsewhere.
    table.update(FORWARDERS, pinned.drain("f4"), TOPICS, SUBS, 2.0)
    assert "f4" not in {table.publishing.owners[publishing_unit(topic.uid, s)] for s in range(3)}


def test_forwarders_take_only_the_kinds_they_serve() -> None:
    forwarders = [
        Forwarder("pub", "127.0.0.1:1", subscribing=False),
        Forwarder("sub", "127.0.0.1:2", publishing=False),
    ]
    table = _table()
    table.update(forwarders, Constraints(), TOPICS, SUBS, 0.0)
    assert set(table.publishing.owners.values()) == {"pub"}
    assert set(table.subscribing.owners.values()) == {"sub"}


def test_a_subscription_of_a_deleted_topic_has_no_units() -> None:
    table = _table()
    table.update(FORWARDERS, Constraints(), TOPICS[:1], [SubscriptionUnits("s", "gone")], 0.0)
    assert not table.subscribing.owners


def test_without_forwarders_nothing_is_routed() -> None:
    table = _table()
    table.update([], Constraints(), TOPICS, SUBS, 0.0)
    assert not table.shards and table.route(publishing_unit("uid1", 0)) == ()


def test_constraints_change_by_value_and_survive_their_encoding() -> None:
    c = Constraints().drain("a").drain_zone("z").pin("projects/p/topics/t", "b")
    assert decode_constraints(encode_constraints(c)) == c
    assert c.undrain("a").undrain_zone("z").unpin("projects/p/topics/t") == Constraints()
    assert decode_constraints(b"") == Constraints()
    assert c.drains(Forwarder("x", "", "z")) and c.drains(Forwarder("a", "", "y"))
    assert not c.drains(Forwarder("x", "", "y"))


def test_colocated_a_topic_its_sources_and_its_subscriptions_share_one_route() -> None:
    table = RoutingTable(epsilon=0.25, hysteresis_s=30.0, colocate=True)
    table.update(FORWARDERS, Constraints(), TOPICS, SUBS, 0.0)
    by_uid = {t.uid: t for t in TOPICS}
    for topic in TOPICS:
        route = table.route(publishing_unit(topic.uid, 0))
        assert route and route[0] in {f.forwarder_id for f in FORWARDERS}
        assert all(
            table.route(publishing_unit(topic.uid, s)) == route for s in range(topic.sources)
        )
    for sub in SUBS:
        head = table.route(publishing_unit(sub.topic_uid, 0))
        for source in range(by_uid[sub.topic_uid].sources):
            assert table.route(subscribing_unit(sub.uid, source)) == head
    # Topics are the units placed: bounded loads hold over topics.
    topics_per_owner = table.publishing.loads()
    assert max(topics_per_owner.values()) <= math.ceil(1.25 * len(TOPICS) / len(FORWARDERS))
    assert table.units("publishing") == sum(t.sources for t in TOPICS)
    assert table.units("subscribing") == sum(by_uid[s.topic_uid].sources for s in SUBS)
    assert sum(table.loads("subscribing").values()) == table.units("subscribing")


def test_colocated_a_drained_forwarder_keeps_no_topic_and_no_subscription() -> None:
    table = RoutingTable(epsilon=0.25, hysteresis_s=30.0, colocate=True)
    table.update(FORWARDERS, Constraints(), TOPICS, SUBS, 0.0)
    table.update(FORWARDERS, Constraints().drain("f2"), TOPICS, SUBS, 1.0)
    heads = [r[0] for routes in table.shards.values() for r in routes.values()]
    assert heads and "f2" not in heads
    assert table.loads("publishing")["f2"] == 0 and table.loads("subscribing")["f2"] == 0


def test_colocated_a_heavy_topic_counts_its_weight_against_the_bound() -> None:
    """Twelve topics over two forwarders; one weighs 10 (its load, core/load.py): its owner
    keeps it and at most capacity - 10 others; its sources and subscriptions follow it."""
    table = RoutingTable(colocate=True)
    forwarders = [Forwarder("f0", "a:1"), Forwarder("f1", "b:1")]
    topics = [TopicUnits(f"projects/p/topics/t{i}", f"u{i}", 2) for i in range(12)]
    subs = [SubscriptionUnits("s0", "u0")]
    table.update(forwarders, Constraints(), topics, subs, now=0.0)
    table.update(forwarders, Constraints(), topics, subs, now=100.0, topic_weights={"u0": 10})
    assert table.publishing.capacity == math.ceil(1.25 * 21 / 2)
    owner = table.route(publishing_unit("u0", 0))[0]
    loads = table.weighted_loads("publishing")
    assert loads[owner] <= table.publishing.capacity and sum(loads.values()) == 21
    assert table.route(publishing_unit("u0", 1))[0] == owner
    assert table.route(subscribing_unit("s0", 1))[0] == owner


SPLIT = [
    Forwarder("pub1", "127.0.0.1:1", "z1", subscribing=False),
    Forwarder("pub2", "127.0.0.1:2", "z2", subscribing=False),
    Forwarder("sub1", "127.0.0.1:3", "z1", publishing=False),
    Forwarder("both", "127.0.0.1:4", "z2"),
]


def test_split_roles_place_topics_and_subscriptions_whole_each_among_its_kind() -> None:
    table = RoutingTable(epsilon=0.25, hysteresis_s=30.0, colocate=True)
    done = table.update(SPLIT, Constraints(), TOPICS, SUBS, 0.0)
    assert table.mode == "split"
    by_uid = {t.uid: t for t in TOPICS}
    for topic in TOPICS:
        route = table.route(publishing_unit(topic.uid, 0))
        assert route[0] in {"pub1", "pub2", "both"} and "sub1" not in route
        assert all(
            table.route(publishing_unit(topic.uid, s)) == route for s in range(topic.sources)
        )
    for sub in SUBS:
        route = table.route(subscribing_unit(sub.uid, 0))
        assert route[0] in {"sub1", "both"} and not {"pub1", "pub2"} & set(route)
        sources = by_uid[sub.topic_uid].sources
        assert all(table.route(subscribing_unit(sub.uid, s)) == route for s in range(sources))
    # Subscriptions are the units placed among the subscribing forwarders: bounded loads.
    assert max(table.subscribing.loads().values()) <= math.ceil(1.25 * len(SUBS) / 2)
    assert done.changed_shards == frozenset(table.shards)
    again = table.update(SPLIT, Constraints(), TOPICS, SUBS, 1.0)
    assert not again.moves and not again.changed_shards


def test_split_a_heavy_subscription_counts_its_weight_against_the_bound() -> None:
    """Ten subscriptions over two subscribing forwarders; one weighs 8 (its subscribing
    forwarder's report): its owner keeps at most capacity - 8 others."""
    table = RoutingTable(colocate=True)
    forwarders = [
        Forwarder("p", "a:1", subscribing=False),
        Forwarder("s0", "b:1", publishing=False),
        Forwarder("s1", "c:1", publishing=False),
    ]
    topics = [TopicUnits("projects/p/topics/t", "t", 1)]
    subs = [SubscriptionUnits(f"sub{i}", "t") for i in range(10)]
    table.update(forwarders, Constraints(), topics, subs, now=0.0)
    table.update(
        forwarders, Constraints(), topics, subs, now=100.0, subscription_weights={"sub0": 8}
    )
    assert table.subscribing.capacity == math.ceil(1.25 * 17 / 2)
    owner = table.route(subscribing_unit("sub0", 0))[0]
    loads = table.weighted_loads("subscribing")
    assert loads[owner] <= table.subscribing.capacity and sum(loads.values()) == 17


def test_the_roles_split_when_a_one_kind_forwarder_joins_and_rejoin_when_it_leaves() -> None:
    table = RoutingTable(epsilon=0.25, hysteresis_s=30.0, colocate=True)
    both = [Forwarder("a", "127.0.0.1:1"), Forwarder("b", "127.0.0.1:2")]
    table.update(both, Constraints(), TOPICS, SUBS, 0.0)
    assert table.mode == "colocated"
    joined = [*both, Forwarder("s", "127.0.0.1:3", publishing=False)]
    table.update(joined, Constraints(), TOPICS, SUBS, 100.0)
    assert table.mode == "split"
    owners = {table.route(subscribing_unit(s.uid, 0))[0] for s in SUBS}
    assert "s" in owners  # the subscribing-only forwarder took subscriptions
    assert all(table.route(publishing_unit(t.uid, 0))[0] in {"a", "b"} for t in TOPICS)
    table.update(both, Constraints(), TOPICS, SUBS, 200.0)
    assert table.mode == "colocated"
    for sub in SUBS:  # with their topics again
        assert table.route(subscribing_unit(sub.uid, 0)) == table.route(
            publishing_unit(sub.topic_uid, 0)
        )


def test_a_forwarders_view_of_its_topics_follows_each_shard() -> None:
    """RoutingView.owned_topics, kept per shard: a shard read again replaces only its own
    topics, a shard gone takes its topics with it."""
    view = RoutingView(Coordinator("127.0.0.1:1", "/unused"))  # never started: no I/O

    def shard(name: str, routes: dict[str, tuple[str, ...]]) -> None:
        data = routing_pb2.AssignmentShard(
            routes=[routing_pb2.Route(unit=u, forwarders=r) for u, r in routes.items()]
        ).SerializeToString()
        view._shard_read(name, (data, None))  # type: ignore[arg-type]

    shard("a", {"p/t1/0": ("f1", "f2"), "p/t1/1": ("f2",), "s/x/0": ("f2",), "p/t2/0": ("f2",)})
    shard("b", {"p/t3/0": ("f1",), "p/t4/0": ()})
    assert view.owned_topics("f1") == {"t1", "t3"} and view.owned_topics("f2") == {"t2"}
    assert view.owned_subscriptions("f2") == {"x"} and view.owned_subscriptions("f1") == set()
    shard("a", {"p/t1/0": ("f2",), "p/t2/0": ("f2",)})
    assert view.owned_topics("f1") == {"t3"} and view.owned_topics("f2") == {"t1", "t2"}
    view._shard_read("b", None)
    assert view.owned_topics("f1") == set() and view.route("p/t3/0") == ()
