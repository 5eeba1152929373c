"""Run fuzz targets, each in its own atheris process (forked from one that instrumented the
imports once), and report inputs run and crashes.

``python -m tests.fuzz.campaign --inputs N [--targets a,b] [--jobs J] [--max-seconds S]
[--work DIR]``: the N inputs are split evenly across the chosen targets (all by default);
each target stops at its share or after S seconds, whichever comes first, so a run is bounded
in time. ``J`` targets run at once. A crash leaves its input as ``WORK/TARGET/crash-*`` (or
``oom-*``, ``timeout-*``); turn each into a regression input under
``tests/fuzz/corpus/TARGET/`` once the decoder is fixed. Exit status 1 if any target crashed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.run import OUTPUT
from tests.fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
_DONE = re.compile(rb"^Done (\d+) runs in", re.MULTILINE)
_EXECUTED = re.compile(rb"^stat::number_of_executed_units: (\d+)", re.MULTILINE)
_ARTIFACT = re.compile(rb"Test unit written to (\S+)")
_EXIT = re.compile(rb"^exit (\S+) (-?\d+)$")


@dataclass(frozen=True)
class Outcome:
    target: str
    inputs: int
    seconds: float
    crashes: list[str]  # the crashing inputs' files
    returncode: int
    tail: str  # the end of the run's output, for a crash report

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.crashes


def _outcome(name: str, returncode: int, seconds: float, output: bytes) -> Outcome:
    counts = _EXECUTED.findall(output) or _DONE.findall(output)
    return Outcome(
        name,
        int(counts[-1]) if counts else 0,
        seconds,
        [m.decode() for m in _ARTIFACT.findall(output)],
        returncode,
        output[-3000:].decode("utf-8", "replace"),
    )


def campaign(
    names: list[str],
    total: int,
    jobs: int,
    max_seconds: int,
    work: Path,
    progress: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Run ``names`` with ``total // len(names)`` inputs each, ``max_seconds`` at most each;
    ``progress`` is called as each target finishes. Outcomes come back in the order of
    ``names``.

    One process instruments the imports, then forks a process per target (``tests.fuzz.run
    --fork``), ``jobs`` at a time; the whole run is killed if it outlasts every target's
    ``max_seconds`` (libFuzzer stops each itself) with two minutes of slack per round."""
    share = max(1, total // len(names))
    rounds = -(-len(names) // jobs)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fuzz.run",
            "--fork",
            str(jobs),
            ",".join(names),
            str(work),
            f"-runs={share}",
            f"-max_total_time={max_seconds}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the forked targets share its group: killed with it
    )
    watchdog = threading.Timer(rounds * (max_seconds + 120), os.killpg, (proc.pid, 9))
    watchdog.start()
    started = {n: time.monotonic() for n in names[:jobs]}
    done: dict[str, Outcome] = {}
    launcher = b""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = _EXIT.match(line)
            if m is None:
                launcher = (launcher + line)[-3000:]
                continue
            name, returncode = m.group(1).decode(), int(m.group(2))
            output = (work / name / OUTPUT).read_bytes()
            seconds = time.monotonic() - started.get(name, time.monotonic())
            done[name] = outcome = _outcome(name, returncode, seconds, output)
            waiting = [n for n in names if n not in started]
            if waiting:
                started[waiting[0]] = time.monotonic()
            if progress is not None:
                progress(outcome)
        returncode = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    # A target the launcher never reported (it failed, or was killed) ran nothing.
    return [done.get(n) or _outcome(n, returncode or 1, 0.0, launcher) for n in names]


def report(outcomes: list[Outcome]) -> str:
    lines = [f"{'target':<22} {'inputs':>10} {'seconds':>8}  crashes"]
    for o in outcomes:
        crashed = ", ".join(o.crashes) if o.crashes else ("0" if o.ok else f"rc={o.returncode}")
        lines.append(f"{o.target:<22} {o.inputs:>10} {o.seconds:>8.0f}  {crashed}")
    total = sum(o.inputs for o in outcomes)
    crashes = sum(len(o.crashes) or (0 if o.ok else 1) for o in outcomes)
    lines.append(f"{'total':<22} {total:>10} {'':>8}  {crashes}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=int, default=10_000_000, help="inputs in all")
    parser.add_argument("--targets", default="", help="comma-separated; all by default")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--max-seconds", type=int, default=600, help="per target")
    parser.add_argument("--work", type=Path, default=None, help="corpora and crashes")
    args = parser.parse_args()
    names = args.targets.split(",") if args.targets else list(TARGETS)
    unknown = set(names) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    work = args.work or Path(tempfile.mkdtemp(prefix="pubsubd-fuzz-"))
    print(f"fuzzing {len(names)} targets, {args.inputs} inputs in all; work dir {work}", flush=True)

    def progress(o: Outcome) -> None:
        print(
            f"done: {o.target} {o.inputs} inputs in {o.seconds:.0f} s, crashes: "
            f"{len(o.crashes) if o.ok or o.crashes else 'exit ' + str(o.returncode)}",
            flush=True,
        )

    outcomes = campaign(names, args.inputs, args.jobs, args.max_seconds, work, progress)
    print(report(outcomes))
    for o in outcomes:
        if not o.ok:
            print(f"\n--- {o.target} (exit {o.returncode}) ---\n{o.tail}")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
