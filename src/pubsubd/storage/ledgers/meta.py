"""Ledger metadata and a source's ledger list (pure).

Stored as JSON in the source's znode (``coordination.paths.Layout.source``) and changed only by
compare-and-set on the znode's version. A ledger is OPEN while its writer appends, IN_RECOVERY
while a new owner fences and recovers it, CLOSED once its last entry is fixed (``end_offset``).
Only CLOSED ledgers are ever deleted, and only when every entry is below the trim point.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclass(frozen=True, slots=True)
class LedgerMeta:
    """One ledger: entries ``[first_offset, end_offset)`` once closed."""

    ledger_id: int
    first_offset: int
    nodes: tuple[str, ...]  # storage node IDs holding it (write quorum = len(nodes))
    ack_quorum: int
    state: LedgerState = LedgerState.OPEN
    end_offset: int | None = None  # set when CLOSED
    epoch: int = 0  # the epoch of the writer that created it

    @property
    def write_quorum(self) -> int:
        return len(self.nodes)

    def closed(self, end_offset: int) -> LedgerMeta:
        if end_offset < self.first_offset:
            raise ValueError(f"ledger {self.ledger_id} cannot end at {end_offset} before its start")
        return replace(self, state=LedgerState.CLOSED, end_offset=end_offset)

    def recovering(self) -> LedgerMeta:
        return replace(self, state=LedgerState.IN_RECOVERY)

    def with_nodes(self, nodes: tuple[str, ...]) -> LedgerMeta:
        """The same ledger on another node list (repair replaced a node)."""
        return replace(self, nodes=nodes)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.ledger_id,
            "first": self.first_offset,
            "end": self.end_offset,
            "nodes": list(self.nodes),
            "qa": self.ack_quorum,
            "state": self.state.value,
            "epoch": self.epoch,
        }

    @staticmethod
    def from_json(data: dict[str, object]) -> LedgerMeta:
        end = data.get("end")
        return LedgerMeta(
            ledger_id=int(str(data["id"])),
            first_offset=int(str(data["first"])),
            nodes=tuple(str(n) for n in data["nodes"]),  # type: ignore[attr-defined]
            ack_quorum=int(str(data["qa"])),
            state=LedgerState(str(data["state"])),
            end_offset=None if end is None else int(str(end)),
            epoch=int(str(data.get("epoch", 0))),
        )


@dataclass(frozen=True, slots=True)
class LedgerList:
    """A source's ledgers, oldest first, with the znode version they were read at.

    Invariants: ledgers are contiguous (each starts where the previous one ended), only the
    last may be OPEN or IN_RECOVERY. ``start_offset`` is where the retained log starts (the
    first ledger's start, or the trim point once every ledger below it is gone)."""

    ledgers: tuple[LedgerMeta, ...] = ()
    version: int = -1  # znode version; -1 = the znode does not exist yet
    start_offset: int = 0

    @property
    def last(self) -> LedgerMeta | None:
        return self.ledgers[-1] if self.ledgers else None

    @property
    def end_offset(self) -> int | None:
        """End of the retained log when every ledger is closed, else None (recover first)."""
        last = self.last
        if last is None:
            return self.start_offset
        return last.end_offset if last.state is LedgerState.CLOSED else None

    def needs_recovery(self) -> bool:
        last = self.last
        return last is not None and last.state is not LedgerState.CLOSED

    def replaced_last(self, ledger: LedgerMeta) -> LedgerList:
        if not self.ledgers or self.ledgers[-1].ledger_id != ledger.ledger_id:
            raise ValueError(f"ledger {ledger.ledger_id} is not the last one")
        return replace(self, ledgers=(*self.ledgers[:-1], ledger))

    def replaced(self, ledger: LedgerMeta) -> LedgerList:
        """The list with ``ledger`` (same ID) put in place of the one it updates."""
        ids = [m.ledger_id for m in self.ledgers]
        if ledger.ledger_id not in ids:
            raise ValueError(f"ledger {ledger.ledger_id} is not in the list")
        i = ids.index(ledger.ledger_id)
        return replace(self, ledgers=(*self.ledgers[:i], ledger, *self.ledgers[i + 1 :]))

    def appended(self, ledger: LedgerMeta) -> LedgerList:
        end = self.end_offset
        if end is None:
            raise ValueError("a new ledger needs every earlier one closed")
        if ledger.first_offset != end:
            raise ValueError(
                f"ledger {ledger.ledger_id} starts at {ledger.first_offset}, not at {end}"
            )
        return replace(self, ledgers=(*self.ledgers, ledger))

    def trimmed(self, before_offset: int) -> tuple[LedgerList, tuple[LedgerMeta, ...]]:
        """Drop the CLOSED ledgers whose entries all precede ``before_offset``; the list
        and the dropped ledgers (to delete from their nodes after the list is written)."""
        keep = list(self.ledgers)
        dropped: list[LedgerMeta] = []
        while (
            keep
            and keep[0].state is LedgerState.CLOSED
            and keep[0].end_offset is not None
            and keep[0].end_offset <= before_offset
        ):
            dropped.append(keep.pop(0))
        if not dropped:
            return self, ()
        start = dropped[-1].end_offset
        assert start is not None
        return replace(self, ledgers=tuple(keep), start_offset=start), tuple(dropped)

    def ledger_at(self, offset: int) -> LedgerMeta | None:
        """The ledger holding ``offset`` (an OPEN last ledger holds everything from its
        start)."""
        for ledger in self.ledgers:
            if offset < ledger.first_offset:
                return None
            if ledger.end_offset is None or offset < ledger.end_offset:
                return ledger
        return None

    def encode(self) -> bytes:
        return json.dumps(
            {"start": self.start_offset, "ledgers": [m.to_json() for m in self.ledgers]},
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def decode(data: bytes, version: int) -> LedgerList:
        if not data:
            return LedgerList(version=version)
        parsed = json.loads(data)
        return LedgerList(
            ledgers=tuple(LedgerMeta.from_json(m) for m in parsed.get("ledgers", [])),
            version=version,
            start_offset=int(parsed.get("start", 0)),
        )


def rebased(base: LedgerList, wanted: LedgerList, fresh: LedgerList) -> LedgerList | None:
    """``wanted`` (a change its writer made to ``base``) on top of ``fresh``, the list another
    process wrote meanwhile, if all that process changed is where CLOSED ledgers' copies are
    (the repair auditor); None for any other change (a new owner's takeover, a trim): the
    writer must not write over it."""
    base_by = {m.ledger_id: m for m in base.ledgers}
    fresh_by = {m.ledger_id: m for m in fresh.ledgers}
    if base_by.keys() != fresh_by.keys() or base.start_offset != fresh.start_offset:
        return None
    for ledger_id, before in base_by.items():
        now = fresh_by[ledger_id]
        if now != before and not (
            before.state is LedgerState.CLOSED and now == before.with_nodes(now.nodes)
        ):
            return None
    merged = tuple(
        fresh_by[m.ledger_id] if base_by.get(m.ledger_id) == m else m for m in wanted.ledgers
    )
    return replace(wanted, ledgers=merged, version=fresh.version)


@dataclass(frozen=True, slots=True)
class StoragePolicy:
    """Where a topic's ledgers go: how many copies, in which zones (empty: any)."""

    replicas: int = 3
    allowed_zones: frozenset[str] = field(default_factory=frozenset)

    @property
    def ack_quorum(self) -> int:
        return self.replicas // 2 + 1
