"""The router's routing table (pure): forwarders, constraints, topics and subscriptions in,
an ordered list of forwarders per unit out, in shards for ZooKeeper.

Units (SCALE_OUT.md §3, issue 11): every publish message source of a topic,
``p/{topic uid}/{source}``, is owned by one publishing forwarder (its ledger writer); every
source of a subscription's topic, ``s/{subscription uid}/{source}``, by one subscribing
forwarder. Two :class:`~pubsubd.control.assignment.Assignment` state machines place them
(bounded loads, stickiness, hysteresis); this module turns the cluster's state into their
members, units and pins, and their owners into the lists frontends use: the owner first, then
the next forwarders of that kind on the unit's walk of the hash ring (``ROUTE_FALLBACKS`` of
them; drained ones last). A frontend moves
the fallbacks of its own zone to the front; the owner stays first, since a source has one
writer wherever the caller is.

Whole units (``colocate=True``, what ``pubsubd router`` runs): a forwarder serves a topic whole
(every source) and a subscription whole, so only the heads are placed, ``p/{uid}/0`` and
``s/{uid}/0``; every other unit of the topic or subscription gets its head's route. While every
registered forwarder is both publishing and subscribing, the subscriptions go with their topics
(*co-located*: ``data/ownership.py``; no copy of a topic is made anywhere). Once some
forwarder serves only one kind (``pubsubd forwarder --no-publishing``/``--no-subscribing``),
the roles are *split*: topics are placed among the publishing forwarders and subscriptions
among the subscribing ones, each with its own assignment, and a subscribing forwarder reads a
topic owned elsewhere from a copy (``data/subscribe/remote_sources.py``). ``colocate=False``
places every source of every topic and subscription on its own (no forwarder serves a
topic's sources apart: ``pubsubd router`` never runs it).

Spread subscriptions (``spread_subscriptions=True``, ``pubsubd router --spread-subscriptions``):
topics are placed whole among the publishing forwarders and every subscription that may be
spread (``SubscriptionUnits.spreadable``: shared and key_shared ones without a backlog quota of
their own, of a topic whose quota does not evict) and that the router spreads
(``update(spread_only=)``: the busy ones, ``core/subscription_spread.py``; all with
``--spread-all``) is placed over ``k`` subscribing
forwarders (its width, ``update(spread_widths=)``, chosen by load; every source apart with
``--spread-all``): ``k`` heads ``s/{uid}/i`` (i < k) placed on their own, source ``j``
following head ``j mod k``, so a busy subscription is served by several, each owning some of
the topic's sources (an ordering key maps to one source, so to one forwarder: per-key order
holds). Other subscriptions are placed
whole (``s/{uid}/0``). This is the split placement, also while every
forwarder is both kinds (``mode == "spread"``): a subscription served where its topic is owned
reads it in-process, elsewhere from a copy. A forwarder serves the sources of a subscription
it owns (``RoutingView.owned_subscription_sources``); frontends fan a StreamingPull out to
every owner (``frontend/fanout.py``).

Routing constraints (the seeds' rules saying which forwarders may be sent work): a drained
forwarder, or every forwarder of a drained zone, owns nothing and stays a last fallback; a
pinned topic's publish message sources go to the pinned forwarder while it is registered and
not drained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

from pubsubd.control.assignment import (
    DEFAULT_EPSILON,
    DEFAULT_HYSTERESIS_S,
    Assignment,
    Member,
    Move,
)
from pubsubd.coordination.paths import bucket

__all__ = [
    "Constraints",
    "Forwarder",
    "RoutingTable",
    "SubscriptionUnits",
    "TopicUnits",
    "publishing_unit",
    "subscribing_unit",
    "unit_kind",
]

PUBLISHING = "p"
SUBSCRIBING = "s"
# Fallbacks per route after the owner: enough to ride out a few forwarders going at once.
ROUTE_FALLBACKS = 3


def publishing_unit(topic_uid: str, source: int) -> str:
    return f"{PUBLISHING}/{topic_uid}/{source}"


def subscribing_unit(subscription_uid: str, source: int) -> str:
    return f"{SUBSCRIBING}/{subscription_uid}/{source}"


def unit_kind(unit: str) -> str:
    """``"publishing"`` or ``"subscribing"``."""
    return "publishing" if unit.startswith(PUBLISHING + "/") else "subscribing"


@dataclass(frozen=True, slots=True)
class Forwarder:
    """A registered forwarder process."""

    forwarder_id: str
    address: str
    zone: str = ""
    version: str = ""
    publishing: bool = True
    subscribing: bool = True


@dataclass(frozen=True, slots=True)
class Constraints:
    """Routing constraints; every change returns a new value (stored by compare-and-set)."""

    drained: frozenset[str] = frozenset()
    drained_zones: frozenset[str] = frozenset()
    pinned_topics: Mapping[str, str] = field(default_factory=dict)  # topic name -> forwarder

    def drains(self, forwarder: Forwarder) -> bool:
        return forwarder.forwarder_id in self.drained or forwarder.zone in self.drained_zones

    def drain(self, forwarder_id: str) -> Constraints:
        return replace(self, drained=self.drained | {forwarder_id})

    def undrain(self, forwarder_id: str) -> Constraints:
        return replace(self, drained=self.drained - {forwarder_id})

    def drain_zone(self, zone: str) -> Constraints:
        return replace(self, drained_zones=self.drained_zones | {zone})

    def undrain_zone(self, zone: str) -> Constraints:
        return replace(self, drained_zones=self.drained_zones - {zone})

    def pin(self, topic: str, forwarder_id: str) -> Constraints:
        return replace(self, pinned_topics={**self.pinned_topics, topic: forwarder_id})

    def unpin(self, topic: str) -> Constraints:
        return replace(
            self, pinned_topics={t: f for t, f in self.pinned_topics.items() if t != topic}
        )


@dataclass(frozen=True, slots=True)
class TopicUnits:
    name: str
    uid: str
    sources: int


@dataclass(frozen=True, slots=True)
class SubscriptionUnits:
    uid: str
    topic_uid: str
    # May be served by several subscribing forwarders by source (with spread subscriptions):
    # not exclusive or failover (one client for the whole subscription), no backlog quota of
    # its own (each forwarder sees the ack state of its own sources only), nor one of a topic
    # whose quota is evict_oldest (control/routing_views.py: it would evict early).
    spreadable: bool = True


@dataclass(frozen=True, slots=True)
class Pass:
    """What one :meth:`RoutingTable.update` did."""

    moves: tuple[Move, ...]
    changed_shards: frozenset[str]  # buckets whose routes differ from before


class RoutingTable:
    """Both assignments and the routes they give, by shard."""

    def __init__(
        self,
        *,
        epsilon: float = DEFAULT_EPSILON,
        hysteresis_s: float = DEFAULT_HYSTERESIS_S,
        colocate: bool = False,
        spread_subscriptions: bool = False,
    ) -> None:
        self.colocate = colocate
        self.spread_subscriptions = spread_subscriptions
        # With whole units: "colocated" or "split" (see the module docstring), by the members;
        # "spread" with spread subscriptions.
        self.mode = "colocated" if colocate else "sources"
        self.publishing = Assignment(epsilon=epsilon, hysteresis_s=hysteresis_s)
        self.subscribing = Assignment(epsilon=epsilon, hysteresis_s=hysteresis_s)
        self.forwarders: dict[str, Forwarder] = {}
        self.shards: dict[str, dict[str, tuple[str, ...]]] = {}  # bucket -> unit -> route
        # The routed units of spread subscriptions (``Route.spread``), and the width of each
        # spread subscription by uid (``Route.spread_width``; left out: every source apart).
        self.spread_units: set[str] = set()
        self.spread_widths: dict[str, int] = {}
        # The members each assignment last routed with: routes change only with them or with
        # their unit's owner, so a pass recomputes only those.
        self._routed_with: dict[str, tuple[tuple[str, str, bool], ...]] = {}

    def update(
        self,
        forwarders: Iterable[Forwarder],
        constraints: Constraints,
        topics: Iterable[TopicUnits],
        subscriptions: Iterable[SubscriptionUnits],
        now: float,
        topic_weights: Mapping[str, int] | None = None,
        subscription_weights: Mapping[str, int] | None = None,
        spread_only: AbstractSet[str] | None = None,
        spread_widths: Mapping[str, int] | None = None,
    ) -> Pass:
        """Place every unit among the registered forwarders at time ``now``. ``topic_weights``:
        a topic's weight by uid (``core/load.py``; 1 if left out), shared by its sources;
        ``subscription_weights``: a subscription's, when the roles are split; ``spread_only``:
        with spread subscriptions, the uids of those to spread (``core/subscription_spread.py``
        decides by load; None: every spreadable one); ``spread_widths``: over how many
        forwarders each is spread (left out: every source placed apart)."""
        self.forwarders = {f.forwarder_id: f for f in forwarders}
        topic_weights = topic_weights or {}
        if self.colocate:
            split = any(not (f.publishing and f.subscribing) for f in self.forwarders.values())
            mode = "split" if split else "colocated"
            if self.spread_subscriptions:
                mode = "spread"
            if mode != self.mode:
                self.mode = mode
                self._routed_with.clear()  # every route is recomputed in the new mode
            if mode != "colocated":
                return self._update_split(
                    constraints,
                    list(topics),
                    list(subscriptions),
                    now,
                    topic_weights,
                    subscription_weights or {},
                    spread_only,
                    spread_widths or {},
                )
            return self._update_colocated(
                constraints, list(topics), subscriptions, now, topic_weights
            )
        topics = list(topics)
        sources = {t.uid: t.sources for t in topics}
        publishing_units = [publishing_unit(t.uid, s) for t in topics for s in range(t.sources)]
        # A subscription of a deleted topic (detached) has no messages to serve.
        subscribing_units = [
            subscribing_unit(s.uid, i)
            for s in subscriptions
            if s.topic_uid in sources
            for i in range(sources[s.topic_uid])
        ]
        pins = {
            publishing_unit(t.uid, s): constraints.pinned_topics[t.name]
            for t in topics
            if t.name in constraints.pinned_topics
            for s in range(t.sources)
        }
        publishing = self._members(constraints, publishing=True)
        subscribing = self._members(constraints, publishing=False)
        weights = {
            publishing_unit(t.uid, s): -(-topic_weights[t.uid] // t.sources)
            for t in topics
            if t.uid in topic_weights and t.sources
            for s in range(t.sources)
        }
        moves = [
            *self.publishing.update(publishing, publishing_units, now, pins, weights),
            *self.subscribing.update(subscribing, subscribing_units, now),
        ]
        changed: set[str] = set()
        for kind, assignment, members in (
            ("publishing", self.publishing, publishing),
            ("subscribing", self.subscribing, subscribing),
        ):
            prefix = PUBLISHING if kind == "publishing" else SUBSCRIBING
            with_members = tuple(sorted((m.member_id, m.zone, m.drained) for m in members))
            everything = self._routed_with.get(kind) != with_members
            self._routed_with[kind] = with_members
            moved = {m.unit for m in moves if unit_kind(m.unit) == kind}
            for shard, routes in list(self.shards.items()):
                gone = [
                    u for u in routes if u.startswith(prefix + "/") and u not in assignment.owners
                ]
                for unit in gone:
                    del routes[unit]
                    changed.add(shard)
                if not routes:
                    del self.shards[shard]
            for unit in assignment.owners:
                shard = bucket(unit)
                routes = self.shards.setdefault(shard, {})
                if not everything and unit not in moved and unit in routes:
                    continue
                route = tuple(assignment.ranked(unit, limit=ROUTE_FALLBACKS))
                if routes.get(unit) != route:
                    routes[unit] = route
                    changed.add(shard)
        return Pass(tuple(moves), frozenset(changed))

    def _update_colocated(
        self,
        constraints: Constraints,
        topics: list[TopicUnits],
        subscriptions: Iterable[SubscriptionUnits],
        now: float,
        topic_weights: Mapping[str, int],
    ) -> Pass:
        """Place each topic (its unit ``p/{uid}/0``, weighing the topic's weight); every unit
        of the topic and of its subscriptions follows it."""
        pins = {
            publishing_unit(t.uid, 0): constraints.pinned_topics[t.name]
            for t in topics
            if t.name in constraints.pinned_topics
        }
        members = self._members(constraints, publishing=True)
        heads = [publishing_unit(t.uid, 0) for t in topics]
        weights = {publishing_unit(uid, 0): w for uid, w in topic_weights.items()}
        moves = self.publishing.update(members, heads, now, pins, weights)
        with_members = tuple(sorted((m.member_id, m.zone, m.drained) for m in members))
        everything = self._routed_with.get("colocated") != with_members
        self._routed_with["colocated"] = with_members
        moved = {m.unit for m in moves}
        wanted: dict[str, tuple[str, ...]] = {}
        by_topic: dict[str, tuple[str, ...]] = {}
        for t in topics:
            head = publishing_unit(t.uid, 0)
            route = self.route(head)
            if everything or head in moved or not route:
                route = tuple(self.publishing.ranked(head, limit=ROUTE_FALLBACKS))
            if not route:
                continue  # no forwarder to take it
            by_topic[t.uid] = route
            for source in range(t.sources):
                wanted[publishing_unit(t.uid, source)] = route
        sources = {t.uid: t.sources for t in topics}
        for sub in subscriptions:
            topic_route = by_topic.get(sub.topic_uid)
            if topic_route is not None:
                for source in range(sources[sub.topic_uid]):
                    wanted[subscribing_unit(sub.uid, source)] = topic_route
        return Pass(tuple(moves), self._publish(wanted))

    def _update_split(
        self,
        constraints: Constraints,
        topics: list[TopicUnits],
        subscriptions: list[SubscriptionUnits],
        now: float,
        topic_weights: Mapping[str, int],
        subscription_weights: Mapping[str, int],
        spread_only: AbstractSet[str] | None = None,
        spread_widths: Mapping[str, int] | None = None,
    ) -> Pass:
        """Place each topic whole among the publishing forwarders (its unit ``p/{uid}/0``) and
        each subscription whole among the subscribing ones (``s/{uid}/0``); every other unit
        of a topic or subscription follows its head. Spread, a spreadable subscription (of
        those in ``spread_only``, when given) of width ``k`` (``spread_widths``; every source
        when left out) has ``k`` heads ``s/{uid}/i`` (i < k) placed on their own, source
        ``j`` following head ``j mod k`` (its weight shared among the heads, each head kept
        on a forwarder of its own while there are enough: ``Assignment`` groups)."""
        spread_widths = spread_widths or {}
        widths: dict[str, int] = {}
        pins = {
            publishing_unit(t.uid, 0): constraints.pinned_topics[t.name]
            for t in topics
            if t.name in constraints.pinned_topics
        }
        sources = {t.uid: t.sources for t in topics}
        live = [s for s in subscriptions if s.topic_uid in sources]
        weights = {publishing_unit(uid, 0): w for uid, w in topic_weights.items()}
        # Each placed unit and the units that follow it (itself included).
        subscription_heads: list[tuple[str, list[str]]] = []
        subscription_unit_weights: dict[str, int] = {}
        spread: set[str] = set()
        apart: dict[str, str] = {}  # a spread subscription's heads, by its uid
        for sub in live:
            count = sources[sub.topic_uid]
            units = [subscribing_unit(sub.uid, i) for i in range(count)]
            weight = subscription_weights.get(sub.uid)
            if (
                self.spread_subscriptions
                and sub.spreadable
                and (spread_only is None or sub.uid in spread_only)
            ):
                width = max(1, min(spread_widths.get(sub.uid, count), count))
                if count:
                    widths[sub.uid] = width
                firsts = units[:width]
                subscription_heads.extend((h, units[i::width]) for i, h in enumerate(firsts))
                apart.update(dict.fromkeys(firsts, sub.uid))  # each head on its own forwarder
                spread.update(units)
                if weight is not None and count:
                    for unit in firsts:
                        subscription_unit_weights[unit] = -(-weight // width)
            else:
                subscription_heads.append((units[0] if units else "", units))
                if weight is not None:
                    subscription_unit_weights[subscribing_unit(sub.uid, 0)] = weight
        placed: list[
            tuple[
                str,
                Assignment,
                list[Member],
                list[tuple[str, list[str]]],
                dict[str, str],
                dict[str, int],
                dict[str, str],
            ]
        ] = [
            (
                "split-publishing",
                self.publishing,
                self._members(constraints, publishing=True),
                [
                    (
                        publishing_unit(t.uid, 0),
                        [publishing_unit(t.uid, i) for i in range(t.sources)],
                    )
                    for t in topics
                ],
                pins,
                weights,
                {},
            ),
            (
                "split-subscribing",
                self.subscribing,
                self._members(constraints, publishing=False),
                [(head, units) for head, units in subscription_heads if head],
                {},
                subscription_unit_weights,
                apart,
            ),
        ]
        moves: list[Move] = []
        wanted: dict[str, tuple[str, ...]] = {}
        for key, assignment, members, heads, kind_pins, kind_weights, groups in placed:
            kind_moves = assignment.update(
                members, [h for h, _ in heads], now, kind_pins, kind_weights, groups
            )
            moves.extend(kind_moves)
            with_members = tuple(sorted((m.member_id, m.zone, m.drained) for m in members))
            everything = self._routed_with.get(key) != with_members
            self._routed_with[key] = with_members
            moved = {m.unit for m in kind_moves}
            for head, units in heads:
                route = self.route(head)
                if everything or head in moved or not route:
                    route = tuple(assignment.ranked(head, limit=ROUTE_FALLBACKS))
                if not route:
                    continue  # no forwarder of this kind to take it
                for unit in units:
                    wanted[unit] = route
        return Pass(tuple(moves), self._publish(wanted, spread, widths))

    def _publish(
        self,
        wanted: Mapping[str, tuple[str, ...]],
        spread: set[str] | None = None,
        widths: Mapping[str, int] | None = None,
    ) -> frozenset[str]:
        """Make the shards hold exactly ``wanted`` (``spread``: the units of it that are
        spread subscriptions', ``widths`` those subscriptions' widths); returns the shards
        that changed."""
        spread = {u for u in spread or () if u in wanted}
        changed: set[str] = {bucket(u) for u in spread ^ self.spread_units}
        widths = dict(widths or {})
        for unit in spread & self.spread_units:
            uid = unit.split("/")[1]
            if widths.get(uid) != self.spread_widths.get(uid):
                changed.add(bucket(unit))
        self.spread_units = spread
        self.spread_widths = widths
        for shard, routes in list(self.shards.items()):
            for unit in [u for u in routes if u not in wanted]:
                del routes[unit]
                changed.add(shard)
            if not routes:
                del self.shards[shard]
        for unit, route in wanted.items():
            shard = bucket(unit)
            routes = self.shards.setdefault(shard, {})
            if routes.get(unit) != route:
                routes[unit] = route
                changed.add(shard)
        return frozenset(changed)

    def units(self, kind: str) -> int:
        """How many units of ``kind`` ("publishing" or "subscribing") have a route."""
        prefix = (PUBLISHING if kind == "publishing" else SUBSCRIBING) + "/"
        return sum(1 for r in self.shards.values() for u in r if u.startswith(prefix))

    def loads(self, kind: str) -> dict[str, int]:
        """Units of ``kind`` each forwarder owns (heads of their routes)."""
        prefix = (PUBLISHING if kind == "publishing" else SUBSCRIBING) + "/"
        out = {
            f.forwarder_id: 0
            for f in self.forwarders.values()
            if (f.publishing if kind == "publishing" else f.subscribing)
        }
        for routes in self.shards.values():
            for unit, route in routes.items():
                if route and unit.startswith(prefix):
                    out[route[0]] = out.get(route[0], 0) + 1
        return out

    def weighted_loads(self, kind: str) -> dict[str, int]:
        """The weight of the units each forwarder owns (what the bound is in)."""
        return (self.publishing if kind == "publishing" else self.subscribing).weighted_loads()

    def _members(self, constraints: Constraints, *, publishing: bool) -> list[Member]:
        return [
            Member(f.forwarder_id, f.zone, constraints.drains(f))
            for f in self.forwarders.values()
            if (f.publishing if publishing else f.subscribing)
        ]

    def last_moved(self, unit: str) -> float | None:
        """When the unit placed as ``unit`` last changed owner (None: not since placed, or a
        unit that follows another, co-located)."""
        kind = self.publishing if unit_kind(unit) == "publishing" else self.subscribing
        return kind.last_moved(unit)

    def restore(self, unit: str, owner: str, moved_at: float | None) -> None:
        """Seed a unit's owner from the published assignment (see ``Assignment.restore``)."""
        kind = self.publishing if unit_kind(unit) == "publishing" else self.subscribing
        kind.restore(unit, owner, moved_at)

    def spread_width(self, unit: str) -> int:
        """The width of the spread subscription ``unit`` is of (0: not spread)."""
        if unit not in self.spread_units:
            return 0
        return self.spread_widths.get(unit.split("/")[1], 0)

    def route(self, unit: str) -> tuple[str, ...]:
        """The unit's ordered list of forwarder IDs (empty: no forwarder can take it)."""
        return self.shards.get(bucket(unit), {}).get(unit, ())
