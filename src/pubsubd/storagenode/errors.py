"""What a storage node refuses, as domain errors carrying their numbers (pure). ``service.py``
maps each to its gRPC status and trailing metadata in one place; ``storage/node_client.py``
turns them back into typed errors on the caller's side.
"""

from __future__ import annotations

from pubsubd.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)


class BadFrames(InvalidArgument):
    """A frame fails its CRC or framing, or the offsets are not consecutive."""

    def __init__(self, ledger_id: int, problem: str) -> None:
        super().__init__(f"ledger {ledger_id}: {problem}")
        self.ledger_id = ledger_id
        self.problem = problem


class FencedAppend(FailedPrecondition):
    def __init__(self, ledger_id: int, epoch: int, fenced_epoch: int) -> None:
        super().__init__(
            f"fenced: ledger {ledger_id} is fenced at epoch {fenced_epoch}; an append from epoch"
            f" {epoch} is refused"
        )
        self.ledger_id = ledger_id
        self.epoch = epoch
        self.fenced_epoch = fenced_epoch


class AppendGap(FailedPrecondition):
    def __init__(self, ledger_id: int, offset: int, node_end: int) -> None:
        super().__init__(
            f"gap: ledger {ledger_id} ends at offset {node_end} on this node; an append from"
            f" offset {offset} would leave a gap (node end offset {node_end})"
        )
        self.ledger_id = ledger_id
        self.offset = offset
        self.node_end = node_end


class OverlapMismatch(FailedPrecondition):
    def __init__(self, ledger_id: int, why: str, node_end: int) -> None:
        super().__init__(f"mismatch: ledger {ledger_id}: {why} (node end offset {node_end})")
        self.ledger_id = ledger_id
        self.node_end = node_end


class UnsupportedVersion(FailedPrecondition):
    def __init__(self, version: int, min_version: int, max_version: int) -> None:
        super().__init__(
            f"unsupported protocol_version {version}: this storage node serves versions"
            f" {min_version} to {max_version}"
        )
        self.version = version
        self.min_version = min_version
        self.max_version = max_version


class UnknownLedger(NotFound):
    def __init__(self, ledger_id: int) -> None:
        super().__init__("ledger", str(ledger_id))
        self.ledger_id = ledger_id


class BadRead(InvalidArgument):
    """A read that does not start at an entry's base offset."""


class DisksFull(ResourceExhausted):
    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"disk full: {what}: {detail}")


class TooFewDisks(Unavailable):
    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"too few healthy disks: {what}: {detail}")


class NodeStopping(Unavailable):
    def __init__(self) -> None:
        super().__init__("the storage node is stopping")
