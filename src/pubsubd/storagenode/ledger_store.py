"""The ledgers of one storage node on its M data directories (disks).

Layout of every data directory::

    DIR/ledgers/{ledger_id:020d}.ledger   the ledger's frames, concatenated (storage/framing.py)
    DIR/ledgers/{ledger_id:020d}.fence    its fence and last-add-confirmed (a small record
                                          with a CRC, replaced by write-temp, fsync, rename,
                                          fsync of the directory)

Writes. Each ledger has one worker task that takes every append waiting for the ledger at once
(group commit), checks each against the rules of ``ledger_index.plan_append`` and the fence,
writes the new bytes to every healthy disk at the same position, one ``pwrite`` and one
``fdatasync`` per disk (in the disk's own threads, so a hung disk stalls only itself), and
answers the whole group once a majority of the M disks have it durable. A node with one disk
writes a group on the event loop itself while no other ledger is writing (the common case at
a modest rate: a thread there and back cost as much CPU as the ``fdatasync`` and put two
wake-ups on every answer's path); appends that arrive meanwhile wait in the socket, at most
one ``fdatasync``, and several ledgers writing at once go to the threads again. A disk that fails
(EIO, ENOSPC, ...) misses that group: it stops counting as a copy of the ledger ("lagging"), an
I/O error other than a full disk marks the whole disk unhealthy, and writes go on while a
majority of the disks takes them. A group that no majority took is cut off again everywhere
(``ftruncate`` to where it started) and refused: RESOURCE_EXHAUSTED when full disks made the
difference, else UNAVAILABLE. Appends that arrive out of order (concurrent RPCs) wait up to
``gap_wait_s`` for the entries before them before they are refused as a gap.

Fences are written to every healthy disk and answered at a majority; the fence only rises, and
it rises in memory first, so an old writer is refused from the moment the Fence arrives. The
last-add-confirmed a writer sends is kept in memory (advisory) and saved with the fence record
when a ledger is fenced, falls idle or the node stops.

Start-up: every ledger of every disk is scanned; torn tails are cut (other invalid bytes are
kept aside in ``.damaged`` files first), the longest valid copy is the node's, and lagging or
diverging copies are brought up to it from that copy; a copy that cannot be repaired stays
lagging (reported as fewer ``healthy_disks``). Idle ledgers close their files.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import mmap
import os
import shutil
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c

from pubsubd.core.errors import PubsubError
from pubsubd.storage.disk_space import DiskSpace, free_bytes
from pubsubd.storage.files import fdatasync, fsync_directory, make_dirs
from pubsubd.storage.framing import FrameInfo
from pubsubd.storage.node_client import DiskHealth, FenceResult, LedgerSummary
from pubsubd.storagenode import metrics
from pubsubd.storagenode.errors import (
    AppendGap,
    BadFrames,
    DisksFull,
    FencedAppend,
    NodeStopping,
    OverlapMismatch,
    TooFewDisks,
    UnknownLedger,
)
from pubsubd.storagenode.ledger_index import (
    Frames,
    LedgerIndex,
    ScannedCopy,
    common_prefix,
    parse_frames,
    plan_append,
    scan_copy,
)

log = logging.getLogger(__name__)

LEDGERS_DIR = "ledgers"
LEDGER_SUFFIX = ".ledger"
FENCE_SUFFIX = ".fence"
TMP_SUFFIX = ".tmp"
DAMAGED_SUFFIX = ".damaged"
FILE_MODE = 0o644

DEFAULT_READ_BYTES = 4 << 20
GROUP_MAX_BYTES = 16 << 20  # one group write at most (more waits for the next group)
GAP_WAIT_S = 0.5  # an append past the end waits this long for the ones before it
STRAGGLER_S = 5.0  # after a majority answered, how long the other disks may take
IDLE_CLOSE_S = 30.0  # a ledger unused this long closes its files
DISK_THREADS = 4
COPY_CHUNK = 8 << 20

# How start_append's caller hears of its append: (end offset, None) or (None, the refusal).
Answered = Callable[[int | None, BaseException | None], None]

_FENCE = struct.Struct("<4sBQq")
_FENCE_CRC = struct.Struct("<I")
FENCE_MAGIC = b"PSLF"
FENCE_VERSION = 1


def ledger_name(ledger_id: int) -> str:
    return f"{ledger_id:020d}"


def parse_ledger_name(name: str) -> int | None:
    """The ledger ID of a ``.ledger`` or ``.fence`` file name, else None."""
    for suffix in (LEDGER_SUFFIX, FENCE_SUFFIX):
        stem = name.removesuffix(suffix)
        if stem != name and len(stem) == 20 and stem.isdigit():
            return int(stem)
    return None


def encode_fence(epoch: int, lac: int) -> bytes:
    body = _FENCE.pack(FENCE_MAGIC, FENCE_VERSION, epoch, lac)
    return body + _FENCE_CRC.pack(google_crc32c.value(body))


def decode_fence(data: bytes) -> tuple[int, int] | None:
    """(epoch, last-add-confirmed) of a fence record, or None if it is not a valid one."""
    if len(data) != _FENCE.size + _FENCE_CRC.size:
        return None
    body = data[: _FENCE.size]
    if _FENCE_CRC.unpack_from(data, _FENCE.size)[0] != google_crc32c.value(body):
        return None
    magic, version, epoch, lac = _FENCE.unpack(body)
    if magic != FENCE_MAGIC or version != FENCE_VERSION:
        return None
    return int(epoch), int(lac)


class CopyDamaged(Exception):
    """A failed write could not be cut off again: this copy of the ledger is no longer a
    prefix of the node's copy."""


def _is_full(exc: BaseException, disk: Disk) -> bool:
    return disk.space.reason(exc) is not None


# --- one disk --------------------------------------------------------------------------------


class LedgerFile:
    """One disk's file of one ledger: opened on first use, closed when the ledger is idle.

    Blocking work holds the descriptor through :meth:`use`; a :meth:`close` while it is in use
    (a write that outlived the straggler timeout) is carried out by its last user, so a
    descriptor number is never closed under a thread still writing through it."""

    __slots__ = ("_close_pending", "_users", "dir_synced", "fd", "lock", "path")

    def __init__(self, path: Path, *, exists: bool = False) -> None:
        self.path = path
        self.fd: int | None = None
        self.lock = threading.Lock()
        self.dir_synced = exists  # its directory entry is durable
        self._users = 0
        self._close_pending = False

    @contextlib.contextmanager
    def use(self, create: bool) -> Iterator[int]:
        with self.lock:
            if self.fd is None:
                flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
                self.fd = os.open(self.path, flags, FILE_MODE)
            self._users += 1
            fd = self.fd
        try:
            yield fd
        finally:
            with self.lock:
                self._users -= 1
                if self._close_pending and not self._users:
                    self._close_locked()

    def close(self) -> None:
        with self.lock:
            if self._users:
                self._close_pending = True
            else:
                self._close_locked()

    def _close_locked(self) -> None:
        self._close_pending = False
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _pwrite_all(fd: int, data: bytes | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _pread_exact(fd: int, n: int, position: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, n, position)
        if not chunk:
            raise OSError(f"short read: {n} bytes missing at position {position}")
        parts.append(chunk)
        n -= len(chunk)
        position += len(chunk)
    return b"".join(parts)


class Disk:
    """One data directory. Its blocking file work runs in its own threads."""

    def __init__(self, index: int, path: Path) -> None:
        self.index = index
        self.path = path
        self.dir = path / LEDGERS_DIR
        self.healthy = True
        self.error = ""
        self.space = DiskSpace(path)
        self.executor = ThreadPoolExecutor(DISK_THREADS, thread_name_prefix=f"disk{index}")
        self._fence_lock = threading.Lock()  # fence records are written one at a time
        metrics.DISK_HEALTHY.labels(str(path)).set(1)

    def fail(self, error: str) -> None:
        """Take the disk out of service until the next start."""
        if self.healthy:
            log.error("disk %s is unhealthy from now on: %s", self.path, error)
            self.healthy = False
            self.error = error
            metrics.DISK_HEALTHY.labels(str(self.path)).set(0)

    def ledger_path(self, ledger_id: int) -> Path:
        return self.dir / f"{ledger_name(ledger_id)}{LEDGER_SUFFIX}"

    def fence_path(self, ledger_id: int) -> Path:
        return self.dir / f"{ledger_name(ledger_id)}{FENCE_SUFFIX}"

    def free_bytes(self) -> int:
        return free_bytes(self.path) or 0

    # --- blocking work (run in self.executor) ---------------------------------------------

    def write_at(self, file: LedgerFile, position: int, data: bytes) -> float:
        """Write ``data`` at ``position`` and make it durable; on failure cut the file back to
        ``position``. Returns the seconds it took."""
        started = time.perf_counter()
        with file.use(create=True) as fd:
            try:
                _pwrite_all(fd, data, position)
                fdatasync(fd)
                if not file.dir_synced:
                    fsync_directory(self.dir)
                    file.dir_synced = True
            except OSError as exc:
                try:
                    os.ftruncate(fd, position)
                except OSError as cut:
                    raise CopyDamaged(f"could not cut a failed write: {cut}") from exc
                raise
        return time.perf_counter() - started

    def truncate(self, file: LedgerFile, size: int) -> None:
        with file.use(create=False) as fd:
            os.ftruncate(fd, size)
            fdatasync(fd)

    def read_at(self, file: LedgerFile, position: int, n: int) -> bytes:
        with file.use(create=False) as fd:
            return _pread_exact(fd, n, position)

    def write_fence(self, ledger_id: int, record: bytes) -> None:
        """Replace the ledger's fence record, durably. The disk's threads may write two
        records of one ledger at once (a fence and a last-add-confirmed save): they take turns,
        and a record never replaces a higher one (epochs and last-add-confirmed only grow), so
        the file ends with the highest whatever order the threads ran in."""
        path = self.fence_path(ledger_id)
        tmp = path.with_name(path.name + TMP_SUFFIX)
        with self._fence_lock:
            try:
                current = decode_fence(path.read_bytes())
            except FileNotFoundError:
                current = None
            new = decode_fence(record)
            if current is not None and new is not None and current >= new:
                return
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
            try:
                _pwrite_all(fd, record, 0)
                fdatasync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            fsync_directory(self.dir)

    def delete(self, ledger_id: int) -> bool:
        existed = False
        for path in (self.ledger_path(ledger_id), self.fence_path(ledger_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                existed = True
        if existed:
            fsync_directory(self.dir)
        return existed


# --- one ledger ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Append:
    epoch: int
    first_offset: int
    data: bytes
    frames: Frames
    lac: int
    future: asyncio.Future[int]
    parked_until: float | None = None
    timer: asyncio.TimerHandle | None = None
    # Called in the step that settles the append (start_append's caller: no loop turn).
    answered: Answered | None = None


@dataclass(eq=False)
class _Fence:
    epoch: int
    future: asyncio.Future[FenceResult]


@dataclass(eq=False)
class _Delete:
    future: asyncio.Future[bool]


@dataclass(eq=False)
class _SaveLac:
    future: asyncio.Future[None]


_Op = _Append | _Fence | _Delete | _SaveLac


@dataclass(eq=False)
class Ledger:
    ledger_id: int
    files: list[LedgerFile]
    index: LedgerIndex | None = None  # None: no entry here (maybe a fence)
    fence: int = 0
    lac: int = -1
    lac_saved: int = -1
    in_sync: list[bool] = field(default_factory=list)  # per disk: holds the node's copy
    sizes: list[int] = field(default_factory=list)  # per disk: bytes durable there
    ops: deque[_Op] = field(default_factory=deque)
    parked: list[_Append] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None
    active: int = 0  # reads in flight
    last_used: float = 0.0
    # Fence record writes still running on the slower disks after a majority answered: a
    # delete waits for them, or one could write the record again after the delete.
    record_tails: set[asyncio.Future[None]] = field(default_factory=set)

    @property
    def end_offset(self) -> int:
        return self.index.end_offset if self.index is not None else 0

    @property
    def size(self) -> int:
        return self.index.size if self.index is not None else 0


def _concat(parts: list[Frames]) -> Frames:
    if len(parts) == 1:
        return parts[0]
    frames: list[FrameInfo] = []
    crcs: list[int] = []
    at = 0
    for part in parts:
        frames.extend(
            FrameInfo(f.position + at, f.length, f.base_offset, f.count, f.publish_time_us)
            for f in part.frames
        )
        crcs.extend(part.crcs)
        at += part.size
    return Frames(frames, crcs, at)


def _settle(op: _Op, exc: BaseException) -> None:
    """Refuse ``op`` (once): its future, and an append's ``answered`` callback at once."""
    future: asyncio.Future[Any] = op.future
    if not future.done():
        future.set_exception(exc)
        if isinstance(op, _Append) and op.answered is not None:
            future.exception()  # retrieved: the callback tells the caller
            _tell(op.answered, None, exc)


def _answer(op: _Op, value: object) -> None:
    """Answer ``op`` (once): its future, and an append's ``answered`` callback at once."""
    future: asyncio.Future[Any] = op.future
    if not future.done():
        future.set_result(value)
        if isinstance(op, _Append) and op.answered is not None:
            _tell(op.answered, value, None)  # type: ignore[arg-type]


def _tell(answered: Answered, end: int | None, error: BaseException | None) -> None:
    try:
        answered(end, error)
    except Exception:  # the caller's bug must not stop the ledger's worker
        log.exception("an append's answer callback failed")


def _result_label(exc: BaseException) -> str:
    if isinstance(exc, FencedAppend):
        return "fenced"
    if isinstance(exc, AppendGap):
        return "gap"
    if isinstance(exc, OverlapMismatch):
        return "mismatch"
    if isinstance(exc, BadFrames):
        return "invalid"
    if isinstance(exc, DisksFull):
        return "disk_full"
    return "unavailable"


# --- the store -------------------------------------------------------------------------------


class LedgerStore:
    """Every ledger of one storage node. Call from one event loop; :meth:`open` first."""

    def __init__(
        self,
        data_dirs: Sequence[Path],
        *,
        gap_wait_s: float = GAP_WAIT_S,
        straggler_s: float = STRAGGLER_S,
        idle_close_s: float = IDLE_CLOSE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not data_dirs:
            raise ValueError("a storage node needs at least one data directory")
        paths = [Path(p) for p in data_dirs]
        if len({p.resolve() for p in paths}) != len(paths):
            raise ValueError(f"data directories must differ: {[str(p) for p in paths]}")
        self.disks = [Disk(i, p) for i, p in enumerate(paths)]
        self.majority = len(self.disks) // 2 + 1
        self.gap_wait_s = gap_wait_s
        self.straggler_s = straggler_s
        self.idle_close_s = idle_close_s
        self._clock = clock
        self._ledgers: dict[int, Ledger] = {}
        self._touched: set[int] = set()  # ledgers that may hold open files
        self._workers: set[asyncio.Task[None]] = set()
        self._housekeeping: asyncio.Task[None] | None = None
        self.stopping = False
        self.opened = False
        # Counters for tests and /status (the metrics count the same across stores).
        self.fenced_appends = 0
        self.group_commits = 0
        self.repaired_copies = 0
        metrics.LEDGERS.set_function(lambda: float(len(self._ledgers)))
        metrics.LAGGING_COPIES.set_function(lambda: float(self.lagging_copies()))

    # --- life cycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Recover every ledger from the disks (blocking work in a thread), then serve."""
        await asyncio.to_thread(self._recover)
        self.opened = True
        self._housekeeping = asyncio.create_task(self._housekeep(), name="ledger_housekeeping")

    async def close(self) -> None:
        """Refuse new calls, finish the queued ones, save last-add-confirmed, close files."""
        self.stopping = True
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        for ledger in self._ledgers.values():
            for op in ledger.parked:
                self._unpark_timer(op)
                _settle(op, NodeStopping())
            ledger.parked.clear()
        if self._workers:
            await asyncio.gather(*list(self._workers), return_exceptions=True)
        dirty = [ledger for ledger in self._ledgers.values() if ledger.lac != ledger.lac_saved]
        results = await asyncio.gather(
            *(self._save_record(ledger, ledger.fence, ledger.lac) for ledger in dirty),
            return_exceptions=True,
        )
        for ledger, result in zip(dirty, results, strict=True):
            if isinstance(result, BaseException):
                log.warning(
                    "ledger %d: saving last-add-confirmed failed: %s", ledger.ledger_id, result
                )
        for ledger in self._ledgers.values():
            for file in ledger.files:
                file.close()
        for disk in self.disks:
            disk.executor.shutdown(wait=False, cancel_futures=True)

    # --- calls ------------------------------------------------------------------------------

    async def append(
        self, ledger_id: int, epoch: int, first_offset: int, data: bytes, lac: int = -1
    ) -> int:
        """Append frames (see the module docstring); returns the durable end offset."""
        return await self.start_append(ledger_id, epoch, first_offset, data, lac)

    def start_append(
        self,
        ledger_id: int,
        epoch: int,
        first_offset: int,
        data: bytes,
        lac: int = -1,
        answered: Answered | None = None,
    ) -> asyncio.Future[int]:
        """:meth:`append` without a coroutine: queue the append now (a refusal found at once is
        raised here) and return the future its group commit settles; ``answered``, if given,
        is called with the outcome in the step that settles it (the group commit's), not one
        event-loop turn later as the future's callbacks are (the future's exception is then
        marked retrieved)."""
        self._check_serving()
        try:
            frames = parse_frames(ledger_id, data) if data else Frames([], [], 0)
        except BadFrames:
            metrics.APPENDS.labels("invalid").inc()
            raise
        ledger = self._ledger(ledger_id)
        if epoch < ledger.fence:
            raise self._fenced(ledger, epoch)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        ledger.ops.append(
            _Append(epoch, first_offset, data, frames, lac, future, answered=answered)
        )
        self._kick(ledger)
        return future

    async def fence(self, ledger_id: int, epoch: int) -> FenceResult:
        """Raise the ledger's fence to ``epoch`` (durable on a majority) and say what is here."""
        self._check_serving()
        ledger = self._ledger(ledger_id)
        # From now on, appends of a lower epoch are refused, even before the fence is durable.
        ledger.fence = max(ledger.fence, epoch)
        future: asyncio.Future[FenceResult] = asyncio.get_running_loop().create_future()
        ledger.ops.append(_Fence(epoch, future))
        self._kick(ledger)
        return await future

    async def read(
        self, ledger_id: int, start_offset: int, end_offset: int = 0, max_bytes: int = 0
    ) -> tuple[bytes, int]:
        """Whole frames from ``start_offset``; returns them and the node's end offset."""
        self._check_serving()
        ledger = self._ledgers.get(ledger_id)
        if ledger is None or ledger.index is None:
            raise UnknownLedger(ledger_id)
        index = ledger.index
        begin, end = index.read_span(
            ledger_id, start_offset, end_offset, max_bytes if max_bytes > 0 else DEFAULT_READ_BYTES
        )
        node_end = index.end_offset
        if begin == end:
            return b"", node_end
        data = await self._read_stored(ledger, begin, end - begin)
        metrics.READ_BYTES.inc(len(data))
        return data, node_end

    async def delete(self, ledger_id: int) -> bool:
        """Delete the ledger's files everywhere; False if the node did not hold it."""
        self._check_serving()
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        ledger.ops.append(_Delete(future))
        self._kick(ledger)
        return await future

    def summaries(self) -> list[LedgerSummary]:
        """Every ledger holding entries, by ID."""
        out = []
        for ledger_id in sorted(self._ledgers):
            ledger = self._ledgers[ledger_id]
            index = ledger.index
            if index is None:
                continue
            out.append(
                LedgerSummary(
                    ledger_id,
                    index.first_offset,
                    index.end_offset,
                    ledger.lac,
                    ledger.fence,
                    index.size,
                    index.digest,
                    self._healthy_copies(ledger),
                )
            )
        return out

    def fenced_only(self) -> list[int]:
        """The ledgers holding a fence record and no entry, by ID."""
        return sorted(
            ledger_id
            for ledger_id, ledger in self._ledgers.items()
            if ledger.index is None and ledger.fence > 0
        )

    def disk_health(self) -> list[DiskHealth]:
        return [DiskHealth(str(d.path), d.healthy, d.free_bytes(), d.error) for d in self.disks]

    def free_bytes(self) -> int:
        """The smallest free space among healthy disks (0 if none is healthy)."""
        free = [d.free_bytes() for d in self.disks if d.healthy]
        return min(free) if free else 0

    @property
    def ledger_count(self) -> int:
        return len(self._ledgers)

    def lagging_copies(self) -> int:
        healthy = [d.index for d in self.disks if d.healthy]
        return sum(
            1
            for ledger in self._ledgers.values()
            if ledger.index is not None
            for i in healthy
            if not ledger.in_sync[i]
        )

    def status(self) -> dict[str, object]:
        return {
            "disks": [
                {"path": d.path.as_posix(), "healthy": d.healthy, "error": d.error}
                for d in self.disks
            ],
            "ledgers": len(self._ledgers),
            "lagging_copies": self.lagging_copies(),
            "fenced_appends": self.fenced_appends,
            "group_commits": self.group_commits,
            "repaired_copies": self.repaired_copies,
        }

    # --- internals: ledgers and workers -----------------------------------------------------

    def _check_serving(self) -> None:
        if self.stopping or not self.opened:
            raise NodeStopping()

    def _new_ledger(self, ledger_id: int, existing: Sequence[bool] = ()) -> Ledger:
        m = len(self.disks)
        files = [
            LedgerFile(d.ledger_path(ledger_id), exists=bool(existing and existing[d.index]))
            for d in self.disks
        ]
        return Ledger(ledger_id, files, in_sync=[True] * m, sizes=[0] * m)

    def _ledger(self, ledger_id: int) -> Ledger:
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = self._new_ledger(ledger_id)
        return ledger

    def _healthy_copies(self, ledger: Ledger) -> int:
        return sum(1 for d in self.disks if d.healthy and ledger.in_sync[d.index])

    def _fenced(self, ledger: Ledger, epoch: int) -> FencedAppend:
        self.fenced_appends += 1
        metrics.FENCED_APPENDS.inc()
        metrics.APPENDS.labels("fenced").inc()
        return FencedAppend(ledger.ledger_id, epoch, ledger.fence)

    def _kick(self, ledger: Ledger) -> None:
        if ledger.worker is None:
            task = asyncio.create_task(self._work(ledger), name=f"ledger-{ledger.ledger_id}")
            ledger.worker = task
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def _work(self, ledger: Ledger) -> None:
        self._touched.add(ledger.ledger_id)
        try:
            while ledger.ops:
                op = ledger.ops[0]
                if isinstance(op, _Append):
                    await self._append_group(ledger)
                    continue
                ledger.ops.popleft()
                if isinstance(op, _Fence):
                    await self._apply_fence(ledger, op)
                elif isinstance(op, _Delete):
                    await self._apply_delete(ledger, op)
                else:
                    await self._apply_save_lac(ledger, op)
        except BaseException as exc:  # a bug: nobody may wait for ever
            log.exception("ledger %d: worker failed", ledger.ledger_id)
            while ledger.ops:
                _settle(ledger.ops.popleft(), exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            ledger.worker = None
            ledger.last_used = self._clock()

    # --- appends ----------------------------------------------------------------------------

    async def _append_group(self, ledger: Ledger) -> None:
        """Take the appends at the head of the queue that can be written together; write."""
        ready: list[_Append] = []  # answered with the end offset, nothing to write
        writers: list[_Append] = []  # answered once the group is durable
        parts: list[Frames] = []
        chunks: list[bytes] = []
        size = 0
        ops = ledger.ops
        while ops and isinstance(ops[0], _Append):
            op = ops[0]
            if op.future.done():  # the caller went away
                ops.popleft()
                continue
            if op.epoch < ledger.fence:
                ops.popleft()
                _settle(op, self._fenced(ledger, op.epoch))
                continue
            if not op.frames.frames:  # only a last-add-confirmed
                ops.popleft()
                ready.append(op)
                continue
            try:
                plan = plan_append(ledger.ledger_id, ledger.index, op.first_offset, op.frames)
                if plan.compare_bytes:
                    stored = await self._read_stored(ledger, plan.compare_at, plan.compare_bytes)
                    if stored != op.data[: plan.compare_bytes]:
                        raise OverlapMismatch(
                            ledger.ledger_id,
                            f"the append's entries from offset {op.frames.first_offset} differ"
                            " from the stored ones",
                            ledger.end_offset,
                        )
            except AppendGap as gap:
                ops.popleft()
                self._park(ledger, op, gap)
                continue
            except PubsubError as exc:
                ops.popleft()
                metrics.APPENDS.labels(_result_label(exc)).inc()
                _settle(op, exc)
                continue
            ops.popleft()
            if not plan.tail.frames:  # a retry of what is stored
                metrics.APPENDS.labels("retry").inc()
                ready.append(op)
                continue
            tail = op.data[plan.tail_start :] if plan.tail_start else op.data
            chunks.append(tail)
            parts.append(plan.tail)
            size = len(tail)
            writers.append(op)
            # Behind staged bytes only plain continuations join, in offset order, whatever
            # order they arrived in; anything else is checked against the durable copy in
            # the next group.
            more = self._continuations(ledger, op.first_offset, plan.tail.end_offset, size)
            writers += more
            chunks += [op.data for op in more]
            parts += [op.frames for op in more]
            break
        if writers:
            await self._write_group(ledger, b"".join(chunks), _concat(parts), writers)
        for op in ready:
            ledger.lac = max(ledger.lac, op.lac)
            _answer(op, ledger.end_offset if ledger.index is not None else op.first_offset)

    def _continuations(
        self, ledger: Ledger, first_offset: int, end: int, size: int
    ) -> list[_Append]:
        """Take the queued (up to the next fence or delete) and parked appends that continue
        the staged bytes from ``end`` on, in offset order, while the group stays below
        GROUP_MAX_BYTES (``size`` is staged already)."""
        limit = next(
            (i for i, op in enumerate(ledger.ops) if not isinstance(op, _Append)), len(ledger.ops)
        )
        candidates: dict[int, _Append] = {}
        for op in (*itertools.islice(ledger.ops, limit), *ledger.parked):
            if (
                isinstance(op, _Append)
                and op.frames.frames
                and op.first_offset == first_offset
                and op.epoch >= ledger.fence
                and not op.future.done()
            ):
                candidates.setdefault(op.frames.first_offset, op)
        taken: list[_Append] = []
        added = 0
        while size + added < GROUP_MAX_BYTES and end in candidates:
            op = candidates.pop(end)
            taken.append(op)
            added += len(op.data)
            end = op.frames.end_offset
        if taken:
            chosen = set(taken)
            ledger.ops = deque(op for op in ledger.ops if op not in chosen)
            if ledger.parked:
                for op in ledger.parked:
                    if op in chosen:
                        self._unpark_timer(op)
                ledger.parked = [op for op in ledger.parked if op not in chosen]
        return taken

    async def _write_group(
        self, ledger: Ledger, data: bytes, frames: Frames, writers: list[_Append]
    ) -> None:
        position = ledger.size
        targets = [d for d in self.disks if d.healthy and ledger.in_sync[d.index]]
        if len(targets) < self.majority:
            self._fail_group(
                writers,
                TooFewDisks(
                    f"ledger {ledger.ledger_id}",
                    f"{len(targets)} of {len(self.disks)} disks hold it, {self.majority} needed",
                ),
            )
            return
        loop = asyncio.get_running_loop()
        calls: dict[asyncio.Future[float], Disk]
        if len(targets) == 1 and self.majority == 1 and len(self._workers) == 1:
            # One disk, and no other ledger writing: write and sync it on the loop. A thread
            # there and back costs as much as the fdatasync itself and two wake-ups more on
            # the answer's path (BENCHMARKS.md, "Session L10"); nothing else waits meanwhile.
            only = targets[0]
            calls = {self._write_here(only, ledger.files[only.index], position, data): only}
        else:
            calls = {
                loop.run_in_executor(
                    d.executor, d.write_at, ledger.files[d.index], position, data
                ): d
                for d in targets
            }
        ok: list[Disk] = []
        failed: dict[int, BaseException] = {}

        def collect(done: set[asyncio.Future[float]]) -> None:
            for call in done:
                disk = calls[call]
                exc = call.exception()
                if exc is None:
                    ok.append(disk)
                    ledger.sizes[disk.index] = position + len(data)
                    metrics.FSYNC_SECONDS.observe(call.result())
                else:
                    failed[disk.index] = exc
                    self._disk_error(disk, exc)

        written = {call for call in calls if call.done()}
        collect(written)
        pending: set[asyncio.Future[float]] = set(calls) - written
        while pending and len(ok) < self.majority and len(targets) - len(failed) >= self.majority:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            collect(done)
        committed = len(ok) >= self.majority
        if committed:
            if ledger.index is None:
                ledger.index = LedgerIndex(frames.first_offset)
            ledger.index.add(frames)
            self.group_commits += 1
            metrics.GROUP_COMMITS.inc()
            metrics.GROUP_APPENDS.observe(len(writers))
            metrics.APPENDED_BYTES.inc(len(data))
            metrics.APPENDS.labels("ok").inc(len(writers))
            end = ledger.index.end_offset
            for op in writers:
                ledger.lac = max(ledger.lac, op.lac)
                _answer(op, end)
            self._unpark(ledger)
        # The other disks finish (or fail) before the ledger's next write.
        if pending:
            done, pending = await asyncio.wait(pending, timeout=self.straggler_s)
            collect(done)
        for call in pending:
            disk = calls[call]
            log.error(
                "disk %s: a write of ledger %d took longer than %.1f s; the copy lags",
                disk.path,
                ledger.ledger_id,
                self.straggler_s,
            )
            ledger.in_sync[disk.index] = False
        if committed:
            for index in failed:
                ledger.in_sync[index] = False
            return
        # No majority: cut the group off again where it was written, then refuse it.
        for index, exc in failed.items():
            if isinstance(exc, CopyDamaged):
                ledger.in_sync[index] = False
        for disk in ok:
            try:
                await loop.run_in_executor(
                    disk.executor, disk.truncate, ledger.files[disk.index], position
                )
                ledger.sizes[disk.index] = position
            except OSError as exc:
                self._disk_error(disk, exc)
                ledger.in_sync[disk.index] = False
        full = sum(1 for i, e in failed.items() if _is_full(e, self.disks[i]))
        detail = (
            f"{len(ok)} of {len(self.disks)} disks took the write, {self.majority} needed:"
            f" {'; '.join(f'{self.disks[i].path}: {e}' for i, e in failed.items())}"
        )
        error: PubsubError
        if full and len(ok) + full >= self.majority:
            error = DisksFull(f"ledger {ledger.ledger_id}", detail)
        else:
            error = TooFewDisks(f"ledger {ledger.ledger_id}", detail)
        self._fail_group(writers, error)

    @staticmethod
    def _write_here(
        disk: Disk, file: LedgerFile, position: int, data: bytes
    ) -> asyncio.Future[float]:
        """``disk.write_at`` on the calling thread, its outcome as a settled future."""
        call: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        try:
            call.set_result(disk.write_at(file, position, data))
        except Exception as exc:
            call.set_exception(exc)
        return call

    def _fail_group(self, writers: list[_Append], error: PubsubError) -> None:
        metrics.APPENDS.labels(_result_label(error)).inc(len(writers))
        for op in writers:
            _settle(op, error)

    def _disk_error(self, disk: Disk, exc: BaseException) -> None:
        cause = exc.__cause__ if isinstance(exc, CopyDamaged) and exc.__cause__ else exc
        if _is_full(cause, disk):
            disk.space.failed(cause, "ledger")
            if isinstance(exc, CopyDamaged):
                disk.fail(str(exc))
            return
        disk.fail(f"{type(cause).__name__}: {cause}")

    # --- gaps: appends that arrived before the ones they follow -----------------------------

    def _park(self, ledger: Ledger, op: _Append, gap: AppendGap) -> None:
        now = self._clock()
        if op.parked_until is None:
            op.parked_until = now + self.gap_wait_s
        if now >= op.parked_until:
            metrics.APPENDS.labels("gap").inc()
            _settle(op, gap)
            return
        ledger.parked.append(op)
        loop = asyncio.get_running_loop()
        op.timer = loop.call_later(op.parked_until - now, self._expire, ledger, op)

    def _unpark_timer(self, op: _Append) -> None:
        if op.timer is not None:
            op.timer.cancel()
            op.timer = None

    def _unpark(self, ledger: Ledger) -> None:
        """After a commit: parked appends the entries now reach go back to the queue's head."""
        if not ledger.parked:
            return
        end = ledger.end_offset
        back = [op for op in ledger.parked if op.frames.first_offset <= end]
        ledger.parked = [op for op in ledger.parked if op.frames.first_offset > end]
        back.sort(key=lambda op: op.frames.first_offset)
        for op in reversed(back):
            self._unpark_timer(op)
            ledger.ops.appendleft(op)
        # The ledger moves on: the others wait gap_wait_s from now (a deep pipeline of appends
        # arriving out of order fills its gaps as long as it makes progress).
        deadline = self._clock() + self.gap_wait_s
        for op in ledger.parked:
            op.parked_until = deadline

    def _expire(self, ledger: Ledger, op: _Append) -> None:
        op.timer = None
        if op not in ledger.parked:
            return
        now = self._clock()
        if op.parked_until is not None and now < op.parked_until:  # progress since it parked
            op.timer = asyncio.get_running_loop().call_later(
                op.parked_until - now, self._expire, ledger, op
            )
            return
        ledger.parked.remove(op)
        end = ledger.end_offset if ledger.index is not None else op.first_offset
        metrics.APPENDS.labels("gap").inc()
        _settle(op, AppendGap(ledger.ledger_id, op.frames.first_offset, end))

    # --- reads ------------------------------------------------------------------------------

    async def _read_stored(self, ledger: Ledger, position: int, n: int) -> bytes:
        """Stored bytes ``[position, position + n)`` from a disk that holds them."""
        loop = asyncio.get_running_loop()
        ledger.active += 1
        self._touched.add(ledger.ledger_id)
        try:
            for disk in self.disks:
                i = disk.index
                if not (disk.healthy and ledger.in_sync[i] and ledger.sizes[i] >= position + n):
                    continue
                try:
                    return await loop.run_in_executor(
                        disk.executor, disk.read_at, ledger.files[i], position, n
                    )
                except OSError as exc:
                    log.error(
                        "disk %s: reading ledger %d failed: %s", disk.path, ledger.ledger_id, exc
                    )
                    disk.fail(f"read failed: {exc}")
        finally:
            ledger.active -= 1
            ledger.last_used = self._clock()
        raise TooFewDisks(f"ledger {ledger.ledger_id}", "no healthy disk holds the bytes to read")

    # --- fence, last-add-confirmed, delete --------------------------------------------------

    async def _save_record(self, ledger: Ledger, epoch: int, lac: int) -> None:
        """Write the fence record on every healthy disk; return once a majority has it."""
        record = encode_fence(epoch, lac)
        loop = asyncio.get_running_loop()
        targets = [d for d in self.disks if d.healthy]
        what = f"fence of ledger {ledger.ledger_id}"
        if len(targets) < self.majority:
            raise TooFewDisks(what, f"{len(targets)} of {len(self.disks)} disks are healthy")
        calls = {
            loop.run_in_executor(d.executor, d.write_fence, ledger.ledger_id, record): d
            for d in targets
        }
        ok = 0
        failed: list[tuple[Disk, BaseException]] = []
        pending: set[asyncio.Future[None]] = set(calls)
        while pending and ok < self.majority and len(targets) - len(failed) >= self.majority:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for call in done:
                exc = call.exception()
                if exc is None:
                    ok += 1
                else:
                    failed.append((calls[call], exc))
                    self._disk_error(calls[call], exc)
        if ok >= self.majority:
            ledger.lac_saved = lac
            for tail in pending:
                ledger.record_tails.add(tail)
                tail.add_done_callback(ledger.record_tails.discard)
                tail.add_done_callback(functools.partial(self._record_tail_done, calls[tail]))
            return
        detail = "; ".join(f"{d.path}: {e}" for d, e in failed)
        full = sum(1 for d, e in failed if _is_full(e, d))
        if full and ok + full >= self.majority:
            raise DisksFull(what, detail)
        raise TooFewDisks(what, detail)

    def _record_tail_done(self, disk: Disk, tail: asyncio.Future[None]) -> None:
        """A slower disk's fence record write, finished after the majority answered."""
        exc = None if tail.cancelled() else tail.exception()
        if exc is not None:
            self._disk_error(disk, exc)

    async def _apply_fence(self, ledger: Ledger, op: _Fence) -> None:
        epoch = max(ledger.fence, op.epoch)
        ledger.fence = epoch
        for parked in list(ledger.parked):
            if parked.epoch < epoch:
                ledger.parked.remove(parked)
                self._unpark_timer(parked)
                _settle(parked, self._fenced(ledger, parked.epoch))
        try:
            await self._save_record(ledger, epoch, ledger.lac)
        except PubsubError as exc:
            _settle(op, exc)
            return
        metrics.FENCES.inc()
        index = ledger.index
        _answer(
            op,
            FenceResult(
                exists=index is not None,
                first_offset=index.first_offset if index is not None else 0,
                end_offset=index.end_offset if index is not None else 0,
                last_add_confirmed=ledger.lac,
                fenced_epoch=epoch,
            ),
        )

    async def _apply_save_lac(self, ledger: Ledger, op: _SaveLac) -> None:
        if ledger.lac != ledger.lac_saved:
            try:
                await self._save_record(ledger, ledger.fence, ledger.lac)
            except PubsubError as exc:
                log.warning(
                    "ledger %d: saving last-add-confirmed failed: %s", ledger.ledger_id, exc
                )
        _answer(op, None)

    async def _apply_delete(self, ledger: Ledger, op: _Delete) -> None:
        existed = ledger.index is not None or ledger.fence > 0
        for parked in ledger.parked:
            self._unpark_timer(parked)
            _settle(parked, UnknownLedger(ledger.ledger_id))
        ledger.parked.clear()
        for file in ledger.files:
            file.close()
        if ledger.record_tails:
            await asyncio.gather(*ledger.record_tails, return_exceptions=True)
        loop = asyncio.get_running_loop()
        targets = [d for d in self.disks if d.healthy]
        results = await asyncio.gather(
            *(loop.run_in_executor(d.executor, d.delete, ledger.ledger_id) for d in targets),
            return_exceptions=True,
        )
        for disk, result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                log.warning(
                    "disk %s: deleting ledger %d failed: %s", disk.path, ledger.ledger_id, result
                )
            elif result:
                existed = True
        fresh = self._new_ledger(ledger.ledger_id)
        ledger.files, ledger.index = fresh.files, None
        ledger.fence, ledger.lac, ledger.lac_saved = 0, -1, -1
        ledger.in_sync, ledger.sizes = fresh.in_sync, fresh.sizes
        if not ledger.ops and self._ledgers.get(ledger.ledger_id) is ledger:
            del self._ledgers[ledger.ledger_id]
            self._touched.discard(ledger.ledger_id)
        _answer(op, existed)

    # --- housekeeping -----------------------------------------------------------------------

    async def _housekeep(self) -> None:
        interval = max(0.05, min(self.idle_close_s / 2, 10.0))
        while True:
            await asyncio.sleep(interval)
            try:
                self.close_idle()
                for disk in self.disks:
                    if disk.healthy:
                        free = disk.free_bytes()
                        metrics.DISK_FREE.labels(str(disk.path)).set(free)
                        disk.space.check()
            except Exception:  # never stop housekeeping
                log.exception("ledger housekeeping failed")

    def close_idle(self) -> int:
        """Close the files of ledgers unused for ``idle_close_s`` (their last-add-confirmed is
        saved first); returns how many were closed."""
        now = self._clock()
        closed = 0
        for ledger_id in list(self._touched):
            ledger = self._ledgers.get(ledger_id)
            if ledger is None:
                self._touched.discard(ledger_id)
                continue
            if ledger.worker is not None or ledger.active or ledger.ops:
                continue
            if now - ledger.last_used < self.idle_close_s:
                continue
            if ledger.lac != ledger.lac_saved and not self.stopping:
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                ledger.ops.append(_SaveLac(future))
                self._kick(ledger)
                continue
            for file in ledger.files:
                file.close()
            self._touched.discard(ledger_id)
            closed += 1
        return closed

    def open_files(self) -> int:
        """File descriptors held by ledgers (for tests)."""
        return sum(1 for ledger in self._ledgers.values() for f in ledger.files if f.fd is not None)

    # --- start-up recovery (blocking) -------------------------------------------------------

    def _recover(self) -> None:
        names: dict[int, list[bool]] = {}
        fences: dict[int, list[tuple[int, int] | None]] = {}
        m = len(self.disks)
        for disk in self.disks:
            try:
                make_dirs(disk.dir)
                entries = list(os.scandir(disk.dir))
            except OSError as exc:
                disk.fail(f"cannot use {disk.dir}: {exc}")
                continue
            for entry in entries:
                if entry.name.endswith(TMP_SUFFIX):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                    continue
                ledger_id = parse_ledger_name(entry.name)
                if ledger_id is None:
                    continue
                if entry.name.endswith(LEDGER_SUFFIX):
                    names.setdefault(ledger_id, [False] * m)[disk.index] = True
                else:
                    fences.setdefault(ledger_id, [None] * m)[disk.index] = self._read_fence(
                        disk, ledger_id
                    )
        for ledger_id in sorted(set(names) | set(fences)):
            ledger = self._recover_ledger(ledger_id, names.get(ledger_id, [False] * m))
            self._recover_fence(ledger, fences.get(ledger_id, [None] * m))
            if ledger.index is not None or ledger.fence > 0 or ledger.lac >= 0:
                self._ledgers[ledger_id] = ledger
        lagging = self.lagging_copies()
        log.info(
            "recovered %d ledgers on %d disks (%d healthy); %d copies repaired, %d lagging",
            len(self._ledgers),
            m,
            sum(d.healthy for d in self.disks),
            self.repaired_copies,
            lagging,
        )

    def _read_fence(self, disk: Disk, ledger_id: int) -> tuple[int, int] | None:
        try:
            record = decode_fence(disk.fence_path(ledger_id).read_bytes())
        except OSError as exc:
            log.error("disk %s: cannot read the fence of ledger %d: %s", disk.path, ledger_id, exc)
            return None
        if record is None:
            log.error("disk %s: the fence record of ledger %d is invalid", disk.path, ledger_id)
        return record

    def _recover_fence(self, ledger: Ledger, records: list[tuple[int, int] | None]) -> None:
        valid = [r for r in records if r is not None]
        if not valid:
            return
        epoch = max(r[0] for r in valid)
        lac = max(r[1] for r in valid)
        ledger.fence, ledger.lac, ledger.lac_saved = epoch, lac, lac
        for disk in self.disks:
            if disk.healthy and records[disk.index] != (epoch, lac):
                try:
                    disk.write_fence(ledger.ledger_id, encode_fence(epoch, lac))
                except OSError as exc:
                    log.error(
                        "disk %s: cannot repair the fence of ledger %d: %s",
                        disk.path,
                        ledger.ledger_id,
                        exc,
                    )

    def _scan(self, disk: Disk, ledger_id: int) -> ScannedCopy | None:
        path = disk.ledger_path(ledger_id)
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return scan_copy(b"")
            with (
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf,
                memoryview(buf) as view,
            ):
                return scan_copy(view)

    def _recover_ledger(self, ledger_id: int, present: list[bool]) -> Ledger:
        ledger = self._new_ledger(ledger_id, present)
        copies: dict[int, ScannedCopy | None] = {}
        for disk in self.disks:
            if not disk.healthy:
                ledger.in_sync[disk.index] = False
                continue
            if not present[disk.index]:
                copies[disk.index] = None
                continue
            try:
                copies[disk.index] = self._scan(disk, ledger_id)
            except OSError as exc:
                disk.fail(f"cannot read ledger {ledger_id}: {exc}")
                ledger.in_sync[disk.index] = False
        scanned = {i: c for i, c in copies.items() if c is not None}
        best_index = max(
            scanned,
            key=lambda i: (scanned[i].frames.end_offset if scanned[i].frames.frames else -1, -i),
            default=None,
        )
        best = scanned[best_index] if best_index is not None else None
        if best is None or not best.frames.frames:
            # No entry anywhere: nothing was ever answered. Drop the empty files.
            for i in scanned:
                with contextlib.suppress(OSError):
                    self.disks[i].ledger_path(ledger_id).unlink()
            return ledger
        assert best_index is not None
        winner = self.disks[best_index]
        for i, copy in copies.items():
            disk = self.disks[i]
            try:
                self._repair_copy(ledger_id, disk, copy, winner, best)
                ledger.sizes[i] = best.valid_end
            except OSError as exc:
                log.error(
                    "disk %s: ledger %d could not be repaired, its copy lags: %s",
                    disk.path,
                    ledger_id,
                    exc,
                )
                ledger.in_sync[i] = False
        index = LedgerIndex(best.frames.first_offset)
        index.add(best.frames)
        ledger.index = index
        return ledger

    def _repair_copy(
        self,
        ledger_id: int,
        disk: Disk,
        copy: ScannedCopy | None,
        winner: Disk,
        best: ScannedCopy,
    ) -> None:
        """Make ``disk``'s copy equal to the best copy's valid prefix (blocking)."""
        path = disk.ledger_path(ledger_id)
        keep = 0
        if copy is not None:
            shared = common_prefix(copy.frames, best.frames)
            keep = (
                best.frames.frames[shared].position
                if shared < len(best.frames.frames)
                else best.valid_end
            )
            if copy.file_size == best.valid_end and shared == len(best.frames.frames):
                return  # already equal
            invalid = copy.problem is not None and not copy.torn
            diverged = shared < len(copy.frames.frames)
            if (invalid or diverged) and copy.file_size > keep:
                damaged = path.with_name(path.name + DAMAGED_SUFFIX)
                shutil.copyfile(path, damaged)
                log.error(
                    "disk %s: ledger %d has %s at byte %d; the copy is cut there and refilled"
                    " from %s (the original is kept as %s)",
                    disk.path,
                    ledger_id,
                    copy.problem if invalid and not diverged else "entries that differ",
                    keep,
                    winner.path,
                    damaged.name,
                )
            elif copy.file_size > keep:
                log.warning(
                    "disk %s: ledger %d: cutting a torn tail at byte %d (%s)",
                    disk.path,
                    ledger_id,
                    keep,
                    copy.problem,
                )
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        fd = os.open(path, flags, FILE_MODE)
        try:
            os.ftruncate(fd, keep)
            if disk is not winner and keep < best.valid_end:
                source = os.open(winner.ledger_path(ledger_id), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    position = keep
                    while position < best.valid_end:
                        n = min(COPY_CHUNK, best.valid_end - position)
                        _pwrite_all(fd, _pread_exact(source, n, position), position)
                        position += n
                finally:
                    os.close(source)
                self.repaired_copies += 1
                log.warning(
                    "disk %s: ledger %d brought up to offset %d from %s",
                    disk.path,
                    ledger_id,
                    best.frames.end_offset,
                    winner.path,
                )
            fdatasync(fd)
        finally:
            os.close(fd)
        if copy is None:
            fsync_directory(disk.dir)
