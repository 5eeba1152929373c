"""``python -m bench.routing_sim``: the router's assignment at scale, simulated in one process.

Two cores cannot run a thousand forwarders, so issue 11's scaling model is checked here on the
router's own state machine (``control/assignment.py``, bounded-load consistent hashing over a
ring of virtual nodes) with ``--forwarders`` members in ``--zones`` zones and ``--units`` units
(publish message sources): the placement from nothing, then a membership change at a time,
each timed in CPU seconds of this process:

1. **place**: every unit placed from nothing; the load spread (min / mean / max units per
   forwarder against the capacity ceil((1+eps) x mean));
2. **steady**: a pass with nothing changed (what the router pays every interval);
3. **leave**: one forwarder goes (its units move; nothing else may);
4. **join**: a new forwarder comes (what the others hold over the new capacity moves, and the
   newcomer takes about its fair share: the bound is their sum);
5. **drain**: a zone is drained (every unit on it moves, forced);
6. **routes**: the ordered list (owner and 3 fallbacks) of every unit, as the router publishes
   them after a change of members;
7. **weighted**: the zone undrained, then every unit given a load (messages/s from a Pareto
   distribution, alpha ``PARETO_ALPHA``: most topics quiet, a few very busy) and the weight the
   router gives it (``core/load.py``); the spread of the real load (messages/s per forwarder)
   under the placement by count, then after one pass by weight, and the moves that pass makes.

Prints a table and, with ``--json``, the figures.

    python -m bench.routing_sim --forwarders 1000 --units 1000000
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pubsubd.control.assignment import Assignment, Member
from pubsubd.control.routing_table import ROUTE_FALLBACKS
from pubsubd.core.load import Load, weight

T = TypeVar("T")

# Topic loads for the weighted step: messages/s = 5 x Pareto(alpha), seeded (mean ~30 msg/s).
PARETO_ALPHA = 1.2


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.process_time()
    result = fn()
    return result, time.process_time() - start


def _spread(a: Assignment) -> dict[str, float]:
    loads = [n for member, n in a.loads().items() if not a.members[member].drained]
    return {
        "min": min(loads),
        "mean": statistics.fmean(loads),
        "max": max(loads),
        "capacity": a.capacity,
        "stdev": statistics.pstdev(loads),
    }


def simulate(forwarders: int, units: int, zones: int, epsilon: float) -> dict[str, Any]:
    members = [Member(f"forwarder-{i:04d}", zone=f"zone-{i % zones}") for i in range(forwarders)]
    names = [f"p/{i:016x}/0" for i in range(units)]
    a = Assignment(epsilon=epsilon, hysteresis_s=0.0)
    out: dict[str, Any] = {"forwarders": forwarders, "units": units, "epsilon": epsilon}

    moves, cpu = _timed(lambda: a.update(members, names, now=0.0))
    out["place"] = {"cpu_s": cpu, "placed": len(moves), **_spread(a)}

    moves, cpu = _timed(lambda: a.update(members, names, now=1.0))
    out["steady"] = {"cpu_s": cpu, "moves": len(moves)}

    gone = members[len(members) // 2]
    held = sum(1 for owner in a.owners.values() if owner == gone.member_id)
    after_leave = [m for m in members if m is not gone]
    moves, cpu = _timed(lambda: a.update(after_leave, names, now=2.0))
    out["leave"] = {
        "cpu_s": cpu,
        "moves": len(moves),
        "held_by_the_one_gone": held,
        "only_its_units": all(m.source == gone.member_id for m in moves),
        **_spread(a),
    }

    newcomer = Member("forwarder-new", zone="zone-0")
    joined = [*after_leave, newcomer]
    capacity = math.ceil((1 + epsilon) * units / len(joined))
    excess = sum(max(0, n - capacity) for n in a.loads().values())
    moves, cpu = _timed(lambda: a.update(joined, names, now=3.0))
    out["join"] = {
        "cpu_s": cpu,
        "moves": len(moves),
        "bound": excess + math.floor(units / len(joined)),  # the excess and a fair share
        "newcomer_holds": a.loads()[newcomer.member_id],
        **_spread(a),
    }

    drained = [Member(m.member_id, m.zone, drained=m.zone == "zone-1") for m in joined]
    on_zone = sum(1 for owner in a.owners.values() if a.members[owner].zone == "zone-1")
    moves, cpu = _timed(lambda: a.update(drained, names, now=4.0))
    out["drain"] = {
        "cpu_s": cpu,
        "moves": len(moves),
        "held_by_the_zone": on_zone,
        "forced": sum(1 for m in moves if m.forced),
        **_spread(a),
    }

    _, cpu = _timed(lambda: [a.ranked(u, limit=ROUTE_FALLBACKS) for u in names])
    out["routes"] = {"cpu_s": cpu, "per_unit_us": cpu / units * 1e6}
    undrained = joined
    a.update(undrained, names, now=5.0)
    rng = random.Random(7)
    rates = {u: 5.0 * rng.paretovariate(PARETO_ALPHA) for u in names}
    weights = {u: w for u, r in rates.items() if (w := weight(Load(messages_per_s=r))) > 1}
    weighed = {u: float(weights.get(u, 1)) for u in names}
    by_count = {"rate": _rate_spread(a, rates), "weight": _rate_spread(a, weighed)}
    moves, cpu = _timed(lambda: a.update(undrained, names, now=6.0, weights=weights))
    out["weighted"] = {
        "cpu_s": cpu,
        "moves": len(moves),
        "heavy_units": len(weights),
        "total_weight": units + sum(w - 1 for w in weights.values()),
        "capacity": a.capacity,
        "max_weight": max(weights.values(), default=1),
        "by_count": by_count,
        "by_weight": {"rate": _rate_spread(a, rates), "weight": _rate_spread(a, weighed)},
        "max_weighted_load": max(a.weighted_loads().values()),
    }
    # The same weights, a hysteresis window apart: what the first pass pushed over the bound
    # (a unit too heavy to fit anywhere) is shed once, then nothing moves.
    later = []
    for window in (1, 2, 3):
        moves, cpu = _timed(
            lambda w=window: a.update(undrained, names, 6.0 + 100 * w, weights=weights)
        )
        later.append({"cpu_s": cpu, "moves": len(moves)})
    out["weighted"]["later_passes"] = later
    out["weighted"]["max_weighted_load_after"] = max(a.weighted_loads().values())
    out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _rate_spread(a: Assignment, rates: dict[str, float]) -> dict[str, float]:
    """A figure per forwarder (units' messages/s or weights) under the assignment's owners: the
    busiest against the mean and against the least any placement can do (the mean, or the
    busiest unit alone), and the stdev against the mean."""
    per = dict.fromkeys(a.members, 0.0)
    for unit, owner in a.owners.items():
        per[owner] += rates[unit]
    loads = list(per.values())
    mean = statistics.fmean(loads)
    floor = max(mean, max(rates.values()))
    return {
        "max_over_mean": max(loads) / mean,
        "max_over_floor": max(loads) / floor,
        "stdev_over_mean": statistics.pstdev(loads) / mean,
    }


def _table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['forwarders']} forwarders, {r['units']:,} units, eps {r['epsilon']}: "
        f"max RSS {r['max_rss_mb']:.0f} MB",
        "",
        "| Step | CPU s | moves | bound on moves | load min / mean / max (capacity) |",
        "|---|---:|---:|---:|---|",
    ]
    for step, bound_key in (
        ("place", "placed"),
        ("steady", None),
        ("leave", "held_by_the_one_gone"),
        ("join", "bound"),
        ("drain", "held_by_the_zone"),
    ):
        s = r[step]
        moves = s.get("moves", s.get("placed", 0))
        bound = s.get(bound_key, "") if bound_key and bound_key != "placed" else ""
        spread = (
            f"{s['min']:.0f} / {s['mean']:.0f} / {s['max']:.0f} ({s['capacity']})"
            if "min" in s
            else ""
        )
        lines.append(f"| {step} | {s['cpu_s']:.2f} | {moves:,} | {bound} | {spread} |")
    lines.append(
        f"| routes (owner + {ROUTE_FALLBACKS}) | {r['routes']['cpu_s']:.2f} | | | "
        f"{r['routes']['per_unit_us']:.1f} µs per unit |"
    )
    w = r["weighted"]
    lines += [
        "",
        f"Weighted ({w['heavy_units']:,} units weigh more than 1, the heaviest "
        f"{w['max_weight']}; total weight {w['total_weight']:,}, capacity {w['capacity']}): "
        f"one pass, {w['cpu_s']:.2f} CPU s, {w['moves']:,} moves; heaviest forwarder "
        f"{w['max_weighted_load']} in weight. The same weights a window apart: "
        + ", ".join(f"{p['moves']:,} moves" for p in w["later_passes"])
        + f"; heaviest forwarder then {w['max_weighted_load_after']}.",
        "",
        "| Placement | weight per forwarder: max / mean | stdev / mean "
        "| messages/s: max / mean | max / least possible | stdev / mean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, key in (("by count", "by_count"), ("by weight", "by_weight")):
        wt, rate = w[key]["weight"], w[key]["rate"]
        lines.append(
            f"| {label} | {wt['max_over_mean']:.2f} | {wt['stdev_over_mean']:.3f} "
            f"| {rate['max_over_mean']:.2f} | {rate['max_over_floor']:.2f} "
            f"| {rate['stdev_over_mean']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forwarders", type=int, default=1000)
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--zones", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=0.25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.time()
    result = simulate(args.forwarders, args.units, args.zones, args.epsilon)
    result["wall_s"] = time.time() - started
    print(json.dumps(result) if args.json else _table(result))


if __name__ == "__main__":
    main()
