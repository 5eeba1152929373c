"""Pulsar message IDs <-> pubsubd positions (pure).

A pubsubd message ID is a position, ``source << 48 | offset`` (core/ids.py). Its Pulsar
MessageIdData is ``(ledgerId = source, entryId = offset, partition = -1)``, totally ordered per
publish message source as the client expects. A SEND of n messages is stored as one batch at
consecutive offsets, and its receipt is ``(source, first offset)``; the client numbers the
batch's messages with ``batch_index`` 0..n-1, so ``(source, offset, i)`` is position
``offset + i``. Pulsar's sentinels: earliest is ``(-1, -1)`` (on the wire uint64 all ones),
latest ``(2**63 - 1, 2**63 - 1)``.
"""

from __future__ import annotations

from typing import Any

from pubsubd.core import ids
from pubsubd.pulsar.api import MessageIdData

EARLIEST = (1 << 64) - 1  # -1 as the uint64 the client sends
LATEST = (1 << 63) - 1


def from_message_id(message_id: str) -> tuple[int, int]:
    """(ledgerId, entryId) of a pubsubd message ID string."""
    pos = int(message_id)
    return ids.source_of(pos), ids.offset_of(pos)


def message_id_data(ledger: int, entry: int, batch_index: int = -1) -> Any:
    mid = MessageIdData(ledgerId=ledger, entryId=entry)
    if batch_index >= 0:
        mid.batch_index = batch_index
    return mid


def position_of(mid: Any) -> int | None:
    """The position a MessageIdData names; None for the earliest/latest sentinels."""
    if mid.ledgerId in (EARLIEST, LATEST) or mid.entryId in (EARLIEST, LATEST):
        return None
    offset = mid.entryId + max(mid.batch_index, 0)
    if mid.ledgerId >= 1 << 16 or offset > ids.OFFSET_MASK:
        return None
    return ids.position(mid.ledgerId, offset)


def key(mid: Any) -> tuple[int, int]:
    """The (ledger, entry) a consumer acks by (delivered messages are never batched)."""
    return mid.ledgerId, mid.entryId + max(mid.batch_index, 0)
