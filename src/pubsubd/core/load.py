"""How busy a topic keeps its forwarder (pure): rates as exponentially weighted moving averages
(EWMA) of counters a forwarder samples every few seconds, and the whole-number weight the
router places the topic by (``control/assignment.py``: bounded loads over weights).

A topic's load is what its forwarder does for it: messages published and delivered per second,
bytes published per second, and messages delivered but not yet acknowledged (leases held). Its
weight is 1 (every topic costs something to hold: logs, ledgers, dispatchers) plus one point per
``MESSAGES_PER_POINT`` messages/s, ``BYTES_PER_POINT`` bytes/s and ``OUTSTANDING_PER_POINT``
outstanding messages. Whole points keep small wobbles of a rate from changing weights, so a
steady load moves nothing; the assignment's hysteresis keeps a unit from moving twice in a
window.

The EWMAs' half-life is the leading router's to choose (``pubsubd router --load-half-life``,
default ``HALF_LIFE_S``): a longer one makes a short burst weigh less and a lasting change
count later. The forwarders compute the EWMAs (``data/load_report.py``) with the half-life the
router publishes (``chosen_half_life``); a change applies from the next sample on, to the
figure reached so far (no jump).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "HALF_LIFE_S",
    "Counters",
    "Load",
    "Rates",
    "chosen_half_life",
    "valid_half_life",
    "weight",
]

# The weight of a sample halves every HALF_LIFE_S: a load that starts is half counted after it.
HALF_LIFE_S = 10.0
MESSAGES_PER_POINT = 100.0
BYTES_PER_POINT = float(1 << 20)
OUTSTANDING_PER_POINT = 10_000.0


def valid_half_life(half_life_s: float) -> float:
    """``half_life_s`` if it can be a half-life (positive, finite); else ValueError."""
    if not (half_life_s > 0 and math.isfinite(half_life_s)):
        raise ValueError(f"the half-life must be a positive number of seconds, got {half_life_s}")
    return half_life_s


def chosen_half_life(published: float | None) -> float:
    """The half-life to use, given what the leading router published: its own if valid, else
    (none published: a router of an earlier release, or none yet) ``HALF_LIFE_S``."""
    if published is None:
        return HALF_LIFE_S
    try:
        return valid_half_life(published)
    except ValueError:
        return HALF_LIFE_S


@dataclass(frozen=True, slots=True)
class Load:
    """One topic's recent load on its forwarder."""

    messages_per_s: float = 0.0  # published and delivered
    bytes_per_s: float = 0.0  # published
    outstanding: int = 0  # delivered, not yet acknowledged

    def larger(self, other: Load) -> Load:
        """The larger of each figure."""
        return Load(
            max(self.messages_per_s, other.messages_per_s),
            max(self.bytes_per_s, other.bytes_per_s),
            max(self.outstanding, other.outstanding),
        )

    def plus(self, other: Load) -> Load:
        """The sum of each figure (one subscription served by several forwarders)."""
        return Load(
            self.messages_per_s + other.messages_per_s,
            self.bytes_per_s + other.bytes_per_s,
            self.outstanding + other.outstanding,
        )

    @property
    def idle(self) -> bool:
        return self.messages_per_s < 0.01 and self.bytes_per_s < 1 and self.outstanding == 0


def weight(load: Load) -> int:
    """The topic's weight in the router's bounded loads: 1 plus its whole points."""
    points = (
        max(0.0, load.messages_per_s) / MESSAGES_PER_POINT
        + max(0.0, load.bytes_per_s) / BYTES_PER_POINT
        + max(0, load.outstanding) / OUTSTANDING_PER_POINT
    )
    return 1 + math.floor(points) if math.isfinite(points) else 1


@dataclass(frozen=True, slots=True)
class Counters:
    """A topic's cumulative counters at one sample (they only grow while it is held here)."""

    messages: int
    bytes: int
    outstanding: int


class Rates:
    """EWMA rates of many topics' counters, one :meth:`sample` at a time (any interval)."""

    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self._half_life_s = valid_half_life(half_life_s)
        self._last: dict[str, tuple[float, Counters]] = {}
        self._rates: dict[str, tuple[float, float]] = {}  # messages/s, bytes/s
        self._outstanding: dict[str, int] = {}

    @property
    def half_life_s(self) -> float:
        return self._half_life_s

    @half_life_s.setter
    def half_life_s(self, half_life_s: float) -> None:
        """Takes effect from the next sample on; the rates reached so far are kept."""
        self._half_life_s = valid_half_life(half_life_s)

    def sample(self, now: float, counters: Mapping[str, Counters]) -> None:
        """Counters of every topic held now, read at ``now`` (seconds, monotonic). A topic left
        out is forgotten; one seen for the first time has no rate until its next sample."""
        for gone in [k for k in self._last if k not in counters]:
            del self._last[gone]
            self._rates.pop(gone, None)
            self._outstanding.pop(gone, None)
        for key, now_counters in counters.items():
            self._outstanding[key] = now_counters.outstanding
            last = self._last.get(key)
            self._last[key] = (now, now_counters)
            if last is None:
                continue
            then, before = last
            elapsed = now - then
            if elapsed <= 0:
                continue
            # A counter that went down was started again (the topic came back): no rate from it.
            messages = max(0, now_counters.messages - before.messages) / elapsed
            size = max(0, now_counters.bytes - before.bytes) / elapsed
            keep = 0.5 ** (elapsed / self.half_life_s)
            old_messages, old_bytes = self._rates.get(key, (0.0, 0.0))
            self._rates[key] = (
                keep * old_messages + (1 - keep) * messages,
                keep * old_bytes + (1 - keep) * size,
            )

    def loads(self) -> dict[str, Load]:
        """Every sampled topic's load now."""
        return {
            key: Load(*self._rates.get(key, (0.0, 0.0)), self._outstanding.get(key, 0))
            for key in self._last
        }
