"""Who owns what: consistent hashing with bounded loads, as the router's pure state machine.

The units are publish message sources ``(topic, source)`` for publishing forwarders and
``(subscription, source)`` for subscribing forwarders, named by strings; the members are the
forwarders. Every unit has one owner, the head of the ordered list a router hands out; the
rest of the list are fallbacks. The rules (SCALE_OUT.md §3, Mirrokni, Thorup and Zadimoghaddam,
"Consistent Hashing with Bounded Loads"):

* **Bounded loads.** No member holds more than ``capacity = ceil((1 + epsilon) * units /
  members)`` units (members that are drained do not count). A unit goes to the first member in
  its rendezvous ranking (``router.rank``) that is below capacity.
* **Stickiness.** A unit stays where it is while its owner is a member, is not drained and is
  not over capacity. So a member that leaves moves only its own units (capacity only grows),
  and a member that joins receives only what the others hold over the new, lower capacity.
* **Hysteresis.** A unit moved less than ``hysteresis_s`` ago is not moved again to even out
  loads; only losing its owner (gone, drained, or the unit pinned elsewhere) moves it sooner. A
  member may then stay over capacity until the window passes.
* **Constraints.** A drained member owns nothing (it still serves as a last fallback); a pinned
  unit goes to its pinned member while that member is present and not drained, and counts
  toward its load.

:meth:`Assignment.update` returns the moves, so a router can name the new owner to both sides
before the old one lets go (pre-assignment) and count moves per membership change.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pubsubd.control.router import rank

__all__ = ["DEFAULT_EPSILON", "Assignment", "Member", "Move"]

DEFAULT_EPSILON = 0.25
DEFAULT_HYSTERESIS_S = 60.0


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


def _order(unit: str) -> bytes:
    return hashlib.blake2b(unit.encode(), digest_size=8).digest()


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
        self._moved_at: dict[str, float] = {}

    def loads(self) -> dict[str, int]:
        """Units per member (every member, zero included)."""
        loads = dict.fromkeys(self.members, 0)
        for owner in self.owners.values():
            loads[owner] = loads.get(owner, 0) + 1
        return loads

    def update(
        self,
        members: Sequence[Member],
        units: Iterable[str],
        now: float,
        pins: Mapping[str, str] | None = None,
    ) -> list[Move]:
        """Assign every unit among ``members`` at time ``now``; returns the moves made."""
        self.members = {m.member_id: m for m in members}
        eligible = sorted(m.member_id for m in members if not m.drained)
        wanted = sorted(set(units), key=_order)
        for gone in set(self.owners) - set(wanted):
            del self.owners[gone]
            self._moved_at.pop(gone, None)
        if not eligible:
            self.capacity = 0
            self.owners.clear()
            return []
        self.capacity = math.ceil((1 + self.epsilon) * len(wanted) / len(eligible))
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
                load[pinned] += 1
                if owner != pinned:
                    moves.append(self._move(unit, owner, pinned, True, now))
                continue
            if owner in load:
                load[owner] += 1
                held[owner].append(unit)
            elif owner is not None:
                unplaced.append((unit, owner, True))  # its owner left or was drained
                del self.owners[unit]
            else:
                unplaced.append((unit, None, True))

        # Members over capacity shed the units that moved longest ago, last in ranking first.
        for member in eligible:
            excess = load[member] - self.capacity
            if excess <= 0:
                continue
            settled = [u for u in held[member] if not self._recent(u, now)]
            settled.sort(key=lambda u: (self._moved_at.get(u, -math.inf), _order(u)))
            for unit in settled[:excess]:
                load[member] -= 1
                del self.owners[unit]
                unplaced.append((unit, member, False))

        for unit, old, forced in sorted(unplaced, key=lambda item: _order(item[0])):
            target = next(
                (m for m in rank(unit, [(m, m) for m in eligible]) if load[m] < self.capacity),
                None,
            )
            if target is None:  # only when hysteresis kept members over capacity
                target = min(eligible, key=lambda m: (load[m], m))
            load[target] += 1
            moves.append(self._move(unit, old, target, forced, now))
        return moves

    def _recent(self, unit: str, now: float) -> bool:
        moved = self._moved_at.get(unit)
        return moved is not None and now - moved < self.hysteresis_s

    def _move(self, unit: str, source: str | None, target: str, forced: bool, now: float) -> Move:
        self.owners[unit] = target
        if source is not None:  # a first placement is not a move for hysteresis
            self._moved_at[unit] = now
        return Move(unit, source, target, forced)

    def ranked(self, unit: str, zone: str | None = None) -> list[str]:
        """The ordered list for ``unit``: its owner, then the other members that are not
        drained (those in ``zone`` first, each group in rendezvous order), drained ones last."""
        owner = self.owners.get(unit)
        others = [m for m in self.members.values() if m.member_id != owner]
        ordered = rank(unit, [(m.member_id, m) for m in others])
        ordered.sort(key=lambda m: (m.drained, zone is not None and m.zone != zone))
        return ([owner] if owner is not None else []) + [m.member_id for m in ordered]
