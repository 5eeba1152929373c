"""The dedup window: dedup ID -> the position it was stored at, for ``window_us`` (pure).

A busy topic's window holds millions of IDs (10 minutes at 50,000 rows/s is 30 million), so
the window has two tiers:

* **Runs.** IDs of the form ``<prefix>:<n>`` (``n`` a canonical decimal) that arrive as a run —
  consecutive ``n`` stored at consecutive positions at one time, as the Spark sink's
  ``query:batch:partition:row`` IDs do — are kept as one entry per run (a 1000-row request is
  one run) in per-prefix lists sorted by ``n`` and searched by bisection. A prefix's runs
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
from collections.abc import Iterable, Sequence

from pubsubd.core import ids

_BITS64 = (1 << 64) - 1
_MAX_N_DIGITS = 18  # n < 10**18
_RUN_SEPARATOR = "\x00"  # joins a run's IDs to compare them at once (see as_run)


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


def as_run(dedup_ids: Sequence[str]) -> tuple[str, int] | None:
    """``(prefix, first n)`` when the IDs are ``<prefix>:<n>``, ``<prefix>:<n + 1>``, ... (two
    or more), else None. Checked by comparing two joined strings, not ID by ID: the expected
    string has exactly ``len - 1`` separators, so equal strings split into equal IDs."""
    if len(dedup_ids) < 2:
        return None
    split = _split(dedup_ids[0])
    if split is None or _RUN_SEPARATOR in split[0]:
        return None
    prefix, first = split
    if first + len(dedup_ids) > 10**_MAX_N_DIGITS:
        return None  # the last n would not split: leave the edge to the ID-by-ID path
    head = f"{prefix}:"
    expected = head + f"{_RUN_SEPARATOR}{head}".join(map(str, range(first, first + len(dedup_ids))))
    if len(expected) != sum(map(len, dedup_ids)) + len(dedup_ids) - 1:
        return None
    if expected != _RUN_SEPARATOR.join(dedup_ids):
        return None
    return prefix, first


class _Runs:
    """One prefix's runs in parallel lists, increasing in ``n``; ``head`` skips expired ones."""

    __slots__ = ("counts", "head", "positions", "starts", "times")

    def __init__(self) -> None:
        self.starts: list[int] = []  # first n
        self.counts: list[int] = []
        self.positions: list[int] = []  # position of the first n
        self.times: list[int] = []
        self.head = 0

    def end(self) -> int:
        """The ``n`` after the last run (0 when empty)."""
        if self.head == len(self.starts):
            return 0
        return self.starts[-1] + self.counts[-1]

    def find(self, n: int) -> int:
        """Index of the run holding ``n``, or -1."""
        i = bisect_right(self.starts, n, lo=self.head) - 1
        if i < self.head or n >= self.starts[i] + self.counts[i]:
            return -1
        return i

    def append(self, first_n: int, count: int, position: int, time_us: int) -> None:
        self.starts.append(first_n)
        self.counts.append(count)
        self.positions.append(position)
        self.times.append(time_us)

    def pop_oldest(self) -> int:
        """Drop the oldest run; returns its count."""
        count = self.counts[self.head]
        self.head += 1
        if self.head > 64 and self.head * 2 > len(self.starts):
            for column in (self.starts, self.counts, self.positions, self.times):
                del column[: self.head]
            self.head = 0
        return count

    def __len__(self) -> int:
        return len(self.starts) - self.head


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
        return self.get_many((dedup_id,), now_us)[0]

    def get_many(self, dedup_ids: Iterable[str], now_us: int) -> list[int | None]:
        """``get`` of each ID; runs of ``prefix:n`` IDs are split once, not ID by ID."""
        cutoff = now_us - self.window_us
        singles = self._ids
        prefixes = self._prefixes
        out: list[int | None] = []
        expect = ""  # the ID that would continue the current run of IDs
        prefix = ""
        n = 0
        for dedup_id in dedup_ids:
            best_time, best = -1, None
            single = singles.get(dedup_id)
            if single is not None:
                best_time, best = single >> 64, single & _BITS64
            if prefixes:
                if dedup_id == expect:
                    n += 1
                else:
                    split = _split(dedup_id)
                    if split is None:
                        expect = ""
                        out.append(best if best_time >= cutoff else None)
                        continue
                    prefix, n = split
                expect = f"{prefix}:{n + 1}"
                prefix_runs = prefixes.get(prefix)
                if prefix_runs is not None:
                    i = prefix_runs.find(n)
                    if i >= 0 and prefix_runs.times[i] > best_time:
                        best_time = prefix_runs.times[i]
                        best = prefix_runs.positions[i] + n - prefix_runs.starts[i]
            out.append(best if best_time >= cutoff else None)
        return out

    def holds_none_of_run(self, prefix: str, first_n: int) -> bool:
        """True when no ID ``<prefix>:<n>`` with ``n >= first_n`` is remembered (so a run
        from there, ``as_run``, is all new without looking its IDs up one by one)."""
        if self._ids:
            return False
        prefix_runs = self._prefixes.get(prefix)
        return prefix_runs is None or first_n >= prefix_runs.end()

    def remember(
        self,
        dedup_ids: Sequence[str],
        first_position: int,
        time_us: int,
        run: tuple[str, int] | None = None,
    ) -> None:
        """IDs stored at consecutive positions from ``first_position`` at ``time_us`` (the
        newest so far). ``run``: ``as_run(dedup_ids)``, when the caller knows it is a run."""
        if run is not None:  # one chunk: what the loop below would find, without it
            self._flush(run[0], run[1], dedup_ids, first_position, time_us)
            return
        chunk_prefix = ""
        chunk_n = chunk_k = 0
        chunk_ids: list[str] = []
        expect = ""  # the ID that would continue the chunk
        for k, dedup_id in enumerate(dedup_ids):
            if dedup_id == expect:
                chunk_ids.append(dedup_id)
                expect = f"{chunk_prefix}:{chunk_n + len(chunk_ids)}"
                continue
            if chunk_ids:
                self._flush(chunk_prefix, chunk_n, chunk_ids, first_position + chunk_k, time_us)
            split = _split(dedup_id)
            if split is None:
                chunk_ids, expect = [], ""
                self._single(dedup_id, first_position + k, time_us)
            else:
                chunk_prefix, chunk_n, chunk_k, chunk_ids = split[0], split[1], k, [dedup_id]
                expect = f"{chunk_prefix}:{chunk_n + 1}"
        if chunk_ids:
            self._flush(chunk_prefix, chunk_n, chunk_ids, first_position + chunk_k, time_us)

    def _single(self, dedup_id: str, position: int, time_us: int) -> None:
        ids_ = self._ids
        if dedup_id in ids_:
            del ids_[dedup_id]  # re-stored after it expired: now the newest
        ids_[dedup_id] = time_us << 64 | position

    def _flush(
        self, prefix: str, first_n: int, chunk: Sequence[str], position: int, time_us: int
    ) -> None:
        """A run of ``<prefix>:<n>`` IDs: into the run tier when it is a run (two or more, or
        it continues the prefix's runs) and keeps the prefix increasing; else single IDs."""
        prefix_runs = self._prefixes.get(prefix)
        count = len(chunk)
        if (prefix_runs is not None or count > 1) and (
            prefix_runs is None or first_n >= prefix_runs.end()
        ):
            if prefix_runs is None:
                prefix_runs = self._prefixes[prefix] = _Runs()
            self._run_ids += count
            if (
                prefix_runs
                and first_n == prefix_runs.end()
                and prefix_runs.times[-1] == time_us
                and prefix_runs.positions[-1] + prefix_runs.counts[-1] == position
            ):  # continues the last run (a request split by the caller)
                prefix_runs.counts[-1] += count
                return
            prefix_runs.append(first_n, count, position, time_us)
            self._run_order.append((time_us, prefix, position))
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
            count = prefix_runs.pop_oldest()
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
