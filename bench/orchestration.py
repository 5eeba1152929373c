"""Running a benchmark session: start the targets, warm them up, measure each workload.

Every measurement runs in a fresh ``bench.worker`` process (killed by PID if it overruns its
bound); the order of targets rotates between runs so no target always goes first. Runs are
interleaved: run 1 of a workload on every target, then run 2 on every target, and so on, so a
drift of the machine's state (other load, page cache, the data directories growing) affects
every target alike; that is what makes a ``--baseline`` comparison fair. Progress goes
to stderr, one line per measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.registry import WARMUP, Workload
from bench.targets import REPO_ROOT, Revision, Target, TargetError, make_target
from bench.worker import RESULT_PREFIX

WORKER_GRACE_S = 60.0  # added to a workload's own time bound before its worker is killed


@dataclass
class Measurement:
    workload: str
    target: str
    run: int
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    wall_s: float = 0.0


class Server(Protocol):
    """What a measurement needs of a target: its address and the serving process's PID."""

    @property
    def endpoint(self) -> str: ...

    @property
    def pid(self) -> int | None: ...


def run_worker(
    kind: str,
    params: dict[str, Any],
    target: Server,
    timeout_s: float,
    watch: dict[str, int] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """One measurement in a fresh process; (result, "") or (None, error text). ``watch``: more
    processes of the target (name -> PID) whose CPU time the measurement records."""
    spec = {
        "workload": kind,
        "endpoint": target.endpoint,
        "server_pid": target.pid,
        "params": params,
        "watch": watch or {},
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
def started(keys: list[str], baseline: Revision | None = None) -> Iterator[dict[str, Target]]:
    """Start the targets (``baseline``: the code of the pubsubd-baseline target); stop every
    one that started, whatever happens."""
    targets: dict[str, Target] = {}
    try:
        for key in keys:
            target = make_target(key, baseline)
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
