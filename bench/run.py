"""``python -m bench.run`` (``make bench``): run the benchmark suite and report it.

Starts every selected target once (pubsubd with fsync=always and fsync=interval, Google's
emulator, the null server), warms each up, then for every workload and run measures each target
in turn, each measurement in a fresh ``bench.worker`` process. Prints markdown tables of the
medians with the ratios pubsubd/emulator and pubsubd/null (from the same session) and saves the
raw results as JSON (plus the tables as markdown) under ``bench/results/``.

Examples::

    python -m bench.run                       # full: 3 runs, ~10 minutes
    python -m bench.run --quick               # 1 run, small counts, ~2-3 minutes
    python -m bench.run --only publish-raw --targets pubsubd,null --runs 5
    python -m bench.run --only names --targets pubsubd   # 100k topics + 100k subscriptions

The feature workloads (``drain-raw-*``, ``publish-raw-attrs``/``-delay``) run on pubsubd only and
are reported against plainer baselines of the same session. The ``names`` workloads take many
minutes, so they run only when ``--only`` names them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.targets import REPO_ROOT, EmulatorTarget, Target, TargetError, make_target
from bench.worker import RESULT_PREFIX

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ALL_TARGETS = ("pubsubd", "pubsubd-interval", "emulator", "null")
CORE_TARGETS = ("pubsubd", "emulator", "null")  # fsync=interval only matters for publishing
BASE = "pubsubd"  # the target the ratios are about
WORKER_GRACE_S = 60.0  # added to a workload's own time bound before its worker is killed


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # function in bench.workloads
    title: str
    full: dict[str, Any]
    quick: dict[str, Any]
    targets: tuple[str, ...] = ALL_TARGETS
    latency: bool = False  # reports percentiles instead of a rate
    # Workloads whose rate is compared with other workloads' of the same session (feature cost).
    baselines: tuple[str, ...] = ()
    # Figures reported in a table of their own instead of a rate (the names workloads).
    report: tuple[str, ...] = ()
    # Run without --only (the names workloads take many minutes: only when asked for).
    in_default: bool = True
    # Targets of full-size runs, if fewer than ``targets`` (the emulator runs a thread per
    # subscription: 100k of them would swamp the machine).
    full_targets: tuple[str, ...] = ()
    # Each run gets a freshly started target (its RSS, fds and data dir are measured).
    fresh_target: bool = False

    def targets_for(self, quick: bool) -> tuple[str, ...]:
        return self.full_targets if self.full_targets and not quick else self.targets

    def params(self, quick: bool) -> dict[str, Any]:
        return self.quick if quick else self.full

    def bound_s(self, quick: bool) -> float:
        """Worst-case duration of one measurement, for the worker's kill timeout."""
        p = self.params(quick)
        if self.latency:
            return float(p["duration_s"] + p["warmup_s"] + 45)
        if self.report:  # creating is bounded by time_limit_s, and so is cleaning up
            return float(2 * p["time_limit_s"] + p.get("idle_s", 0) + 60)
        return float(p["time_limit_s"] + 30)


def _publish_client(size: int, label: str) -> Workload:
    return Workload(
        f"publish-client-{label}",
        "publish_client",
        f"Publish {label}, official PublisherClient (batch ≤1000 msgs / 1 MB / 10 ms)",
        {"size": size, "count": 50_000, "time_limit_s": 20.0},
        {"size": size, "count": 10_000, "time_limit_s": 10.0},
    )


def _publish_raw(size: int, label: str, count: int) -> Workload:
    return Workload(
        f"publish-raw-{label}",
        "publish_raw",
        f"Publish {label}, raw gRPC (1000-msg requests, 4 in flight)",
        {"size": size, "count": count, "batch": 1000, "concurrency": 4, "time_limit_s": 3.0},
        {"size": size, "count": count, "batch": 1000, "concurrency": 4, "time_limit_s": 1.5},
    )


FEATURE_TARGETS = ("pubsubd",)  # the emulator ignores filters and delays
DRAIN_PLAIN = "drain-raw"
PUBLISH_PLAIN = "publish-raw-100B"


def _drain_feature(name: str, title: str, baselines: tuple[str, ...], **extra: Any) -> Workload:
    """A raw drain (like drain-raw) with a delivery feature, compared with plainer drains."""
    return Workload(
        name,
        "drain_raw",
        title,
        {"count": 100_000, "size": 100, "max_messages": 5000, "time_limit_s": 30.0, **extra},
        {"count": 20_000, "size": 100, "max_messages": 5000, "time_limit_s": 15.0, **extra},
        targets=FEATURE_TARGETS,
        baselines=baselines,
    )


def _publish_feature(name: str, attributes: str, title: str) -> Workload:
    params = {"size": 100, "count": 10_000_000, "batch": 1000, "concurrency": 4}
    return Workload(
        name,
        "publish_raw",
        title,
        {**params, "time_limit_s": 3.0, "attributes": attributes},
        {**params, "time_limit_s": 1.5, "attributes": attributes},
        targets=FEATURE_TARGETS,
        baselines=(PUBLISH_PLAIN,),
    )


NAMES_REPORT = (
    "create_topics_per_s",
    "create_subs_per_s",
    "list_topics_per_s",
    "list_subs_per_s",
    "delete_subs_per_s",
    "delete_topics_per_s",
    "create_topics_server_cpu_pct",
    "create_topics_client_cpu_pct",
    "create_subs_server_cpu_pct",
    "create_subs_client_cpu_pct",
    "delete_subs_server_cpu_pct",
    "delete_topics_server_cpu_pct",
    "rss_mb_before",
    "rss_mb_created",
    "rss_mb_per_1k_names",
    "fds_before",
    "fds_created",
    "data_mb_before",
    "data_entries_before",
    "data_mb_created",
    "data_entries_created",
    "idle_server_cpu_pct",
    "rss_mb_deleted",
    "fds_deleted",
    "data_mb_deleted",
    "data_entries_deleted",
)


def _names(name: str, title: str, topics: int, subs_per_topic: int, quick_topics: int) -> Workload:
    params = {"subs_per_topic": subs_per_topic, "threads": 16, "idle_s": 6.0}
    return Workload(
        name,
        "names",
        title,
        {**params, "topics": topics, "time_limit_s": 1500.0},
        {**params, "topics": quick_topics, "time_limit_s": 300.0},
        targets=("pubsubd", "emulator"),
        full_targets=("pubsubd",),
        fresh_target=True,
        report=NAMES_REPORT,
        in_default=False,
    )


WORKLOADS: tuple[Workload, ...] = (
    _publish_client(100, "100B"),
    _publish_client(1024, "1KiB"),
    _publish_raw(100, "100B", 10_000_000),
    _publish_raw(1024, "1KiB", 4_000_000),
    Workload(
        "latency-1000",
        "latency",
        "End-to-end latency at 1000 msg/s, 100 B (official publisher → subscribe() callback)",
        {"rate": 1000, "duration_s": 10.0, "warmup_s": 1.0, "size": 100},
        {"rate": 1000, "duration_s": 3.0, "warmup_s": 1.0, "size": 100},
        targets=CORE_TARGETS,
        latency=True,
    ),
    Workload(
        "drain-client",
        "drain_client",
        "Drain a backlog of 100 B messages, official subscribe() + ack (FlowControl 5000)",
        {"count": 100_000, "size": 100, "max_messages": 5000, "time_limit_s": 15.0},
        {"count": 20_000, "size": 100, "max_messages": 5000, "time_limit_s": 8.0},
        targets=CORE_TARGETS,
    ),
    Workload(
        "drain-raw",
        "drain_raw",
        "Drain a backlog of 100 B messages, raw StreamingPull + unary Acknowledge (max 5000 out)",
        {"count": 100_000, "size": 100, "max_messages": 5000, "time_limit_s": 15.0},
        {"count": 20_000, "size": 100, "max_messages": 5000, "time_limit_s": 8.0},
        targets=CORE_TARGETS,
    ),
    _drain_feature(
        "drain-raw-attrs",
        "drain-raw with 2 attributes per message (no filter): the baseline of the filter",
        (DRAIN_PLAIN,),
        attributes="half",
    ),
    _drain_feature(
        "drain-raw-filter",
        'drain-raw through the filter attributes.half = "yes" (matches half; 2 attributes)',
        (DRAIN_PLAIN, "drain-raw-attrs"),
        attributes="half",
        filter_half=True,
    ),
    _drain_feature(
        "drain-raw-b100",
        "drain-raw of a backlog published in 100-message requests: the baseline of ordering",
        (DRAIN_PLAIN,),
        batch=100,
    ),
    _drain_feature(
        "drain-raw-ordered",
        "drain-raw with enable_message_ordering, 100 keys (one per 100-message request)",
        (DRAIN_PLAIN, "drain-raw-b100"),
        batch=100,
        keys=100,
        ordering=True,
    ),
    _drain_feature(
        "drain-raw-delay",
        'drain-raw of messages with "pubsubd.deliver_after" = "0" (delay path, due at once)',
        (DRAIN_PLAIN,),
        attributes="delay",
    ),
    _drain_feature(
        "drain-raw-delayed",
        'drain-raw of messages with "pubsubd.deliver_after" = "3": each waits in the on-disk '
        "delay index and is handed back when due (timed from the first delivery)",
        (DRAIN_PLAIN, "drain-raw-delay"),
        attributes="delay3",
        timed_from_first=True,
    ),
    _publish_feature(
        "publish-raw-attrs", "half", "Publish 100 B + 2 attributes, raw gRPC (1000-msg requests)"
    ),
    _publish_feature(
        "publish-raw-delay",
        "delay",
        'Publish 100 B + "pubsubd.deliver_after" = "0", raw gRPC (1000-msg requests)',
    ),
    _publish_feature(
        "publish-raw-delayed",
        "delay3600",
        'Publish 100 B + "pubsubd.deliver_after" = "3600" (every message indexed on disk), '
        "raw gRPC (1000-msg requests)",
    ),
    _names("names-1sub", "Topics with one subscription each", 100_000, 1, 10_000),
    _names("names-100subs", "Topics with 100 subscriptions each", 1_000, 100, 100),
)

# Warm-up per target (JIT, caches, connections): not reported.
WARMUP: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "publish_raw",
        {"size": 100, "count": 200_000, "batch": 1000, "concurrency": 4, "time_limit_s": 2.0},
    ),
    ("drain_raw", {"count": 5_000, "size": 100, "max_messages": 5000, "time_limit_s": 5.0}),
    ("publish_client", {"size": 100, "count": 5_000, "time_limit_s": 5.0}),
)


@dataclass
class Measurement:
    workload: str
    target: str
    run: int
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    wall_s: float = 0.0


# --- running -----------------------------------------------------------------------------------


def run_worker(
    kind: str, params: dict[str, Any], target: Target, timeout_s: float
) -> tuple[dict[str, Any] | None, str]:
    """One measurement in a fresh process; (result, "") or (None, error text)."""
    spec = {
        "workload": kind,
        "endpoint": target.endpoint,
        "server_pid": target.pid,
        "params": params,
    }
    env = dict(os.environ)
    env.update(
        PUBSUB_EMULATOR_HOST=target.endpoint,
        GRPC_VERBOSITY="ERROR",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=REPO_ROOT,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()  # our own child, by PID
        out, err = proc.communicate()
        return None, f"worker killed after {timeout_s:.0f}s\n{err[-3000:]}"
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :]), ""
    return None, f"worker exited with {proc.returncode}\n{err[-3000:]}"


@contextlib.contextmanager
def started(keys: list[str]) -> Iterator[dict[str, Target]]:
    """Start the targets; stop every one that started, whatever happens."""
    targets: dict[str, Target] = {}
    try:
        for key in keys:
            target = make_target(key)
            t0 = time.monotonic()
            target.start()
            targets[key] = target
            log(
                f"started {target.label} at {target.endpoint} (pid {target.pid}) in "
                f"{time.monotonic() - t0:.1f}s"
            )
        yield targets
    finally:
        for target in targets.values():
            target.stop()


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def headline(w: Workload, r: dict[str, Any]) -> str:
    if w.report:
        return (
            f"create {r.get('create_topics_per_s', 0):,.0f} topics/s, "
            f"{r.get('create_subs_per_s', 0):,.0f} subs/s; RSS {r.get('rss_mb_created', 0):,.0f} "
            f"MB, {r.get('fds_created', '-')} fds; complete={r.get('complete')}"
        )
    if w.latency:
        return f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, lost {r['lost']}"
    done = "" if r.get("complete", True) else f" (time-bounded: {r['messages']:,} msgs)"
    return f"{r['msgs_per_s']:,.0f} msg/s, {r['mb_per_s']:.1f} MB/s{done}"


def run_session(
    workloads: list[Workload], targets: dict[str, Target], runs: int, quick: bool, warmup: bool
) -> list[Measurement]:
    if warmup:
        for key, target in targets.items():
            t0 = time.monotonic()
            for kind, params in WARMUP:
                _, error = run_worker(kind, params, target, 120.0)
                if error:
                    log(f"warm-up {kind} on {key} failed: {error}")
            log(f"warmed up {key} in {time.monotonic() - t0:.1f}s")
    plan = [
        (w, run, key)
        for w in workloads
        for run in range(runs)
        for key in _rotate([k for k in targets if k in w.targets_for(quick)], run)
    ]
    measurements: list[Measurement] = []
    for i, (w, run, key) in enumerate(plan, 1):
        target = targets[key]
        prefix = f"[{i}/{len(plan)}] {w.name} run {run + 1}/{runs} {key}:"
        if w.fresh_target:
            target.stop()  # memory and file figures need a server that ran nothing else
            try:
                target.start()
            except TargetError as e:
                log(f"{prefix} restarting the target failed: {e}")
        if not target.alive():
            measurements.append(Measurement(w.name, key, run, False, error="target not running"))
            log(f"{prefix} SKIPPED, target not running")
            continue
        t0 = time.monotonic()
        result, error = run_worker(
            w.kind, w.params(quick), target, w.bound_s(quick) + WORKER_GRACE_S
        )
        wall = time.monotonic() - t0
        if result is None:
            measurements.append(Measurement(w.name, key, run, False, error=error, wall_s=wall))
            log(f"{prefix} FAILED ({wall:.1f}s): {error.strip().splitlines()[-1:]}")
            continue
        measurements.append(Measurement(w.name, key, run, True, result, wall_s=wall))
        log(f"{prefix} {headline(w, result)} [{wall:.1f}s]")
    return measurements


def _rotate(keys: list[str], run: int) -> list[str]:
    """Vary the order of targets between runs so no target always goes first."""
    if not keys:
        return keys
    k = run % len(keys)
    return keys[k:] + keys[:k]


# --- summarising -------------------------------------------------------------------------------

THROUGHPUT_KEYS = (
    "msgs_per_s",
    "mb_per_s",
    "backlog_per_s",
    "server_cpu_pct",
    "client_cpu_pct",
    "other_cpu_pct",
    "order_violations",
    "duplicates",
)
LATENCY_KEYS = (
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "p999_ms",
    "max_ms",
    "lost",
    "late_sends",
    "server_cpu_pct",
    "client_cpu_pct",
    "other_cpu_pct",
)


def summarise(workloads: list[Workload], measurements: list[Measurement]) -> dict[str, Any]:
    """Per workload and target: median/min/max of each figure; ratios of pubsubd's medians."""
    summary: dict[str, Any] = {}
    for w in workloads:
        keys = w.report or (LATENCY_KEYS if w.latency else THROUGHPUT_KEYS)
        per_target: dict[str, Any] = {}
        for target in w.targets:
            ok = [m for m in measurements if m.workload == w.name and m.target == target and m.ok]
            if not ok:
                continue
            stats: dict[str, Any] = {"runs": len(ok)}
            for key in keys:
                values = [m.result[key] for m in ok if key in m.result]
                if values:
                    stats[key] = {
                        "median": statistics.median(values),
                        "min": min(values),
                        "max": max(values),
                        "runs": values,
                    }
            stats["complete"] = all(m.result.get("complete", True) for m in ok)
            stats["messages"] = [m.result.get("messages") for m in ok]
            per_target[target] = stats
        ratios: dict[str, Any] = {}
        metrics = ("p50_ms", "p99_ms") if w.latency else ("msgs_per_s",)
        for other in ("emulator", "null"):
            if BASE in per_target and other in per_target:
                for metric in metrics:
                    a = per_target[BASE].get(metric, {}).get("median")
                    b = per_target[other].get(metric, {}).get("median")
                    if a and b:
                        ratios[f"{BASE}/{other} {metric}"] = {
                            "of_medians": a / b,
                            "per_run_median": _per_run_ratio(measurements, w, other, metric),
                        }
        summary[w.name] = {"title": w.title, "targets": per_target, "ratios": ratios}
    return summary


def _per_run_ratio(
    measurements: list[Measurement], w: Workload, other: str, metric: str
) -> float | None:
    by_run: dict[int, dict[str, float]] = {}
    for m in measurements:
        if m.workload == w.name and m.ok and metric in m.result:
            by_run.setdefault(m.run, {})[m.target] = m.result[metric]
    ratios = [r[BASE] / r[other] for r in by_run.values() if BASE in r and r.get(other)]
    return statistics.median(ratios) if ratios else None


# --- markdown ----------------------------------------------------------------------------------

LABELS = {
    "pubsubd": "pubsubd (fsync=always)",
    "pubsubd-interval": "pubsubd (fsync=interval)",
    "emulator": "Google emulator",
    "null": "null server",
}


def _med(stats: dict[str, Any], key: str) -> float | None:
    value = stats.get(key, {}).get("median")
    return float(value) if value is not None else None


def _ratio(summary: dict[str, Any], name: str, other: str, metric: str) -> str:
    r = summary[name]["ratios"].get(f"{BASE}/{other} {metric}")
    return f"{r['of_medians']:.2f}x" if r else "-"


def markdown(summary: dict[str, Any], workloads: list[Workload], targets: list[str]) -> str:
    lines: list[str] = []
    rate = [w for w in workloads if not w.latency and not w.report and w.name in summary]
    if rate:
        cols = [t for t in targets if any(t in summary[w.name]["targets"] for w in rate)]
        lines += [
            "Throughput: median msgs/s (payload MB/s); † = stopped by its time bound",
            "",
            "| Workload | "
            + " | ".join(LABELS.get(t, t) for t in cols)
            + f" | {BASE} ÷ emulator | {BASE} ÷ null |",
            "|---|" + "---:|" * (len(cols) + 2),
        ]
        for w in rate:
            cells = []
            for t in cols:
                stats = summary[w.name]["targets"].get(t)
                if stats is None:
                    cells.append("-")
                    continue
                msgs, mb = _med(stats, "msgs_per_s"), _med(stats, "mb_per_s")
                mark = "" if stats["complete"] else " †"
                cells.append(f"{msgs:,.0f} ({mb:.1f}){mark}" if msgs is not None else "-")
            lines.append(
                f"| {w.name} | "
                + " | ".join(cells)
                + f" | {_ratio(summary, w.name, 'emulator', 'msgs_per_s')}"
                + f" | {_ratio(summary, w.name, 'null', 'msgs_per_s')} |"
            )
        lines += [
            "",
            "Spread: msgs/s of each run (min-max)",
            "",
            "| Workload | " + " | ".join(LABELS.get(t, t) for t in cols) + " |",
            "|---|" + "---:|" * len(cols),
        ]
        for w in rate:
            cells = []
            for t in cols:
                stats = summary[w.name]["targets"].get(t, {}).get("msgs_per_s")
                cells.append(f"{stats['min']:,.0f}-{stats['max']:,.0f}" if stats else "-")
            lines.append(f"| {w.name} | " + " | ".join(cells) + " |")
        lines += [""]
    lat = [w for w in workloads if w.latency and w.name in summary]
    for w in lat:
        lines += [
            f"{w.title}: median of runs, ms",
            "",
            "| Target | p50 | p90 | p99 | p99.9 | max | lost | server CPU | client CPU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for t in targets:
            stats = summary[w.name]["targets"].get(t)
            if stats is None:
                continue
            vals = [_med(stats, k) for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")]
            lost = _med(stats, "lost")
            cpu = [_med(stats, k) for k in ("server_cpu_pct", "client_cpu_pct")]
            lines.append(
                f"| {LABELS.get(t, t)} | "
                + " | ".join(f"{v:.1f}" if v is not None else "-" for v in vals)
                + f" | {lost:.0f} | "
                + " | ".join(f"{c:.0f}%" if c is not None else "-" for c in cpu)
                + " |"
            )
        for other in ("emulator", "null"):
            if not summary[w.name]["ratios"].get(f"{BASE}/{other} p50_ms"):
                continue
            lines.append(
                f"| ratio {BASE} ÷ {other} | {_ratio(summary, w.name, other, 'p50_ms')} | "
                f"| {_ratio(summary, w.name, other, 'p99_ms')} | | | | | |"
            )
        lines += [""]
    lines += _feature_table(summary, [w for w in rate if w.baselines])
    for w in workloads:
        if w.report and w.name in summary:
            lines += _report_table(summary, w, targets)
    if rate or lat:
        shown = rate + lat
        cols = [t for t in targets if any(t in summary[w.name]["targets"] for w in shown)]
        lines += [
            "CPU during the measured section, median % of one core (200 = both cores of a "
            "2-CPU machine): server / client / rest of the machine (other users, kernel)",
            "",
            "| Workload | " + " | ".join(LABELS.get(t, t) for t in cols) + " |",
            "|---|" + "---:|" * len(cols),
        ]
        for w in shown:
            cells = []
            for t in cols:
                stats = summary[w.name]["targets"].get(t)
                if stats is None:
                    cells.append("-")
                    continue
                srv, cli, oth = (
                    _med(stats, k) for k in ("server_cpu_pct", "client_cpu_pct", "other_cpu_pct")
                )
                cells.append(
                    " / ".join(f"{v:.0f}" if v is not None else "-" for v in (srv, cli, oth))
                )
            lines.append(f"| {w.name} | " + " | ".join(cells) + " |")
        lines += [""]
    return "\n".join(lines)


def _feature_table(summary: dict[str, Any], features: list[Workload]) -> list[str]:
    """Feature cost: each workload's median rate against its baselines' (same session)."""
    if not features:
        return []

    def med(name: str, key: str) -> float | None:
        stats = summary.get(name, {}).get("targets", {}).get(BASE)
        return _med(stats, key) if stats else None

    lines = [
        f"Feature cost ({LABELS[BASE]}): median msgs/s delivered, backlog msgs/s consumed "
        "(delivered or filtered out), and ratios of medians to the baselines in this session",
        "",
        "| Workload | delivered msgs/s | backlog msgs/s | server CPU | ratio delivered "
        "| ratio backlog |",
        "|---|---:|---:|---:|---|---|",
    ]
    for w in features:
        rate, backlog = med(w.name, "msgs_per_s"), med(w.name, "backlog_per_s")
        cpu = med(w.name, "server_cpu_pct")
        ratios, backlog_ratios = [], []
        for base in w.baselines:
            b_rate, b_backlog = med(base, "msgs_per_s"), med(base, "backlog_per_s")
            if rate and b_rate:
                ratios.append(f"{rate / b_rate:.2f}x {base}")
            if backlog and (b_backlog or b_rate):
                backlog_ratios.append(f"{backlog / (b_backlog or b_rate or 1):.2f}x {base}")
        cells = [
            f"{rate:,.0f}" if rate else "-",
            f"{backlog:,.0f}" if backlog else "-",
            f"{cpu:.0f}%" if cpu is not None else "-",
            ", ".join(ratios) or "-",
            ", ".join(backlog_ratios) or "-",
        ]
        lines.append(f"| {w.name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _report_table(summary: dict[str, Any], w: Workload, targets: list[str]) -> list[str]:
    """One row per reported figure, one column per target: medians (min-max)."""
    cols = [t for t in targets if t in summary[w.name]["targets"]]
    p = w.full  # titles name the full sizes; quick runs say so in the JSON
    lines = [
        f"{w.name}: {w.title} ({p.get('topics')} topics x {p.get('subs_per_topic')} "
        "subscriptions at full size): median (min-max) of runs",
        "",
        "| Figure | " + " | ".join(LABELS.get(t, t) for t in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for key in w.report:
        cells = []
        for t in cols:
            stats = summary[w.name]["targets"][t].get(key)
            if not stats:
                cells.append("-")
                continue
            med_, lo, hi = stats["median"], stats["min"], stats["max"]
            fmt = "{:,.0f}" if abs(med_) >= 100 else "{:,.1f}"
            cell = fmt.format(med_)
            if len(stats["runs"]) > 1:
                cell += f" ({fmt.format(lo)}-{fmt.format(hi)})"
            cells.append(cell)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    complete = [t for t in cols if not summary[w.name]["targets"][t]["complete"]]
    if complete:
        lines.append(f"\nIncomplete (time bound or errors): {', '.join(complete)}")
    return [*lines, ""]


# --- environment -------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        (
            int(line.split()[1])
            for line in read("/proc/meminfo").splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    versions = {}
    for package in ("grpcio", "google-cloud-pubsub", "protobuf", "uvloop", "pubsubd"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "ram_gib": round(mem_kb / 2**20, 1),
        "disk": _disk_info(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": versions,
        "emulator": EmulatorTarget.version(),
        "java": (java.stderr.splitlines() or ["unknown"])[0],
        "git_commit": git.stdout.strip(),
        **_source_state(),
        "loadavg_start": os.getloadavg(),
    }


def _source_state() -> dict[str, Any]:
    """What code the servers ran: uncommitted files under src/ and a digest of src/pubsubd."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", "src"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "src" / "pubsubd").rglob("*.py")):
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    return {
        "src_uncommitted": [line[3:] for line in status.stdout.splitlines()],
        "src_sha256": digest.hexdigest()[:16],
    }


def _disk_info() -> str:
    """Block device under the temp dir (where pubsubd's data dirs live) and its rotational flag."""
    import tempfile

    tmp = Path(tempfile.gettempdir()).resolve()
    best = ("", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mount = line.split()[:2]
        if str(tmp).startswith(mount) and len(mount) > len(best[1]):
            best = (dev, mount)
    dev = Path(best[0]).name
    rotational = Path(f"/sys/block/{dev}/queue/rotational")
    flag = rotational.read_text().strip() if rotational.exists() else "?"
    return f"{best[0]} on {best[1]} (rotational={flag})"


# --- CLI ---------------------------------------------------------------------------------------


def select(only: str | None) -> list[Workload]:
    if not only:
        return [w for w in WORKLOADS if w.in_default]
    wanted = [s.strip() for s in only.split(",") if s.strip()]
    # "=name" selects exactly that workload (e.g. "=drain-raw" without the drain-raw-* ones).
    chosen = [
        w
        for w in WORKLOADS
        if any(
            w.name == s.removeprefix("=") or (s[0] != "=" and w.name.startswith(s)) for s in wanted
        )
    ]
    if not chosen:
        raise SystemExit(f"--only {only!r} matches no workload; see --list")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, 1 run by default")
    parser.add_argument(
        "--runs", type=int, help="runs per workload and target (default 3, quick 1)"
    )
    parser.add_argument(
        "--only", help="comma-separated workload names or prefixes; =NAME for exactly NAME"
    )
    parser.add_argument(
        "--targets", default=",".join(ALL_TARGETS), help=f"subset of {','.join(ALL_TARGETS)}"
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the per-target warm-up")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    args = parser.parse_args(argv)
    if args.list:
        for w in WORKLOADS:
            extra = "" if w.in_default else "; only with --only"
            if w.full_targets:
                extra += f"; full size: {','.join(w.full_targets)}"
            print(f"{w.name:22} {w.title}  [targets: {','.join(w.targets)}{extra}]")
        return 0
    runs = args.runs or (1 if args.quick else 3)
    workloads = select(args.only)
    requested = {k.strip() for k in args.targets.split(",") if k.strip()}
    for k in requested - set(ALL_TARGETS):
        raise SystemExit(f"unknown target {k!r}; choose from {','.join(ALL_TARGETS)}")
    keys = [
        k
        for k in ALL_TARGETS
        if k in requested and any(k in w.targets_for(args.quick) for w in workloads)
    ]

    info = machine_info()
    started_at = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    try:
        with started(keys) as targets:
            measurements = run_session(workloads, targets, runs, args.quick, not args.no_warmup)
    except TargetError as e:
        log(f"error: {e}")
        return 2
    info["loadavg_end"] = os.getloadavg()
    summary = summarise(workloads, measurements)
    table = markdown(summary, workloads, keys)
    report = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t0, 1),
        "machine": info,
        "settings": {
            "quick": args.quick,
            "runs": runs,
            "targets": keys,
            "workloads": {w.name: {"kind": w.kind, **w.params(args.quick)} for w in workloads},
            "warmup": not args.no_warmup,
        },
        "summary": summary,
        "measurements": [m.__dict__ for m in measurements],
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = (
        RESULTS_DIR
        / f"bench-{started_at.strftime('%Y%m%dT%H%M%SZ')}{'-quick' if args.quick else ''}"
    )
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(table + "\n")
    print(
        f"## pubsubd benchmarks ({'quick, ' if args.quick else ''}{runs} run(s), "
        f"{report['duration_s']:.0f} s)\n"
    )
    print(
        f"{info['nproc']} CPUs ({info['cpu_model']}), {info['ram_gib']} GiB RAM, Python "
        f"{info['python']}, grpcio {info['packages']['grpcio']}, google-cloud-pubsub "
        f"{info['packages']['google-cloud-pubsub']}, emulator {info['emulator']}; load average "
        f"{info['loadavg_start'][0]:.2f} → {info['loadavg_end'][0]:.2f}\n"
    )
    print(table)
    failed = [m for m in measurements if not m.ok]
    for m in failed:
        print(f"FAILED {m.workload} {m.target} run {m.run + 1}: {m.error.strip()[-500:]}")
    print(f"raw results: {stem.with_suffix('.json').relative_to(REPO_ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
