"""Append-only, segmented, crash-safe log of one publish message source.

Layout: a directory of segment files named ``{base_offset:020d}.seg``, each a run of
frames (see :mod:`pubsubd.storage.framing`) with consecutive offsets; the segment with
the highest base is the active one, the only one written to. The active segment is never
deleted, so an emptied log still remembers its end offset across restarts.

Writes: :meth:`SourceLog.append` assigns offsets immediately, in call order, and queues
the frame. One writer task takes everything queued, writes it with one ``write()`` and,
with :attr:`FsyncPolicy.ALWAYS`, one fsync for the whole group before resolving every
append in it (group commit). Writes go through a :class:`QuorumWriter`, today over the
local disk only. A replicated log (``remote``, a cluster) acknowledges a group once the
storage nodes' quorum has it and serves it from memory until its unsynced local write has
put it in the index. Reads are synchronous ``pread`` calls on the local segment files, with a
bounded in-memory cache of recent entries for fan-out to many subscriptions.

Recovery (:meth:`SourceLog.open`) rebuilds the in-memory index (three ``array('q')`` per
segment: offsets, file positions, publish times): a sealed segment's from the index file
written when the log rolled past it (:mod:`pubsubd.storage.segment_index`), if it checks out,
else by scanning the segment; the last segment is always scanned and a torn tail cut off it.

Damage (:mod:`pubsubd.storage.damage`): an invalid frame followed by a valid one is not a torn
tail. The scan resynchronises on the next valid frame and records the entries in between as a
damaged range; a read that finds an entry failing its CRC records it the same way. Reads stop
before a damaged range and raise :class:`DamagedEntries` inside one, so one flipped byte costs
the entries it hit, never the log, the topic or the server. :meth:`SourceLog.recheck_damage`
re-reads damaged ranges, so bytes an operator restores become readable without a restart.

Many logs, few files: a log whose directory does not exist yet is empty at offset 0 and
creates its directory and first segment (fsyncing each new directory entry) before its
first write, so topics that are never published to cost no files. :meth:`release_idle`,
called every few seconds, closes the files of a log unused since the previous call; they
reopen on the next read or append.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import os
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pubsubd.observability import metrics
from pubsubd.storage import cache_budget, segment_index
from pubsubd.storage.cache_budget import CacheBudget
from pubsubd.storage.damage import FOUND_AT_START, FOUND_BY_READ, DamagedRange, DamageMap
from pubsubd.storage.disk_space import disk_full_reason
from pubsubd.storage.errors import (
    CorruptEntry,
    DamagedEntries,
    LogClosed,
    OffsetOutOfRange,
    StorageError,
)
from pubsubd.storage.files import fsync_directory, make_dirs
from pubsubd.storage.framing import (
    FRAME_OVERHEAD,
    Entry,
    decode_frame_at,
    decode_frames,
    encode_entry,
    find_next_frame,
    scan_frames,
)
from pubsubd.storage.replication import (
    SEGMENT_SUFFIX,
    LocalDiskReplica,
    QuorumWriter,
    parse_segment_file_name,
    segment_file_name,
)

__all__ = ["SEGMENT_SUFFIX", "DamagedRange", "FsyncPolicy", "SourceLog"]

logger = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 << 20  # roll to a new segment past this size
DEFAULT_FSYNC_INTERVAL_S = 0.05  # background fsync period for FsyncPolicy.INTERVAL
DEFAULT_CACHE_BYTES = 32 << 20  # payload bytes of recent entries kept in memory
MAX_GROUP_BYTES = 16 << 20  # bytes written per group; a bigger backlog forms several groups
# A replicated log sends its next group while earlier ones are on their way to the storage
# nodes only when this many bytes wait: below that, waiting for the round trip gathers the
# next group (fewer, larger appends; on one 2-CPU machine pipelining small groups cost a
# sixth of the throughput, BENCHMARKS.md); above it the groups are large anyway and the
# round trip would leave the nodes idle. At most REMOTE_PIPELINE groups are on their way.
REMOTE_PIPELINE = 4
REMOTE_PIPELINE_BYTES = 4 << 20
# A replicated log's local copy that could not be written is tried again after this pause,
# doubled after each failure up to the second figure (the data is durable meanwhile).
LOCAL_RETRY_FIRST_S = 0.1
LOCAL_RETRY_MAX_S = 5.0
MAX_OPEN_READ_FDS = 16  # read-only segment fds kept open per log (LRU)
DEFAULT_READ_MAX_ENTRIES = 1000
DEFAULT_READ_MAX_BYTES = 4 << 20


class RemoteLog(Protocol):
    """The durable copy of a log on other machines (storage/ledgers/writer.py)."""

    async def append(self, first_offset: int, frames: bytes, end_offset: int) -> None: ...
    def start_append(
        self,
        first_offset: int,
        frames: bytes,
        end_offset: int,
        done: Callable[[BaseException | None], None],
    ) -> bool:
        """:meth:`append` without a coroutine: sent now, ``done`` called once with its
        outcome (None: durable), from the step that learns it; or False (nothing sent):
        await :meth:`append` instead."""
        ...

    async def read_frames(self, start: int, end: int) -> bytes:
        """Frames of the durable copy from ``start`` (an entry's base offset), at least one
        entry when ``start < end``, none at or past ``end``."""
        ...

    async def trim(self, before_offset: int) -> int: ...
    async def close(self) -> None: ...
    async def destroy(self) -> None:
        """Delete every ledger of the source and its metadata (the topic is gone)."""
        ...


# Where the remote copy of a topic's source comes from: (topic uid, source) -> its ledgers.
RemoteLogs = Callable[[str, int], RemoteLog]


class FsyncPolicy(enum.Enum):
    """When appended data is fsynced before an append is acknowledged."""

    ALWAYS = "always"  # every group is fsynced before its appends resolve
    INTERVAL = "interval"  # appends resolve after write(); fsync in the background
    NEVER = "never"  # never fsync; the OS flushes when it likes


Listener = Callable[[int], None]


@dataclass(slots=True, eq=False)
class _Segment:
    """In-memory index of one segment file (committed entries only)."""

    base: int
    path: Path
    offsets: array[int] = field(default_factory=lambda: array("q"))
    positions: array[int] = field(default_factory=lambda: array("q"))
    times: array[int] = field(default_factory=lambda: array("q"))
    size: int = 0  # committed bytes
    end_offset: int = -1  # next offset after the last entry
    # The start-up scan skipped damaged bytes: the index has a hole, so no index file may be
    # written for this segment (it would hide the hole at the next start).
    holes: bool = False

    def __post_init__(self) -> None:
        if self.end_offset < 0:
            self.end_offset = self.base

    def add(self, base_offset: int, count: int, publish_time_us: int, length: int) -> None:
        self.offsets.append(base_offset)
        self.positions.append(self.size)
        self.times.append(publish_time_us)
        self.size += length
        self.end_offset = base_offset + count

    def add_at(
        self, position: int, base_offset: int, count: int, publish_time_us: int, length: int
    ) -> None:
        """Add an entry found at ``position`` (after damaged bytes the scan skipped)."""
        self.size = position
        self.add(base_offset, count, publish_time_us, length)

    def frame_end(self, index: int) -> int:
        """File position just after entry ``index``'s frame."""
        return self.positions[index + 1] if index + 1 < len(self.positions) else self.size


class _EntryCache:
    """LRU of entries keyed by base offset, bounded by total payload bytes, and charged to the
    process-wide budget (``storage/cache_budget.py``), which may drop its oldest entries."""

    __slots__ = ("_budget", "_entries", "_max_bytes", "bytes")

    def __init__(self, max_bytes: int, budget: CacheBudget | None = None) -> None:
        # Created by the first put: a log never written or read has no cache.
        self._entries: OrderedDict[int, Entry] | None = None
        self._max_bytes = max_bytes
        self._budget = budget if budget is not None else cache_budget.PROCESS
        self.bytes = 0

    def get(self, base_offset: int) -> Entry | None:
        if self._entries is None:
            return None
        entry = self._entries.get(base_offset)
        if entry is not None:
            self._entries.move_to_end(base_offset)
            self._budget.touch(self, base_offset)
        return entry

    def put(self, entry: Entry) -> None:
        size = len(entry.payload)
        if self._entries is None:
            self._entries = OrderedDict()
        entries = self._entries
        if size > self._max_bytes or entry.base_offset in entries:
            return
        entries[entry.base_offset] = entry
        self.bytes += size
        while self.bytes > self._max_bytes:
            base, old = entries.popitem(last=False)
            self.bytes -= len(old.payload)
            self._budget.forget(self, base)
        self._budget.charge(self, entry.base_offset, size)

    def evicted(self, base_offset: int) -> None:
        """The process-wide budget dropped this entry (it was the oldest of any log's)."""
        if self._entries is not None:
            entry = self._entries.pop(base_offset, None)
            if entry is not None:
                self.bytes -= len(entry.payload)

    def drop_below(self, offset: int) -> None:
        entries = self._entries
        if entries is None:
            return
        for key in [k for k in entries if k < offset]:
            self.bytes -= len(entries.pop(key).payload)
            self._budget.forget(self, key)

    def clear(self) -> None:
        if self._entries is not None:
            for key in self._entries:
                self._budget.forget(self, key)
        self._entries = None
        self.bytes = 0


@dataclass(slots=True)
class _Pending:
    entry: Entry
    frame: bytes
    future: asyncio.Future[int]


@dataclass(slots=True, eq=False)
class _Flight:
    """A replicated log's group on its way to the storage nodes."""

    group: list[_Pending]
    landed: bool = False  # the quorum has it
    error: BaseException | None = None  # the quorum refused it


def _recover(directory: Path) -> tuple[list[_Segment], list[DamagedRange]]:
    """Scan the segment files of ``directory`` into an index; cut a torn last tail; record
    damaged entries instead of failing on them."""
    bases = sorted(
        base
        for path in directory.iterdir()
        if (base := parse_segment_file_name(path.name)) is not None
    )
    if not bases:
        path = directory / segment_file_name(0)
        path.touch()
        fsync_directory(directory)
        return [_Segment(0, path)], []
    segments: list[_Segment] = []
    damaged: list[DamagedRange] = []
    for k, base in enumerate(bases):
        is_last = k == len(bases) - 1
        path = directory / segment_file_name(base)
        if segments and base != segments[-1].end_offset:
            previous = segments[-1]
            if base < previous.end_offset:
                raise CorruptEntry(
                    f"{path}: segment starts at offset {base} but the previous one ends at"
                    f" {previous.end_offset}"
                )
            # The previous segment's damaged tail (or a lost segment file) hides these.
            tail = damaged[-1] if damaged and damaged[-1].path == str(previous.path) else None
            if tail is not None and tail.end_offset == previous.end_offset:
                damaged[-1] = _with_end(tail, base)
            else:
                damaged.append(
                    DamagedRange(
                        str(previous.path),
                        previous.end_offset,
                        base,
                        previous.size,
                        previous.size,
                        f"no entries between this segment's end and {path.name}",
                        FOUND_AT_START,
                        indexed=False,
                    )
                )
            previous.end_offset = base
            previous.holes = True
        if not is_last:  # sealed: its index file spares the scan (storage/segment_index.py)
            index = segment_index.load(directory, base, path.stat().st_size)
            if index is not None:
                segments.append(
                    _Segment(
                        base,
                        path,
                        offsets=index.offsets,
                        positions=index.positions,
                        times=index.times,
                        size=index.size,
                        end_offset=index.end_offset,
                    )
                )
                continue
        segment, found = _scan_segment(path, base, is_last)
        segments.append(segment)
        damaged.extend(found)
        if not is_last and not segment.holes:
            segment_index.write(directory, _index_of(segment))
    for d in damaged:
        if d.end_offset > d.first_offset:
            logger.error("log %s: damaged entries: %s", directory, d.describe())
        else:
            logger.warning("log %s: invalid bytes hold no entry: %s", directory, d.describe())
    return segments, [d for d in damaged if d.end_offset > d.first_offset]


def _scan_segment(path: Path, base: int, is_last: bool) -> tuple[_Segment, list[DamagedRange]]:
    """Index one segment by scanning it. An invalid frame with a valid one after it is
    damage (recorded, skipped); with none after it, a torn tail (cut off the last segment) or
    a damaged tail (a sealed segment's: it runs to the segment's end)."""
    data = path.read_bytes()
    segment = _Segment(base, path)
    damaged: list[DamagedRange] = []
    position = 0
    while True:
        scan = scan_frames(data, position)
        for frame in scan.frames:
            if frame.base_offset != segment.end_offset:
                raise CorruptEntry(
                    f"{path}: entry at byte {frame.position} has offset {frame.base_offset},"
                    f" expected {segment.end_offset}"
                )
            segment.add_at(
                frame.position, frame.base_offset, frame.count, frame.publish_time_us, frame.length
            )
        if scan.problem is None:
            return segment, damaged
        resync = find_next_frame(data, scan.valid_end, segment.end_offset)
        if resync is None:
            break
        if resync.base_offset > segment.end_offset:
            damaged.append(
                DamagedRange(
                    str(path),
                    segment.end_offset,
                    resync.base_offset,
                    scan.valid_end,
                    resync.position,
                    scan.problem,
                    FOUND_AT_START,
                    indexed=False,
                )
            )
        segment.holes = True
        segment.end_offset = resync.base_offset
        position = resync.position
    if is_last:
        logger.warning(
            "%s: cutting %d bytes of torn tail at byte %d (%s)",
            path,
            len(data) - scan.valid_end,
            scan.valid_end,
            scan.problem,
        )
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, scan.valid_end)
            os.fsync(fd)
        finally:
            os.close(fd)
        segment.size = scan.valid_end
    else:
        # A sealed segment's tail never tears (the log rolled past it after fsyncing it): the
        # entries up to the next segment's base are damaged (set by _recover). The size stays
        # the valid prefix: nothing is ever appended to a sealed segment.
        damaged.append(
            DamagedRange(
                str(path),
                segment.end_offset,
                segment.end_offset,  # placeholder: _recover sets the next segment's base
                scan.valid_end,
                len(data),
                scan.problem,
                FOUND_AT_START,
                indexed=False,
            )
        )
        segment.size = scan.valid_end
        segment.holes = True
    return segment, damaged


def _with_end(damaged: DamagedRange, end_offset: int) -> DamagedRange:
    return DamagedRange(
        damaged.path,
        damaged.first_offset,
        end_offset,
        damaged.byte_start,
        damaged.byte_stop,
        damaged.reason,
        damaged.found,
        damaged.indexed,
    )


def _index_of(segment: _Segment) -> segment_index.SegmentIndex:
    return segment_index.SegmentIndex(
        segment.base,
        segment.end_offset,
        segment.size,
        segment.offsets,
        segment.positions,
        segment.times,
    )


def _base_offset(entry: Entry) -> int:
    return entry.base_offset


def _create_log_files(directory: Path, first_segment: Path) -> None:
    """Create a new log's directory (and missing parents) and first segment, durably."""
    make_dirs(directory)
    fd = os.open(first_segment, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.close(fd)
    fsync_directory(directory)


class SourceLog:
    """The append-only log of one publish message source; see the module docstring.

    All methods must be called from the thread running the event loop that the log is
    used with (the writer task is bound to the loop of the first :meth:`append`).
    """

    # One per publish message source, and every topic has one: no per-instance __dict__.
    __slots__ = (
        "_active",
        "_cache",
        "_close_task",
        "_closed",
        "_closing",
        "_committed_offset",
        "_damage",
        "_directory",
        "_dirtied",
        "_dirty",
        "_end_offset",
        "_fsync_interval_s",
        "_fsyncs",
        "_listeners",
        "_local_write_retries",
        "_on_disk",
        "_pending",
        "_pending_bytes",
        "_policy",
        "_read_fds",
        "_release_requested",
        "_remote",
        "_remote_sends",
        "_remote_tasks",
        "_replica",
        "_restoring",
        "_segment_bytes",
        "_segment_lock",
        "_segments",
        "_stop_syncer",
        "_syncer_task",
        "_unwritten",
        "_wakeup",
        "_write_fd_open",
        "_write_groups",
        "_writer",
        "_writer_task",
        "_written_offset",
    )

    def __init__(
        self,
        directory: Path,
        segments: list[_Segment],
        *,
        fsync: FsyncPolicy,
        segment_bytes: int,
        fsync_interval_s: float,
        cache_bytes: int,
        damaged: Iterable[DamagedRange] = (),
        remote: RemoteLog | None = None,
    ) -> None:
        self._directory = directory
        # In a cluster the source's ledgers on the storage nodes are the durable copy and
        # this directory a local copy to read from (storage/ledgers/): an append is
        # committed (readable, acknowledged) once the remote quorum has it, and written to
        # the local copy after that, not fsynced.
        self._remote = remote
        self._remote_tasks: set[asyncio.Task[int]] = set()
        self._remote_sends: set[asyncio.Future[None]] = set()  # groups sent in tasks
        # Damage found while running is re-read from the storage nodes at once; until that
        # finishes, readers wait at it instead of applying the damage policy (it is not lost).
        self._restoring = False
        self._segments = segments
        # Damaged ranges (storage/damage.py); None while there are none, the usual case.
        self._damage: DamageMap | None = None
        for d in damaged:
            self._damage_map().add(d)
        self._policy = fsync
        self._segment_bytes = segment_bytes
        self._fsync_interval_s = fsync_interval_s
        self._replica = LocalDiskReplica(directory)
        self._writer = QuorumWriter([self._replica])
        self._end_offset = segments[-1].end_offset
        self._committed_offset = self._end_offset
        # A replicated log acknowledges a group once the storage nodes' quorum has it and
        # writes its local copy after that: the entries [written, committed) are readable
        # from ``_unwritten`` (in offset order) until the local write puts them in the
        # index. Without a remote the two offsets are always equal.
        self._written_offset = self._end_offset
        self._unwritten: list[Entry] = []
        self._pending: deque[_Pending] | None = None  # created by the first append
        self._pending_bytes = 0  # frame bytes in _pending
        self._listeners: list[Listener] = []
        self._cache = _EntryCache(cache_bytes)
        self._read_fds: OrderedDict[int, int] = OrderedDict()
        self._wakeup: asyncio.Event | None = None
        self._stop_syncer: asyncio.Event | None = None
        self._segment_lock: asyncio.Lock | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._syncer_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Future[None] | None = None
        self._closing = False
        self._closed = False
        self._dirty = False  # written but not fsynced
        self._dirtied: asyncio.Event | None = None  # wakes the INTERVAL syncer
        self._on_disk = True  # the directory and the active segment file exist
        self._active = False  # appended to or read from disk since the last release_idle()
        self._write_fd_open = False  # the replica may hold the active segment open
        self._release_requested = False
        self._fsyncs = 0
        self._write_groups = 0
        self._local_write_retries = 0

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync_interval_s: float = DEFAULT_FSYNC_INTERVAL_S,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        remote: RemoteLog | None = None,
    ) -> SourceLog:
        """Open (creating if needed) and recover the log in ``directory``; blocking, no tasks."""
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
        if fsync_interval_s <= 0:
            raise ValueError(f"fsync_interval_s must be positive, got {fsync_interval_s}")
        on_disk = directory.is_dir()
        # A new log: created on disk by its first write (see the module docstring).
        if on_disk:
            segments, damaged = _recover(directory)
        else:
            segments, damaged = [_Segment(0, directory / segment_file_name(0))], []
        log = cls(
            directory,
            segments,
            fsync=fsync,
            segment_bytes=segment_bytes,
            fsync_interval_s=fsync_interval_s,
            cache_bytes=cache_bytes,
            damaged=damaged,
            remote=remote,
        )
        log._on_disk = on_disk
        return log

    # -- offsets -----------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The directory holding this log's segment files."""
        return self._directory

    @property
    def start_offset(self) -> int:
        """First retained offset (equals :attr:`end_offset` when the log is empty)."""
        return self._segments[0].base

    @property
    def on_disk(self) -> bool:
        """Whether the log's directory exists (a new log creates it on its first write)."""
        return self._on_disk

    @property
    def segment_count(self) -> int:
        """Segments retained, the active one included."""
        return len(self._segments)

    @property
    def end_offset(self) -> int:
        """Next offset to be assigned (appends in flight included)."""
        return self._end_offset

    @property
    def committed_offset(self) -> int:
        """Offsets below this are written (durable per the fsync policy) and readable."""
        return self._committed_offset

    # -- listeners ---------------------------------------------------------------------

    def add_listener(self, callback: Listener) -> None:
        """Call ``callback(committed_offset)`` on the event loop after each commit."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Listener) -> None:
        """Stop calling ``callback``; unknown callbacks are ignored."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    def _notify(self) -> None:
        offset = self._committed_offset
        for callback in tuple(self._listeners):
            try:
                callback(offset)
            except Exception:
                logger.exception("log listener %r failed", callback)

    # -- append / writer ---------------------------------------------------------------

    async def append(self, payload: bytes, count: int, publish_time_us: int) -> int:
        """Append an entry of ``count`` messages; return its base offset once committed.

        The offset is assigned at call time, in call order. If the write fails every append
        of the failed group and every append queued behind it raises :class:`StorageError`,
        and their offsets are handed out again (``end_offset`` goes back to
        ``committed_offset``). A cancelled append may still be written.
        """
        if self._closing:
            raise LogClosed(f"log {self._directory} is closed")
        entry = Entry(self._end_offset, count, publish_time_us, payload)
        frame = encode_entry(entry)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._end_offset = entry.next_offset
        if self._pending is None:
            self._pending = deque()
        self._pending.append(_Pending(entry, frame, future))
        self._pending_bytes += len(frame)
        self._active = self._write_fd_open = True
        self._start_tasks().set()
        return await future

    def _start_tasks(self) -> asyncio.Event:
        if self._wakeup is None or self._writer_task is None:
            self._wakeup = asyncio.Event()
            self._segment_lock = asyncio.Lock()
            self._writer_task = asyncio.get_running_loop().create_task(self._run_writer())
            if self._policy is FsyncPolicy.INTERVAL:
                self._stop_syncer = asyncio.Event()
                self._dirtied = asyncio.Event()
                self._syncer_task = asyncio.get_running_loop().create_task(self._run_syncer())
        return self._wakeup

    async def _run_writer(self) -> None:
        assert self._wakeup is not None
        if self._remote is not None:
            await self._run_replicated_writer(self._remote)
            return
        while True:
            if not self._pending:
                if not await self._idle():
                    return
                continue
            group = self._take_group()
            try:
                failure = await self._write_group(group)
            except Exception as exc:  # a bug; never leave appends hanging
                logger.exception("log %s: writer failed", self._directory)
                self._fail(group, exc)
                continue
            if failure is not None:
                unwritten, cause = failure
                self._fail(group[unwritten:], cause)

    async def _run_replicated_writer(self, remote: RemoteLog) -> None:
        """The writer of a replicated log: up to REMOTE_PIPELINE groups travel to the storage
        nodes at once (their round trip is most of an append's time). A group goes out from
        this task itself (``remote.start_append``: no task per group), else in a task of its
        own. As each one's quorum answers, in order, it is made readable (from memory) and
        acknowledged at once, in the step that learns it (the storage node connection's
        reader: no event-loop turn in between); this task then writes it to the local copy,
        which puts it in the index (:meth:`_accept`). A group the quorum refused fails every
        group behind it (the remote log fails them too); one the quorum took is never failed
        (see :meth:`_write_durable_group`)."""
        assert self._wakeup is not None
        wakeup = self._wakeup
        flights: deque[_Flight] = deque()
        to_write: list[_Pending] = []  # acknowledged, not yet in the local copy

        def accept_landed() -> None:
            while flights and flights[0].landed:
                group = flights.popleft().group
                self._accept(group)
                to_write.extend(group)

        def settled(flight: _Flight, error: BaseException | None) -> None:
            if error is None:
                flight.landed = True
                accept_landed()  # flights complete in order; an earlier one may still be out
            else:
                flight.error = error
            wakeup.set()

        async def send(flight: _Flight, first: int, data: bytes, end: int) -> None:
            try:
                await remote.append(first, data, end)
            except asyncio.CancelledError:
                settled(flight, StorageError("cancelled"))
                raise
            except Exception as e:
                settled(flight, e)
            else:
                settled(flight, None)

        while True:
            accept_landed()
            if flights and (error := flights[0].error) is not None:  # the quorum refused it
                head = flights.popleft()
                behind = [p for f in flights for p in f.group]
                flights.clear()  # they fail too (the remote log fails them)
                self._fail([*head.group, *behind], error)
            if to_write:
                written = to_write[:]
                to_write.clear()
                await self._write_durable_group(written)
                continue
            if self._pending and (
                not flights
                or (len(flights) < REMOTE_PIPELINE and self._pending_bytes >= REMOTE_PIPELINE_BYTES)
            ):
                group = self._take_group()
                first, end = group[0].entry.base_offset, group[-1].entry.next_offset
                data = group[0].frame if len(group) == 1 else b"".join(p.frame for p in group)
                flight = _Flight(group)
                flights.append(flight)
                if not remote.start_append(first, data, end, functools.partial(settled, flight)):
                    task = asyncio.ensure_future(send(flight, first, data, end))
                    self._remote_sends.add(task)
                    task.add_done_callback(self._remote_sends.discard)
                continue
            if not self._pending and not flights:
                if not await self._idle():
                    return
                continue
            await wakeup.wait()
            wakeup.clear()

    async def _idle(self) -> bool:
        """The writer has nothing to do: False when it should end (the log is closing);
        else close the idle segment if asked, or wait for the next append."""
        assert self._wakeup is not None
        if self._closing:
            return False
        if self._release_requested:
            self._release_requested = False
            await self._release_write_fd()
            return True
        await self._wakeup.wait()
        self._wakeup.clear()
        return True

    def _take_group(self) -> list[_Pending]:
        pending = self._pending
        assert pending is not None  # only called while appends are pending
        group = [pending.popleft()]
        size = len(group[0].frame)
        while pending and size + len(pending[0].frame) <= MAX_GROUP_BYTES:
            item = pending.popleft()
            size += len(item.frame)
            group.append(item)
        self._pending_bytes -= size
        return group

    async def _write_durable_group(self, group: list[_Pending]) -> None:
        """Write to the local copy a group the storage nodes' quorum already holds.

        Its appends are acknowledged and its entries readable from memory already
        (:meth:`_accept`); its offsets are the ledger's, so they are never handed out again.
        If the local write fails (a full or failing local disk), the rest of the group is
        written again, with a growing pause, until it is written or the log closes; readers
        keep reading it from memory meanwhile. No new group is sent meanwhile (appends wait,
        and the publish memory budget pushes back on publishers). A log closed before that
        reopens from the ledgers, which fill the local copy in (materialize).
        """
        pause = LOCAL_RETRY_FIRST_S
        while (failure := await self._write_group(group)) is not None:
            unwritten, cause = failure
            group = group[unwritten:]
            self._resolve(group)
            logger.log(
                logging.DEBUG if disk_full_reason(cause) else logging.WARNING,
                "log %s: local copy of offsets %d-%d not written (%s); they are durable on "
                "the storage nodes; retrying in %.1f s",
                self._directory,
                group[0].entry.base_offset,
                group[-1].entry.next_offset - 1,
                cause,
                pause,
            )
            self._local_write_retries += 1
            wakeup = self._wakeup
            assert wakeup is not None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):  # woken early only to close
                    while not self._closing:
                        await wakeup.wait()
                        wakeup.clear()
            if self._closing:
                return
            pause = min(pause * 2, LOCAL_RETRY_MAX_S)

    async def _write_group(self, group: list[_Pending]) -> tuple[int, BaseException] | None:
        """Write ``group`` (fsynced unless replicated), commit and resolve it. On a failed
        write: the index of the first item not written (those before it are committed and
        resolved) and the cause; the caller fails or retries the rest."""
        self._write_groups += 1
        if not self._on_disk:
            try:
                await asyncio.to_thread(_create_log_files, self._directory, self._segments[0].path)
            except OSError as exc:
                return 0, exc
            self._on_disk = True
        # A replicated log's groups reach here once the storage nodes' quorum has them: the
        # local copy is not fsynced.
        sync = self._policy is FsyncPolicy.ALWAYS and self._remote is None
        start = 0
        while start < len(group):
            active = self._segments[-1]
            if active.size >= self._segment_bytes:
                try:
                    await self._roll()
                except StorageError as exc:
                    return start, exc
                active = self._segments[-1]
            room = self._segment_bytes - active.size
            stop, size = start + 1, len(group[start].frame)
            while stop < len(group) and size + len(group[stop].frame) <= room:
                size += len(group[stop].frame)
                stop += 1
            chunk = group[start:stop]
            data = chunk[0].frame if len(chunk) == 1 else b"".join(p.frame for p in chunk)
            started = time.perf_counter()
            try:
                await self._writer.append(active.base, data, sync)
            except StorageError as exc:
                return start, exc
            metrics.LOG_WRITE_SECONDS.observe(time.perf_counter() - started)
            if sync:
                self._fsyncs += 1
            else:
                self._dirty = True
                if self._dirtied is not None:
                    self._dirtied.set()
            self._commit(active, chunk)
            try:
                if active.size >= self._segment_bytes:
                    # Roll before acknowledging, so a full segment is trimmable once acked.
                    await self._roll()
            except StorageError as exc:
                # A full disk is reported once per episode by the caller (storage/disk_space.py).
                logger.log(
                    logging.DEBUG if disk_full_reason(exc) else logging.ERROR,
                    "log %s: roll failed; retried before the next write",
                    self._directory,
                    exc_info=True,
                )
            finally:
                self._resolve(chunk)
            start = stop
        return None

    def _accept(self, group: list[_Pending]) -> None:
        """A replicated log: the quorum holds ``group`` (the next entries in order). Make it
        readable from memory and acknowledge it; the local write follows (:meth:`_commit`)."""
        self._unwritten.extend(item.entry for item in group)
        self._committed_offset = group[-1].entry.next_offset
        self._notify()
        self._resolve(group)

    def _commit(self, segment: _Segment, chunk: list[_Pending]) -> None:
        """``chunk`` is written to ``segment``: index it. Without a remote that also makes it
        readable; a replicated log's entries were readable since :meth:`_accept`."""
        for item in chunk:
            entry = item.entry
            segment.add(entry.base_offset, entry.count, entry.publish_time_us, len(item.frame))
            self._cache.put(entry)
        self._written_offset = written = segment.end_offset
        unwritten = self._unwritten
        if unwritten:
            indexed = 0
            while indexed < len(unwritten) and unwritten[indexed].base_offset < written:
                indexed += 1
            del unwritten[:indexed]
        if written > self._committed_offset:
            self._committed_offset = written
            self._notify()

    @staticmethod
    def _resolve(chunk: list[_Pending]) -> None:
        for item in chunk:
            if not item.future.done():
                item.future.set_result(item.entry.base_offset)

    def _fail(self, failed: Iterable[_Pending], cause: BaseException) -> None:
        """Fail ``failed`` and everything queued behind it; reuse their offsets."""
        doomed = [*failed, *(self._pending or ())]
        if self._pending is not None:
            self._pending.clear()
        self._pending_bytes = 0
        self._end_offset = self._committed_offset  # acknowledged entries keep theirs
        logger.log(
            logging.DEBUG if disk_full_reason(cause) else logging.ERROR,  # see above
            "log %s: write of %d appends failed: %s",
            self._directory,
            len(doomed),
            cause,
        )
        for item in doomed:
            if not item.future.done():
                error = StorageError(f"append failed: {cause}")
                error.__cause__ = cause
                item.future.set_exception(error)

    async def _roll(self) -> None:
        assert self._segment_lock is not None
        async with self._segment_lock:
            new_base = self._segments[-1].end_offset
            sync = self._policy is not FsyncPolicy.NEVER
            await self._writer.roll(new_base, sync)
            if sync:
                self._fsyncs += 1
                self._dirty = False
            self._segments.append(_Segment(new_base, self._directory / segment_file_name(new_base)))
            # The sealed segment never changes again: save its index for the next start-up
            # (unless damage left a hole in it, which an index file would hide).
            if not self._segments[-2].holes:
                sealed = _index_of(self._segments[-2])
                await asyncio.to_thread(segment_index.write, self._directory, sealed)

    async def _sync(self) -> None:
        assert self._segment_lock is not None
        async with self._segment_lock:
            self._dirty = False
            await self._writer.sync()
            self._fsyncs += 1

    async def _run_syncer(self) -> None:
        assert self._stop_syncer is not None and self._dirtied is not None
        while not self._stop_syncer.is_set():
            # Idle until a write leaves data unsynced (many logs must not poll), then give
            # it at most one interval.
            await self._dirtied.wait()
            self._dirtied.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._fsync_interval_s):  # cancellable (3.11)
                    await self._stop_syncer.wait()
            if self._dirty:
                try:
                    await self._sync()
                except StorageError:
                    logger.exception("log %s: background fsync failed", self._directory)

    # -- idle files --------------------------------------------------------------------

    def release_idle(self) -> None:
        """Close the files of a log unused since the previous call; they reopen on demand.

        Called every few seconds for every log, so idle logs hold no file descriptors.
        """
        if self._active:
            self._active = False
            return
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._write_fd_open and self._wakeup is not None and not self._closing:
            self._release_requested = True  # the writer closes it between groups
            self._wakeup.set()

    async def _release_write_fd(self) -> None:
        """Writer task, nothing pending: close the active segment unless data awaits fsync."""
        assert self._segment_lock is not None
        async with self._segment_lock:  # no fsync or roll meanwhile
            if self._pending or (self._dirty and self._policy is not FsyncPolicy.NEVER):
                return
            # Cleared before the await: an append arriving meanwhile sets it again (its write
            # reopens the segment), so the next idle period closes the file again.
            self._write_fd_open = False
            await self._writer.close()  # the local replica reopens on the next append

    # -- close -------------------------------------------------------------------------

    async def close(self) -> None:
        """Finish queued appends, fsync (unless NEVER), release files; idempotent."""
        if self._close_task is None:
            self._closing = True
            if self._writer_task is None:
                # Never written to in this process: no task, nothing unsynced, no replica
                # operation ever ran. Closing many idle logs must not cost a task each.
                self._close_task = asyncio.get_running_loop().create_future()
                self._close_task.set_result(None)
                self._close_files()
            else:
                self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        if self._writer_task is not None and self._wakeup is not None:
            self._wakeup.set()
            await self._writer_task
        if self._syncer_task is not None and self._stop_syncer is not None:
            self._stop_syncer.set()
            if self._dirtied is not None:
                self._dirtied.set()
            await self._syncer_task
        if self._dirty and self._policy is not FsyncPolicy.NEVER:
            try:
                await self._sync()
            except StorageError:
                logger.exception("log %s: final fsync failed", self._directory)
        await self._writer.close()
        if self._remote_tasks:
            await asyncio.gather(*self._remote_tasks, return_exceptions=True)
        if self._remote is not None:
            await self._remote.close()
        self._close_files()

    def _close_files(self) -> None:
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        self._cache.clear()
        self._unwritten = []  # a log closed before writing them reopens from the ledgers
        self._closed = True

    # -- reads -------------------------------------------------------------------------

    def _check_readable(self) -> None:
        if self._closed:
            raise LogClosed(f"log {self._directory} is closed")

    def _locate(self, offset: int) -> tuple[int, int]:
        """(segment index, entry index) of the written entry containing ``offset`` (callers
        look in :meth:`_unwritten_at` first for offsets at or past ``_written_offset``)."""
        if offset < self.start_offset or offset >= self._written_offset:
            raise OffsetOutOfRange(offset, self.start_offset, self._committed_offset)
        if self._damage:
            damaged = self._damage.at(offset)
            if damaged is not None:
                raise DamagedEntries(damaged, restoring=self._restoring)
        seg_index = bisect_right(self._segments, offset, key=lambda s: s.base) - 1
        segment = self._segments[seg_index]
        return seg_index, bisect_right(segment.offsets, offset) - 1

    def _read_fd(self, segment: _Segment) -> int:
        fd = self._read_fds.get(segment.base)
        if fd is not None:
            self._read_fds.move_to_end(segment.base)
            return fd
        fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
        self._read_fds[segment.base] = fd
        if len(self._read_fds) > MAX_OPEN_READ_FDS:
            _, old = self._read_fds.popitem(last=False)
            os.close(old)
        return fd

    def _load(self, segment: _Segment, first: int, stop: int) -> list[Entry]:
        """Read entries ``[first, stop)`` of ``segment`` from disk with one pread. Stops at
        the first entry whose frame fails its checks, recording it (and any bad entries right
        after it) as damaged: the result is then shorter than asked."""
        position = segment.positions[first]
        length = segment.frame_end(stop - 1) - position
        self._active = True
        buf = os.pread(self._read_fd(segment), length, position)
        entries: list[Entry] = []
        for i in range(first, stop):
            at = segment.positions[i] - position
            try:
                entry, _ = decode_frame_at(buf, at)
            except CorruptEntry as exc:
                problem = str(exc)
            else:
                if entry.base_offset == segment.offsets[i]:
                    self._cache.put(entry)
                    entries.append(entry)
                    continue
                problem = f"entry has offset {entry.base_offset}, the index says it is at {at}"
            self._found_damage(segment, i, stop, buf, position, problem)
            break
        return entries

    def _found_damage(
        self, segment: _Segment, first: int, stop: int, buf: bytes, position: int, problem: str
    ) -> None:
        """A read found entry ``first`` of ``segment`` damaged: record it with the bad entries
        that follow it in ``buf`` (entries up to ``stop``), log it once."""
        end = first + 1
        while end < stop and (
            _check_frame(buf, segment.positions[end] - position, segment.offsets[end]) is not None
        ):
            end += 1
        end_offset = segment.offsets[end] if end < len(segment.offsets) else segment.end_offset
        damaged = DamagedRange(
            str(segment.path),
            segment.offsets[first],
            end_offset,
            segment.positions[first],
            segment.frame_end(end - 1),
            problem,
            FOUND_BY_READ,
            indexed=True,
        )
        recorded = self._damage_map().add(damaged)
        logger.error("log %s: damaged entries: %s", self._directory, recorded.describe())
        self._restore_soon()

    def _restore_soon(self) -> None:
        """In a cluster: re-read the damaged ranges from the storage nodes now (a task);
        readers meeting them meanwhile are told to wait (``DamagedEntries.restoring``)."""
        if self._remote is None or self._restoring or self._closing:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._restore_now())
        except RuntimeError:  # no loop (a synchronous read): the next trim pass restores
            return
        self._restoring = True
        self._remote_tasks.add(task)
        task.add_done_callback(self._remote_tasks.discard)

    async def _restore_now(self) -> int:
        try:
            rewritten = await self.restore_damage()
            restored = len(self.recheck_damage())
        except Exception:
            logger.exception("log %s: restoring damaged entries failed", self._directory)
            restored = 0
        finally:
            self._restoring = False
        if self._damage:
            # What could not be restored is damage again: readers apply the policy now
            # (the trim pass keeps trying to restore it).
            logger.error(
                "log %s: %d damaged range(s) not restored from the storage nodes (%d rewritten)",
                self._directory,
                len(self._damage),
                rewritten,
            )
            self._notify()
        return restored

    def _damage_map(self) -> DamageMap:
        if self._damage is None:
            self._damage = DamageMap()
        return self._damage

    def read(
        self,
        offset: int,
        *,
        max_entries: int = DEFAULT_READ_MAX_ENTRIES,
        max_bytes: int = DEFAULT_READ_MAX_BYTES,
    ) -> list[Entry]:
        """Committed entries from the one containing ``offset`` on, within the limits.

        ``max_bytes`` bounds the payload bytes returned but at least one entry is returned
        when one is available. Returns ``[]`` if ``offset >= committed_offset``; raises
        :class:`OffsetOutOfRange` if ``offset < start_offset``. The entries end before the
        first damaged range after ``offset``; :class:`DamagedEntries` if ``offset`` is in
        one (read on from its ``end_offset``).
        """
        self._check_readable()
        if max_entries < 1:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        if offset < self.start_offset:
            raise OffsetOutOfRange(offset, self.start_offset, self._committed_offset)
        if offset >= self._committed_offset:
            return []
        result: list[Entry] = []
        if offset >= self._written_offset:
            self._read_unwritten(result, offset, max_entries, max_bytes, 0)
            return result
        seg_index, index = self._locate(offset)
        stop_offset = self._written_offset
        if self._damage:
            stop_offset = min(stop_offset, self._damage.next_after(offset) or stop_offset)
        # Plan (segment, first, stop) ranges within the limits using index sizes only.
        plan: list[tuple[_Segment, int, int]] = []
        taken = total = 0
        limited = False
        while seg_index < len(self._segments) and not limited:
            segment = self._segments[seg_index]
            first = index
            while index < len(segment.offsets):
                size = segment.frame_end(index) - segment.positions[index] - FRAME_OVERHEAD
                if (
                    taken >= max_entries
                    or (taken and total + size > max_bytes)
                    or segment.offsets[index] >= stop_offset
                ):
                    limited = True
                    break
                taken += 1
                total += size
                index += 1
            if index > first:
                plan.append((segment, first, index))
            seg_index, index = seg_index + 1, 0
        for segment, first, stop in plan:
            run_start = first
            for i in range(first, stop):
                cached = self._cache.get(segment.offsets[i])
                if cached is None:
                    continue
                if run_start < i and not self._load_into(result, segment, run_start, i):
                    return self._partial(result, offset)
                result.append(cached)
                run_start = i + 1
            if run_start < stop and not self._load_into(result, segment, run_start, stop):
                return self._partial(result, offset)
        if not limited and result and result[-1].next_offset == self._written_offset:
            # Read on past the local copy's end (not past damage that ends it).
            self._read_unwritten(result, self._written_offset, max_entries, max_bytes, total)
        return result

    def _unwritten_at(self, offset: int) -> Entry | None:
        """The acknowledged entry containing ``offset`` that the local copy does not hold yet
        (a replicated log, ``written_offset <= offset < committed_offset``); else None."""
        unwritten = self._unwritten
        if not unwritten or offset < self._written_offset or offset >= self._committed_offset:
            return None
        return unwritten[bisect_right(unwritten, offset, key=_base_offset) - 1]

    def _read_unwritten(
        self, result: list[Entry], offset: int, max_entries: int, max_bytes: int, total: int
    ) -> None:
        """Extend ``result`` (``total`` payload bytes so far) with acknowledged entries not
        yet in the local copy, from the one containing ``offset``, within the limits."""
        unwritten = self._unwritten
        at = max(0, bisect_right(unwritten, offset, key=_base_offset) - 1)
        for entry in unwritten[at:]:
            size = len(entry.payload)
            if len(result) >= max_entries or (result and total + size > max_bytes):
                return
            result.append(entry)
            total += size

    def _load_into(self, result: list[Entry], segment: _Segment, first: int, stop: int) -> bool:
        """Extend ``result`` with entries ``[first, stop)``; False if damage cut it short."""
        loaded = self._load(segment, first, stop)
        result.extend(loaded)
        return len(loaded) == stop - first

    def _partial(self, result: list[Entry], offset: int) -> list[Entry]:
        """A read cut short by damage it found: what came before it, or the damage itself."""
        if result:
            return result
        self._locate(offset)  # raises DamagedEntries: the damage starts at ``offset``'s entry
        raise AssertionError("unreachable: the read found damage at its first entry")

    # -- damage ------------------------------------------------------------------------

    def damaged_ranges(self) -> list[DamagedRange]:
        """Every damaged range of the log, in offset order."""
        return list(self._damage) if self._damage else []

    def recheck_damage(self) -> list[DamagedRange]:
        """Re-read every damaged range; the ones whose bytes now check out (an operator
        restored the segment file) become readable again. Returns those; commit listeners
        are told, so readers waiting at the damage go on."""
        if not self._damage:
            return []
        restored: list[DamagedRange] = []
        for damaged in self._damage:
            segment = self._segment_of(damaged)
            if segment is None:  # trimmed meanwhile
                self._damage.remove(damaged)
                continue
            try:
                with open(segment.path, "rb") as f:
                    f.seek(damaged.byte_start)
                    data = f.read(damaged.byte_stop - damaged.byte_start)
            except OSError:
                continue
            frames = _frames_covering(data, damaged)
            if frames is None:
                continue
            if not damaged.indexed:
                _insert_entries(segment, damaged.byte_start, frames)
            self._damage.remove(damaged)
            restored.append(damaged)
            logger.warning(
                "log %s: damaged entries readable again: %s", self._directory, damaged.describe()
            )
        if restored:
            self._notify()
        return restored

    async def restore_damage(self, remote: RemoteLog | None = None) -> int:
        """In a cluster: overwrite each damaged range of this local copy with the same
        entries read from the storage nodes (``remote``, else the log's own; the frames are
        byte for byte the ones written here), so the next :meth:`recheck_damage` finds them
        readable. A range whose bytes would not fit exactly is left for an operator. Returns
        the ranges rewritten."""
        remote = remote or self._remote
        if remote is None or not self._damage:
            return 0
        rewritten = 0
        for damaged in list(self._damage):
            segment = self._segment_of(damaged)
            size = damaged.byte_stop - damaged.byte_start
            if segment is None or damaged.end_offset <= damaged.first_offset or size <= 0:
                continue
            try:
                data = await _remote_range(remote, damaged.first_offset, damaged.end_offset)
            except StorageError as e:
                logger.warning("log %s: damaged range not re-read: %s", self._directory, e)
                continue
            if len(data) != size:
                logger.warning(
                    "log %s: the storage nodes' copy of %s is %d bytes, the damaged range %d: "
                    "left as it is",
                    self._directory,
                    damaged.describe(),
                    len(data),
                    size,
                )
                continue
            await asyncio.to_thread(_overwrite, segment.path, damaged.byte_start, data)
            rewritten += 1
            logger.warning(
                "log %s: damaged range re-read from the storage nodes: %s",
                self._directory,
                damaged.describe(),
            )
        return rewritten

    def _segment_of(self, damaged: DamagedRange) -> _Segment | None:
        for segment in self._segments:
            if str(segment.path) == damaged.path:
                return segment
        return None

    def entry_at(self, offset: int) -> Entry:
        """The committed entry containing ``offset``; :class:`OffsetOutOfRange` if none."""
        self._check_readable()
        unwritten = self._unwritten_at(offset)
        if unwritten is not None:
            return unwritten
        self._locate(offset)
        return self.read(offset, max_entries=1)[0]

    def publish_time_us(self, offset: int) -> int:
        """Publish time of the committed entry containing ``offset``, from the in-memory index
        (no I/O); :class:`OffsetOutOfRange` if none."""
        self._check_readable()
        unwritten = self._unwritten_at(offset)
        if unwritten is not None:
            return unwritten.publish_time_us
        seg_index, index = self._locate(offset)
        return self._segments[seg_index].times[index]

    def offset_for_time(self, publish_time_us: int) -> int:
        """First offset whose entry's publish time is >= ``publish_time_us``.

        Only committed entries are considered; when none qualifies the result is
        :attr:`committed_offset` (equal to :attr:`end_offset` unless appends are in flight).
        """
        self._check_readable()
        segments = self._segments
        seg_index = bisect_left(
            segments,
            publish_time_us,
            key=lambda s: s.times[-1] if s.times else publish_time_us,
        )
        for segment in segments[seg_index:]:
            if segment.times and segment.times[-1] >= publish_time_us:
                return segment.offsets[bisect_left(segment.times, publish_time_us)]
        for entry in self._unwritten:
            if entry.publish_time_us >= publish_time_us:
                return entry.base_offset
        return self._committed_offset

    def stored_bytes(self, start: int, stop: int) -> float:
        """Stored bytes of the messages at offsets ``[start, stop)``, from the in-memory index
        (no I/O): whole entries' frame bytes, an entry's shared evenly by its messages. Only
        retained, committed entries count."""
        if stop <= start:
            return 0.0
        return self._bytes_before(stop) - self._bytes_before(start)

    def _bytes_before(self, offset: int) -> float:
        self._check_readable()
        segments = self._segments
        offset = min(max(offset, segments[0].base), self._committed_offset)
        if offset > self._written_offset:
            return self._bytes_before_unwritten(offset)
        seg_index = bisect_right(segments, offset, key=lambda s: s.base) - 1
        before = float(sum(s.size for s in segments[:seg_index]))
        segment = segments[seg_index]
        if offset >= segment.end_offset:
            return before + segment.size
        index = bisect_right(segment.offsets, offset) - 1
        if index < 0:
            return before
        first = segment.offsets[index]
        after = (
            segment.offsets[index + 1] if index + 1 < len(segment.offsets) else segment.end_offset
        )
        position = segment.positions[index]
        length = segment.frame_end(index) - position
        return before + position + length * (offset - first) / (after - first)

    def _bytes_before_unwritten(self, offset: int) -> float:
        """:meth:`_bytes_before` an offset past the local copy's end: every segment, and the
        acknowledged entries not written yet as the frames they will be."""
        before = float(sum(s.size for s in self._segments))
        for entry in self._unwritten:
            if entry.base_offset >= offset:
                break
            length = len(entry.payload) + FRAME_OVERHEAD
            if entry.next_offset <= offset:
                before += length
            else:
                before += length * (offset - entry.base_offset) / entry.count
        return before

    # -- retention ---------------------------------------------------------------------

    def segment_sizes(self) -> list[tuple[int, int]]:
        """(base offset, committed bytes) of every segment, oldest first (retention by size)."""
        return [(s.base, s.size) for s in self._segments]

    def trim(self, before_offset: int) -> int:
        """Delete whole segments whose entries all precede ``before_offset``.

        The active segment is never deleted. Returns the new :attr:`start_offset`.
        """
        self._check_readable()
        while len(self._segments) > 1 and self._segments[0].end_offset <= before_offset:
            segment = self._segments.pop(0)
            fd = self._read_fds.pop(segment.base, None)
            if fd is not None:
                os.close(fd)
            self._writer.delete_segment(segment.base)
            segment_index.delete(self._directory, segment.base)
            logger.debug("log %s: deleted segment %d", self._directory, segment.base)
        if self._remote is not None and not self._remote_tasks:
            task = asyncio.get_running_loop().create_task(self._remote.trim(self.start_offset))
            self._remote_tasks.add(task)
            task.add_done_callback(self._remote_trimmed)
        self._cache.drop_below(self.start_offset)
        if self._damage:
            self._damage.drop_below(self.start_offset)
        return self.start_offset

    def _remote_trimmed(self, task: asyncio.Task[int]) -> None:
        self._remote_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning(
                "log %s: deleting trimmed ledgers failed: %s", self._directory, task.exception()
            )

    def stats(self) -> dict[str, int]:
        """Counters for metrics and tests."""
        return {
            "segments": len(self._segments),
            "bytes": sum(s.size for s in self._segments),
            "entries": sum(len(s.offsets) for s in self._segments),
            "start_offset": self.start_offset,
            "end_offset": self._end_offset,
            "committed_offset": self._committed_offset,
            "written_offset": self._written_offset,
            "unwritten_entries": len(self._unwritten),
            "fsyncs": self._fsyncs,
            "write_groups": self._write_groups,
            "local_write_retries": self._local_write_retries,
            "cached_bytes": self._cache.bytes,
            "pending_appends": len(self._pending or ()),
            "damaged_ranges": len(self._damage or ()),
        }


async def _remote_range(remote: RemoteLog, start: int, end: int) -> bytes:
    """The frames of entries ``[start, end)`` from the durable copy, whole."""
    parts, offset = [], start
    while offset < end:
        frames = await remote.read_frames(offset, end)
        decoded, valid_end = decode_frames(frames)
        kept = [(e, pos, n) for e, pos, n in decoded if e.base_offset < end]
        if valid_end != len(frames) or not kept:
            raise CorruptEntry(f"the storage nodes sent invalid frames at {offset}")
        last, pos, length = kept[-1]
        parts.append(frames[: pos + length])
        offset = last.next_offset
    return b"".join(parts)


def _overwrite(path: Path, position: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], position + written)
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_frame(buf: bytes, at: int, expected_offset: int) -> str | None:
    """Why the frame at ``at`` of ``buf`` is not entry ``expected_offset``; None if it is."""
    try:
        entry, _ = decode_frame_at(buf, at)
    except CorruptEntry as exc:
        return str(exc)
    if entry.base_offset != expected_offset:
        return f"entry has offset {entry.base_offset}, the index says {expected_offset}"
    return None


def _frames_covering(data: bytes, damaged: DamagedRange) -> list[tuple[int, Entry, int]] | None:
    """The frames of ``data`` (a damaged range's bytes) if they are exactly its entries:
    valid, consecutive from its first offset to its end offset, filling every byte."""
    frames: list[tuple[int, Entry, int]] = []
    position = 0
    expected = damaged.first_offset
    while position < len(data):
        try:
            entry, length = decode_frame_at(data, position)
        except CorruptEntry:
            return None
        if entry.base_offset != expected:
            return None
        frames.append((position, entry, length))
        position += length
        expected = entry.next_offset
    if expected != damaged.end_offset:
        return None
    return frames


def _insert_entries(
    segment: _Segment, byte_start: int, frames: list[tuple[int, Entry, int]]
) -> None:
    """Put restored entries (a hole the start-up scan left) into the segment's index."""
    at = bisect_right(segment.offsets, frames[0][1].base_offset)
    for k, (position, entry, _) in enumerate(frames):
        segment.offsets.insert(at + k, entry.base_offset)
        segment.positions.insert(at + k, byte_start + position)
        segment.times.insert(at + k, entry.publish_time_us)
    last_position, _, length = frames[-1]
    if at + len(frames) == len(segment.offsets):  # the hole was the segment's tail
        segment.size = max(segment.size, byte_start + last_position + length)
