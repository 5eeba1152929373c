"""Where a read-only copy of a source catches up from: the storage nodes or the owner (pure).

A subscribing forwarder keeps a copy of every source of a topic another forwarder owns
(data/subscribe/remote_sources.py). A copy that is far behind (new, or back after an outage)
would make the owner read and send its whole retained log. What the source's CLOSED ledgers
hold is fixed and durable on their nodes, so that part is read from the nodes instead; only
the rest (the open ledger's entries and live commits) comes over the owner's ``Tail``.

``plan_catch_up`` decides it from the copy's bounds and the source's ledger list:

* nothing from the nodes when the closed ledgers end at or before the copy's end, or when
  the gap is under ``min_messages`` (the owner's cache serves a small gap more cheaply than a
  metadata read and a node round trip);
* a copy never written, or one that ends before the first retained ledger (the owner trimmed
  past it), starts anew at the first ledger's first offset;
* otherwise the copy goes on from its end. The reads run ledger by ledger, each up to its
  closed end, and the owner's ``Tail`` starts where they stop (``end``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pubsubd.storage.ledgers.meta import LedgerList, LedgerMeta, LedgerState


@dataclass(frozen=True, slots=True)
class LedgerRead:
    """Entries ``[start, end)`` of one closed ledger, to be read from its nodes."""

    ledger: LedgerMeta
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Read ``reads`` in order from the nodes into the copy (first started anew at
    ``restart_at`` when it is set), then tail the owner from ``end``."""

    reads: tuple[LedgerRead, ...]
    end: int
    restart_at: int | None = None

    @property
    def messages(self) -> int:
        return sum(r.end - r.start for r in self.reads)


def closed_end(ledgers: LedgerList) -> int | None:
    """The end of the source's closed ledgers (None when none is closed)."""
    end = None
    for ledger in ledgers.ledgers:
        if ledger.state is not LedgerState.CLOSED or ledger.end_offset is None:
            break
        end = ledger.end_offset
    return end


def plan_catch_up(
    copy_end: int, copy_written: bool, ledgers: LedgerList, min_messages: int = 1
) -> CatchUp | None:
    """What to read from the nodes for a copy ending at ``copy_end`` (``copy_written``:
    whether it holds anything, or was ever started at an offset); None: tail the owner from
    the copy's end."""
    end = closed_end(ledgers)
    if end is None or not ledgers.ledgers:
        return None
    first = ledgers.ledgers[0].first_offset
    restart_at = None
    start = copy_end
    if not copy_written or copy_end < first:
        restart_at = start = first
    if end - start < max(1, min_messages):
        return None
    reads = []
    for ledger in ledgers.ledgers:
        if ledger.state is not LedgerState.CLOSED or ledger.end_offset is None:
            break
        if ledger.end_offset <= start or ledger.end_offset == ledger.first_offset:
            continue
        reads.append(LedgerRead(ledger, max(start, ledger.first_offset), ledger.end_offset))
    return CatchUp(tuple(reads), end, restart_at)
