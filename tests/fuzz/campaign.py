"""Run fuzz targets, each in its own atheris process, and report inputs run and crashes.

``python -m tests.fuzz.campaign --inputs N [--targets a,b] [--jobs J] [--max-seconds S]
[--work DIR]``: the N inputs are split evenly across the chosen targets (all by default);
each target stops at its share or after S seconds, whichever comes first, so a run is bounded
in time. ``J`` targets run at once. A crash leaves its input as ``WORK/TARGET/crash-*`` (or
``oom-*``, ``timeout-*``); turn each into a regression input under
``tests/fuzz/corpus/TARGET/`` once the decoder is fixed. Exit status 1 if any target crashed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
_DONE = re.compile(rb"^Done (\d+) runs in", re.MULTILINE)
_EXECUTED = re.compile(rb"^stat::number_of_executed_units: (\d+)", re.MULTILINE)
_ARTIFACT = re.compile(rb"Test unit written to (\S+)")


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


def run_target(name: str, inputs: int, max_seconds: int, work: Path) -> Outcome:
    """One atheris process: ``inputs`` runs of ``name`` at most, ``max_seconds`` at most."""
    directory = work / name
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fuzz.run",
            name,
            str(directory),
            f"-runs={inputs}",
            f"-max_total_time={max_seconds}",
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=max_seconds + 120,  # startup and the last input; libFuzzer stops itself
        check=False,
    )
    output = proc.stdout + proc.stderr
    counts = _EXECUTED.findall(output) or _DONE.findall(output)
    crashes = [m.decode() for m in _ARTIFACT.findall(output)]
    return Outcome(
        name,
        int(counts[-1]) if counts else 0,
        time.monotonic() - started,
        crashes,
        proc.returncode,
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
    """Run ``names`` with ``total // len(names)`` inputs each; ``progress`` is called as each
    target finishes. Outcomes come back in the order of ``names``."""
    share = max(1, total // len(names))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_target, n, share, max_seconds, work): n for n in names}
        done = {}
        for future in as_completed(futures):
            done[futures[future]] = outcome = future.result()
            if progress is not None:
                progress(outcome)
    return [done[n] for n in names]


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
