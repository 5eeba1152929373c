"""The dedup window: dedup ID -> the position it was stored at, for ``window_us`` (pure).

A busy topic's window holds millions of IDs (10 minutes at 50,000 rows/s is 30 million), so
the window has two tiers:

* **Runs.** IDs of the form ``<prefix>:<n>`` (``n`` a canonical decimal) that arrive as a run —
  consecutive ``n`` stored at consecutive positions at one time, as the Spark sink's
  ``query:batch:partition:row`` IDs do — are kept as one packed int per run (a 1000-row request
  is one run), in a per-prefix list sorted by ``n`` and searched by bisection. A prefix's runs
  must be increasing in ``n`` (each starts at or above where the last ended); an ID that would
  break that goes to the other tier.
* **Single IDs** (everything else) in an OrderedDict, oldest first, one int per ID beside its key:
  ``time_us << 64 | position``.

Both tiers forget in time order (``expire``). An ID re-stored after it expired may sit in both
tiers until the older copy is swept; ``get`` answers the newer one.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Iterable

from pubsubd.core import ids

_BITS64 = (1 << 64) - 1
# A run packed into one int, ordered by its first ``n`` (the top field):
#   first_n << 148 | count << 128 | first_position << 64 | time_us
_COUNT_SHIFT, _N_SHIFT = 128, 148
_COUNT_MASK = (1 << 20) - 1
_MAX_RUN = _COUNT_MASK  # longer runs are split
_MAX_N_DIGITS = 18  # n < 10**18 < 2**60


def _split(dedup_id: str) -> tuple[str, int] | None:
    """``(prefix, n)`` for ``<prefix>:<n>`` with a canonical decimal ``n``, else None."""
    prefix, colon, tail = dedup_id.rpartition(":")
    if (
        not colon
        or not tail.isascii()
        or not tail.isdigit()
        or len(tail) > _MAX_N_DIGITS
        or (tail[0] == "0" and len(tail) > 1)
    ):
        return None
    return prefix, int(tail)


def _pack(first_n: int, count: int, first_position: int, time_us: int) -> int:
    return first_n << _N_SHIFT | count << _COUNT_SHIFT | first_position << 64 | time_us


class _Runs:
    """One prefix's runs, increasing in ``n``; ``head`` skips the expired ones."""

    __slots__ = ("head", "runs")

    def __init__(self) -> None:
        self.runs: list[int] = []
        self.head = 0

    def end(self) -> int:
        """The ``n`` after the last run (0 when empty)."""
        if self.head == len(self.runs):
            return 0
        last = self.runs[-1]
        return (last >> _N_SHIFT) + (last >> _COUNT_SHIFT & _COUNT_MASK)

    def find(self, n: int) -> int | None:
        runs = self.runs
        i = bisect_right(runs, (n + 1) << _N_SHIFT, lo=self.head) - 1
        if i < self.head:
            return None
        run = runs[i]
        first = run >> _N_SHIFT
        return run if n < first + (run >> _COUNT_SHIFT & _COUNT_MASK) else None

    def pop_oldest(self) -> int:
        run = self.runs[self.head]
        self.head += 1
        if self.head > 64 and self.head * 2 > len(self.runs):
            del self.runs[: self.head]
            self.head = 0
        return run

    def __len__(self) -> int:
        return len(self.runs) - self.head


class DedupWindow:
    def __init__(self, window_us: int) -> None:
        self.window_us = window_us
        self._ids: OrderedDict[str, int] = OrderedDict()
        self._prefixes: dict[str, _Runs] = {}
        # (time_us, prefix, first position) per run, oldest first
        self._run_order: deque[tuple[int, str, int]] = deque()
        self._run_ids = 0

    def __len__(self) -> int:
        return len(self._ids) + self._run_ids

    @property
    def runs(self) -> int:
        """Runs held (each stands for one or more IDs)."""
        return len(self._run_order)

    def get(self, dedup_id: str, now_us: int) -> int | None:
        """The position ``dedup_id`` was stored at, if within the window."""
        cutoff = now_us - self.window_us
        best_time, best = -1, None
        single = self._ids.get(dedup_id)
        if single is not None:
            best_time, best = single >> 64, single & _BITS64
        if self._prefixes:
            split = _split(dedup_id)
            prefix_runs = self._prefixes.get(split[0]) if split is not None else None
            if split is not None and prefix_runs is not None:
                run = prefix_runs.find(split[1])
                if run is not None and run & _BITS64 > best_time:
                    best_time = run & _BITS64
                    best = (run >> 64 & _BITS64) + split[1] - (run >> _N_SHIFT)
        return best if best_time >= cutoff else None

    def remember(self, dedup_ids: Iterable[str], first_position: int, time_us: int) -> None:
        """IDs stored at consecutive positions from ``first_position`` at ``time_us`` (the
        newest so far)."""
        chunk_prefix: str | None = None
        chunk_n = chunk_k = chunk_len = 0
        chunk_ids: list[str] = []
        k = -1
        for k, dedup_id in enumerate(dedup_ids):
            split = _split(dedup_id)
            if (
                split is not None
                and split[0] == chunk_prefix
                and split[1] == chunk_n + chunk_len
                and chunk_len < _MAX_RUN
            ):
                chunk_len += 1
                chunk_ids.append(dedup_id)
                continue
            if chunk_ids:
                self._flush(chunk_prefix, chunk_n, chunk_ids, first_position + chunk_k, time_us)
            if split is None:
                chunk_prefix, chunk_ids, chunk_len = None, [], 0
                self._single(dedup_id, first_position + k, time_us)
            else:
                chunk_prefix, chunk_n, chunk_k, chunk_len = split[0], split[1], k, 1
                chunk_ids = [dedup_id]
        if chunk_ids:
            self._flush(chunk_prefix, chunk_n, chunk_ids, first_position + chunk_k, time_us)

    def _single(self, dedup_id: str, position: int, time_us: int) -> None:
        ids_ = self._ids
        if dedup_id in ids_:
            del ids_[dedup_id]  # re-stored after it expired: now the newest
        ids_[dedup_id] = time_us << 64 | position

    def _flush(
        self, prefix: str | None, first_n: int, chunk: list[str], position: int, time_us: int
    ) -> None:
        """A run of ``<prefix>:<n>`` IDs: into the run tier when it is a run (two or more, or
        it continues the prefix's runs) and keeps the prefix increasing; else single IDs."""
        assert prefix is not None
        prefix_runs = self._prefixes.get(prefix)
        runs_ok = prefix_runs is not None or len(chunk) > 1
        if runs_ok and (prefix_runs is None or first_n >= prefix_runs.end()):
            if prefix_runs is None:
                prefix_runs = self._prefixes[prefix] = _Runs()
            count = len(chunk)
            if prefix_runs and first_n == prefix_runs.end():
                last = prefix_runs.runs[-1]
                last_count = last >> _COUNT_SHIFT & _COUNT_MASK
                if (
                    last & _BITS64 == time_us
                    and (last >> 64 & _BITS64) + last_count == position
                    and last_count + count <= _MAX_RUN
                ):  # continues the last run (a request split by the caller)
                    prefix_runs.runs[-1] = _pack(
                        last >> _N_SHIFT, last_count + count, last >> 64 & _BITS64, time_us
                    )
                    self._run_ids += count
                    return
            prefix_runs.runs.append(_pack(first_n, count, position, time_us))
            self._run_order.append((time_us, prefix, position))
            self._run_ids += count
            return
        for j, dedup_id in enumerate(chunk):
            self._single(dedup_id, position + j, time_us)

    def expire(self, now_us: int) -> int:
        """Forget IDs older than the window; returns how many."""
        cutoff = now_us - self.window_us
        n = 0
        ids_ = self._ids
        while ids_:
            first = next(iter(ids_.values()))
            if first >> 64 >= cutoff:
                break
            ids_.popitem(last=False)
            n += 1
        order = self._run_order
        while order and order[0][0] < cutoff:
            _, prefix, _ = order.popleft()
            prefix_runs = self._prefixes[prefix]
            run = prefix_runs.pop_oldest()
            count = run >> _COUNT_SHIFT & _COUNT_MASK
            self._run_ids -= count
            n += count
            if not prefix_runs:
                del self._prefixes[prefix]
        return n

    def pin(self, source_count: int) -> dict[int, int]:
        """Per source, the lowest remembered offset."""
        lowest: dict[int, int] = {}
        # Oldest first in each tier, and a source's positions grow with time: the first
        # position of a source met in a tier is the tier's lowest for it.
        for tier in (
            (tagged & _BITS64 for tagged in self._ids.values()),
            (position for _, _, position in self._run_order),
        ):
            found: set[int] = set()
            for position in tier:
                source = ids.source_of(position)
                if source in found:
                    continue
                found.add(source)
                offset = ids.offset_of(position)
                if offset < lowest.get(source, offset + 1):
                    lowest[source] = offset
                if len(found) >= source_count:
                    break
        return lowest
