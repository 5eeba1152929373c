"""Plain values <-> the ``pubsubd.internal.v1.Sources`` messages (proto/pubsubd/internal/v1/
sources.proto), shared by the publishing forwarder's servicer and the subscribing forwarder's
client, so both sides agree on one encoding of an ack state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pubsubd._gen.pubsubd.internal.v1 import sources_pb2 as s
from pubsubd.core.records import CursorState

# 1: Tail, Attach, Detach, RecordAcks, FlushAcks, ResetCursors, CursorStates, SetPublishBlock.
PROTOCOL_VERSION = 1
SERVICE = "pubsubd.internal.v1.Sources"


def _flat(ranges: Iterable[tuple[int, int]]) -> list[int]:
    return [bound for pair in ranges for bound in pair]


def _pairs(flat: Any) -> tuple[tuple[int, int], ...]:
    values = list(flat)
    if len(values) % 2:
        raise ValueError("ranges: an odd number of bounds")
    pairs = tuple((values[i], values[i + 1]) for i in range(0, len(values), 2))
    if any(start >= end for start, end in pairs):
        raise ValueError("ranges: an empty or inverted range")
    return pairs


def cursors_to_wire(states: Mapping[int, CursorState]) -> list[Any]:
    return [
        s.CursorState(source=source, mark_delete=state.mark_delete, ranges=_flat(state.ranges))
        for source, state in sorted(states.items())
    ]


def cursors_from_wire(cursors: Iterable[Any]) -> dict[int, CursorState]:
    """Raises ValueError for malformed ranges."""
    return {c.source: CursorState(c.mark_delete, _pairs(c.ranges)) for c in cursors}


def acks_to_wire(acks: Mapping[int, list[tuple[int, int]]]) -> list[Any]:
    return [s.CursorState(source=source, ranges=_flat(r)) for source, r in sorted(acks.items())]


def acks_from_wire(acks: Iterable[Any]) -> dict[int, list[tuple[int, int]]]:
    """Raises ValueError for malformed ranges."""
    found: dict[int, list[tuple[int, int]]] = {}
    for a in acks:
        found.setdefault(a.source, []).extend(_pairs(a.ranges))
    return found
