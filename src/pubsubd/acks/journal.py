"""Crash-safe persistence of one subscription's ack cursors (one per message source).

State is a snapshot file plus an append-only journal of changes made since that
snapshot. Acks are buffered in memory by :meth:`AckJournal.record` and made durable
by :meth:`AckJournal.flush` (one ``write`` + ``fsync`` per flush, group commit).
Losing unflushed records in a crash only causes redelivery; the cursors recovered
are always a state that actually existed, and mark-delete never passes an offset
that was not acked.

Files in the subscription's directory (all integers little-endian)::

    acks.snapshot        full cursor state as of journal generation G
    acks.journal         header (generation G) + records appended since the snapshot
    <name>.tmp           compaction in progress; deleted on open

Journal header (20 bytes):

    ======  ====  ===========  ==========================================
    offset  size  field        meaning
    ======  ====  ===========  ==========================================
    0       8     magic        ``b"PSDACKJ1"``
    8       8     generation   u64; must equal the snapshot's generation
    16      4     crc          u32 CRC32C of bytes 0..16
    ======  ====  ===========  ==========================================

Journal record (repeated until end of file):

    ======  ====  ===========  ==========================================
    offset  size  field        meaning
    ======  ====  ===========  ==========================================
    0       4     length       u32 payload length in bytes
    4       4     crc          u32 CRC32C of the ``length`` bytes + payload
    8       1     kind         1 = ACK, 2 = RESET
    9       8     source_id    i64
    ACK:
    17      4     n            u32 number of ranges
    21      16*n  ranges       n x (start i64, end i64), half-open, newly acked
    RESET (cursor created or Seek; replaces the whole cursor):
    17      8     mark_delete  i64
    25      4     n            u32 number of ranges
    29      16*n  ranges       n x (start i64, end i64), acked above mark_delete
    ======  ====  ===========  ==========================================

Snapshot file (written whole to a temp file, fsynced, then renamed):

    ======  ====  ===========  ==========================================
    offset  size  field        meaning
    ======  ====  ===========  ==========================================
    0       8     magic        ``b"PSDACKS1"``
    8       8     generation   u64; the journal generation that follows it
    16      4     count        u32 number of cursors
    20      ...   cursors      count x (source_id i64, mark_delete i64,
                               n u32, n x (start i64, end i64))
    end-4   4     crc          u32 CRC32C of everything before it
    ======  ====  ===========  ==========================================

Recovery rules (:meth:`AckJournal.open`):

1. Temp files are deleted (an unfinished compaction never affects state).
2. No snapshot means generation 0 and no cursors. A snapshot that fails its CRC
   is corruption (it is only ever installed complete) and raises.
3. Journal generation == snapshot generation: replay its records in order, stop at
   the first torn record (short or bad CRC) and truncate the file there, so later
   appends are not hidden behind garbage. A record with a valid CRC that does not
   parse raises. Generation < snapshot generation: we crashed inside compaction
   after installing the snapshot, which already contains every record; the
   journal is replaced by an empty one. Generation > snapshot generation raises.
   A missing journal, or one shorter than its header, is replaced by an empty one
   (journals are installed by rename, so that cannot hide records).
4. Sources in ``initial`` with no cursor yet get one (journaled as RESET).

Files are created lazily: a journal opened on a directory that does not exist creates
nothing until it has something to write beyond the cursors of ``initial`` (the caller passes
the same ``initial`` on every open: a subscription's sync point is in the metadata store).
Then it creates the directory and an empty journal (fsyncing each new directory entry) before
the first write. No file descriptor is held between flushes: each flush opens the journal,
writes, fsyncs and closes it, so many idle subscriptions cost no descriptors.

Replay is idempotent over a newer state: ACK is a set union and RESET a
replacement, so records that are also contained in a snapshot do no harm.

Compaction from generation G to G+1 (rules for crash safety):

a. snapshot(G+1) -> ``acks.snapshot.tmp``, fsync, rename over ``acks.snapshot``,
   fsync directory. A crash before the rename leaves snapshot(G) + journal(G).
b. header(G+1) -> ``acks.journal.tmp``, fsync, rename over ``acks.journal``, fsync
   directory. A crash before this rename leaves snapshot(G+1) + journal(G): the
   stale journal is ignored (rule 3) and the snapshot holds the same state.

Concurrency: all disk I/O runs in a worker thread under one :class:`asyncio.Lock`;
cursors and the record buffer are only touched on the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final, Protocol, TypeVar

import google_crc32c

from pubsubd.acks.cursor import Cursor, CursorState
from pubsubd.storage.files import fdatasync, fsync_directory, make_dirs, write_all

__all__ = [
    "DEFAULT_COMPACT_BYTES",
    "JOURNAL_FILENAME",
    "SNAPSHOT_FILENAME",
    "AckJournal",
    "AckJournalCorruptError",
    "AckJournalError",
    "JournalMirror",
]

logger = logging.getLogger(__name__)

SNAPSHOT_FILENAME: Final = "acks.snapshot"
JOURNAL_FILENAME: Final = "acks.journal"
TMP_SUFFIX: Final = ".tmp"
SNAPSHOT_MAGIC: Final = b"PSDACKS1"
JOURNAL_MAGIC: Final = b"PSDACKJ1"
DEFAULT_COMPACT_BYTES: Final = 4 * 1024 * 1024

KIND_ACK: Final = 1
KIND_RESET: Final = 2

_HEADER = struct.Struct("<8sQ")  # magic, generation
_HEADER_CRC = struct.Struct("<I")
JOURNAL_HEADER_SIZE: Final = _HEADER.size + _HEADER_CRC.size
_FRAME = struct.Struct("<II")  # payload length, crc
_LENGTH = struct.Struct("<I")
_ACK_HEAD = struct.Struct("<BqI")  # kind, source_id, n
_RESET_HEAD = struct.Struct("<BqqI")  # kind, source_id, mark_delete, n
_KIND = struct.Struct("<B")
_SNAP_HEAD = struct.Struct("<8sQI")  # magic, generation, count
_SNAP_CURSOR = struct.Struct("<qqI")  # source_id, mark_delete, n
_CRC = struct.Struct("<I")
_RANGE_SIZE: Final = 16

_T = TypeVar("_T")


class AckJournalError(OSError):
    """The ack journal cannot be used (earlier I/O failure, or closed).

    An ``OSError`` so that callers handling disk errors around :meth:`AckJournal.flush`
    catch it too.
    """


class AckJournalCorruptError(AckJournalError):
    """On-disk ack state is damaged beyond a torn journal tail."""


class _NothingWritten(OSError):
    """A flush could not open the journal; the journal is unchanged and still usable."""


# ---------------------------------------------------------------------------
# Pure encoding / decoding (no I/O)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AckRecord:
    source_id: int
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class ResetRecord:
    source_id: int
    state: CursorState


Record = AckRecord | ResetRecord


def _pack_ranges(ranges: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> bytes:
    flat = [x for r in ranges for x in r]
    return struct.pack(f"<{len(flat)}q", *flat)


def _unpack_ranges(buf: bytes, offset: int, n: int) -> tuple[tuple[int, int], ...]:
    flat = struct.unpack_from(f"<{2 * n}q", buf, offset)
    return tuple(zip(flat[0::2], flat[1::2], strict=True))


def _frame(payload: bytes) -> bytes:
    length = _LENGTH.pack(len(payload))
    crc = google_crc32c.extend(google_crc32c.value(length), payload)
    return length + _CRC.pack(crc) + payload


def encode_ack(source_id: int, ranges: list[tuple[int, int]]) -> bytes:
    """One framed ACK record."""
    return _frame(_ACK_HEAD.pack(KIND_ACK, source_id, len(ranges)) + _pack_ranges(ranges))


def encode_reset(source_id: int, state: CursorState) -> bytes:
    """One framed RESET record."""
    head = _RESET_HEAD.pack(KIND_RESET, source_id, state.mark_delete, len(state.ranges))
    return _frame(head + _pack_ranges(state.ranges))


def encode_journal_header(generation: int) -> bytes:
    head = _HEADER.pack(JOURNAL_MAGIC, generation)
    return head + _HEADER_CRC.pack(google_crc32c.value(head))


def decode_journal_header(data: bytes) -> int:
    """Generation of a journal whose first ``JOURNAL_HEADER_SIZE`` bytes are ``data``."""
    magic, generation = _HEADER.unpack_from(data, 0)
    (crc,) = _HEADER_CRC.unpack_from(data, _HEADER.size)
    if magic != JOURNAL_MAGIC or crc != google_crc32c.value(data[: _HEADER.size]):
        raise AckJournalCorruptError("bad ack journal header")
    return int(generation)


def _decode_payload(payload: bytes) -> Record:
    """Decode a CRC-verified payload; a malformed one is corruption, not a torn write."""
    try:
        (kind,) = _KIND.unpack_from(payload, 0)
        if kind == KIND_ACK:
            _, source_id, n = _ACK_HEAD.unpack_from(payload, 0)
            if len(payload) != _ACK_HEAD.size + n * _RANGE_SIZE:
                raise ValueError("length mismatch")
            return AckRecord(source_id, _unpack_ranges(payload, _ACK_HEAD.size, n))
        if kind == KIND_RESET:
            _, source_id, mark_delete, n = _RESET_HEAD.unpack_from(payload, 0)
            if len(payload) != _RESET_HEAD.size + n * _RANGE_SIZE:
                raise ValueError("length mismatch")
            ranges = _unpack_ranges(payload, _RESET_HEAD.size, n)
            return ResetRecord(source_id, CursorState(mark_delete, ranges))
        raise ValueError(f"unknown record kind {kind}")
    except (struct.error, ValueError) as exc:
        raise AckJournalCorruptError(f"malformed ack journal record: {exc}") from exc


def iter_records(data: bytes, offset: int) -> Iterator[tuple[int, Record]]:
    """Yield ``(end_offset, record)`` for each intact record from ``offset``.

    Stops silently at the first torn record (incomplete, or CRC mismatch); the
    last yielded ``end_offset`` (or ``offset`` if none) is where valid data ends.
    """
    while offset + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, offset)
        end = offset + _FRAME.size + length
        if end > len(data):
            return
        # google_crc32c needs bytes (not memoryview); records are small, copying is fine.
        payload = data[offset + _FRAME.size : end]
        if google_crc32c.extend(google_crc32c.value(data[offset : offset + 4]), payload) != crc:
            return
        yield end, _decode_payload(payload)
        offset = end


def encode_snapshot(generation: int, states: Mapping[int, CursorState]) -> bytes:
    parts = [_SNAP_HEAD.pack(SNAPSHOT_MAGIC, generation, len(states))]
    for source_id, state in sorted(states.items()):
        parts.append(_SNAP_CURSOR.pack(source_id, state.mark_delete, len(state.ranges)))
        parts.append(_pack_ranges(state.ranges))
    body = b"".join(parts)
    return body + _CRC.pack(google_crc32c.value(body))


def decode_snapshot(data: bytes) -> tuple[int, dict[int, CursorState]]:
    """``(generation, states)`` of a snapshot file; raises if it is damaged."""
    try:
        if len(data) < _SNAP_HEAD.size + _CRC.size:
            raise ValueError("too short")
        body_len = len(data) - _CRC.size
        (crc,) = _CRC.unpack_from(data, body_len)
        if crc != google_crc32c.value(data[:body_len]):
            raise ValueError("bad crc")
        magic, generation, count = _SNAP_HEAD.unpack_from(data, 0)
        if magic != SNAPSHOT_MAGIC:
            raise ValueError("bad magic")
        offset = _SNAP_HEAD.size
        states: dict[int, CursorState] = {}
        for _ in range(count):
            source_id, mark_delete, n = _SNAP_CURSOR.unpack_from(data, offset)
            offset += _SNAP_CURSOR.size
            if offset + n * _RANGE_SIZE > body_len:
                raise ValueError("truncated cursor")
            states[source_id] = CursorState(mark_delete, _unpack_ranges(data, offset, n))
            offset += n * _RANGE_SIZE
        if offset != body_len:
            raise ValueError("trailing bytes")
    except (struct.error, ValueError) as exc:
        raise AckJournalCorruptError(f"damaged ack snapshot: {exc}") from exc
    return int(generation), states


def apply_record(cursors: dict[int, Cursor], record: Record) -> None:
    """Replay one record onto ``cursors``."""
    if isinstance(record, ResetRecord):
        cursor = cursors.get(record.source_id)
        if cursor is None:
            cursors[record.source_id] = Cursor.from_state(record.state)
        else:
            cursor.reset(record.state.mark_delete, record.state.ranges)
        return
    cursor = cursors.get(record.source_id)
    if cursor is None:
        # Cursor creation is always journaled (RESET) before its first ACK.
        raise AckJournalCorruptError(f"ack record for unknown source {record.source_id}")
    for start, end in record.ranges:
        cursor.ack_range(start, end)


# ---------------------------------------------------------------------------
# File helpers (blocking; called from open() or a worker thread)
# ---------------------------------------------------------------------------


def install_file(directory: Path, name: str, data: bytes) -> None:
    """Atomically replace ``directory/name`` with ``data`` (temp, fsync, rename, fsync dir)."""
    tmp = directory / (name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / name)
    fsync_directory(directory)


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)


async def _run_in_thread(fn: Callable[[], _T]) -> _T:
    """Run blocking ``fn`` in a thread; if cancelled, still wait for it to finish.

    The caller holds the I/O lock, and it must not be released while a write on
    the journal fd is still in flight.
    """
    task = asyncio.ensure_future(asyncio.to_thread(fn))
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved; failures already marked the journal broken
        raise asyncio.CancelledError
    return task.result()


# ---------------------------------------------------------------------------
# The journal
# ---------------------------------------------------------------------------


class JournalMirror(Protocol):
    """A copy of the journal on other machines (``acks/replicated.py``: the subscription's
    cursor ledgers on the storage nodes). Written before the local files, so it holds at least
    what they hold; a new machine rebuilds the local files from it."""

    async def append_records(self, data: bytes) -> None:
        """Make encoded journal records durable, in order."""
        ...

    async def append_snapshot(self, snapshot: bytes) -> None:
        """Make an encoded snapshot durable; what came before it may be dropped."""
        ...

    async def close(self) -> None: ...
    async def destroy(self) -> None:
        """Delete the copy (the subscription is gone)."""
        ...


class AckJournal:
    """Durable ack cursors of one subscription, keyed by message source id.

    Use :meth:`open`. Mutate a cursor, then immediately (no ``await`` in between)
    call :meth:`record` with the ranges it returned; :meth:`flush` makes them durable.
    """

    # One per subscription, so no per-instance __dict__ (BENCHMARKS.md, "Scale of names").
    __slots__ = (
        "_broken",
        "_buffer",
        "_buffered_bytes",
        "_closed",
        "_compact_bytes",
        "_cursors",
        "_deferred",
        "_directory",
        "_generation",
        "_journal_size",
        "_lock",
        "_mirror",
        "_on_disk",
        "_snapshot_size",
        "_unsynced",
    )

    def __init__(
        self,
        directory: Path,
        cursors: dict[int, Cursor],
        on_disk: bool,
        generation: int,
        journal_size: int,
        snapshot_size: int,
        compact_bytes: int,
        mirror: JournalMirror | None = None,
    ) -> None:
        self._directory = directory
        self._mirror = mirror
        self._cursors = cursors
        self._on_disk = on_disk  # the directory and the journal file exist
        # Only records restating ``initial`` are buffered and nothing is on disk: no need to write.
        self._deferred = False
        self._generation = generation
        self._journal_size = journal_size  # bytes written to the journal file so far
        self._snapshot_size = snapshot_size
        self._compact_bytes = compact_bytes
        self._buffer: list[bytes] = []  # encoded records not yet written
        self._buffered_bytes = 0
        self._unsynced = False  # written but not yet fsynced
        self._lock = asyncio.Lock()  # serializes all I/O on the files and compaction
        self._broken: BaseException | None = None
        self._closed = False

    # -- opening / recovery -----------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        initial: Mapping[int, int] | None = None,
        *,
        compact_bytes: int = DEFAULT_COMPACT_BYTES,
        mirror: JournalMirror | None = None,
    ) -> AckJournal:
        """Open and recover the journal in ``directory`` (created on the first write). Blocking.

        With a ``mirror`` every flush and compaction is written to it first (a cluster: the
        local files are then a copy, rebuilt from the mirror on a new machine)."""
        existed = directory.is_dir()
        for name in (SNAPSHOT_FILENAME, JOURNAL_FILENAME):
            (directory / (name + TMP_SUFFIX)).unlink(missing_ok=True)

        snapshot_path = directory / SNAPSHOT_FILENAME
        states: dict[int, CursorState]
        try:
            snapshot_data = snapshot_path.read_bytes()
        except FileNotFoundError:
            generation, states, snapshot_size = 0, {}, 0
        else:
            generation, states = decode_snapshot(snapshot_data)
            snapshot_size = len(snapshot_data)
        cursors = {sid: Cursor.from_state(state) for sid, state in states.items()}

        journal_path = directory / JOURNAL_FILENAME
        journal_size = cls._recover_journal(journal_path, generation, cursors)
        if journal_size is None:
            if existed:
                install_file(directory, JOURNAL_FILENAME, encode_journal_header(generation))
            journal_size = JOURNAL_HEADER_SIZE

        journal = cls(
            directory,
            cursors,
            existed,
            generation,
            journal_size,
            snapshot_size,
            compact_bytes,
            mirror,
        )
        for source_id, start in (initial or {}).items():
            journal.cursor(source_id, start)
        journal._deferred = not existed  # set after the initial cursors: any later record clears it
        if journal._should_compact() and mirror is None:  # a mirror compacts on the first flush
            journal._compact_sync(generation + 1, journal._snapshot_states())
        return journal

    @staticmethod
    def _recover_journal(path: Path, generation: int, cursors: dict[int, Cursor]) -> int | None:
        """Replay ``path`` onto ``cursors``; return its valid size, or None to start afresh."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) < JOURNAL_HEADER_SIZE:
            logger.warning("ack journal %s has a torn header; starting empty", path)
            return None
        journal_generation = decode_journal_header(data)
        if journal_generation < generation:
            logger.info("ack journal %s is older than its snapshot; discarding", path)
            return None
        if journal_generation > generation:
            raise AckJournalCorruptError(
                f"ack journal {path} generation {journal_generation} > snapshot {generation}"
            )
        good_end = JOURNAL_HEADER_SIZE
        for end, record in iter_records(data, JOURNAL_HEADER_SIZE):
            apply_record(cursors, record)
            good_end = end
        if good_end < len(data):
            logger.warning(
                "ack journal %s: dropping %d-byte torn tail at %d",
                path,
                len(data) - good_end,
                good_end,
            )
            _truncate(path, good_end)
        return good_end

    # -- cursor access (event loop thread, no I/O) ------------------------------

    @property
    def cursors(self) -> dict[int, Cursor]:
        """All cursors by source id. Read-only use: create with :meth:`cursor`."""
        return self._cursors

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def mirror(self) -> JournalMirror | None:
        return self._mirror

    @property
    def buffered_bytes(self) -> int:
        """Size of records recorded but not yet written by :meth:`flush`."""
        return self._buffered_bytes

    def cursor(self, source_id: int, default_start: int) -> Cursor:
        """The cursor for ``source_id``, created at mark-delete ``default_start`` if missing."""
        cursor = self._cursors.get(source_id)
        if cursor is None:
            cursor = Cursor(default_start)
            self._cursors[source_id] = cursor
            self._append(encode_reset(source_id, cursor.snapshot()))
        return cursor

    def record(self, source_id: int, ranges: list[tuple[int, int]]) -> None:
        """Buffer the ranges a ``Cursor.ack``/``ack_range`` just returned as newly acked."""
        if not ranges:
            return
        if source_id not in self._cursors:
            raise KeyError(f"no cursor for source {source_id}; create it with cursor()")
        self._append(encode_ack(source_id, ranges))

    def reset(self, source_id: int, state: CursorState) -> None:
        """Set the cursor of ``source_id`` to ``state`` (creating it) and buffer a RESET."""
        cursor = self._cursors.get(source_id)
        if cursor is None:
            cursor = Cursor.from_state(state)
            self._cursors[source_id] = cursor
        else:
            cursor.reset(state.mark_delete, state.ranges)
        self._append(encode_reset(source_id, cursor.snapshot()))

    def _append(self, record: bytes) -> None:
        if self._closed:
            raise AckJournalError("ack journal is closed")
        self._deferred = False
        self._buffer.append(record)
        self._buffered_bytes += len(record)

    def _snapshot_states(self) -> dict[int, CursorState]:
        return {sid: cursor.snapshot() for sid, cursor in self._cursors.items()}

    # -- I/O ----------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise AckJournalError("ack journal is closed")
        if self._broken is not None:
            raise AckJournalError(
                f"ack journal {self._directory} failed earlier; reopen it"
            ) from self._broken

    async def flush(self, sync: bool = True) -> None:
        """Write all buffered records in one ``write``; fsync if ``sync``.

        Safe to call concurrently: callers queue on a lock and whoever runs next
        writes everything buffered so far (group commit), so a queued caller often
        finds nothing left to do. Compacts when the journal has grown too large.
        An I/O failure raises the ``OSError`` and leaves the journal file untrusted (a torn
        record, pages dropped by a failed fsync); the next flush heals it by compaction: a fresh
        snapshot of the in-memory cursors (which hold every recorded ack) and an empty journal,
        so no ack recorded before or after the failure is lost. A no-op once closed
        (close() flushed everything and nothing can be recorded afterwards).
        """
        if self._closed:
            return
        async with self._lock:
            if self._closed:
                return
            if self._broken is not None:
                await self._heal_locked()
                return
            if self._deferred:
                return
            data = b"".join(self._buffer)
            self._buffer.clear()
            self._buffered_bytes = 0
            if data and self._mirror is not None:
                try:
                    await self._mirror.append_records(data)
                except BaseException:
                    self._buffer.insert(0, data)  # kept for the next flush
                    self._buffered_bytes += len(data)
                    raise
            if data or (sync and self._unsynced):
                try:
                    await _run_in_thread(partial(self._write_sync, data, sync))
                except _NothingWritten:
                    # The journal could not be opened: keep the records for the next flush.
                    self._buffer.insert(0, data)
                    self._buffered_bytes += len(data)
                    raise
            if self._should_compact():
                await self._compact_locked()

    async def compact(self) -> None:
        """Replace snapshot + journal by a fresh snapshot of all cursors and an empty journal."""
        self._check_usable()
        async with self._lock:
            self._check_usable()
            await self._compact_locked()

    async def close(self) -> None:
        """Flush (with fsync) and close. Idempotent."""
        if self._closed:
            return
        try:
            await self.flush(sync=True)  # heals a broken journal first
        finally:
            async with self._lock:
                self._closed = True
            if self._mirror is not None:
                await self._mirror.close()

    def delete(self) -> None:
        """Remove the on-disk state (subscription deleted). Unflushed records are dropped.

        Must not overlap a running flush/compaction (``await close()`` first is simplest).
        """
        if self._lock.locked():
            raise AckJournalError("cannot delete ack journal while I/O is in progress")
        self._closed = True
        self._buffer.clear()
        self._buffered_bytes = 0
        for name in (SNAPSHOT_FILENAME, JOURNAL_FILENAME):
            (self._directory / name).unlink(missing_ok=True)
            (self._directory / (name + TMP_SUFFIX)).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._directory.rmdir()  # only if nothing else lives there

    def _should_compact(self) -> bool:
        # Amortize: never rewrite a snapshot more often than the journal re-grows to its size.
        return self._journal_size > max(self._compact_bytes, self._snapshot_size)

    async def _heal_locked(self) -> None:
        # Everything buffered is in the cursors the snapshot is taken from.
        self._buffer.clear()
        self._buffered_bytes = 0
        self._deferred = False
        await self._compact_locked()  # raises (and stays broken) if the disk still fails
        self._broken = None
        logger.warning("ack journal %s healed by compaction", self._directory)

    async def _compact_locked(self) -> None:
        # States are captured on the event loop, consistent with every record already
        # written; records buffered meanwhile go to the new journal (replay is idempotent).
        states = self._snapshot_states()
        if self._mirror is not None:
            await self._mirror.append_snapshot(encode_snapshot(self._generation + 1, states))
        await _run_in_thread(partial(self._compact_sync, self._generation + 1, states))

    # -- blocking parts (worker thread, or open()) ----------------------------------

    def _create_files(self) -> None:
        """Create the directory (fsyncing each new entry) and an empty journal."""
        make_dirs(self._directory)
        install_file(self._directory, JOURNAL_FILENAME, encode_journal_header(self._generation))
        self._on_disk = True

    def _write_sync(self, data: bytes, sync: bool) -> None:
        try:
            if not self._on_disk:
                self._create_files()
            fd = _open_append(self._directory / JOURNAL_FILENAME)
        except OSError as exc:
            raise _NothingWritten(exc.errno, f"cannot open ack journal: {exc}") from exc
        try:
            if data:
                self._unsynced = True
                write_all(fd, data)
                self._journal_size += len(data)
            if sync and self._unsynced:
                fdatasync(fd)
                self._unsynced = False
        except BaseException as exc:
            # A partial write may have left a torn record, and after a failed fsync
            # the kernel may have dropped dirty pages: nothing written later could
            # be trusted. Recovery (reopen) truncates the torn tail.
            self._broken = exc
            raise
        finally:
            os.close(fd)

    def _compact_sync(self, generation: int, states: Mapping[int, CursorState]) -> None:
        try:
            if not self._on_disk:
                self._create_files()
            snapshot = encode_snapshot(generation, states)
            install_file(self._directory, SNAPSHOT_FILENAME, snapshot)
            # Crash here: snapshot(G+1) + journal(G) -> journal ignored, same state.
            install_file(self._directory, JOURNAL_FILENAME, encode_journal_header(generation))
        except BaseException as exc:
            self._broken = exc
            raise
        self._generation = generation
        self._journal_size = JOURNAL_HEADER_SIZE
        self._snapshot_size = len(snapshot)
        self._unsynced = False
        logger.info(
            "compacted ack journal %s: generation %d, %d cursors, %d-byte snapshot",
            self._directory,
            generation,
            len(states),
            len(snapshot),
        )
