"""Reading closed ledgers for a process that does not own their source.

A subscribing forwarder fills its read-only copies of other forwarders' sources from the
storage nodes (storage/ledgers/catch_up.py decides what): the ledger list comes from the
metadata store (``LedgerDirectory.read``), the entries from any node holding a copy of the
ledger. Every answer is decoded and CRC-checked as ``materialize`` does; a node that is not
registered, fails, answers nothing at the offset or sends damaged frames is passed over for
the next one; when none answers, ``ReplicationFailed`` (the caller falls back to the owner).
Reads are bounded in bytes per second (a token bucket shared by every source of the
process), so a catch-up cannot take the nodes' disks from the writers. Nothing here writes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pubsubd.core.deadlines import within
from pubsubd.core.records import Entry
from pubsubd.storage.errors import ReplicationFailed
from pubsubd.storage.framing import decode_frames
from pubsubd.storage.ledgers.catch_up import LedgerRead
from pubsubd.storage.ledgers.meta import LedgerList
from pubsubd.storage.ledgers.repair import RateLimiter
from pubsubd.storage.ledgers.writer import (
    COPY_PAGE_BYTES,
    NODE_CALL_TIMEOUT_S,
    LedgerDirectory,
    StorageNodes,
)

DEFAULT_RATE_BYTES = 32 << 20  # bytes read per second at most, every source together


class LedgerReader:
    """Closed ledgers' entries from the storage nodes, for copies (see the module docstring)."""

    def __init__(
        self,
        directory: LedgerDirectory,
        nodes: StorageNodes,
        *,
        rate_bytes: int = DEFAULT_RATE_BYTES,
        page_bytes: int = COPY_PAGE_BYTES,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate_bytes <= 0:
            raise ValueError(f"the copy fill rate must be positive, not {rate_bytes!r}")
        self._directory = directory
        self._nodes = nodes
        self._limiter = RateLimiter(float(rate_bytes))
        self._page_bytes = page_bytes
        self._clock = clock
        self._sleep = sleep
        self.node_failures = 0  # reads a node failed (down, damaged, short), another tried

    async def ledger_list(self, topic_uid: str, source: int) -> LedgerList:
        return await self._directory.read(topic_uid, source)

    async def read(self, read: LedgerRead, start: int) -> tuple[list[Entry], int]:
        """Entries of ``read.ledger`` from ``start`` (an entry's base offset) on, below
        ``read.end``, at least one, from the first node that has them undamaged; and the
        bytes of frames they came in."""
        ledger = read.ledger
        errors = []
        # Start at a different node per ledger, so catch-ups spread over the copies.
        order = list(ledger.nodes)
        if order:
            shift = ledger.ledger_id % len(order)
            order = order[shift:] + order[:shift]
        for node_id in order:
            node = self._directory.node(node_id)
            if node is None:
                errors.append(f"{node_id}: not registered")
                continue
            try:
                frames, _ = await within(
                    self._nodes.read(node, ledger.ledger_id, start, read.end, self._page_bytes),
                    NODE_CALL_TIMEOUT_S,
                )
            except Exception as e:  # any failure of one node: the next one
                errors.append(f"{node_id}: {e}")
                self.node_failures += 1
                continue
            decoded, valid_end = decode_frames(frames)
            entries, nbytes = _contiguous(decoded, start, read.end)
            if valid_end != len(frames) or not entries:
                why = "damaged frames" if valid_end != len(frames) else f"no entry at {start}"
                errors.append(f"{node_id}: {why}")
                self.node_failures += 1
                continue
            delay = self._limiter.take(len(frames), self._clock())
            if delay > 0:
                await self._sleep(delay)
            return entries, nbytes
        raise ReplicationFailed(
            f"ledger {ledger.ledger_id} unreadable at {start}: " + "; ".join(errors)
        )


def _contiguous(
    decoded: list[tuple[Entry, int, int]], start: int, end: int
) -> tuple[list[Entry], int]:
    """The entries that follow on from ``start`` one after the other, below ``end``, and
    their frames' bytes."""
    out: list[Entry] = []
    nbytes = 0
    expected = start
    for entry, _, length in decoded:
        if entry.base_offset != expected or entry.base_offset >= end:
            break
        out.append(entry)
        nbytes += length
        expected = entry.next_offset
    return out, nbytes
