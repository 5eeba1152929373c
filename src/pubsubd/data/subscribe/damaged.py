"""Rules for damaged stored messages as one subscription meets them (pure; the topic's policy
is ``core/damage_policy.py``, the ranges come from ``storage/damage.py``)."""

from __future__ import annotations

from pubsubd.acks.cursor import Cursor
from pubsubd.core import ids
from pubsubd.core.errors import DataLoss
from pubsubd.core.records import DamagedRange


def unacked_positions(cursor: Cursor, source: int, damaged: DamagedRange) -> list[int]:
    """Positions of ``source`` in ``damaged`` the cursor has not acked."""
    out: list[int] = []
    offset = cursor.next_unacked(damaged.first_offset)
    while offset < damaged.end_offset:
        out.append(ids.position(source, offset))
        offset = cursor.next_unacked(offset + 1)
    return out


def all_acked(cursor: Cursor, damaged: DamagedRange) -> bool:
    """Whether every message of ``damaged`` is acked already (delivery may go past it)."""
    return cursor.next_unacked(damaged.first_offset) >= damaged.end_offset


def unacked_count(cursor: Cursor, damaged: DamagedRange) -> int:
    return cursor.unacked_count(damaged.end_offset) - cursor.unacked_count(damaged.first_offset)


def stopped(subscription: str, topic: str, source: int, damaged: DamagedRange) -> DataLoss:
    """What a consumer of a subscription stopped at damaged messages is told."""
    return DataLoss(
        f"subscription {subscription} is stopped at damaged messages: {damaged.messages} "
        f"messages at {damaged.describe()}, publish message source {source} of topic "
        f"{topic}. Restore the file's bytes (delivery resumes by itself), or skip them: "
        f"`pubsubd topics skip-damaged {topic}` once, or the topic label "
        f"pubsubd-damaged-entries=skip"
    )
