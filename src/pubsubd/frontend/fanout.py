"""A spread subscription's calls fanned out over its subscribing forwarders (pure).

With ``pubsubd router --spread-subscriptions`` each source of a shared subscription is owned by
one subscribing forwarder (``control/routing_table.py``; its unit ``s/{uid}/{source}`` is
published with ``Route.spread``), and a forwarder serves only the sources it owns. A frontend
then sends one client's StreamingPull to every owner, a *leg* each (``legs``: the owners and
the sources each serves, named to it in the ``pubsubd-sources`` header), and every later request
of the client to every leg with the acks and deadline changes of that leg's sources only
(``split_streaming_request``): an ack ID carries its source (``core/ids.py``), so it reaches the
forwarder that leased it. Acknowledge and ModifyAckDeadline are split the same way
(``split_ack_ids``). An ack ID of a source no leg serves (leased before the source moved) goes
to the first leg: the ack is recorded at the topic's owner all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pubsubd.control.routing_table import Forwarder, subscribing_unit
from pubsubd.core.ids import ack_id_source
from pubsubd.core.publish_sources import MAX_SOURCES

__all__ = [
    "Leg",
    "legs",
    "only_sources",
    "sources_header",
    "split_ack_ids",
    "split_streaming_request",
]


@dataclass(frozen=True, slots=True)
class Leg:
    """One subscribing forwarder of a spread subscription and the sources it serves."""

    forwarder: Forwarder
    sources: frozenset[int]


def legs(
    subscription_uid: str,
    route_of: Callable[[str], Sequence[str]],
    spread: Callable[[str], bool],
    forwarders: Mapping[str, Forwarder],
) -> list[Leg] | None:
    """The legs of a spread subscription, by forwarder ID; None if it is not spread (served
    whole by the owner of ``s/{uid}/0``). A source goes to the first registered forwarder of
    its route (its owner while that one is registered)."""
    by_owner: dict[str, set[int]] = {}
    spread_seen = False
    for source in range(MAX_SOURCES):
        unit = subscribing_unit(subscription_uid, source)
        route = route_of(unit)
        if not route or not spread(unit):
            continue
        spread_seen = True
        owner = next((f for f in route if f in forwarders), None)
        if owner is not None:
            by_owner.setdefault(owner, set()).add(source)
    if not spread_seen:
        return None
    return [Leg(forwarders[f], frozenset(s)) for f, s in sorted(by_owner.items())]


def only_sources(spread_legs: Sequence[Leg], wanted: frozenset[int] | None) -> list[Leg]:
    """The legs of a stream that asks for ``wanted`` sources only (its ``pubsubd-sources``
    header, e.g. a Pulsar partition's consumer): those serving any of them, each with just
    those (None: every leg, whole)."""
    if wanted is None:
        return list(spread_legs)
    return [Leg(g.forwarder, g.sources & wanted) for g in spread_legs if g.sources & wanted]


def sources_header(leg: Leg) -> str:
    """The ``pubsubd-sources`` value naming a leg's sources."""
    return ",".join(str(s) for s in sorted(leg.sources))


def _leg_of(ack_id: str, by_source: Mapping[int, int]) -> int:
    source = ack_id_source(ack_id)
    return by_source.get(source, 0) if source is not None else 0


def by_source(spread_legs: Sequence[Leg]) -> dict[int, int]:
    """Source -> the index of the leg serving it."""
    return {source: i for i, leg in enumerate(spread_legs) for source in leg.sources}


def split_ack_ids(ack_ids: Sequence[str], sources: Mapping[int, int]) -> dict[int, list[str]]:
    """Ack IDs by the index of the leg that leased them (``sources``: ``by_source``)."""
    out: dict[int, list[str]] = {}
    for ack_id in ack_ids:
        out.setdefault(_leg_of(ack_id, sources), []).append(ack_id)
    return out


def split_streaming_request(request: Any, sources: Mapping[int, int], count: int) -> list[Any]:
    """One StreamingPullRequest per leg: every field as the client sent it, but the acks and
    deadline changes, which go to the leg of their source only. Every leg gets a request,
    so each sees the client alive. Mismatched deadline lists go whole to every leg (each
    refuses them, as one forwarder would)."""
    parts = []
    for _ in range(count):
        part = type(request)()
        part.CopyFrom(request)
        parts.append(part)
    if len(request.modify_deadline_ack_ids) != len(request.modify_deadline_seconds):
        return parts
    for part in parts:
        del part.ack_ids[:]
        del part.modify_deadline_ack_ids[:]
        del part.modify_deadline_seconds[:]
    for ack_id in request.ack_ids:
        parts[_leg_of(ack_id, sources)].ack_ids.append(ack_id)
    for ack_id, seconds in zip(
        request.modify_deadline_ack_ids, request.modify_deadline_seconds, strict=True
    ):
        part = parts[_leg_of(ack_id, sources)]
        part.modify_deadline_ack_ids.append(ack_id)
        part.modify_deadline_seconds.append(seconds)
    return parts
