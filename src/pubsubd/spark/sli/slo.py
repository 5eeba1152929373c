"""SLO evaluation of the SLI job: targets, their overrides from a file, and the verdicts (pure).

Nothing here touches Spark: :func:`evaluate` takes the job's collected rows (plain mappings) and
returns one :class:`Check` per SLO and scope, so the rules are unit-tested without a session.
Targets default to :data:`DEFAULT_SLO`; ``--slo FILE`` (TOML or JSON, the format of
``observability/slo.py``, shared with the server's alerts) overrides them, globally at the top
level and per topic under ``[topics."projects/p/topics/t"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsubd.observability import slo as _shared
from pubsubd.observability.slo import DEFAULT_SLO, SloConfig

# The SLO file is shared with the server's burn-rate alerts (observability/slo.py): targets
# for publish latency (ms, of the whole window), publish error rate (fraction), backlog oldest
# unacked age (s, the worst minute), end-to-end delivery latency (ms, publish time to ack, per
# subscription over the whole window; it includes the subscriber's own processing time).
__all__ = ["DEFAULT_SLO", "Check", "SloConfig", "error_rate", "evaluate", "load_slo"]


def load_slo(path: Path | None) -> SloConfig:
    """The shared SLO file (observability/slo.py); any latency threshold will do here (the
    job's quantiles come from samples, not from histogram buckets)."""
    return _shared.load_slo(path, for_alerts=False)


@dataclass(frozen=True)
class Check:
    slo: str
    scope: str
    target: float
    actual: float
    bad_minutes: int
    minutes: int

    @property
    def status(self) -> str:
        return "PASS" if self.actual <= self.target else "FAIL"


def evaluate(
    slo: SloConfig,
    publish: list[Any],
    totals: list[Any],
    errors: list[Any],
    backlog: list[Any],
    delivery: list[Any] | None = None,
    delivery_totals: list[Any] | None = None,
) -> list[Check]:
    """SLO verdicts. Latency: the topic's quantile over the whole window (merged sketches).
    Error rate: errors / (successful publishes + errors), all RPCs, whole window. Backlog: the
    worst minute per subscription. Delivery latency: the subscription's quantile over the whole
    window (merged sketches), against its topic's target. ``bad_minutes`` counts the minutes over
    the target."""
    checks: list[Check] = []
    by_topic: dict[str, list[Any]] = {}
    for r in publish:
        by_topic.setdefault(r["topic"], []).append(r)
    for t in totals:
        rows = by_topic.get(t["topic"], [])
        for key, col in (("publish_p95_ms", "p95_ms"), ("publish_p99_ms", "p99_ms")):
            target = slo.target(key, t["topic"])
            if t[col] is None:
                continue
            bad = sum(1 for r in rows if r[col] is not None and r[col] > target)
            checks.append(Check(key, t["topic"], target, float(t[col]), bad, len(rows)))
    ok_by_minute: dict[Any, int] = {}
    for r in publish:
        ok_by_minute[r["minute"]] = ok_by_minute.get(r["minute"], 0) + r["publishes"] - r["failed"]
    err_by_minute: dict[Any, int] = {}
    for r in errors:
        err_by_minute[r["minute"]] = err_by_minute.get(r["minute"], 0) + r["errors"]
    minutes = set(ok_by_minute) | set(err_by_minute)
    if minutes:
        target = slo.target("error_rate")
        ok, err = sum(ok_by_minute.values()), sum(err_by_minute.values())
        bad = sum(
            1
            for m in minutes
            if error_rate(err_by_minute.get(m, 0), ok_by_minute.get(m, 0)) > target
        )
        checks.append(
            Check("error_rate", "all RPCs", target, error_rate(err, ok), bad, len(minutes))
        )
    by_sub: dict[str, list[Any]] = {}
    for r in backlog:
        by_sub.setdefault(r["subscription"], []).append(r)
    for sub, rows in sorted(by_sub.items()):
        target = slo.target("backlog_oldest_age_s", rows[0]["topic"])
        worst = max(float(r["max_oldest_age_s"] or 0.0) for r in rows)
        bad = sum(1 for r in rows if (r["max_oldest_age_s"] or 0.0) > target)
        checks.append(Check("backlog_oldest_age_s", sub, target, worst, bad, len(rows)))
    by_delivery: dict[str, list[Any]] = {}
    for r in delivery or []:
        by_delivery.setdefault(r["subscription"], []).append(r)
    for t in sorted(delivery_totals or [], key=lambda t: str(t["subscription"])):
        rows = by_delivery.get(t["subscription"], [])
        for key, col in (("delivery_p95_ms", "p95_ms"), ("delivery_p99_ms", "p99_ms")):
            target = slo.target(key, t["topic"])
            if t[col] is None:
                continue
            bad = sum(1 for r in rows if r[col] is not None and r[col] > target)
            checks.append(Check(key, t["subscription"], target, float(t[col]), bad, len(rows)))
    return checks


def error_rate(errors: int, ok: int) -> float:
    """errors / (successful calls + errors); 0 when there were no calls."""
    return errors / (errors + ok) if errors + ok else 0.0
