"""Errors raised by the storage engine (segment logs, framing, replication)."""

from __future__ import annotations

from pubsubd.storage.damage import DamagedRange


class StorageError(Exception):
    """Base class of every error raised by ``pubsubd.storage``."""


class CorruptEntry(StorageError):
    """A stored entry failed validation (bad length, CRC mismatch, wrong offset)."""


class DamagedEntries(CorruptEntry):
    """The requested offset lies in a damaged range of the log (storage/damage.py); the
    entries after it are readable from ``damaged.end_offset`` on. ``restoring``: a copy is
    being read back from the storage nodes (a cluster's local copy): wait for it, do not
    skip or report the messages as lost."""

    def __init__(self, damaged: DamagedRange, *, restoring: bool = False) -> None:
        state = " (being restored from the storage nodes)" if restoring else ""
        super().__init__(f"damaged entries{state}: {damaged.describe()}")
        self.damaged = damaged
        self.restoring = restoring


class OffsetOutOfRange(StorageError):
    """An offset outside the retained, readable range ``[start, end)`` was requested."""

    def __init__(self, offset: int, start: int, end: int) -> None:
        super().__init__(f"offset {offset} is outside the retained range [{start}, {end})")
        self.offset = offset
        self.start = start
        self.end = end


class LogClosed(StorageError):
    """The log was closed; no more appends or reads are accepted."""


class ReplicationFailed(StorageError):
    """A write did not reach a majority of the replicas."""


class Fenced(ReplicationFailed):
    """A storage node refused an append: the ledger was fenced by a newer owner."""


class LostOwnership(ReplicationFailed):
    """This process no longer writes the source (fenced, or its ZooKeeper session ended)."""


class ListConflict(StorageError):
    """A source's ledger list changed since it was read (compare-and-set failed)."""
