"""Replicated segment writes: the ``Replica`` seam, the local-disk replica, majority writes.

A replica stores a log's segment files. :class:`QuorumWriter` sends every operation to
all replicas concurrently and returns once a majority applied it. Today a log has one
replica, its local disk (:class:`LocalDiskReplica`); N clusters x M disks plug in here.

Blocking file work (``write``, ``fsync``, ``open``) runs in worker threads so the event
loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from pubsubd.storage.errors import ReplicationFailed, StorageError
from pubsubd.storage.files import fdatasync, fsync_directory, write_all
from pubsubd.storage.quorum import QuorumTracker

logger = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
SEGMENT_NAME_DIGITS = 20  # zero-padded base offset, so names sort in offset order
SEGMENT_FILE_MODE = 0o644


def segment_file_name(base_offset: int) -> str:
    """File name of the segment whose first offset is ``base_offset``."""
    return f"{base_offset:0{SEGMENT_NAME_DIGITS}d}{SEGMENT_SUFFIX}"


def parse_segment_file_name(name: str) -> int | None:
    """Base offset encoded in a segment file name, or ``None`` if ``name`` is not one."""
    stem = name.removesuffix(SEGMENT_SUFFIX)
    if stem == name or len(stem) != SEGMENT_NAME_DIGITS or not stem.isdigit():
        return None
    return int(stem)


class Replica(Protocol):
    """One copy of a log's segments.

    The caller serializes ``append`` and ``roll`` (a single writer); ``sync`` may run
    concurrently with ``append`` but never with ``roll`` or ``close``.
    """

    async def append(self, segment_base: int, data: bytes, sync: bool) -> None:
        """Append ``data`` to the active segment ``segment_base``; fsync it if ``sync``.

        On failure nothing of ``data`` may remain in the segment.
        """

    async def sync(self) -> None:
        """Make everything appended so far durable."""

    async def roll(self, new_segment_base: int, sync: bool) -> None:
        """Start the empty segment ``new_segment_base``; it becomes the active one.

        With ``sync`` the old segment and the new file's directory entry are made durable.
        """

    def delete_segment(self, segment_base: int) -> None:
        """Delete a non-active segment; must not block for long (remote replicas enqueue)."""

    async def close(self) -> None:
        """Release the replica's resources; no sync is implied.

        The log also closes an idle replica (nothing pending, nothing unsynced) to release its
        files; the next operation must reopen what it needs.
        """


class LocalDiskReplica:
    """A replica on the local file system: one file per segment in ``directory``.

    The active segment file must exist before the first append to it (the log creates
    it); it is opened lazily in append mode. After a failed fsync the replica refuses
    further writes, because the kernel may have dropped the unsynced pages.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._fd: int | None = None
        self._segment_base: int | None = None
        self._size = 0
        self._broken: str | None = None
        self.fsync_count = 0  # fsync calls made, directory syncs included

    @property
    def directory(self) -> Path:
        """The directory holding the segment files."""
        return self._directory

    def _path(self, segment_base: int) -> Path:
        return self._directory / segment_file_name(segment_base)

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise StorageError(f"replica {self._directory} is unusable: {self._broken}")

    def _fsync(self, fd: int) -> None:
        self.fsync_count += 1
        try:
            fdatasync(fd)
        except OSError as exc:
            self._broken = f"fsync failed: {exc}"
            raise

    def _active_fd(self, segment_base: int) -> int:
        if self._fd is not None:
            if segment_base != self._segment_base:
                raise StorageError(
                    f"append to segment {segment_base}, but {self._segment_base} is active"
                )
            return self._fd
        fd = os.open(self._path(segment_base), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._fd, self._segment_base, self._size = fd, segment_base, os.fstat(fd).st_size
        return fd

    def _append_blocking(self, segment_base: int, data: bytes, sync: bool) -> None:
        self._check_usable()
        fd = self._active_fd(segment_base)
        before = self._size
        try:
            write_all(fd, data)
            self._size = before + len(data)
            if sync:
                self._fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, before)
                self._size = before
            except OSError as exc:
                self._broken = f"could not remove a failed write: {exc}"
            raise

    def _sync_blocking(self) -> None:
        self._check_usable()
        if self._fd is not None:
            self._fsync(self._fd)

    def _roll_blocking(self, new_segment_base: int, sync: bool) -> None:
        self._check_usable()
        if self._fd is not None and sync:
            self._fsync(self._fd)
        path = self._path(new_segment_base)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, SEGMENT_FILE_MODE)
        ours = os.fstat(fd).st_size == 0
        try:
            if not ours:
                raise StorageError(f"new segment {path} already holds data")
            if sync:
                self.fsync_count += 1
                fsync_directory(self._directory)
        except BaseException:
            os.close(fd)
            if ours:
                path.unlink(missing_ok=True)
            raise
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._segment_base, self._size = fd, new_segment_base, 0

    def _close_blocking(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._segment_base = None

    async def append(self, segment_base: int, data: bytes, sync: bool) -> None:
        await asyncio.to_thread(self._append_blocking, segment_base, data, sync)

    async def sync(self) -> None:
        await asyncio.to_thread(self._sync_blocking)

    async def roll(self, new_segment_base: int, sync: bool) -> None:
        await asyncio.to_thread(self._roll_blocking, new_segment_base, sync)

    def delete_segment(self, segment_base: int) -> None:
        if segment_base == self._segment_base:
            raise StorageError(f"refusing to delete the active segment {segment_base}")
        self._path(segment_base).unlink(missing_ok=True)

    async def close(self) -> None:
        if self._fd is not None:  # many idle logs: no thread hop for nothing
            await asyncio.to_thread(self._close_blocking)


_NO_FAILURES: frozenset[int] = frozenset()


class QuorumWriter:
    """Applies each operation to every replica and returns once a majority applied it.

    Operations reach each replica in order (a replica that is still busy with an earlier
    one gets the next queued behind it). A replica that fails an operation is logged and
    left out of every later operation; bringing it back (background repair, catch-up from
    the others) is future work. If a majority cannot be reached, :class:`ReplicationFailed`
    is raised. With one replica this is a thin pass-through to it.
    """

    # One per log, and every topic has a log: no per-instance __dict__.
    __slots__ = ("_failed", "_replicas", "_seq", "_tails", "_tracker")

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self._replicas = list(replicas)
        self._tracker = QuorumTracker(len(self._replicas))
        self._seq = 0
        self._tails: list[asyncio.Future[None] | None] = [None] * len(self._replicas)
        # Rebound, never mutated: the empty frozenset is shared by every writer.
        self._failed: frozenset[int] = _NO_FAILURES

    @property
    def replicas(self) -> list[Replica]:
        """The replicas written to, in index order."""
        return list(self._replicas)

    @property
    def failed_replicas(self) -> frozenset[int]:
        """Indexes of replicas left out after a failure."""
        return self._failed

    async def append(self, segment_base: int, data: bytes, sync: bool) -> None:
        """Append ``data`` to the active segment on a majority of the replicas."""
        await self._run("append", lambda r: r.append(segment_base, data, sync))

    async def sync(self) -> None:
        """Fsync the active segment on a majority of the replicas."""
        await self._run("sync", lambda r: r.sync())

    async def roll(self, new_segment_base: int, sync: bool) -> None:
        """Start segment ``new_segment_base`` on a majority of the replicas."""
        await self._run("roll", lambda r: r.roll(new_segment_base, sync))

    def delete_segment(self, segment_base: int) -> None:
        """Delete a segment everywhere; failures are logged (the file is merely left over)."""
        for index, replica in enumerate(self._replicas):
            if index in self._failed:
                continue
            try:
                replica.delete_segment(segment_base)
            except (OSError, StorageError):
                logger.warning(
                    "replica %d: deleting segment %d failed", index, segment_base, exc_info=True
                )

    async def close(self) -> None:
        """Wait for operations still running on slow replicas, then close every replica."""
        tails = [tail for tail in self._tails if tail is not None]
        await asyncio.gather(*tails, return_exceptions=True)
        results = await asyncio.gather(
            *(replica.close() for replica in self._replicas), return_exceptions=True
        )
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                logger.warning("replica %d: close failed: %s", index, result)

    async def _run(self, what: str, op: Callable[[Replica], Awaitable[None]]) -> None:
        self._seq += 1
        seq = self._seq
        if len(self._replicas) == 1:
            if self._failed:
                raise ReplicationFailed(f"{what}: the only replica has failed")
            try:
                await op(self._replicas[0])
            except Exception as exc:
                raise ReplicationFailed(f"{what} failed: {exc}") from exc
            self._tracker.ack(0, seq)
            return
        await self._run_replicated(what, seq, op)

    async def _run_replicated(
        self, what: str, seq: int, op: Callable[[Replica], Awaitable[None]]
    ) -> None:
        live = [i for i in range(len(self._replicas)) if i not in self._failed]
        needed = self._tracker.majority
        if len(live) < needed:
            raise ReplicationFailed(
                f"{what}: only {len(live)} of {len(self._replicas)} replicas are healthy"
            )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failures = 0

        def settle(index: int, task: asyncio.Future[None]) -> None:
            nonlocal failures
            error = None if task.cancelled() else task.exception()
            if task.cancelled() or error is not None:
                self._failed = self._failed | {index}
                failures += 1
                logger.warning("replica %d: %s #%d failed: %r", index, what, seq, error)
                if len(live) - failures < needed and not done.done():
                    done.set_exception(ReplicationFailed(f"{what} failed on a majority"))
                return
            self._tracker.ack(index, seq)
            if self._tracker.committed() >= seq and not done.done():
                done.set_result(None)

        for index in live:
            task = asyncio.ensure_future(self._chained(index, self._tails[index], op))
            self._tails[index] = task
            task.add_done_callback(functools.partial(settle, index))
        await done

    async def _chained(
        self,
        index: int,
        previous: asyncio.Future[None] | None,
        op: Callable[[Replica], Awaitable[None]],
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        if index in self._failed:
            raise ReplicationFailed(f"replica {index} failed an earlier operation")
        await op(self._replicas[index])
