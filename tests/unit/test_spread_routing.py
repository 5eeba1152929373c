"""Spread subscriptions in the routing table (control/routing_table.py, pure) and in a
forwarder's view of the published routes (control/routing_views.py): each source of a
spreadable subscription placed on its own, marked spread; other subscriptions whole."""

from __future__ import annotations

import pytest

from pubsubd._gen.pubsubd.internal.v1 import routing_pb2
from pubsubd.control.routing_store import encode_shard, spread_subscriptions
from pubsubd.control.routing_table import (
    Constraints,
    Forwarder,
    RoutingTable,
    SubscriptionUnits,
    TopicUnits,
    publishing_unit,
    subscribing_unit,
)
from pubsubd.control.routing_views import NamesView, RoutingView, spreadable
from pubsubd.coordination.paths import bucket
from pubsubd.coordination.zk import Coordinator
from pubsubd.core import pb
from pubsubd.storage.metadata import Change, SubscriptionRecord, TopicRecord

pytestmark = pytest.mark.unit

SPLIT = [
    Forwarder("pub", "127.0.0.1:1", subscribing=False),
    Forwarder("s1", "127.0.0.1:2", publishing=False),
    Forwarder("s2", "127.0.0.1:3", publishing=False),
]
TOPICS = [
    TopicUnits("projects/p/topics/busy", "busy", 8),
    TopicUnits("projects/p/topics/q", "q", 2),
]
SUBS = [
    SubscriptionUnits("hot", "busy"),
    SubscriptionUnits("whole", "busy", spreadable=False),
    SubscriptionUnits("quiet", "q"),
]


def _spread_table() -> RoutingTable:
    return RoutingTable(epsilon=0.25, hysteresis_s=30.0, colocate=True, spread_subscriptions=True)


def test_a_spreadable_subscription_has_each_source_placed_on_its_own() -> None:
    table = _spread_table()
    table.update(SPLIT, Constraints(), TOPICS, SUBS, 0.0)
    assert table.mode == "spread"
    hot = {table.route(subscribing_unit("hot", i))[0] for i in range(8)}
    assert hot == {"s1", "s2"}  # eight sources over two subscribing forwarders: both serve
    assert all(subscribing_unit("hot", i) in table.spread_units for i in range(8))
    # Not spreadable: served whole, every unit with the head's route, none marked spread.
    head = table.route(subscribing_unit("whole", 0))
    assert all(table.route(subscribing_unit("whole", i)) == head for i in range(8))
    assert not any(u.startswith("s/whole/") for u in table.spread_units)
    # Topics stay whole, among the publishing forwarders.
    assert all(table.route(publishing_unit("busy", i))[0] == "pub" for i in range(8))
    assert not table.update(SPLIT, Constraints(), TOPICS, SUBS, 1.0).changed_shards


def test_spreading_works_while_every_forwarder_is_both_kinds() -> None:
    both = [Forwarder(f"f{i}", f"127.0.0.1:{i}") for i in range(3)]
    table = _spread_table()
    table.update(both, Constraints(), TOPICS, SUBS, 0.0)
    assert table.mode == "spread"
    assert len({table.route(subscribing_unit("hot", i))[0] for i in range(8)}) > 1


def test_a_subscription_that_stops_being_spreadable_is_whole_again_and_unmarked() -> None:
    table = _spread_table()
    table.update(SPLIT, Constraints(), TOPICS, SUBS, 0.0)
    whole = [SubscriptionUnits("hot", "busy", spreadable=False), *SUBS[1:]]
    done = table.update(SPLIT, Constraints(), TOPICS, whole, 100.0)
    head = table.route(subscribing_unit("hot", 0))
    assert all(table.route(subscribing_unit("hot", i)) == head for i in range(8))
    assert not any(u.startswith("s/hot/") for u in table.spread_units)
    # Every shard whose marks changed is rewritten, even where the route stayed.
    assert {bucket(subscribing_unit("hot", i)) for i in range(8)} <= done.changed_shards


def test_spreading_by_load_spreads_only_the_busy_and_gathers_keep_the_head_s_owner() -> None:
    """``spread_only``: the subscriptions the router found busy (core/subscription_spread.py);
    the others are whole. Spreading and gathering back leave the head ``s/{uid}/0`` where it
    was, so the forwarder serving the subscription whole keeps serving (some of) it."""
    table = _spread_table()
    table.update(SPLIT, Constraints(), TOPICS, SUBS, 0.0, spread_only=set())
    assert table.mode == "spread" and not table.spread_units
    head = table.route(subscribing_unit("hot", 0))
    assert all(table.route(subscribing_unit("hot", i)) == head for i in range(8))
    done = table.update(SPLIT, Constraints(), TOPICS, SUBS, 10.0, spread_only={"hot", "whole"})
    assert set(table.spread_units) == {subscribing_unit("hot", i) for i in range(8)}
    assert {table.route(subscribing_unit("hot", i))[0] for i in range(8)} == {"s1", "s2"}
    assert table.route(subscribing_unit("hot", 0)) == head
    assert not any(m.unit == subscribing_unit("hot", 0) and m.source for m in done.moves)
    quiet_head = table.route(subscribing_unit("quiet", 0))
    assert table.route(subscribing_unit("quiet", 1)) == quiet_head  # not busy: whole
    table.update(SPLIT, Constraints(), TOPICS, SUBS, 20.0, spread_only=set())
    assert not table.spread_units
    assert all(table.route(subscribing_unit("hot", i)) == head for i in range(8))


def test_a_width_places_that_many_heads_and_every_source_follows_one() -> None:
    """``spread_widths``: a subscription of width k has heads ``s/{uid}/i`` (i < k) placed
    on their own and source j following head j mod k; every unit is marked spread and the
    width is published with it (``Route.spread_width``); a change of width rewrites the
    shards, the head ``s/{uid}/0`` staying where it was."""
    subscribing = [Forwarder(f"s{i}", f"127.0.0.1:{i}", publishing=False) for i in range(4)]
    forwarders = [SPLIT[0], *subscribing]
    table = _spread_table()
    table.update(forwarders, Constraints(), TOPICS, SUBS, 0.0, spread_only=set())
    head = table.route(subscribing_unit("hot", 0))
    table.update(
        forwarders, Constraints(), TOPICS, SUBS, 10.0, spread_only={"hot"}, spread_widths={"hot": 3}
    )
    routes = [table.route(subscribing_unit("hot", i)) for i in range(8)]
    assert routes[0] == head
    assert all(routes[j] == routes[j % 3] for j in range(8))
    assert len({r[0] for r in routes[:3]}) == 3  # three heads on three forwarders
    assert {table.spread_width(subscribing_unit("hot", i)) for i in range(8)} == {3}
    assert table.spread_width(subscribing_unit("quiet", 0)) == 0
    shard = bucket(subscribing_unit("hot", 5))
    data = encode_shard(
        table.shards[shard], 1, "r", lambda _: None, table.spread_units.__contains__,
        table.spread_width,
    )  # fmt: skip
    assert spread_subscriptions(data) == {"hot": 3}
    done = table.update(
        forwarders, Constraints(), TOPICS, SUBS, 20.0, spread_only={"hot"}, spread_widths={"hot": 4}
    )
    routes = [table.route(subscribing_unit("hot", i)) for i in range(8)]
    assert routes[0] == head and len({r[0] for r in routes}) == 4
    assert all(routes[j] == routes[j % 4] for j in range(8))
    assert {bucket(subscribing_unit("hot", i)) for i in range(8)} <= done.changed_shards
    # Wider than the topic's sources: every source apart; none given: every source apart too.
    table.update(
        forwarders, Constraints(), TOPICS, SUBS, 30.0, spread_only={"hot", "quiet"},
        spread_widths={"hot": 4, "quiet": 9},
    )  # fmt: skip
    assert table.spread_width(subscribing_unit("quiet", 1)) == 2


def test_the_default_places_subscriptions_whole() -> None:
    table = RoutingTable(epsilon=0.25, hysteresis_s=30.0, colocate=True)
    table.update(SPLIT, Constraints(), TOPICS, SUBS, 0.0)
    assert table.mode == "split" and not table.spread_units
    head = table.route(subscribing_unit("hot", 0))
    assert all(table.route(subscribing_unit("hot", i)) == head for i in range(8))


def test_a_forwarder_reads_the_sources_it_owns_of_each_spread_subscription() -> None:
    table = _spread_table()
    table.update(SPLIT, Constraints(), TOPICS, SUBS, 0.0)
    view = RoutingView(Coordinator("127.0.0.1:1", "/unused"))  # never started: no I/O
    for shard, routes in table.shards.items():
        data = encode_shard(routes, 1, "r", lambda _: None, table.spread_units.__contains__)
        view._shard_read(shard, (data, None))  # type: ignore[arg-type]
    whole_owners = []
    for forwarder in ("s1", "s2"):
        owned = view.owned_subscription_sources(forwarder)
        mine = {i for i in range(8) if table.route(subscribing_unit("hot", i))[0] == forwarder}
        assert owned["hot"] == mine
        if "whole" in owned:
            assert owned["whole"] is None  # served whole, unrestricted
            whole_owners.append(forwarder)
    assert whole_owners == [table.route(subscribing_unit("whole", 0))[0]]
    assert view.spread(subscribing_unit("hot", 3)) and not view.spread(subscribing_unit("whole", 0))
    assert view.owned_subscription_sources("pub") == {}


def _record(labels: dict[str, str]) -> SubscriptionRecord:
    body = pb.Subscription(
        name="projects/p/subscriptions/s", topic="projects/p/topics/t", labels=labels
    ).SerializeToString()
    return SubscriptionRecord("projects/p/subscriptions/s", "u", "t", body, {})


def test_only_shared_subscriptions_without_a_quota_of_their_own_may_be_spread() -> None:
    assert spreadable(_record({}))
    assert spreadable(_record({"pubsubd-subscription-type": "key_shared"}))
    assert not spreadable(_record({"pubsubd-subscription-type": "exclusive"}))
    assert not spreadable(_record({"pubsubd-subscription-type": "failover"}))
    assert not spreadable(_record({"pubsubd-backlog-quota-messages": "10"}))


def test_a_shard_without_marks_reads_as_whole_subscriptions() -> None:
    """A shard written by a router of the previous release has no ``spread``: whole."""
    view = RoutingView(Coordinator("127.0.0.1:1", "/unused"))
    data = routing_pb2.AssignmentShard(
        routes=[routing_pb2.Route(unit="s/x/0", forwarders=["f1"])]
    ).SerializeToString()
    view._shard_read("a", (data, None))  # type: ignore[arg-type]
    assert view.owned_subscription_sources("f1") == {"x": None}


def _topic_record(labels: dict[str, str]) -> TopicRecord:
    body = pb.Topic(name="projects/p/topics/t", labels=labels).SerializeToString()
    return TopicRecord("projects/p/topics/t", "t", body)


def test_a_subscription_of_a_topic_whose_quota_evicts_is_served_whole() -> None:
    """Eviction is the dispatcher's, and a dispatcher serving part of a subscription would
    count the other sources' backlog as of its attach: too high, so it would evict early. Its
    topic's quota changing (either way, or the topic deleted) changes it at once."""
    view = NamesView(Coordinator("127.0.0.1:1", "/unused"))
    evicting = {"pubsubd-backlog-quota-messages": "10", "pubsubd-backlog-policy": "evict_oldest"}
    view._changed(Change(_topic_record(evicting)))
    view._changed(Change(_record({})))
    assert not view.subscriptions["projects/p/subscriptions/s"].spreadable
    view._changed(Change(_topic_record({"pubsubd-backlog-quota-messages": "10"})))  # blocks
    assert view.subscriptions["projects/p/subscriptions/s"].spreadable
    view._changed(Change(_topic_record(evicting)))
    assert not view.subscriptions["projects/p/subscriptions/s"].spreadable
    view._changed(Change(_topic_record(evicting), deleted=True))
    assert view.subscriptions["projects/p/subscriptions/s"].spreadable
