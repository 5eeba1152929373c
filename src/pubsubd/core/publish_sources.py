"""How many publish message sources a topic has, from its labels (pure).

| label                          | value                                                       |
|--------------------------------|-------------------------------------------------------------|
| pubsubd-publish-sources        | 1-16 (default 1); UpdateTopic may raise it, never lower it  |
| pubsubd-ordering-key-sources   | 1..sources, fixed at CreateTopic (default: the sources then)|
| pubsubd-active-publish-sources | key sources..sources (default: every source)                |

Routing rule (``data/publish/routing.py``): a publish without an ordering key goes round-robin
over every source; a publish with one goes to the source its key ranks first (rendezvous hash)
among sources ``0 .. key_sources - 1``. ``key_sources`` never changes after the topic is created,
so a key stays in one source log for the topic's life and its order is that log's order; sources
added later take only unkeyed messages. Unkeyed publishes go over the *active* sources
``0 .. active - 1`` (all of them unless the label says fewer): source growth
(``core/source_growth.py``) raises it when the topic is busy and lowers it when it is quiet;
the sources past it stay readable and take nothing new.

The server writes ``pubsubd-ordering-key-sources`` into a topic created with more than one source
(a topic without it has 1). An UpdateTopic whose labels leave either label out keeps its current
value (clients replacing their own labels need not know about these); lowering the sources or
changing the ordering-key sources is FAILED_PRECONDITION. An UpdateTopic that raises the sources
and leaves the active label out makes every source active again.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from pubsubd.core.errors import FailedPrecondition, InvalidArgument

SOURCES_LABEL = "pubsubd-publish-sources"
KEY_SOURCES_LABEL = "pubsubd-ordering-key-sources"
ACTIVE_SOURCES_LABEL = "pubsubd-active-publish-sources"
MAX_SOURCES = 16


@dataclass(frozen=True, slots=True)
class SourceCounts:
    sources: int = 1
    key_sources: int = 1
    active: int = 0  # the sources unkeyed publishes go to; 0: every source

    @property
    def serving(self) -> int:
        """How many sources take unkeyed publishes (``0 .. serving - 1``)."""
        return self.active or self.sources


def _count(labels: Mapping[str, str], key: str, maximum: int) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise InvalidArgument(
            f"labels[{key!r}]: {raw!r} must be a whole number from 1 to {maximum}"
        )
    return int(raw)


def _active(labels: Mapping[str, str], sources: int, key_sources: int) -> int:
    active = _count(labels, ACTIVE_SOURCES_LABEL, sources)
    if active is None:
        return 0
    if active < key_sources:
        raise InvalidArgument(
            f"labels[{ACTIVE_SOURCES_LABEL!r}]: {active} is fewer than the topic's "
            f"{key_sources} ordering-key sources (they always take their keys)"
        )
    return 0 if active == sources else active


def parse(labels: Mapping[str, str]) -> SourceCounts:
    """The counts a stored topic's labels say (absent labels: 1; no active label: all)."""
    sources = _count(labels, SOURCES_LABEL, MAX_SOURCES) or 1
    key_sources = _count(labels, KEY_SOURCES_LABEL, sources) or 1
    return SourceCounts(sources, key_sources, _active(labels, sources, key_sources))


def on_create(labels: MutableMapping[str, str]) -> SourceCounts:
    """Validate a new topic's labels and fix its ordering-key sources (written into ``labels``
    when more than one source)."""
    sources = _count(labels, SOURCES_LABEL, MAX_SOURCES) or 1
    key_sources = _count(labels, KEY_SOURCES_LABEL, sources)
    if key_sources is None:
        key_sources = sources
        if sources > 1:
            labels[KEY_SOURCES_LABEL] = str(sources)
    return SourceCounts(sources, key_sources, _active(labels, sources, key_sources))


def on_update(current: Mapping[str, str], labels: MutableMapping[str, str]) -> SourceCounts:
    """Validate an updated topic's labels against its current ones: sources only grow, the
    ordering-key sources never change; a label left out keeps its value (put back in
    ``labels``)."""
    now = parse(current)
    raised = (_count(labels, SOURCES_LABEL, MAX_SOURCES) or now.sources) > now.sources
    kept = (SOURCES_LABEL, KEY_SOURCES_LABEL, *(() if raised else (ACTIVE_SOURCES_LABEL,)))
    for key in kept:
        if key not in labels and key in current:
            labels[key] = current[key]
    sources = _count(labels, SOURCES_LABEL, MAX_SOURCES) or 1
    if sources < now.sources:
        raise FailedPrecondition(
            f"labels[{SOURCES_LABEL!r}]: cannot lower the publish message sources of a topic "
            f"from {now.sources} to {sources}; they can only be added"
        )
    key_sources = _count(labels, KEY_SOURCES_LABEL, MAX_SOURCES) or 1
    if key_sources != now.key_sources:
        raise FailedPrecondition(
            f"labels[{KEY_SOURCES_LABEL!r}]: fixed at {now.key_sources} when the topic was "
            f"created (ordering keys never move between sources); cannot change it to "
            f"{key_sources}"
        )
    return SourceCounts(sources, key_sources, _active(labels, sources, key_sources))


# A StreamingPull stream that sends this request header takes the messages of these sources only
# (decimal indexes, comma-separated): the Pulsar front's consumers of ``TOPIC-partition-N``.
STREAM_SOURCES_HEADER = "pubsubd-sources"


def stream_sources(value: str) -> frozenset[int]:
    """The sources a ``pubsubd-sources`` header names; INVALID_ARGUMENT if it is malformed.
    A source the topic does not have (yet) is allowed: that stream gets nothing from it."""
    out: set[int] = set()
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) >= MAX_SOURCES:
            raise InvalidArgument(
                f"{STREAM_SOURCES_HEADER}: {value!r} is not a comma-separated list of sources "
                f"0..{MAX_SOURCES - 1}"
            )
        out.add(int(part))
    return frozenset(out)
