"""Run one fuzz target under atheris (coverage guided): ``python -m tests.fuzz.run TARGET
WORK_DIR [libFuzzer flags]``.

pubsubd, h11 and the protobuf runtime's Python parts are instrumented for coverage. The
target's seeds and its committed corpus (``tests/fuzz/corpus/TARGET/``, read only) start the
run; new inputs go to ``WORK_DIR/corpus`` and a crash to ``WORK_DIR/crash-*`` (libFuzzer's
``-artifact_prefix``). One process per run: libFuzzer owns the process and exits with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

CORPUS = Path(__file__).parent / "corpus"


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit("usage: python -m tests.fuzz.run TARGET WORK_DIR [libFuzzer flags]")
    name, work = argv[1], Path(argv[2])
    with atheris.instrument_imports(include=["pubsubd", "h11"]):
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
    atheris.Setup([argv[0], *flags, *argv[3:], *dirs], target.one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
