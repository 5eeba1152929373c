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
    python -m bench.run --only =publish-raw-100B,=drain-raw --targets pubsubd --baseline HEAD~5

``--baseline REV`` adds the target ``pubsubd-baseline``: the same pubsubd server (same command
line and settings as ``pubsubd``) running the code of git revision REV, exported with ``git
archive`` into a temporary directory and put first on its ``PYTHONPATH``. It runs every workload
``pubsubd`` runs, interleaved with it run by run, and the tables gain a before/after table
(``pubsubd`` ÷ ``pubsubd-baseline``, medians and per-run ratios). Only the server's code differs:
the clients, the runner and the interpreter are this checkout's.

The feature workloads (``drain-raw-*``, ``publish-raw-attrs``/``-delay``) run on pubsubd only and
are reported against plainer baselines of the same session. The ``names`` workloads take many
minutes, so they run only when ``--only`` names them.

The pieces: ``bench/registry.py`` (which workloads and targets exist), ``bench/orchestration.py``
(starting the targets and running the measurements), ``bench/report.py`` (medians, ratios,
markdown tables, machine info); this module is the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import time

from bench.orchestration import log, run_session, started
from bench.registry import ALL_TARGETS, BASELINE, KNOWN_TARGETS, WORKLOADS, select
from bench.report import RESULTS_DIR, machine_info, markdown, summarise
from bench.targets import REPO_ROOT, Revision, TargetError, exported


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
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help=f"also run pubsubd as of git revision REV (target {BASELINE}) beside the current "
        "code, interleaved run by run, and report after/before",
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
    for k in requested - set(KNOWN_TARGETS):
        raise SystemExit(f"unknown target {k!r}; choose from {','.join(KNOWN_TARGETS)}")
    if args.baseline:
        requested.add(BASELINE)
    elif BASELINE in requested:
        raise SystemExit(f"the {BASELINE} target needs --baseline REV")
    keys = [
        k
        for k in KNOWN_TARGETS
        if k in requested and any(k in w.targets_for(args.quick) for w in workloads)
    ]

    info = machine_info()
    started_at = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    baseline: Revision | None = None
    try:
        with contextlib.ExitStack() as stack:
            if args.baseline:
                baseline = stack.enter_context(exported(args.baseline))
                log(f"{BASELINE}: {baseline.name} = {baseline.commit}, exported to {baseline.src}")
            targets = stack.enter_context(started(keys, baseline))
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
            "baseline": (
                {"rev": baseline.name, "commit": baseline.commit} if baseline is not None else None
            ),
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
    if baseline is not None:
        print(
            f"{BASELINE} ran commit {baseline.commit[:10]} ({baseline.name}); pubsubd ran the "
            f"working tree at {info['git_commit']}"
            + (
                f" plus uncommitted {', '.join(info['src_uncommitted'])}"
                if info["src_uncommitted"]
                else ""
            )
            + "\n"
        )
    print(table)
    failed = [m for m in measurements if not m.ok]
    for m in failed:
        print(f"FAILED {m.workload} {m.target} run {m.run + 1}: {m.error.strip()[-500:]}")
    print(f"raw results: {stem.with_suffix('.json').relative_to(REPO_ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
