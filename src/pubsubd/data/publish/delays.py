"""Delay tracker: when each delayed message of one topic falls due, from the on-disk index.

One tracker per topic, beside its publish message sources. It watches the topic's logs commit,
puts every delayed message (``pubsubd.deliver_at`` / ``deliver_after``) into the on-disk delay
index (storage/delay_index.py) and, on a timer, takes the rows that have fallen due a page at a
time and hands their positions to the subscription dispatchers of the topic.

The contract with the dispatchers is the ``done`` mark, a ``(at_us, position)`` pair that only
grows: the tracker has handed out every delayed message at or below it, and the index holds a row
for every delayed message above it. So a dispatcher reading the log delivers a delayed message
whose ``(at_us, position)`` is at or below ``done`` and skips (forgets) one above it: the tracker
will hand it back when it falls due. A message indexed at or below ``done`` (it was published due,
or fell due while its commit was being indexed) is handed out at once.

At start-up ``done`` is "now": dispatchers start from their subscriptions' mark-delete positions
and read every unacked message again, so rows already due are stale and deleted; entries committed
after the index's recorded progress (a crash) are indexed again from the log.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from pubsubd.core import ids, pb
from pubsubd.core.clock import SYSTEM_CLOCK, Clock, Timer
from pubsubd.core.delays import MARKER, due_times
from pubsubd.core.errors import DiskFull
from pubsubd.data.publish.source import TopicSources
from pubsubd.observability import background
from pubsubd.storage.delay_index import DelayIndex, Row
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange

log = logging.getLogger(__name__)

# After an unexpected failure of the timer, it runs again this much later.
FAILURE_RETRY_S = 1.0

# Rows handed out per timer step (one index range scan).
PAGE_ROWS = 10_000
# A subscription with consumers holding this many due-but-undelivered messages pauses the paging
# (the rows wait on disk instead of in its memory).
MAX_PENDING_DUE = 50_000
PRESSURE_RETRY_S = 0.1
# A write to the index failed for lack of disk space: try again after this long.
DISK_FULL_RETRY_S = 1.0
MAX_POSITION = (1 << 63) - 1

Mark = tuple[int, int]  # (at_us, position) in due order


@dataclass
class DueListener:
    """A subscription dispatcher's hooks: take due positions, say how many it still holds."""

    on_due: Callable[[list[int]], None]
    pending: Callable[[], int]


class DelayTracker:
    """``first_delay``: created by the topic's first delayed publish, so nothing committed so
    far is delayed and indexing starts at the committed offsets (recorded at once, before that
    publish is appended, so a crash before its row is written still re-reads it)."""

    def __init__(
        self,
        sources: TopicSources,
        index: DelayIndex,
        first_delay: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.clock = clock
        self.sources = sources
        self.topic = sources.topic_uid
        self.index = index
        self.done: Mark = (self.clock.time_us(), MAX_POSITION)
        self._listeners: dict[int, DueListener] = {}
        self._through: dict[int, int] = {}  # source -> offset below which all is indexed
        self._saved: dict[int, int] = {}  # the part of _through the index has recorded
        self._watched: dict[int, Callable[[int], None]] = {}
        self._timer: Timer | None = None
        self._timer_at: int | None = None
        # A lower bound of the earliest row's due time (None: the index has no row of the topic).
        self._earliest: int | None = None
        self._closed = False
        # Rows that fell due while the server was down are stale: the dispatchers re-read them.
        first = self.index.next_due(self.topic)
        if first is not None and first <= self.done[0]:
            self.index.delete_due(self.topic, self.done[0])
            first = self.index.next_due(self.topic)
        self._earliest = first
        self._saved = self.index.progress(self.topic)
        if first_delay and not self._saved:
            self._saved = {s: log_.committed_offset for s, log_ in enumerate(sources.logs)}
            self.index.save_progress(self.topic, self._saved)
        self.watch_sources()
        self._arm(first)

    # --- dispatchers --------------------------------------------------------------------------

    def add_listener(self, key: int, listener: DueListener) -> None:
        self._listeners[key] = listener

    def remove_listener(self, key: int) -> None:
        self._listeners.pop(key, None)

    def is_due(self, at_us: int, position: int) -> bool:
        """Whether a dispatcher reading this delayed message delivers it (see module doc)."""
        return (at_us, position) <= self.done

    # --- indexing -----------------------------------------------------------------------------

    def watch_sources(self) -> None:
        """Index the sources not watched yet (all at start, new ones as the topic grows)."""
        for source, log_ in enumerate(self.sources.logs):
            if source in self._watched:
                continue
            start = max(self._saved.get(source, log_.start_offset), log_.start_offset)
            self._through[source] = start
            callback = functools.partial(self._on_commit, source)
            self._watched[source] = callback
            log_.add_listener(callback)
            if start < log_.committed_offset:
                self._on_commit(source, log_.committed_offset)  # catch up after a crash

    def _on_commit(self, source: int, committed: int) -> None:
        if self._closed:
            return
        log_ = self.sources.logs[source]
        offset = self._through.get(source, log_.start_offset)
        rows: list[Row] = []
        due_now: list[int] = []
        now = self.clock.time_us()
        if self._earliest is None or self._earliest > now:
            # No row is due yet, so everything up to now has been handed out: messages published
            # already due skip the index.
            self.done = max(self.done, (now, MAX_POSITION))
        done = self.done
        while offset < committed:
            try:
                entries = log_.read(offset, max_entries=256)
            except OffsetOutOfRange:
                offset = log_.start_offset
                continue
            except DamagedEntries as e:  # delivery decides about damaged messages
                offset = e.damaged.end_offset
                continue
            if not entries:
                break
            for entry in entries:
                offset = entry.next_offset
                if MARKER not in entry.payload:
                    continue
                request = pb.PublishRequest.FromString(entry.payload)
                dues = due_times(request.messages, entry.publish_time_us)
                if dues is None:
                    continue
                base = ids.position(source, entry.base_offset)
                for at, first, n in _runs(dues):
                    if (at, base + first + n - 1) <= done:
                        due_now.extend(range(base + first, base + first + n))
                    else:  # (``done`` never falls inside a new run: it is an indexed position)
                        rows.append((at, base + first, n))
        if rows:
            try:
                self.index.add(self.topic, rows, {source: offset})
            except DiskFull:
                # Nothing indexed: these entries are read again by the next commit or
                # flush_progress. Dispatchers skip the messages meanwhile, as for any row.
                return
            self._saved[source] = offset
        self._through[source] = offset
        if rows:
            first = min(row[0] for row in rows)
            self._earliest = first if self._earliest is None else min(self._earliest, first)
            self._arm(first)
        if due_now:
            self._hand_out(due_now)

    def flush_progress(self) -> None:
        """Record how far the logs are indexed (so a restart re-reads only the rest), after
        indexing what a full disk left unindexed. Raises DiskFull if the disk is still full."""
        for source, log_ in enumerate(self.sources.logs):
            if source in self._watched and self._through[source] < log_.committed_offset:
                self._on_commit(source, log_.committed_offset)
        changed = {s: o for s, o in self._through.items() if self._saved.get(s) != o}
        if changed:
            self.index.save_progress(self.topic, changed)
            self._saved.update(changed)

    def pending_rows(self) -> int:
        """Delayed messages not yet due (rows in the index)."""
        return self.index.count(self.topic)

    # --- falling due --------------------------------------------------------------------------

    def _arm(self, at_us: int | None) -> None:
        if at_us is None or self._closed:
            return
        if self._timer is not None and self._timer_at is not None and self._timer_at <= at_us:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at_us
        delay = max(0.0, (at_us - self.clock.time_us()) / 1e6)
        self._timer = self.clock.call_later(delay, self._timer_step)

    def _timer_step(self) -> None:
        """The timer callback: a failure is reported (observability/background.py) and the
        timer tries again a little later, so delayed messages are never left waiting for good."""
        try:
            self._on_timer()
        except Exception as e:
            background.report("delay tracker", e)
            self._timer_at = self.clock.time_us() + int(FAILURE_RETRY_S * 1e6)
            self._timer = self.clock.call_later(FAILURE_RETRY_S, self._timer_step)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._closed:
            return
        if any(
            lst.pending() >= MAX_PENDING_DUE for lst in self._listeners.values()
        ):  # let the dispatchers deliver what they hold first
            self._timer_at = self.clock.time_us() + int(PRESSURE_RETRY_S * 1e6)
            self._timer = self.clock.call_later(PRESSURE_RETRY_S, self._timer_step)
            return
        now = self.clock.time_us()
        rows = self.index.due(self.topic, now, PAGE_ROWS)
        try:
            if len(rows) == PAGE_ROWS:
                at, first, n = rows[-1]
                self.index.delete_through(self.topic, at, first)
                mark = (at, first + n - 1)
            else:
                if rows:
                    self.index.delete_due(self.topic, now)
                mark = (now, MAX_POSITION)
        except DiskFull:  # nothing deleted nor handed out: the same rows next time
            self._timer_at = now + int(DISK_FULL_RETRY_S * 1e6)
            self._timer = self.clock.call_later(DISK_FULL_RETRY_S, self._timer_step)
            return
        self.done = max(self.done, mark)
        if rows:
            self._hand_out([pos for _, first, n in rows for pos in range(first, first + n)])
        if len(rows) == PAGE_ROWS:
            self._timer_at = now
            self._timer = self.clock.call_later(0, self._timer_step)
        else:
            self._earliest = self.index.next_due(self.topic)
            self._arm(self._earliest)

    def _hand_out(self, positions: list[int]) -> None:
        for lst in tuple(self._listeners.values()):
            try:
                lst.on_due(positions)
            except Exception:
                log.exception("delay listener of topic %s failed", self.topic)

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(DiskFull):  # the next start indexes from the saved progress
            self.flush_progress()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for source, callback in self._watched.items():
            if source < len(self.sources.logs):
                self.sources.logs[source].remove_listener(callback)
        self._watched.clear()


def _runs(dues: list[int | None]) -> list[tuple[int, int, int]]:
    """(due time, first index, length) of each run of consecutive delayed messages of one batch
    that share a due time."""
    out: list[tuple[int, int, int]] = []
    start = 0
    while start < len(dues):
        at = dues[start]
        stop = start + 1
        while stop < len(dues) and dues[stop] == at:
            stop += 1
        if at is not None:
            out.append((at, start, stop - start))
        start = stop
    return out
