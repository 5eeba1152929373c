"""A full disk: recognised, answered RESOURCE_EXHAUSTED, reported once per episode, healed.

Every write to the data directory (topic logs, ack journals, the metadata and delay-index SQLite
files) can fail because its file system is full: ``OSError`` ENOSPC or EDQUOT, SQLite's
SQLITE_FULL ("database or disk is full"), or a SQLite I/O error while (almost) no space is left.
:func:`disk_full_reason` recognises these anywhere in an exception's cause chain.

One :class:`DiskSpace` watches one data directory. The layer that owns a write reports its
failure with :meth:`DiskSpace.failed` (or wraps it in :meth:`DiskSpace.guard`) and raises the
:class:`~pubsubd.core.errors.DiskFull` it gets back: RESOURCE_EXHAUSTED naming the directory and
the free bytes, never INTERNAL. The first failure starts an *episode*: one ERROR line, the
``pubsubd_disk_full`` gauge at 1; later failures are only counted (``pubsubd_disk_full_writes``
by what was written), so a client retrying in a loop does not flood the log. The episode ends,
with one line saying how many writes failed, at the first successful write or periodic
:meth:`DiskSpace.check` that finds at least :data:`RECOVERY_MARGIN_BYTES` free (the margin keeps
a disk hovering at a few free kilobytes, where small writes succeed and large ones fail, in one
episode instead of starting one per write).

Nothing here retries: the callers keep what failed (the log reuses the offsets, an ack journal
keeps its cursors and heals by compaction on its next flush, SQLite rolls the statement back), so
the same call succeeds once space is freed.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from pubsubd.core.errors import DiskFull
from pubsubd.observability import metrics

log = logging.getLogger(__name__)

# What was being written (the label of pubsubd_disk_full_writes and part of the client message).
LOG = "topic log"
ACKS = "ack journal"
METADATA = "metadata store"
DELAYS = "delay index"

# An episode ends only when at least this much is free (see the module docstring).
RECOVERY_MARGIN_BYTES = 1 << 20
# A periodic check ends an episode only if no write failed for this long: with a quota (EDQUOT)
# the file system may show plenty of free space while writes still fail.
CHECK_HOLD_S = 5.0

_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_SQLITE_FULL = 13  # primary result codes (the low byte of extended ones)
_SQLITE_IOERR = 10
_FULL_TEXT = "database or disk is full"


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes and contexts, each once."""
    out: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def _disk_full_cause(exc: BaseException) -> tuple[BaseException, str] | None:
    """The exception of ``exc``'s chain that says the disk is full, and why."""
    for e in _chain(exc):
        if isinstance(e, DiskFull):
            return e, e.reason
        if isinstance(e, OSError) and e.errno in _ERRNOS:
            return e, os.strerror(e.errno)
        if isinstance(e, sqlite3.Error):
            code = getattr(e, "sqlite_errorcode", None)
            if (code is not None and code & 0xFF == _SQLITE_FULL) or _FULL_TEXT in str(e):
                return e, _FULL_TEXT
    return None


def disk_full_reason(exc: BaseException) -> str | None:
    """Why ``exc`` means the disk is full ("No space left on device", "Disk quota exceeded",
    "database or disk is full"), or None if it does not (a cause or context counts too)."""
    found = _disk_full_cause(exc)
    return None if found is None else found[1]


def _sqlite_io_error(exc: BaseException) -> bool:
    for e in _chain(exc):
        if isinstance(e, sqlite3.Error):
            code = getattr(e, "sqlite_errorcode", None)
            if code is not None and code & 0xFF == _SQLITE_IOERR:
                return True
    return False


def free_bytes(directory: Path) -> int | None:
    """Bytes this process may still write in ``directory``'s file system (root may use the
    reserved blocks too); None if it cannot be told (the directory is gone)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return int(blocks * st.f_frsize)


class DiskSpace:
    """Disk-full episodes of one data directory; see the module docstring.

    Call from the event loop thread (the writers' callers all run there)."""

    def __init__(
        self,
        directory: Path,
        *,
        margin_bytes: int = RECOVERY_MARGIN_BYTES,
        hold_s: float = CHECK_HOLD_S,
        clock: Callable[[], float] = time.monotonic,
        free: Callable[[Path], int | None] = free_bytes,
    ) -> None:
        self.directory = directory
        self.margin_bytes = margin_bytes
        self.hold_s = hold_s
        self._clock = clock
        self._free = free
        self.full = False  # an episode is under way
        self.failures = 0  # failed writes in the current (or last) episode
        self.total_failures = 0
        self.episodes = 0
        self._since = 0.0
        self._last_failure = 0.0
        self._first_error = ""

    def free_bytes(self) -> int | None:
        return self._free(self.directory)

    # --- reporting ----------------------------------------------------------------------------

    def reason(self, exc: BaseException) -> str | None:
        """Why ``exc`` is a disk-full failure, or None. A SQLite I/O error counts when (almost)
        nothing is free: SQLite reports some failed writes (its shared-memory file) that way."""
        reason = disk_full_reason(exc)
        if reason is None and _sqlite_io_error(exc):
            free = self.free_bytes()
            if free is not None and free < self.margin_bytes:
                reason = f"{exc}, with almost no space left"
        return reason

    def failed(self, exc: BaseException, what: str, reason: str | None = None) -> DiskFull:
        """Record a write that failed for lack of space; return the error to raise."""
        reason = reason or self.reason(exc) or str(exc)
        free = self.free_bytes()
        now = self._clock()
        self._last_failure = now
        self.total_failures += 1
        metrics.DISK_FULL_WRITES.labels(what).inc()
        if not self.full:
            self.full = True
            self.episodes += 1
            self.failures = 0
            self._since = now
            found = _disk_full_cause(exc)
            cause = exc if found is None else found[0]  # the OSError, not its wrappers
            self._first_error = f"{what}: {cause}"
            metrics.DISK_FULL.set(1)
            log.error(
                "disk full: writing the %s in data directory %s failed (%s bytes free): %s;"
                " writes are answered RESOURCE_EXHAUSTED until space returns (failures are"
                " counted in pubsubd_disk_full_writes_total, not logged)",
                what,
                self.directory,
                "unknown" if free is None else free,
                cause,
            )
        self.failures += 1
        return DiskFull(str(self.directory), free, what, reason)

    def error(self, exc: BaseException, what: str) -> DiskFull | None:
        """The DiskFull to raise instead of ``exc`` (recorded), or None if it is not one."""
        if isinstance(exc, DiskFull):
            return exc  # already recorded by whoever raised it
        reason = self.reason(exc)
        return None if reason is None else self.failed(exc, what, reason)

    def succeeded(self) -> None:
        """A write succeeded: may end the episode (cheap when there is none)."""
        if self.full:
            self._end_if_space()

    def check(self) -> bool:
        """Periodic: end the episode if space is back and nothing failed lately; True while
        the disk is full."""
        if self.full and self._clock() - self._last_failure >= self.hold_s:
            self._end_if_space()
        return self.full

    def _end_if_space(self) -> None:
        free = self.free_bytes()
        if free is not None and free < self.margin_bytes:
            return
        self.full = False
        metrics.DISK_FULL.set(0)
        log.warning(
            "disk space back in data directory %s (%s bytes free): writes resume after %d"
            " failed writes in %.1f s",
            self.directory,
            "unknown" if free is None else free,
            self.failures,
            self._clock() - self._since,
        )

    def refusal(self, what: str) -> DiskFull | None:
        """While an episode is under way (and space has not come back), the error to answer a
        write that must not even start, such as an exactly-once ack: applied in memory first,
        it could not be retried by the client once the journal failed. None otherwise."""
        if not self.check():
            return None
        reason = self._first_error or "no space left on device"
        return DiskFull(str(self.directory), self.free_bytes(), what, reason)

    def guard(self, what: str) -> _Guard:
        """``with disk.guard(what): write()``: a disk-full failure becomes DiskFull (recorded),
        a success may end the episode; other errors pass unchanged."""
        return _Guard(self, what)

    # --- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """For /status and /healthz."""
        out: dict[str, Any] = {
            "data_dir": str(self.directory),
            "full": self.full,
            "free_bytes": self.free_bytes(),
            "episodes": self.episodes,
            "failed_writes": self.total_failures,
        }
        if self.full:
            out["episode"] = {
                "for_s": round(self._clock() - self._since, 1),
                "failed_writes": self.failures,
                "first_error": self._first_error,
            }
        return out

    def problem(self) -> str | None:
        """One line for /healthz while the disk is full, else None."""
        if not self.check():
            return None
        free = self.free_bytes()
        return (
            f"disk full: data directory {self.directory} has "
            f"{'unknown' if free is None else free} bytes free; {self.failures} writes failed"
            f" in the last {self._clock() - self._since:.1f} s and were answered"
            " RESOURCE_EXHAUSTED (publish, admin, acks). Reads, pulls and acks go on; writes"
            " resume by themselves once space is freed"
        )


class _Guard:
    __slots__ = ("_disk", "_what")

    def __init__(self, disk: DiskSpace, what: str) -> None:
        self._disk = disk
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self._disk.succeeded()
            return
        error = self._disk.error(exc, self._what)
        if error is not None and error is not exc:
            raise error from exc
