"""Property test: the storage node's append, retry and gap rules against a simple model.

The model is a list of entries (one message each, identified by offset and a variant that
decides its bytes). An append of entries ``[start, start + n)`` of one variant must be:
accepted when it starts at the end (or at the first offset of a new ledger), or when every
entry it overlaps is stored with the same bytes (a retry; the tail is added); refused as a gap
when it starts past the end, as a mismatch when an overlapped entry differs. After every run
the store is reopened and must hold exactly the model's entries, on every disk.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsubd.core.records import Entry
from pubsubd.storage.framing import decode_frames, encode_entry
from pubsubd.storagenode.errors import AppendGap, BadFrames, OverlapMismatch
from pubsubd.storagenode.ledger_store import LedgerStore

pytestmark = pytest.mark.property

FIRST = 100


def entry(offset: int, variant: int) -> bytes:
    return encode_entry(Entry(offset, 1, offset, b"v%d-%d" % (variant, offset)))


appends = st.lists(
    st.tuples(st.integers(FIRST - 2, FIRST + 14), st.integers(1, 4), st.integers(0, 2)),
    min_size=1,
    max_size=25,
)


def expected(model: list[int], start: int, n: int, variant: int) -> str:
    end = FIRST + len(model)
    if start < FIRST:
        return "bad"
    if start > end:
        return "gap"
    overlap = model[start - FIRST : start - FIRST + n]
    return "ok" if all(v == variant for v in overlap) else "mismatch"


async def run(tmp: Path, ops: list[tuple[int, int, int]]) -> None:
    paths = [tmp / f"d{i}" for i in range(3)]
    store = LedgerStore(paths, gap_wait_s=0.0)
    await store.open()
    model: list[int] = []  # variant per offset from FIRST on
    try:
        for start, n, variant in ops:
            data = b"".join(entry(o, variant) for o in range(start, start + n))
            want = expected(model, start, n, variant)
            try:
                end = await store.append(1, 1, FIRST, data)
                got = "ok"
            except AppendGap as e:
                got, end = "gap", e.node_end
            except OverlapMismatch as e:
                got, end = "mismatch", e.node_end
            except BadFrames:
                got, end = "bad", -1
            assert got == want, (start, n, variant, model)
            if got == "ok":
                new = start + n - FIRST - len(model)
                model.extend([variant] * max(0, new))
            if got != "bad":
                assert end == FIRST + len(model)
    finally:
        await store.close()
    store = LedgerStore(paths, gap_wait_s=0.0)
    await store.open()
    try:
        stored = b"".join(entry(FIRST + i, v) for i, v in enumerate(model))
        if model:
            data, end = await store.read(1, FIRST, max_bytes=1 << 20)
            assert data == stored and end == FIRST + len(model)
        for p in paths:
            path = p / "ledgers" / f"{1:020d}.ledger"
            assert (path.read_bytes() if path.exists() else b"") == stored
            assert decode_frames(stored)[1] == len(stored)
    finally:
        await store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(appends)
def test_append_rules_match_the_model(ops: list[tuple[int, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp), ops))
