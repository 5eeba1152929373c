"""What a new owner does with the last ledger of a source it takes over (pure).

SCALE_OUT.md §2, step 3: the ledger is fenced on its nodes; with answers from at least
``write_quorum - ack_quorum + 1`` of them, every entry ever acknowledged (held by ``ack_quorum``
nodes) is on at least one answering node. Each node holds a contiguous prefix of the ledger, so
the recovered end is the largest end among the answers. The entries up to it are copied from a
node that holds them to every answering node that lacks them (so at least ``ack_quorum`` hold
them) before the ledger is closed at that end.
"""

from __future__ import annotations

from dataclasses import dataclass


class NotEnoughReplies(Exception):
    """Too few of a ledger's nodes answered the fence to know its last entry."""


@dataclass(frozen=True, slots=True)
class FenceReply:
    node: str
    end_offset: int  # one past the node's last entry (the ledger's start if it has none)


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    end_offset: int  # close the ledger here
    source: str  # a node holding every entry up to end_offset
    copies: tuple[tuple[str, int], ...]  # (node, from offset): copy [from, end) to it


def plan_recovery(
    first_offset: int, replies: list[FenceReply], write_quorum: int, ack_quorum: int
) -> RecoveryPlan:
    needed = write_quorum - ack_quorum + 1
    if len(replies) < needed:
        raise NotEnoughReplies(
            f"{len(replies)} of {write_quorum} nodes answered the fence; {needed} are needed"
        )
    ends = {r.node: max(r.end_offset, first_offset) for r in replies}
    end = max(ends.values())
    source = min(node for node, e in ends.items() if e == end)  # deterministic
    copies = tuple(sorted((node, e) for node, e in ends.items() if e < end))
    return RecoveryPlan(end, source, copies)
