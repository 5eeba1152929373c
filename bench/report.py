"""Reporting a benchmark session: medians and ratios, markdown tables, the machine it ran on.

``summarise`` reduces the measurements to median/min/max per workload and target and the ratios
of pubsubd's medians to the emulator's, the null server's and (``--baseline``) the baseline
revision's; ``markdown`` renders the tables
that ``bench.run`` prints and saves; ``machine_info`` records the machine, package versions and
source state saved with the raw results under ``bench/results/``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import statistics
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.orchestration import Measurement
from bench.registry import BASE, BASELINE, Workload, with_baseline
from bench.targets import REPO_ROOT, EmulatorTarget

RESULTS_DIR = Path(__file__).resolve().parent / "results"


THROUGHPUT_KEYS = (
    "msgs_per_s",
    "mb_per_s",
    "backlog_per_s",
    "server_cpu_pct",
    "client_cpu_pct",
    "other_cpu_pct",
    "order_violations",
    "duplicates",
    "server_us_per_msg",  # derived: server CPU time per message (see _figures)
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


def _figures(m: Measurement) -> dict[str, Any]:
    """A measurement's figures plus derived ones: ``server_us_per_msg``, the server's CPU time
    per message (less sensitive than the rate to the client's share of a 2-CPU machine)."""
    figures = dict(m.result)
    cpu, rate = figures.get("server_cpu_pct"), figures.get("msgs_per_s")
    if cpu is not None and rate:
        figures["server_us_per_msg"] = cpu / 100 * 1e6 / rate
    return figures


def summarise(workloads: list[Workload], measurements: list[Measurement]) -> dict[str, Any]:
    """Per workload and target: median/min/max of each figure; ratios of pubsubd's medians."""
    summary: dict[str, Any] = {}
    for w in workloads:
        keys = w.report or (LATENCY_KEYS if w.latency else THROUGHPUT_KEYS)
        per_target: dict[str, Any] = {}
        for target in with_baseline(w.targets):
            ok = [m for m in measurements if m.workload == w.name and m.target == target and m.ok]
            if not ok:
                continue
            stats: dict[str, Any] = {"runs": len(ok)}
            figures = [_figures(m) for m in ok]
            for key in keys:
                values = [f[key] for f in figures if key in f]
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
        for other in ("emulator", "null", BASELINE):
            if BASE in per_target and other in per_target:
                extra = ("server_us_per_msg",) if other == BASELINE and not w.latency else ()
                for metric in (*metrics, *extra):
                    a = per_target[BASE].get(metric, {}).get("median")
                    b = per_target[other].get(metric, {}).get("median")
                    if a and b:
                        per_run = _per_run_ratios(measurements, w, other, metric)
                        ratios[f"{BASE}/{other} {metric}"] = {
                            "of_medians": a / b,
                            "per_run_median": statistics.median(per_run) if per_run else None,
                            "per_run": per_run,
                        }
        summary[w.name] = {"title": w.title, "targets": per_target, "ratios": ratios}
    return summary


def _per_run_ratios(
    measurements: list[Measurement], w: Workload, other: str, metric: str
) -> list[float]:
    """pubsubd's figure ÷ ``other``'s in each run (the two measured one after the other)."""
    by_run: dict[int, dict[str, float]] = {}
    for m in measurements:
        figures = _figures(m)
        if m.workload == w.name and m.ok and metric in figures:
            by_run.setdefault(m.run, {})[m.target] = figures[metric]
    return [r[BASE] / r[other] for _, r in sorted(by_run.items()) if BASE in r and r.get(other)]


LABELS = {
    "pubsubd": "pubsubd (fsync=always)",
    "pubsubd-interval": "pubsubd (fsync=interval)",
    "emulator": "Google emulator",
    "null": "null server",
    BASELINE: "pubsubd baseline (fsync=always)",
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
        for other in ("emulator", "null", BASELINE):
            if not summary[w.name]["ratios"].get(f"{BASE}/{other} p50_ms"):
                continue
            lines.append(
                f"| ratio {BASE} ÷ {other} | {_ratio(summary, w.name, other, 'p50_ms')} | "
                f"| {_ratio(summary, w.name, other, 'p99_ms')} | | | | | |"
            )
        lines += [""]
    if BASELINE in targets:
        lines += _before_after_table(summary, rate)
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


def _before_after_table(summary: dict[str, Any], rate: list[Workload]) -> list[str]:
    """``--baseline``: each rate workload before (the baseline revision) and after (this tree)."""
    shown = [
        w for w in rate if {BASE, BASELINE} <= set(summary[w.name]["targets"])
    ]  # workloads both ran
    if not shown:
        return []

    def spread(stats: dict[str, Any]) -> str:
        return f"{(stats['max'] - stats['min']) / stats['median']:.0%}" if stats["median"] else "-"

    lines = [
        f"Before/after: {LABELS[BASELINE]} (before: the --baseline revision) and {LABELS[BASE]} "
        "(after: this tree), same session, runs interleaved. msgs/s median (min-max); after ÷ "
        "before of the medians, and of each run's pair (the two measured one after the other); "
        "spread = (max - min) ÷ median of one target's runs; server CPU µs per message, medians",
        "",
        "| Workload | before msgs/s | after msgs/s | after ÷ before | per-run after ÷ before "
        "| spread before / after | server µs/msg before → after |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for w in shown:
        before = summary[w.name]["targets"][BASELINE]
        after = summary[w.name]["targets"][BASE]
        ratio = summary[w.name]["ratios"].get(f"{BASE}/{BASELINE} msgs_per_s")
        if "msgs_per_s" not in before or "msgs_per_s" not in after or not ratio:
            continue
        b, a = before["msgs_per_s"], after["msgs_per_s"]
        per_run = ratio["per_run"]
        runs = (
            f"{statistics.median(per_run):.3f} ({min(per_run):.3f}-{max(per_run):.3f})"
            if per_run
            else "-"
        )
        us_b, us_a = _med(before, "server_us_per_msg"), _med(after, "server_us_per_msg")
        us = f"{us_b:.1f} → {us_a:.1f}" if us_b is not None and us_a is not None else "-"
        mark_b = "" if before["complete"] else " †"
        mark_a = "" if after["complete"] else " †"
        lines.append(
            f"| {w.name} | {b['median']:,.0f} ({b['min']:,.0f}-{b['max']:,.0f}){mark_b} "
            f"| {a['median']:,.0f} ({a['min']:,.0f}-{a['max']:,.0f}){mark_a} "
            f"| {ratio['of_medians']:.3f} | {runs} | {spread(b)} / {spread(a)} | {us} |"
        )
    return [*lines, ""]


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
