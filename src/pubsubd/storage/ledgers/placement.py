"""Which storage nodes get a new ledger (pure).

Replicas go to distinct zones while there are enough zones, then to more nodes of the zones
already used. ``spread`` (for instance the ledger ID) rotates the order of zones and of the
nodes inside each zone, so ledgers do not pile onto the same nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pubsubd.storage.ledgers.meta import StoragePolicy


class NotEnoughNodes(Exception):
    """Fewer usable storage nodes than a ledger needs."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A storage node as registered in ZooKeeper."""

    node_id: str
    address: str
    zone: str
    free_bytes: int = 0
    append_address: str = ""  # the node's append port ("" = appends over gRPC)


def replica_count(policy: StoragePolicy, available: int) -> int:
    """The policy's replica count, at most the number of nodes there are (at least one)."""
    return max(1, min(policy.replicas, available))


def choose_nodes(
    nodes: list[NodeInfo],
    policy: StoragePolicy,
    *,
    count: int,
    exclude: frozenset[str] = frozenset(),
    spread: int = 0,
) -> tuple[str, ...]:
    usable = [
        n
        for n in nodes
        if n.node_id not in exclude and (not policy.allowed_zones or n.zone in policy.allowed_zones)
    ]
    if len(usable) < count:
        where = ", ".join(sorted(policy.allowed_zones)) or "any zone"
        raise NotEnoughNodes(
            f"a ledger needs {count} storage nodes in {where}; {len(usable)} are usable"
        )
    by_zone: dict[str, list[NodeInfo]] = {}
    for n in sorted(usable, key=lambda n: n.node_id):
        by_zone.setdefault(n.zone, []).append(n)
    for zone_nodes in by_zone.values():
        k = spread % len(zone_nodes)
        zone_nodes[:] = zone_nodes[k:] + zone_nodes[:k]
    zones = sorted(by_zone)
    if zones:
        k = spread % len(zones)
        zones = zones[k:] + zones[:k]
    chosen: list[str] = []
    while len(chosen) < count:
        for zone in zones:
            if by_zone[zone] and len(chosen) < count:
                chosen.append(by_zone[zone].pop(0).node_id)
    return tuple(chosen)
