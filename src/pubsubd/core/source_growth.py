"""Source growth (pure): how many publish message sources a busy topic should write to.

A publish message source is one log with one writer (``core/publish_sources.py``); it takes so
many messages and bytes per second before its writer is the limit. A topic that runs over that
for ``grow_after_s`` gets more *active* sources, enough to bring each back to ``target`` of its
capacity (at least one more, at most ``MAX_SOURCES``): the topic's ``pubsubd-publish-sources``
label is raised when it has too few, and ``pubsubd-active-publish-sources`` set. A topic quiet
enough that one source fewer would run under ``low`` of capacity for ``shrink_after_s`` loses
one active source at a time (never below its ordering-key sources, which always take their
keys). The sources are never removed: a source made inactive takes no new publishes, its
messages are delivered and trimmed as usual, and growing again reuses it.

Ordering keys keep their order across every change: a key's source is fixed for the topic's
life (rendezvous hash over the ordering-key sources, ``data/publish/routing.py``), and those
sources are always active; growth adds and removes only sources for unkeyed messages.

Hysteresis: a change restarts both timers, so the next one waits a full window while the
load's EWMA (``core/load.py``) settles on the new spread; over-capacity and quiet are far apart
(``target`` < 1, ``low`` times one source fewer), so a steady load never flips between them.

The decision is made where the topic's publishes are counted (its publishing forwarder,
``control/source_growth_loop.py``) and applied as an UpdateTopic, through the same rules as a
client's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pubsubd.core.load import Load
from pubsubd.core.publish_sources import MAX_SOURCES, SourceCounts

__all__ = ["GrowthSettings", "SourceGrowth"]


@dataclass(frozen=True, slots=True)
class GrowthSettings:
    """A source's capacity and how eagerly a topic grows and shrinks."""

    messages_per_source: float  # messages/s one source takes before it is over capacity
    bytes_per_source: float = float(64 << 20)  # bytes/s likewise
    grow_after_s: float = 30.0  # over capacity this long: grow
    shrink_after_s: float = 300.0  # quiet this long: one source fewer
    target: float = 0.75  # growing aims each source at this fraction of capacity
    low: float = 0.5  # quiet: one source fewer would run under this fraction
    sample_interval_s: float = 5.0  # how often the owner samples its topics' publish counters

    def __post_init__(self) -> None:
        if not (self.messages_per_source > 0 and self.bytes_per_source > 0):
            raise ValueError("a source's capacity must be positive")
        if not self.sample_interval_s > 0:
            raise ValueError("the sample interval must be positive")
        if not (self.grow_after_s >= 0 and self.shrink_after_s >= 0):
            raise ValueError("the growth windows must not be negative")
        if not 0 < self.low < self.target <= 1:
            raise ValueError(f"need 0 < low < target <= 1, got {self.low} and {self.target}")

    def utilization(self, load: Load) -> float:
        """The topic's publishing load in sources' worth of capacity."""
        return max(
            max(0.0, load.messages_per_s) / self.messages_per_source,
            max(0.0, load.bytes_per_s) / self.bytes_per_source,
        )


class SourceGrowth:
    """Per topic: since when it has been over capacity or quiet; the active sources it should
    have now (``decide``), or None to leave it as it is."""

    def __init__(self, settings: GrowthSettings) -> None:
        self.settings = settings
        self._over_since: dict[str, float] = {}
        self._quiet_since: dict[str, float] = {}

    def decide(self, topic: str, load: Load, counts: SourceCounts, now: float) -> int | None:
        """The number of active sources ``topic`` should have, when it should change."""
        settings = self.settings
        used = settings.utilization(load)
        active = counts.serving
        if used > active and active < MAX_SOURCES:
            self._quiet_since.pop(topic, None)
            since = self._over_since.setdefault(topic, now)
            if now - since < settings.grow_after_s:
                return None
            self._over_since.pop(topic, None)
            return min(MAX_SOURCES, max(active + 1, math.ceil(used / settings.target)))
        self._over_since.pop(topic, None)
        if active > max(1, counts.key_sources) and used <= settings.low * (active - 1):
            since = self._quiet_since.setdefault(topic, now)
            if now - since < settings.shrink_after_s:
                return None
            self._quiet_since.pop(topic, None)
            return active - 1
        self._quiet_since.pop(topic, None)
        return None

    def forget(self, topic: str) -> None:
        """``topic`` is no longer held here (deleted, or moved to another forwarder)."""
        self._over_since.pop(topic, None)
        self._quiet_since.pop(topic, None)

    def topics(self) -> set[str]:
        """Topics with a timer running."""
        return set(self._over_since) | set(self._quiet_since)
