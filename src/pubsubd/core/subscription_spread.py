"""Spreading subscriptions by load (pure): which spreadable subscriptions the router places by
source over several subscribing forwarders (``control/routing_table.py``), and which it serves
whole again.

A subscription's load is what all its subscribing forwarders together report for it (messages
delivered per second and leases held, EWMAs from ``core/load.py``, summed over the forwarders
serving it), in *forwarders' worth*: the larger of messages/s over ``messages_per_forwarder``
and leases over ``outstanding_per_forwarder``. A whole subscription over ``spread_share`` of
one forwarder's worth for ``spread_after_s`` is spread; a spread one under ``gather_ratio`` of
that threshold for ``gather_after_s`` (longer) is gathered back to one forwarder.

The *width* of a spread subscription, how many subscribing forwarders it is placed over, is
chosen by load the same way: wide enough that each forwarder's share stays at most the spread
share (:func:`busy_width`, at least 2), at most the live subscribing forwarders and its
topic's sources (``limits``). Wanting more for ``spread_after_s`` widens it; fitting in fewer
with each share under the gather share (:func:`quiet_width`) for ``gather_after_s`` narrows it
(to 1: gathered). A width between the two changes nothing. The routing table places a
subscription of width ``k`` as ``k`` heads ``s/{uid}/i`` (i < k), source ``j`` following head
``j mod k``; the router publishes the width (``Route.spread_width``).

Hysteresis, so no subscription goes back and forth (Pulsar's unload ping-pong):

* the load is the sum over the forwarders that serve the subscription, so spreading it does not
  change it (a per-forwarder figure would halve on spreading and look quiet);
* the two thresholds are apart (``gather_ratio`` < 1): a load between them changes nothing;
* a change restarts both windows, so a spread follows the last change by ``spread_after_s`` at
  least and a gather by ``gather_after_s`` (≥ ``spread_after_s``) at least;
* a router that takes over starts from the published assignment's spread subscriptions and
  their widths (``Route.spread``, ``Route.spread_width``), so a router restart changes nothing.

The decision is made by the leading router (``router/main.py``), which reads the load reports
and applies it in its next pass; the forwarders and frontends follow the published routes, with
the moves' usual pre-assignment (the new owner of a source is named in the same route that
takes it from the old one).
"""

from __future__ import annotations

import math
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
    "busy_width",
    "quiet_width",
]

# How a router spreads subscriptions (``pubsubd router --spread-subscriptions [--spread-all]``).
SPREAD_OFF = "off"  # every subscription whole
SPREAD_BY_LOAD = "load"  # spreadable subscriptions spread while busy (this module)
SPREAD_ALL = "all"  # every spreadable subscription spread, whatever its load
SPREAD_MODES = (SPREAD_OFF, SPREAD_BY_LOAD, SPREAD_ALL)
_NO_LIMIT = 1 << 16  # more forwarders than any width needs
_EPSILON = 1e-9  # float noise at a threshold does not change a width


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
    resized: frozenset[str] = frozenset()  # spread ones whose width changed


def busy_width(settings: SpreadSettings, used: float) -> int:
    """The fewest forwarders over which each share of ``used`` (forwarders' worth) is at most
    the spread share: under it a subscription is busy (1: not busy at all)."""
    return max(1, math.ceil(used / settings.spread_share - _EPSILON))


def quiet_width(settings: SpreadSettings, used: float) -> int:
    """The fewest forwarders over which each share of ``used`` is under the gather share:
    over it a subscription is quiet (1: quiet enough to be served whole). Never under
    :func:`busy_width`, so no load both widens and narrows."""
    return math.floor(used / settings.gather_share + _EPSILON) + 1


class SubscriptionSpread:
    """The spread subscriptions and the width of each (how many subscribing forwarders it is
    placed over), and per subscription since when it has wanted to be wider (busy) or
    narrower (quiet)."""

    def __init__(
        self, settings: SpreadSettings, spread: Iterable[str] | Mapping[str, int] = ()
    ) -> None:
        """``spread``: the subscriptions spread already (a router taking over: those of the
        published assignment), with their widths when known (``Route.spread_width``; 0 or a
        bare uid: unknown, taken as the most it may use at the first pass)."""
        self.settings = settings
        known = spread if isinstance(spread, Mapping) else dict.fromkeys(spread, 0)
        self.widths: dict[str, int] = {uid: max(0, int(w)) for uid, w in known.items()}
        self._busy_since: dict[str, float] = {}
        self._quiet_since: dict[str, float] = {}

    @property
    def spread(self) -> set[str]:
        """The uids of the spread subscriptions."""
        return set(self.widths)

    def decide(
        self,
        candidates: Iterable[str],
        loads: Mapping[str, Load],
        now: float,
        limits: Mapping[str, int] | None = None,
    ) -> Changes:
        """One pass at ``now``: ``candidates`` are the subscriptions that may be spread
        (others are forgotten, and gathered if spread); ``loads`` their summed loads (a
        subscription left out is idle); ``limits`` the most forwarders each may be spread
        over (the live subscribing forwarders, its topic's sources; left out: no limit). One
        whose limit is under 2 is not spread; one spread already keeps its width when its
        limit falls (its sources share forwarders) and never widens past it."""
        settings = self.settings
        wanted = set(candidates)
        gathered = {uid for uid in self.widths if uid not in wanted}
        for uid in gathered:
            del self.widths[uid]
        for timers in (self._busy_since, self._quiet_since):
            for uid in [u for u in timers if u not in wanted]:
                del timers[uid]
        spread: set[str] = set()
        resized: set[str] = set()
        idle = Load()
        for uid in wanted:
            used = settings.utilization(loads.get(uid, idle))
            limit = _NO_LIMIT if limits is None else limits.get(uid, _NO_LIMIT)
            width = self.widths.get(uid, 1)
            if width == 0:  # spread by a router that published no width: the most it may use
                width = max(2, limit)
                if limit < _NO_LIMIT:
                    self.widths[uid] = width
            busy, quiet = busy_width(settings, used), quiet_width(settings, used)
            wider = min(busy, limit)
            if wider > width:
                self._quiet_since.pop(uid, None)
                since = self._busy_since.setdefault(uid, now)
                if now - since >= settings.spread_after_s:
                    del self._busy_since[uid]
                    self.widths[uid] = wider
                    (resized if width > 1 else spread).add(uid)
                continue
            self._busy_since.pop(uid, None)
            if quiet >= width:
                self._quiet_since.pop(uid, None)
                continue
            since = self._quiet_since.setdefault(uid, now)
            if now - since >= settings.gather_after_s:
                del self._quiet_since[uid]
                if quiet <= 1:
                    del self.widths[uid]
                    gathered.add(uid)
                else:
                    self.widths[uid] = quiet
                    resized.add(uid)
        return Changes(frozenset(spread), frozenset(gathered), frozenset(resized))

    def timers(self) -> set[str]:
        """Subscriptions with a window running."""
        return set(self._busy_since) | set(self._quiet_since)
