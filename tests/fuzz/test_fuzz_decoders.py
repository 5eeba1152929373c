"""The decoders that read outside input, fuzzed: every committed input replayed (the crashes
fuzzing found, each a regression test) and a short coverage-guided run of every target.

The long run is ``make fuzz`` (ten million inputs; figures in README.md, "Fuzzing").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.campaign import campaign, report
from tests.fuzz.run import CORPUS
from tests.fuzz.targets import TARGETS

pytestmark = pytest.mark.fuzz

# Inputs per target in the short run: each target's process (forked from one that instrumented
# the imports in ~2.5 s) runs these in 0.1-2 s; 17 targets two at a time take ~6-10 s.
SHORT_RUN_INPUTS = 4000


def _committed() -> list[tuple[str, Path]]:
    return sorted(
        (directory.name, path)
        for directory in CORPUS.iterdir()
        if directory.is_dir()
        for path in directory.iterdir()
    )


def test_every_committed_input_names_a_target() -> None:
    assert {name for name, _ in _committed()} <= set(TARGETS)


@pytest.mark.parametrize(
    ("target", "path"), _committed(), ids=[f"{n}/{p.name}" for n, p in _committed()]
)
def test_committed_input_decodes_or_raises_the_documented_error(target: str, path: Path) -> None:
    TARGETS[target].one(path.read_bytes())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seeds_decode_or_raise_the_documented_error(target: str) -> None:
    for seed in TARGETS[target].seeds():
        TARGETS[target].one(seed)


def test_short_fuzz_run_of_every_target_finds_no_crash(tmp_path: Path) -> None:
    outcomes = campaign(sorted(TARGETS), SHORT_RUN_INPUTS * len(TARGETS), 2, 60, tmp_path)
    failed = [o for o in outcomes if not o.ok]
    assert not failed, report(outcomes) + "".join(f"\n--- {o.target}\n{o.tail}" for o in failed)
    # Each target really ran its inputs (a target that cannot start reports 0).
    assert all(o.inputs == SHORT_RUN_INPUTS for o in outcomes), report(outcomes)
