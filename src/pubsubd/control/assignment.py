"""Who owns what: consistent hashing with bounded loads, as the router's pure state machine.

The units are publish message sources ``(topic, source)`` for publishing forwarders and
``(subscription, source)`` for subscribing forwarders, named by strings; the members are the
forwarders. Every unit has one owner, the head of the ordered list a router hands out; the
rest of the list are fallbacks. The rules (SCALE_OUT.md §3, Mirrokni, Thorup and Zadimoghaddam,
"Consistent Hashing with Bounded Loads"):

* **Bounded loads.** No member holds more than ``capacity = ceil((1 + epsilon) * weight /
  members)``, where a member's load is the sum of its units' weights (a whole number, 1 unless
  the router was given one: ``core/load.py`` weighs a topic by its recent load) and ``weight``
  that of every unit; members that are drained do not count. A unit goes to the first member
  its weight still fits in (at or below capacity after it) in its walk of the hash ring:
  every member has ``VNODES`` points on a ring of 64-bit hashes, and a unit's walk visits the
  members clockwise from its own hash, each once. A unit too heavy to fit anywhere goes to the
  least loaded member. Finding a unit's place costs a binary search and a short walk, not a
  hash per member, so a router places a million units over a thousand members in seconds
  (``bench/routing_sim.py``).
* **Stickiness.** A unit stays where it is while its owner is a member, is not drained and is
  not over capacity (a member over it sheds its lightest units first). So a member that
  leaves moves only its own units (capacity only grows).
* **No idle newcomer.** A member that joined (or was undrained) since the last pass and is
  below ``mean / (1 + epsilon)`` takes the units whose walk now reaches it before their owner,
  up to the mean (the share consistent hashing gives it), and if that is not enough, units of
  the busiest members.
  So a member that joins receives what the others hold over the new capacity plus about its
  fair share, and nothing else moves (Pulsar's idle new broker, SCALE_OUT.md §3, does not
  happen here).
* **Hysteresis.** A unit moved less than ``hysteresis_s`` ago is not moved again to even out
  loads; only losing its owner (gone, drained, or the unit pinned elsewhere) moves it sooner. A
  member may then stay over capacity until the window passes.
* **Apart.** Units given the same *group* (``update(groups=)``: the heads of one spread
  subscription) go to members holding no other unit of the group while one fits, so a
  subscription spread over ``k`` heads is served by ``k`` members when there are that many; a
  unit sharing its member with another of its group (members left, or none was free) moves to
  a free member that fits once it is outside the hysteresis window, and stays otherwise.
* **Constraints.** A drained member owns nothing (it still serves as a last fallback); a pinned
  unit goes to its pinned member while that member is present and not drained, and counts
  toward its load.

:meth:`Assignment.update` returns the moves, so a router can name the new owner to both sides
before the old one lets go (pre-assignment) and count moves per membership change.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_EPSILON", "Assignment", "Member", "Move"]

DEFAULT_EPSILON = 0.25
DEFAULT_HYSTERESIS_S = 60.0
# Points per member on the ring: enough that each member's share of the ring is within a few
# per cent of the mean (the bounded-load walk evens out the rest).
VNODES = 64


@dataclass(frozen=True, slots=True)
class Member:
    """A forwarder as the router sees it."""

    member_id: str
    zone: str = ""
    drained: bool = False


@dataclass(frozen=True, slots=True)
class Move:
    """``unit`` changes owner: ``source`` (None: it had none) to ``target``."""

    unit: str
    source: str | None
    target: str
    forced: bool  # its owner left, was drained, or the unit was pinned elsewhere


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class Ring:
    """Members' points on the ring of 64-bit hashes (pure)."""

    __slots__ = ("_members", "_points")

    def __init__(self, member_ids: Iterable[str]) -> None:
        points = sorted((_hash(f"{m}#{i}"), m) for m in set(member_ids) for i in range(VNODES))
        self._points = [p for p, _ in points]
        self._members = [m for _, m in points]

    def walk(self, point: int) -> Iterator[str]:
        """Every member once, clockwise from ``point``."""
        count = len(self._points)
        start = bisect_left(self._points, point)
        seen: set[str] = set()
        for i in range(count):
            member = self._members[(start + i) % count]
            if member not in seen:
                seen.add(member)
                yield member


class Assignment:
    """Owners of units over members; :meth:`update` is the one way it changes."""

    def __init__(
        self, *, epsilon: float = DEFAULT_EPSILON, hysteresis_s: float = DEFAULT_HYSTERESIS_S
    ) -> None:
        if not epsilon > 0:
            raise ValueError(f"epsilon must be positive, got {epsilon}")
        if hysteresis_s < 0:
            raise ValueError(f"hysteresis_s must not be negative, got {hysteresis_s}")
        self.epsilon = epsilon
        self.hysteresis_s = hysteresis_s
        self.owners: dict[str, str] = {}
        self.members: dict[str, Member] = {}
        self.capacity = 0
        self.weights: dict[str, int] = {}  # units that weigh more than 1, as last given
        self._moved_at: dict[str, float] = {}
        self._hashes: dict[str, int] = {}  # each unit's point, computed once
        self._eligible: frozenset[str] = frozenset()  # who could own units last pass
        self._eligible_ring: tuple[tuple[str, ...], Ring] | None = None
        self._all_ring: Ring | None = None  # every member's points, for ranked()

    def _point(self, unit: str) -> int:
        point = self._hashes.get(unit)
        if point is None:
            point = self._hashes[unit] = _hash(unit)
        return point

    def _ring_of(self, eligible: Sequence[str]) -> Ring:
        """The ring of the members that may own units (built again when they change)."""
        key = tuple(eligible)
        if self._eligible_ring is None or self._eligible_ring[0] != key:
            self._eligible_ring = (key, Ring(key))
        return self._eligible_ring[1]

    def loads(self) -> dict[str, int]:
        """Units per member (every member, zero included)."""
        loads = dict.fromkeys(self.members, 0)
        for owner in self.owners.values():
            loads[owner] = loads.get(owner, 0) + 1
        return loads

    def weighted_loads(self) -> dict[str, int]:
        """The sum of the weights of each member's units (every member, zero included)."""
        loads = dict.fromkeys(self.members, 0)
        for unit, owner in self.owners.items():
            loads[owner] = loads.get(owner, 0) + self.weights.get(unit, 1)
        return loads

    def update(
        self,
        members: Sequence[Member],
        units: Iterable[str],
        now: float,
        pins: Mapping[str, str] | None = None,
        weights: Mapping[str, int] | None = None,
        groups: Mapping[str, str] | None = None,
    ) -> list[Move]:
        """Assign every unit among ``members`` at time ``now``; returns the moves made.
        ``weights``: a unit's weight (at least 1; a unit left out weighs 1); ``groups``: a
        unit's group (units of one group are kept apart; a unit left out has none)."""
        groups = groups or {}
        if set(self.members) != {m.member_id for m in members}:
            self._all_ring = None  # ranked() builds it again for the new members
        self.members = {m.member_id: m for m in members}
        eligible = sorted(m.member_id for m in members if not m.drained)
        wanted = sorted(set(units), key=self._point)
        wanted_set = set(wanted)
        for gone in [u for u in self.owners if u not in wanted_set]:
            del self.owners[gone]
            self._moved_at.pop(gone, None)
        for gone in [u for u in self._hashes if u not in wanted_set]:
            del self._hashes[gone]
        self.weights = {
            u: int(w) for u, w in (weights or {}).items() if u in wanted_set and int(w) > 1
        }
        weight = self.weight
        if not eligible:
            self.capacity = 0
            self.owners.clear()
            return []
        total = len(wanted) + sum(w - 1 for w in self.weights.values())
        self.capacity = math.ceil((1 + self.epsilon) * total / len(eligible))
        pins = {u: m for u, m in (pins or {}).items() if m in eligible}
        load = dict.fromkeys(eligible, 0)
        held: dict[str, list[str]] = {m: [] for m in eligible}  # unpinned units kept, by owner
        moves: list[Move] = []
        unplaced: list[tuple[str, str | None, bool]] = []  # unit, old owner, forced

        # Pinned units first, then those that may stay where they are.
        for unit in wanted:
            owner = self.owners.get(unit)
            pinned = pins.get(unit)
            if pinned is not None:
                load[pinned] += weight(unit)
                if owner != pinned:
                    moves.append(self._move(unit, owner, pinned, True, now))
                continue
            if owner in load:
                load[owner] += weight(unit)
                held[owner].append(unit)
            elif owner is not None:
                unplaced.append((unit, owner, True))  # its owner left or was drained
                del self.owners[unit]
            else:
                unplaced.append((unit, None, True))

        # Members over capacity shed their lightest units (moving a busy one pauses more
        # clients), those that moved longest ago first, last in ranking first.
        for member in eligible:
            if load[member] <= self.capacity:
                continue
            # A unit heavier than the bound fits nowhere: moving it would only move the
            # overload (and back again every window), so it stays.
            settled = [
                u for u in held[member] if not self._recent(u, now) and weight(u) <= self.capacity
            ]
            settled.sort(
                key=lambda u: (weight(u), self._moved_at.get(u, -math.inf), self._point(u))
            )
            for unit in settled:
                if load[member] <= self.capacity:
                    break
                load[member] -= weight(unit)
                del self.owners[unit]
                unplaced.append((unit, member, False))

        # Units of a group sharing a member with another of it: all but the first look for a
        # member of their own (outside the hysteresis window; they stay if none fits).
        holding = self._holding(groups)
        apart: set[str] = set()
        if groups:
            for unit in wanted:
                group, owner = groups.get(unit), self.owners.get(unit)
                if group is None or owner not in load or unit in pins:
                    continue
                if holding[group][owner] > 1 and not self._recent(unit, now):
                    holding[group][owner] -= 1
                    load[owner] -= weight(unit)
                    del self.owners[unit]
                    unplaced.append((unit, owner, False))
                    apart.add(unit)

        ring = self._ring_of(eligible)
        capacity = self.capacity
        for unit, old, forced in sorted(unplaced, key=lambda item: self._point(item[0])):
            w = weight(unit)
            group = groups.get(unit)
            taken = holding.get(group, {}) if group is not None else {}
            target = next(
                (
                    m
                    for m in ring.walk(self._point(unit))
                    if load[m] + w <= capacity and not taken.get(m)
                ),
                None,
            )
            if target is None and unit in apart:
                target = old  # no member of its own fits: it stays
            if target is None and taken:
                target = next(
                    (m for m in ring.walk(self._point(unit)) if load[m] + w <= capacity), None
                )
            if group is not None and target is not None:
                holding.setdefault(group, {})[target] = taken.get(target, 0) + 1
            if target is None:  # hysteresis kept members over capacity, or a unit this heavy
                # One shed to even out loads stays where it was (moving it would only move
                # the overload); a new one, or one whose owner went, takes the least loaded.
                if old is not None and not forced and old in load:
                    target = old
                else:
                    target = min(eligible, key=lambda m: (load[m], m))
                if group is not None:
                    holding.setdefault(group, {})[target] = taken.get(target, 0) + 1
            load[target] += w
            if target == old:  # back where it was (it fit there after all): not a move
                self.owners[unit] = target
                continue
            moves.append(self._move(unit, old, target, forced, now))
        newcomers = set(eligible) - self._eligible if self._eligible else set()
        self._eligible = frozenset(eligible)
        if newcomers:
            self._fill(wanted, eligible, newcomers, load, set(pins), moves, ring, now, groups)
        return moves

    def _holding(self, groups: Mapping[str, str]) -> dict[str, dict[str, int]]:
        """Per group, how many of its units each member owns."""
        holding: dict[str, dict[str, int]] = {}
        for unit, group in groups.items():
            owner = self.owners.get(unit)
            if owner is not None:
                members = holding.setdefault(group, {})
                members[owner] = members.get(owner, 0) + 1
        return holding

    def weight(self, unit: str) -> int:
        return self.weights.get(unit, 1)

    def last_moved(self, unit: str) -> float | None:
        """When ``unit`` last changed owner (None: not since it was placed)."""
        return self._moved_at.get(unit)

    def restore(self, unit: str, owner: str, moved_at: float | None) -> None:
        """Take ``unit``'s owner (and when it last moved) from an earlier router's published
        assignment, before the first :meth:`update`."""
        self.owners[unit] = owner
        if moved_at is not None:
            self._moved_at[unit] = moved_at

    def _fill(
        self,
        wanted: list[str],
        eligible: list[str],
        newcomers: set[str],
        load: dict[str, int],
        pinned: set[str],
        moves: list[Move],
        ring: Ring,
        now: float,
        groups: Mapping[str, str],
    ) -> None:
        """Newcomers (members that joined or were undrained since the last pass) well below
        the mean take units, so none stays idle:
        first the units whose walk of the ring now reaches them before their owner (what
        consistent hashing itself moves on a join, each unit only ever earlier in its own walk,
        so no unit can go round in circles), until they hold the mean; then, if that was not
        enough, settled units of the busiest members, until they hold mean / (1 + epsilon).
        Units pinned, moved in this pass or within the hysteresis window stay, and no unit
        goes to a member holding another of its group."""
        if not wanted:
            return
        weight = self.weight
        mean = (len(wanted) + sum(w - 1 for w in self.weights.values())) / len(eligible)
        full, enough = math.floor(mean), math.floor(mean / (1 + self.epsilon))
        hungry = {m for m in newcomers if load[m] < enough}
        if not hungry:
            return
        moved = {m.unit for m in moves}
        holding = self._holding(groups)

        def movable(unit: str) -> bool:
            return unit not in pinned and unit not in moved and not self._recent(unit, now)

        def apart(unit: str, member: str) -> bool:
            group = groups.get(unit)
            return group is None or not holding.get(group, {}).get(member)

        def moved_to(unit: str, owner: str, member: str) -> None:
            group = groups.get(unit)
            if group is not None:
                held = holding.setdefault(group, {})
                held[owner] = held.get(owner, 0) - 1
                held[member] = held.get(member, 0) + 1
            moves.append(self._move(unit, owner, member, False, now))

        for unit in wanted:
            owner = self.owners[unit]
            if owner in hungry or not movable(unit):
                continue
            for member in ring.walk(self._point(unit)):
                if member == owner:
                    break
                if (
                    member in hungry
                    and load[member] + weight(unit) <= self.capacity
                    and apart(unit, member)
                ):
                    load[owner] -= weight(unit)
                    load[member] += weight(unit)
                    moved.add(unit)
                    moved_to(unit, owner, member)
                    if load[member] >= full:
                        hungry.discard(member)
                    break
            if not hungry:
                return
        hungry = {m for m in hungry if load[m] < enough}
        if not hungry:
            return
        donors: dict[str, list[str]] = {}
        for unit in wanted:
            owner = self.owners[unit]
            if load[owner] > full and movable(unit):
                donors.setdefault(owner, []).append(unit)
        for member in sorted(hungry):
            while load[member] < enough:
                donor = max(
                    (d for d, units in donors.items() if units and load[d] > full),
                    key=lambda d: (load[d], d),
                    default=None,
                )
                if donor is None:
                    return
                unit = donors[donor].pop()
                if load[member] + weight(unit) > self.capacity or not apart(unit, member):
                    continue  # too heavy for it, or beside its group: another may fit
                load[donor] -= weight(unit)
                load[member] += weight(unit)
                moved_to(unit, donor, member)

    def _recent(self, unit: str, now: float) -> bool:
        moved = self._moved_at.get(unit)
        return moved is not None and now - moved < self.hysteresis_s

    def _move(self, unit: str, source: str | None, target: str, forced: bool, now: float) -> Move:
        self.owners[unit] = target
        if source is not None:  # a first placement is not a move for hysteresis
            self._moved_at[unit] = now
        return Move(unit, source, target, forced)

    def ranked(self, unit: str, zone: str | None = None, limit: int | None = None) -> list[str]:
        """The ordered list for ``unit``: its owner, then the other members that are not
        drained (those in ``zone`` first, each group in ring order), drained ones last; at
        most ``limit`` fallbacks (the first ones of the unit's walk of the ring)."""
        owner = self.owners.get(unit)
        if self._all_ring is None:
            self._all_ring = Ring(self.members)
        walk = self._all_ring.walk(self._point(unit))
        others: list[Member] = []
        for member_id in walk:
            if member_id != owner:
                others.append(self.members[member_id])
                if limit is not None and len(others) >= limit:
                    break
        others.sort(key=lambda m: (m.drained, zone is not None and m.zone != zone))
        return ([owner] if owner is not None else []) + [m.member_id for m in others]
