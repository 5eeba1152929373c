"""The process-wide bound on cached log entries (storage/cache_budget.py) with real log
caches: one LRU order across logs, the oldest entry of any log dropped past the bound, and a
dropped entry still readable from its log's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsubd.core.records import Entry
from pubsubd.storage.cache_budget import CacheBudget
from pubsubd.storage.log import FsyncPolicy, SourceLog, _EntryCache

pytestmark = pytest.mark.unit


def _entry(base: int, size: int) -> Entry:
    return Entry(base, 1, 0, b"x" * size)


def test_the_oldest_entry_of_any_cache_goes_past_the_bound() -> None:
    budget = CacheBudget(300)
    a, b = _EntryCache(1 << 20, budget), _EntryCache(1 << 20, budget)
    a.put(_entry(0, 100))
    b.put(_entry(0, 100))
    a.put(_entry(1, 100))
    assert budget.bytes == 300 and a.get(0) is not None  # a's first is now the newest
    b.put(_entry(1, 100))  # over: b's first entry is the least recently used
    assert b.get(0) is None and a.get(0) is not None and b.get(1) is not None
    assert budget.bytes == 300 == a.bytes + b.bytes
    assert budget.status()["evictions"] == 1


def test_a_caches_own_bound_trims_and_clear_give_the_budget_back() -> None:
    budget = CacheBudget(10_000)
    a = _EntryCache(250, budget)
    for base in range(5):
        a.put(_entry(base, 100))
    assert a.bytes == 200 and budget.bytes == 200  # its own 250-byte bound held two
    a.drop_below(4)
    assert a.bytes == 100 and budget.bytes == 100
    a.clear()
    assert budget.bytes == 0 and budget.status()["entries"] == 0
    with pytest.raises(ValueError):
        CacheBudget(-1)


async def test_logs_share_the_bound_and_read_dropped_entries_from_disk(tmp_path: Path) -> None:
    budget = CacheBudget(64 << 10)
    logs = [SourceLog.open(tmp_path / f"log-{i}", fsync=FsyncPolicy.NEVER) for i in range(4)]
    for log in logs:
        log._cache = _EntryCache(1 << 20, budget)
    try:
        for n in range(20):
            for log in logs:
                await log.append(bytes([n]) * 4096, 1, 1_000 + n)
        assert budget.bytes <= 64 << 10
        assert sum(log.stats()["cached_bytes"] for log in logs) == budget.bytes
        for log in logs:  # everything still reads back, the oldest from disk
            entries = log.read(0, max_entries=100, max_bytes=1 << 30)
            assert [e.payload[0] for e in entries] == list(range(20))
    finally:
        for log in logs:
            await log.close()
