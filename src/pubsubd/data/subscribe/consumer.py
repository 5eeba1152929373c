"""A consumer of a subscription, as the delivery planner sees it: flow control, nothing else
(pure; the asyncio consumers are in ``consumers.py``, the pusher in ``push.py``).

A consumer is anything the dispatcher can hand messages to. It knows how many messages and bytes
it may still take (the client's max_outstanding_messages/bytes for a stream, max_messages for a
Pull) and how long the first lease of what it takes lasts.
"""

from __future__ import annotations

import abc
import itertools
from typing import Any

from pubsubd.core.failover_rank import FailoverRank

# Emulator-mode clients cannot receive gRPC messages over 4 MiB (docs/GOOGLE_API.md §8.1), so a
# response carries at most this much payload unless a single message is bigger.
MAX_RESPONSE_BYTES = 4_000_000
# Messages per response: large enough to amortise per-response cost, small enough to share.
MAX_RESPONSE_MESSAGES = 1000

_ids = itertools.count(1)


class Consumer(abc.ABC):
    # A client waits on this consumer and must be told why it ends (a stream, a Pull); a
    # pusher has nobody to tell and retries on its own.
    has_client = True
    # A StreamingPull stream (failover, exclusive and key_shared rank streams by client_id).
    is_stream = False
    # One Pull call: served first, removed once it got a response.
    is_pull = False
    client_id = ""  # a stream's, stable across the client's reconnects
    # The publish message sources whose messages this consumer takes; None: every source.
    sources: frozenset[int] | None = None
    # A stream that asked to be told when it becomes or stops being a failover subscription's
    # receiver (core/active_notices.py), and what it was last told (None: nothing yet).
    active_notices = False
    notified_active: bool | None = None
    # How a stream ranks on a failover subscription (core/failover_rank.py; None: by client_id).
    failover_rank: FailoverRank | None = None
    # Handed its deliveries unframed (an in-process stream, the Pulsar front's): the stored
    # messages, their positions, the first lease generation and the delivery attempts, with
    # no ReceivedMessage and no ack ID built (``planner.Delivery``).
    raw = False

    def __init__(self, ack_deadline_s: float, max_messages: int, max_bytes: int) -> None:
        self.id = next(_ids)
        self.ack_deadline_s = ack_deadline_s
        self.max_messages = max_messages  # 0 = unlimited
        self.max_bytes = max_bytes  # 0 = unlimited
        self.outstanding = 0
        self.outstanding_bytes = 0
        self.closed = False
        # Set when a lease of ours expired unconfirmed: the client is not reading this stream
        # (e.g. it reopened its stream and abandoned this one). Cleared by any sign of life.
        self.stalled = False

    def room(self) -> tuple[int, int]:
        """(messages, bytes) this consumer may take now; (0, 0) when it is full."""
        if self.closed or self.stalled:
            return 0, 0
        msgs = MAX_RESPONSE_MESSAGES
        if self.max_messages:
            msgs = min(msgs, self.max_messages - self.outstanding)
        size = MAX_RESPONSE_BYTES
        if self.max_bytes:
            left = self.max_bytes - self.outstanding_bytes
            # One message is always allowed when nothing is outstanding, however big.
            size = min(size, left) if self.outstanding else max(min(size, left), 1)
        if msgs <= 0 or size <= 0:
            return 0, 0
        return msgs, size

    def taken(self, count: int, size: int) -> None:
        self.outstanding += count
        self.outstanding_bytes += size

    def returned(self, size: int) -> None:
        self.outstanding -= 1
        self.outstanding_bytes -= size

    def returned_many(self, count: int, size: int) -> None:
        """``count`` leases of ``size`` bytes in all ended (``returned`` each)."""
        self.outstanding -= count
        self.outstanding_bytes -= size

    def notify_active(self, active: bool) -> None:
        """Tell the client it became (or stopped being) a receiver; only streams can."""
        return

    def deliver_raw(self, delivery: Any) -> None:
        """Take a ``planner.Delivery`` unframed; only a ``raw`` consumer is handed one."""
        raise TypeError(f"{type(self).__name__} takes framed deliveries, not raw ones")

    @abc.abstractmethod
    def deliver(self, messages: list[bytes], positions: list[int]) -> None:
        """Take framed ReceivedMessages (``core.wire.received_message``) and the positions
        leased with them (to give back what never reaches the client)."""
