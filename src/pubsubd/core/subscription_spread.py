"""Spreading subscriptions by load (pure): which spreadable subscriptions the router places by
source over several subscribing forwarders (``control/routing_table.py``), and which it serves
whole again.

A subscription's load is what all its subscribing forwarders together report for it (messages
delivered per second and leases held, EWMAs from ``core/load.py``, summed over the forwarders
serving it), in *forwarders' worth*: the larger of messages/s over ``messages_per_forwarder``
and leases over ``outstanding_per_forwarder``. A whole subscription over ``spread_share`` of
one forwarder's worth for ``spread_after_s`` is spread; a spread one under ``gather_ratio`` of
that threshold for ``gather_after_s`` (longer) is gathered back to one forwarder.

Hysteresis, so no subscription goes back and forth (Pulsar's unload ping-pong):

* the load is the sum over the forwarders that serve the subscription, so spreading it does not
  change it (a per-forwarder figure would halve on spreading and look quiet);
* the two thresholds are apart (``gather_ratio`` < 1): a load between them changes nothing;
* a change restarts both windows, so a spread follows the last change by ``spread_after_s`` at
  least and a gather by ``gather_after_s`` (≥ ``spread_after_s``) at least;
* a router that takes over starts from the published assignment's spread subscriptions
  (``Route.spread``), so a router restart gathers nothing.

The decision is made by the leading router (``router/main.py``), which reads the load reports
and applies it in its next pass; the forwarders and frontends follow the published routes, with
the moves' usual pre-assignment (the new owner of a source is named in the same route that
takes it from the old one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pubsubd.core.load import Load

__all__ = [
    "SPREAD_ALL",
    "SPREAD_BY_LOAD",
    "SPREAD_MODES",
    "SPREAD_OFF",
    "Changes",
    "SpreadSettings",
    "SubscriptionSpread",
]

# How a router spreads subscriptions (``pubsubd router --spread-subscriptions [--spread-all]``).
SPREAD_OFF = "off"  # every subscription whole
SPREAD_BY_LOAD = "load"  # spreadable subscriptions spread while busy (this module)
SPREAD_ALL = "all"  # every spreadable subscription spread, whatever its load
SPREAD_MODES = (SPREAD_OFF, SPREAD_BY_LOAD, SPREAD_ALL)


@dataclass(frozen=True, slots=True)
class SpreadSettings:
    """One subscribing forwarder's capacity and how eagerly subscriptions spread and gather."""

    messages_per_forwarder: float = 10_000.0  # messages/s one subscribing forwarder delivers
    outstanding_per_forwarder: float = 100_000.0  # leases one holds
    spread_share: float = 0.5  # spread over this share of one forwarder's capacity...
    spread_after_s: float = 30.0  # ... for this long
    gather_ratio: float = 0.5  # gather under this ratio of the spread threshold...
    gather_after_s: float = 300.0  # ... for this long

    def __post_init__(self) -> None:
        if not (self.messages_per_forwarder > 0 and self.outstanding_per_forwarder > 0):
            raise ValueError("a forwarder's capacity must be positive")
        if not self.spread_share > 0:
            raise ValueError(f"the spread share must be positive, got {self.spread_share}")
        if not 0 < self.gather_ratio < 1:
            raise ValueError(f"need 0 < gather ratio < 1, got {self.gather_ratio}")
        if not 0 <= self.spread_after_s <= self.gather_after_s:
            raise ValueError(
                "need 0 <= spread window <= gather window, got "
                f"{self.spread_after_s} and {self.gather_after_s}"
            )

    @property
    def gather_share(self) -> float:
        """Under this share of one forwarder's capacity a spread subscription is quiet."""
        return self.spread_share * self.gather_ratio

    def utilization(self, load: Load) -> float:
        """The subscription's load in forwarders' worth of capacity."""
        return max(
            max(0.0, load.messages_per_s) / self.messages_per_forwarder,
            max(0, load.outstanding) / self.outstanding_per_forwarder,
        )


@dataclass(frozen=True, slots=True)
class Changes:
    """What one :meth:`SubscriptionSpread.decide` changed."""

    spread: frozenset[str]
    gathered: frozenset[str]


class SubscriptionSpread:
    """The spread subscriptions, and per subscription since when it has been busy (whole) or
    quiet (spread)."""

    def __init__(self, settings: SpreadSettings, spread: Iterable[str] = ()) -> None:
        """``spread``: the subscriptions spread already (a router taking over: those of the
        published assignment)."""
        self.settings = settings
        self.spread: set[str] = set(spread)
        self._busy_since: dict[str, float] = {}
        self._quiet_since: dict[str, float] = {}

    def decide(self, candidates: Iterable[str], loads: Mapping[str, Load], now: float) -> Changes:
        """One pass at ``now``: ``candidates`` are the subscriptions that may be spread
        (others are forgotten, and gathered if spread); ``loads`` their summed loads (a
        subscription left out is idle)."""
        settings = self.settings
        wanted = set(candidates)
        gathered = {uid for uid in self.spread if uid not in wanted}
        self.spread -= gathered
        for timers in (self._busy_since, self._quiet_since):
            for uid in [u for u in timers if u not in wanted]:
                del timers[uid]
        spread: set[str] = set()
        idle = Load()
        for uid in wanted:
            used = settings.utilization(loads.get(uid, idle))
            if uid not in self.spread:
                self._quiet_since.pop(uid, None)
                if used <= settings.spread_share:
                    self._busy_since.pop(uid, None)
                    continue
                since = self._busy_since.setdefault(uid, now)
                if now - since >= settings.spread_after_s:
                    del self._busy_since[uid]
                    self.spread.add(uid)
                    spread.add(uid)
                continue
            self._busy_since.pop(uid, None)
            if used >= settings.gather_share:
                self._quiet_since.pop(uid, None)
                continue
            since = self._quiet_since.setdefault(uid, now)
            if now - since >= settings.gather_after_s:
                del self._quiet_since[uid]
                self.spread.discard(uid)
                gathered.add(uid)
        return Changes(frozenset(spread), frozenset(gathered))

    def timers(self) -> set[str]:
        """Subscriptions with a window running."""
        return set(self._busy_since) | set(self._quiet_since)
