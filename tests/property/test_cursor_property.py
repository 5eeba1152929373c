"""Property tests: Cursor + AckJournal against a naive model (a Python set of acked offsets)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pubsubd.acks.cursor import CursorState
from pubsubd.acks.journal import AckJournal

pytestmark = pytest.mark.property

UNIVERSE = 64  # offsets 0..UNIVERSE-1; small so batches collide and mark_delete moves
SOURCES = (1, 2)
START = {1: 0, 2: 5}

offsets = st.integers(min_value=0, max_value=UNIVERSE - 1)
sources = st.sampled_from(SOURCES)


def model_mark_delete(acked: set[int]) -> int:
    x = 0
    while x in acked:
        x += 1
    return x


class CursorJournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = Path(tempfile.mkdtemp(prefix="ackprop-"))
        self.generation = 0
        self.dir = self.tmp / "sub"
        self.journal = AckJournal.open(self.dir, initial=START, compact_bytes=512)
        # Model: the full set of acked offsets (everything below a start is acked).
        self.model = {sid: set(range(start)) for sid, start in START.items()}
        self.durable = {sid: set(acked) for sid, acked in self.model.items()}

    def run(self, coro: object) -> None:
        self.loop.run_until_complete(coro)  # type: ignore[arg-type]

    def teardown(self) -> None:
        try:
            self.run(self.journal.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    @rule(sid=sources, batch=st.lists(offsets, max_size=20))
    def ack(self, sid: int, batch: list[int]) -> None:
        cursor = self.journal.cursors[sid]
        new = cursor.ack(batch)
        self.journal.record(sid, new)
        newly = {x for s, e in new for x in range(s, e)}
        assert newly == set(batch) - self.model[sid]
        self.model[sid] |= newly

    @rule(sid=sources, start=offsets, end=offsets)
    def ack_range(self, sid: int, start: int, end: int) -> None:
        self.journal.record(sid, self.journal.cursors[sid].ack_range(start, end))
        self.model[sid] |= set(range(start, end))

    @rule(sid=sources, mark_delete=offsets, extra=st.lists(offsets, max_size=10))
    def reset(self, sid: int, mark_delete: int, extra: list[int]) -> None:
        acked = set(range(mark_delete)) | set(extra)
        ranges = tuple((x, x + 1) for x in sorted(set(extra)))
        self.journal.reset(sid, CursorState(mark_delete, ranges))
        self.model[sid] = acked

    @rule(sync=st.booleans())
    def flush(self, sync: bool) -> None:
        self.run(self.journal.flush(sync=sync))
        self.durable = {sid: set(acked) for sid, acked in self.model.items()}

    @rule()
    def compact(self) -> None:
        # The snapshot captures the in-memory cursors, unflushed acks included.
        self.run(self.journal.compact())
        self.durable = {sid: set(acked) for sid, acked in self.model.items()}

    @rule()
    def close_and_reopen(self) -> None:
        self.run(self.journal.close())
        self.journal = AckJournal.open(self.dir, initial=START, compact_bytes=512)
        self.durable = {sid: set(acked) for sid, acked in self.model.items()}

    @rule()
    def crash_and_reopen(self) -> None:
        """Copy the on-disk files as they are (unflushed records lost) and continue there."""
        self.generation += 1
        crashed = self.tmp / f"crash{self.generation}"
        if self.dir.exists():  # a new journal creates its files on its first real write
            shutil.copytree(self.dir, crashed)
        self.run(self.journal.close())
        self.dir = crashed
        self.journal = AckJournal.open(self.dir, initial=START, compact_bytes=512)
        self.model = {sid: set(acked) for sid, acked in self.durable.items()}

    @invariant()
    def matches_model(self) -> None:
        for sid in SOURCES:
            cursor = self.journal.cursors[sid]
            acked = self.model[sid]
            assert cursor.mark_delete == model_mark_delete(acked)
            assert all(cursor.mark_delete < s for s, _ in cursor.acked_ranges())
            for x in range(UNIVERSE + 2):
                assert cursor.is_acked(x) == (x in acked)
            for x in (0, 3, 17, UNIVERSE // 2, UNIVERSE - 1, UNIVERSE + 5):
                y = x
                while y in acked:
                    y += 1
                assert cursor.next_unacked(x) == y
            for end in (0, 1, 10, UNIVERSE // 2, UNIVERSE):
                assert cursor.unacked_count(end) == sum(1 for x in range(end) if x not in acked)


CursorJournalMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCursorJournal = CursorJournalMachine.TestCase
