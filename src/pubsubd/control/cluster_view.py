"""What a cluster looks like from ZooKeeper, for ``pubsubd cluster status``, ``pubsubd routing
show`` and the dashboard of a serving process (which reads it with its own connection):
storage nodes, zones, ledgers and their copies, the repair auditor, the forwarders, the
leading router's last pass, and each subscription's whole backlog from the
forwarders' load reports, with which forwarder serves which of its sources
(``core/backlog_view.py``).

A ledger counts as under-replicated when one of the nodes its metadata lists is not registered
now (down, or gone), or when it has fewer nodes than the largest write quorum in use (a ledger
opened while nodes were missing). Background repair is what brings the count back to zero:
``repair`` shows the elected auditor and what its last pass found and did (the znode
``Layout.auditor/status`` it writes after every pass, storage/ledgers/auditor.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Any

from pubsubd.control.routing_store import RoutingStore
from pubsubd.control.routing_table import Forwarder
from pubsubd.coordination.election import CANDIDATE_PREFIX
from pubsubd.coordination.errors import NoNode
from pubsubd.coordination.zk import Coordinator
from pubsubd.core.backlog_view import ranked, whole_backlogs
from pubsubd.storage.ledgers.auditor import STATUS_NODE
from pubsubd.storage.ledgers.meta import LedgerList, LedgerState


async def storage_and_routing(coordinator: Coordinator) -> dict[str, Any]:
    """The storage side of the cluster and its routing, read through ``coordinator``."""
    layout = coordinator.layout
    nodes: dict[str, dict[str, Any]] = {}
    try:
        children = await coordinator.children(layout.storage_nodes)
    except NoNode:
        children = []
    for child in children:
        try:
            data, _ = await coordinator.get(f"{layout.storage_nodes}/{child}")
        except NoNode:
            continue
        info = json.loads(data)
        nodes[str(info["node_id"])] = info
    ledgers: list[tuple[str, LedgerList]] = []
    try:
        buckets = await coordinator.children(layout.sources)
    except NoNode:
        buckets = []
    for bucket in buckets:
        for uid in await coordinator.children(f"{layout.sources}/{bucket}"):
            for source in await coordinator.children(f"{layout.sources}/{bucket}/{uid}"):
                if not source.isdigit():
                    continue
                data, stat = await coordinator.get(f"{layout.sources}/{bucket}/{uid}/{source}")
                ledgers.append((f"{uid}/{source}", LedgerList.decode(data, stat.version)))
    repair = await _repair(coordinator)
    routing = await _routing(coordinator)
    # ZooKeeper alone shows ledgers listing a node that is not registered; the auditor's last
    # pass also knows each topic's policy (copies, zones) and what the nodes hold.
    under = [
        {"source": name, "ledger": m.ledger_id, "nodes": list(m.nodes)}
        for name, lst in ledgers
        for m in lst.ledgers
        if any(n not in nodes for n in m.nodes)
    ]
    audited = repair.get("last_pass", {}).get("under_replicated")
    return {
        "nodes": [
            {
                "node_id": node_id,
                "address": info.get("address"),
                "zone": info.get("zone"),
                "free_bytes": info.get("free_bytes"),
            }
            for node_id, info in sorted(nodes.items())
        ],
        "zones": sorted({str(info.get("zone")) for info in nodes.values()}),
        "sources": len(ledgers),
        "ledgers": sum(len(lst.ledgers) for _, lst in ledgers),
        "open_ledgers": sum(
            1 for _, lst in ledgers for m in lst.ledgers if m.state is not LedgerState.CLOSED
        ),
        "under_replicated": audited if isinstance(audited, int) else len(under),
        "under_replicated_by": "auditor" if isinstance(audited, int) else "registry",
        "ledgers_on_absent_nodes": under[:100],
        "repair": repair,
        "routing": routing,
    }


async def _routing(coordinator: Coordinator) -> dict[str, Any]:
    """The registered forwarders and the leading router's last pass (issue 11)."""
    store = RoutingStore(coordinator)
    summary = await store.summary()
    forwarders = await store.forwarders()
    return {
        "forwarders": [
            {"forwarder_id": f.forwarder_id, "address": f.address, "zone": f.zone}
            for f in forwarders
        ],
        "router": None
        if summary is None
        else {
            "router_id": summary.router_id,
            "generation": summary.generation,
            "publishing_units": summary.publishing_units,
            "subscribing_units": summary.subscribing_units,
            "total_moves": summary.total_moves,
        },
        # The whole backlog of each subscription, as ``pubsubd routing show`` gives it.
        **await subscription_backlogs(store, forwarders),
    }


async def _repair(coordinator: Coordinator) -> dict[str, Any]:
    """The auditor now (the lowest candidate) and its last published pass."""
    parent = coordinator.layout.auditor
    try:
        children = await coordinator.children(parent)
    except NoNode:
        return {"auditor": None, "candidates": 0}
    candidates = sorted(
        (c for c in children if c.startswith(CANDIDATE_PREFIX)),
        key=lambda c: int(c.rsplit("-", 1)[1]) if c.rsplit("-", 1)[1].isdigit() else -1,
    )
    out: dict[str, Any] = {"auditor": None, "candidates": len(candidates)}
    if candidates:
        with contextlib.suppress(NoNode, ValueError):
            data, _ = await coordinator.get(f"{parent}/{candidates[0]}")
            out["auditor"] = json.loads(data)
    with contextlib.suppress(NoNode, ValueError):
        data, _ = await coordinator.get(f"{parent}/{STATUS_NODE}")
        published = json.loads(data)
        out["last_published_by"] = published.pop("auditor", None)
        out.update(published)
    return out


async def describe_routing(store: RoutingStore) -> dict[str, Any]:
    """``pubsubd routing show``: the forwarders, the constraints, the router's last pass, and
    the whole backlog of every subscription a forwarder reports a share of."""
    forwarders = await store.forwarders()
    constraints, _ = await store.constraints()
    summary = await store.summary()
    last = None
    if summary is not None:
        last = {
            "router_id": summary.router_id,
            "generation": summary.generation,
            "at_unix_s": summary.at_unix_s,
            "publishing_units": summary.publishing_units,
            "subscribing_units": summary.subscribing_units,
            "publishing_capacity": summary.publishing_capacity,
            "subscribing_capacity": summary.subscribing_capacity,
            "moves": summary.moves,
            "total_moves": summary.total_moves,
            # 0: a router of an earlier release (the forwarders use their default).
            "load_half_life_s": summary.load_half_life_s,
        }
    pub = dict(summary.publishing_loads) if summary else {}
    sub = dict(summary.subscribing_loads) if summary else {}
    # A router of an earlier release sends no weights: a unit weighs 1 there.
    pub_weight = dict(summary.publishing_weights) if summary else {}
    return {
        "forwarders": [
            {
                "forwarder_id": f.forwarder_id,
                "address": f.address,
                "zone": f.zone,
                "version": f.version,
                "publishing": f.publishing,
                "subscribing": f.subscribing,
                "drained": constraints.drains(f),
                "publishing_units": pub.get(f.forwarder_id, 0),
                "subscribing_units": sub.get(f.forwarder_id, 0),
                # What the bound (publishing_capacity) is in: busy topics weigh more.
                "publishing_weight": pub_weight.get(f.forwarder_id, pub.get(f.forwarder_id, 0)),
            }
            for f in forwarders
        ],
        "constraints": {
            "drained_forwarders": sorted(constraints.drained),
            "drained_zones": sorted(constraints.drained_zones),
            "pinned_topics": dict(sorted(constraints.pinned_topics.items())),
        },
        "router": last,
        **await subscription_backlogs(store, forwarders),
    }


async def subscription_backlogs(
    store: RoutingStore, forwarders: Iterable[Forwarder]
) -> dict[str, Any]:
    """``subscriptions``: the whole backlog of every subscription a registered forwarder
    (of ``forwarders``) reports a share of (core/backlog_view.py), spread ones first, then by
    the largest backlog; ``subscription_shares_left_out``: by forwarder, the shares its
    report left out (it lists at most core.backlog_view.MAX_SHARES)."""
    reports = await store.forwarder_reports()
    backlogs = whole_backlogs(
        ((r.forwarder_id, r.at_unix_s, r.shares) for r in reports),
        {f.forwarder_id for f in forwarders},
    )
    return {
        "subscriptions": [b.as_json() for b in ranked(backlogs.values())],
        "subscription_shares_left_out": {
            r.forwarder_id: r.shares_left_out for r in reports if r.shares_left_out
        },
    }
