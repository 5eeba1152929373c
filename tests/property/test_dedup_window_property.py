"""Property test: the two-tier dedup window (runs of ``prefix:n`` IDs, single IDs) answers like a
plain dict of dedup ID -> (time, position), whatever mix of IDs is stored, re-stored after it
expired, and expired."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pubsubd.core import ids
from pubsubd.data.publish.dedup_window import DedupWindow, as_run

pytestmark = pytest.mark.property

WINDOW = 10

# A small universe so IDs repeat, runs touch and prefixes mix with non-canonical forms.
ns = st.integers(min_value=0, max_value=12)
prefixes = st.sampled_from(["q:1:0", "q:1:1", "", "p"])
odd_ids = st.sampled_from(
    ["uuid-a", "q:1:0:07", "q:1:0:-1", "q:1:0:", ":", "p:x", "p:１"]  # noqa: RUF001 (a non-ASCII digit)
)


@st.composite
def batches(draw: st.DrawFn) -> list[str]:
    """What one stored request holds: mostly runs of consecutive n, sometimes a mix."""
    out: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        if draw(st.booleans()):
            prefix, start = draw(prefixes), draw(ns)
            out += [f"{prefix}:{n}" for n in range(start, start + draw(st.integers(1, 5)))]
        else:
            out.append(draw(st.one_of(odd_ids, st.builds(lambda p, n: f"{p}:{n}", prefixes, ns))))
    return out


class WindowModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.window = DedupWindow(WINDOW)
        self.model: dict[str, tuple[int, int]] = {}  # id -> (time, position)
        self.now = 100
        self.next_offset = {0: 0, 2: 0}

    def _in_window(self, dedup_id: str) -> bool:
        found = self.model.get(dedup_id)
        return found is not None and found[0] >= self.now - WINDOW

    @rule(batch=batches(), source=st.sampled_from([0, 2]), use_run=st.booleans())
    def store(self, batch: list[str], source: int, use_run: bool) -> None:
        # As the Deduplicator does: IDs within the window are duplicates, one copy per request.
        fresh: list[str] = []
        for dedup_id in batch:
            if not self._in_window(dedup_id) and dedup_id not in fresh:
                fresh.append(dedup_id)
        if not fresh:
            return
        first = ids.position(source, self.next_offset[source])
        self.next_offset[source] += len(fresh)
        # As the Deduplicator does: a run is remembered in one step when it is known to be one.
        self.window.remember(fresh, first, self.now, as_run(fresh) if use_run else None)
        for k, dedup_id in enumerate(fresh):
            self.model[dedup_id] = (self.now, first + k)

    @rule(dt=st.integers(min_value=0, max_value=6))
    def tick(self, dt: int) -> None:
        self.now += dt

    @precondition(lambda self: self.model)
    @rule()
    def expire(self) -> None:
        self.window.expire(self.now)
        cutoff = self.now - WINDOW
        self.model = {k: v for k, v in self.model.items() if v[0] >= cutoff}
        # After expire() the window holds, and pins, exactly the live IDs.
        want: dict[int, int] = {}
        for _, pos in self.model.values():
            s, o = ids.source_of(pos), ids.offset_of(pos)
            want[s] = min(want.get(s, o), o)
        assert self.window.pin(2) == want
        assert len(self.window) == len(self.model)

    @invariant()
    def answers_like_the_model(self) -> None:
        universe = set(self.model) | {f"{p}:{n}" for p in ["q:1:0", "p"] for n in range(14)}
        for dedup_id in universe:
            want = self.model[dedup_id][1] if self._in_window(dedup_id) else None
            assert self.window.get(dedup_id, self.now) == want, dedup_id

    @invariant()
    def a_run_said_new_is_new(self) -> None:
        # holds_none_of_run lets the Deduplicator skip looking a run's IDs up one by one.
        for prefix in ["q:1:0", "q:1:1", "p", ""]:
            for start in (0, 3, 11, 14):
                if self.window.holds_none_of_run(prefix, start):
                    for n in range(start, start + 4):
                        assert self.window.get(f"{prefix}:{n}", self.now) is None


TestWindowModel = WindowModel.TestCase
TestWindowModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_a_sink_request_is_one_run() -> None:
    window = DedupWindow(WINDOW)
    window.remember([f"query:7:1:{n}" for n in range(1000)], ids.position(1, 500), 100)
    window.remember([f"query:7:1:{n}" for n in range(1000, 2000)], ids.position(1, 1500), 101)
    assert window.runs == 2 and len(window) == 2000
    assert window.get("query:7:1:1234", 105) == ids.position(1, 1734)
    assert window.get("query:7:1:2000", 105) is None
    assert window.pin(2) == {1: 500}
