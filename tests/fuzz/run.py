"""Run fuzz targets under atheris (coverage guided).

``python -m tests.fuzz.run TARGET WORK_DIR [libFuzzer flags]`` runs one target;
``python -m tests.fuzz.run --fork JOBS TARGET,TARGET,... WORK_DIR [libFuzzer flags]`` runs
several, ``JOBS`` at a time, each in its own process forked from one that instrumented the
imports once (the ~2.5 s every process would otherwise spend on it): a child's output goes to
``WORK_DIR/TARGET/output.log`` and the parent prints ``exit TARGET RC`` as each one ends.

pubsubd, h11 and the protobuf runtime's Python parts are instrumented for coverage. The
target's seeds and its committed corpus (``tests/fuzz/corpus/TARGET/``, read only) start the
run; new inputs go to ``WORK_DIR/corpus`` (``WORK_DIR/TARGET/corpus`` forked) and a crash to
``WORK_DIR/crash-*`` (libFuzzer's ``-artifact_prefix``). One process per target run:
libFuzzer owns the process and exits with it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import atheris

CORPUS = Path(__file__).parent / "corpus"
OUTPUT = "output.log"  # a forked run's output, in its target's work directory


def fuzz(argv0: str, name: str, work: Path, extra: list[str]) -> None:
    """Fuzz ``name`` in this process (instrumented already); libFuzzer exits it at the end."""
    from tests.fuzz.targets import TARGETS

    target = TARGETS[name]
    scratch = work / "corpus"
    scratch.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(target.seeds()):
        (scratch / f"seed-{i}").write_bytes(seed)
    dirs = [str(scratch)]
    committed = CORPUS / name
    if committed.is_dir():
        dirs.append(str(committed))
    flags = [
        f"-max_len={target.max_len}",
        f"-artifact_prefix={work}/",
        "-timeout=10",  # one input: a hang, not a slow input
        "-rss_limit_mb=1536",  # memory: a decoder allocating what the input declares
        "-print_final_stats=1",
    ]
    atheris.Setup([argv0, *flags, *extra, *dirs], target.one)
    atheris.Fuzz()


def _child(argv0: str, name: str, work: Path, extra: list[str]) -> int:
    """Fork a process fuzzing ``name``, its output in ``work/OUTPUT``; returns its pid."""
    work.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        return pid
    out = os.open(work / OUTPUT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    # The child leaves the way a single run does: libFuzzer exits it at the end, and an
    # uncaught exception of the target unwinds out of the interpreter, whose exit lets
    # libFuzzer write the crashing input.
    fuzz(argv0, name, work, extra)
    raise SystemExit(70)  # not reached: Fuzz() does not return


def fork(argv0: str, jobs: int, names: list[str], work: Path, extra: list[str]) -> None:
    """Fuzz ``names``, ``jobs`` at a time, each in a child forked from this process."""
    pending = list(reversed(names))
    running: dict[int, str] = {}
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop()
            running[_child(argv0, name, work / name, extra)] = name
        pid, status = os.wait()
        name = running.pop(pid)
        print(f"exit {name} {os.waitstatus_to_exitcode(status)}", flush=True)


def main(argv: list[str]) -> None:
    forked = len(argv) >= 5 and argv[1] == "--fork"
    if len(argv) < 3 or (argv[1] == "--fork" and not forked):
        raise SystemExit(
            "usage: python -m tests.fuzz.run TARGET WORK_DIR [libFuzzer flags]\n"
            "       python -m tests.fuzz.run --fork JOBS TARGET,... WORK_DIR [libFuzzer flags]"
        )
    with atheris.instrument_imports(include=["pubsubd", "h11"]):
        from tests.fuzz.targets import TARGETS
    if forked:
        names = argv[3].split(",")
        unknown = set(names) - set(TARGETS)
        if unknown:
            raise SystemExit(f"unknown targets: {', '.join(sorted(unknown))}")
        fork(argv[0], int(argv[2]), names, Path(argv[4]), argv[5:])
    else:
        fuzz(argv[0], argv[1], Path(argv[2]), argv[3:])


if __name__ == "__main__":
    main(sys.argv)
