"""One bound on the entries every log of the process keeps in memory (pure).

Each log caches recent entries for fan-out to many subscriptions, up to 32 MiB of payload per
log (``storage/log.py``). Many busy topics would add up without limit, so every cache also
charges a process-wide budget (``PUBSUBD_LOG_CACHE_BYTES``, 256 MiB by default): one
least-recently-used order across all logs' cached entries, and past the bound the oldest entry
of any log is dropped. A dropped entry is read from its segment file again when needed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

DEFAULT_PROCESS_CACHE_BYTES = 256 << 20


class Evictable(Protocol):
    def evicted(self, base_offset: int) -> None:
        """The budget dropped the cached entry at ``base_offset``."""
        ...


class CacheBudget:
    """Payload bytes cached by every log, in one LRU order."""

    __slots__ = ("_lru", "bytes", "evictions", "max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_PROCESS_CACHE_BYTES) -> None:
        self.set_max_bytes(max_bytes)
        self._lru: OrderedDict[tuple[Evictable, int], int] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def set_max_bytes(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"the log cache bound must not be negative, got {max_bytes}")
        self.max_bytes = max_bytes

    def charge(self, cache: Evictable, base_offset: int, size: int) -> None:
        """``cache`` keeps an entry of ``size`` bytes; the oldest entries of any cache go
        while the total is over the bound (possibly this one)."""
        self._lru[(cache, base_offset)] = size
        self.bytes += size
        lru = self._lru
        while self.bytes > self.max_bytes and lru:
            (owner, base), dropped = lru.popitem(last=False)
            self.bytes -= dropped
            self.evictions += 1
            owner.evicted(base)

    def touch(self, cache: Evictable, base_offset: int) -> None:
        """The entry was read: it is the most recently used."""
        key = (cache, base_offset)
        if key in self._lru:
            self._lru.move_to_end(key)

    def forget(self, cache: Evictable, base_offset: int) -> None:
        """``cache`` dropped the entry itself (its own bound, a trim, a close)."""
        size = self._lru.pop((cache, base_offset), None)
        if size is not None:
            self.bytes -= size

    def status(self) -> dict[str, int]:
        return {
            "max_bytes": self.max_bytes,
            "bytes": self.bytes,
            "entries": len(self._lru),
            "evictions": self.evictions,
        }


# The process's budget: set from the configuration at start-up (app.py).
PROCESS = CacheBudget()
