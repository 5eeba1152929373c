"""Subscription dispatcher: hands a subscription's unacked messages to its consumers under leases.

One dispatcher per subscription, owned by the subscribing forwarder. It reads the topic's publish
message sources from the subscription's read offset on, skips what the cursor says is acked,
grants a lease per delivery (``leases.LeaseTable``) and gives each consumer at most what its flow
control allows, round-robin. Acks go to the cursor beside the log (through the publishing
forwarder); nacks and expired leases put the position back for redelivery.

Everything here runs on the event loop and never awaits: ``pump`` is synchronous (reads are
page-cache preads), so no two deliveries interleave and no lock is needed.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import defaultdict
from typing import Any

from pubsubd.acks.cursor import CursorState
from pubsubd.acks.journal import AckJournal
from pubsubd.core import ids, wire
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe.consumers import Consumer, PullWaiter
from pubsubd.data.subscribe.leases import LeaseTable
from pubsubd.storage.errors import OffsetOutOfRange

log = logging.getLogger(__name__)

# Entries read from a log per step while filling a response.
READ_ENTRIES = 64


class SubscriptionDispatcher:
    def __init__(
        self,
        subscription: Any,
        uid: str,
        topic_uid: str,
        forwarder: PublishingForwarder,
        journal: AckJournal,
    ) -> None:
        self.subscription = subscription  # google.pubsub.v1.Subscription (raw protobuf)
        self.uid = uid
        self.incarnation = uid[:8]
        self.topic_uid = topic_uid
        self.forwarder = forwarder
        self.sources = forwarder.open_topic(topic_uid)
        self.journal = journal
        self.leases = LeaseTable()
        self.consumers: dict[int, Consumer] = {}
        self._order: list[int] = []  # consumer ids in round-robin order
        self._rr = 0
        self._redeliver: list[int] = []  # heap of positions to deliver again
        self._redeliver_set: set[int] = set()
        self.read_offsets = {s: c.mark_delete for s, c in journal.cursors.items()}
        self._pump_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._expiry_handle: asyncio.TimerHandle | None = None
        self._expiry_at: float | None = None
        self.delivered = 0
        self.acked = 0
        self._listener = self._on_commit
        forwarder.add_commit_listener(topic_uid, self._listener)

    # --- consumers ----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers[consumer.id] = consumer
        if isinstance(consumer, PullWaiter):
            self._order.insert(0, consumer.id)  # a waiting Pull is served first
        else:
            self._order.append(consumer.id)
        self.pump()

    def remove_consumer(self, consumer: Consumer) -> None:
        if self.consumers.pop(consumer.id, None) is not None:
            self._order.remove(consumer.id)

    @property
    def ack_deadline_s(self) -> int:
        return int(self.subscription.ack_deadline_seconds)

    # --- delivery -----------------------------------------------------------------------------

    def _on_commit(self, _committed: int) -> None:
        self.schedule_pump()

    def schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self.pump)

    def pump(self) -> None:
        """Deliver as much as the consumers can take, round-robin, one response at a time."""
        self._pump_scheduled = False
        if not self._order:
            self._arm_expiry()
            return
        idle = 0
        while idle < len(self._order):
            if self._rr >= len(self._order):
                self._rr = 0
            consumer = self.consumers[self._order[self._rr]]
            self._rr += 1
            max_msgs, max_bytes = consumer.room()
            if max_msgs <= 0:
                idle += 1
                continue
            batch = self._take(max_msgs, max_bytes)
            if not batch:
                break
            idle = 0
            self._deliver(consumer, batch)
            if isinstance(consumer, PullWaiter):
                self.remove_consumer(consumer)
        self._arm_expiry()

    def _deliver(self, consumer: Consumer, batch: list[tuple[int, bytes, int]]) -> None:
        now = time.monotonic()
        dead_letter = self.subscription.HasField("dead_letter_policy")
        received = []
        total = 0
        grant = self.leases.grant
        attempts = self.leases.attempts
        incarnation = self.incarnation
        deadline = consumer.ack_deadline_s
        for pos, message, size in batch:
            lease = grant(pos, now, deadline, consumer.id, size)
            ack_id = ids.encode_ack_id(incarnation, pos, lease.generation).encode()
            received.append(
                wire.received_message(ack_id, message, attempts(pos) if dead_letter else 0)
            )
            total += size
        consumer.taken(len(batch), total)
        self.delivered += len(batch)
        consumer.deliver(received)

    def _take(self, max_msgs: int, max_bytes: int) -> list[tuple[int, bytes, int]]:
        """Up to max_msgs messages (at least one if any, then up to max_bytes) to deliver next."""
        out: list[tuple[int, bytes, int]] = []
        size = 0
        # Redeliveries first, oldest position first.
        while self._redeliver and len(out) < max_msgs:
            pos = heapq.heappop(self._redeliver)
            self._redeliver_set.discard(pos)
            if pos in self.leases:
                continue
            source, offset = ids.source_of(pos), ids.offset_of(pos)
            cursor = self.journal.cursors[source]
            if cursor.is_acked(offset):
                continue
            message = self._message_at(source, offset)
            if message is None:
                continue
            msize = len(message)
            if out and size + msize > max_bytes:
                heapq.heappush(self._redeliver, pos)
                self._redeliver_set.add(pos)
                return out
            out.append((pos, message, msize))
            size += msize
        # Then new messages from each source's read offset.
        for source, log_ in enumerate(self.sources.logs):
            cursor = self.journal.cursors[source]
            offset = self.read_offsets.get(source, cursor.mark_delete)
            while len(out) < max_msgs and offset < log_.committed_offset:
                try:
                    entries = log_.read(offset, max_entries=READ_ENTRIES)
                except OffsetOutOfRange:
                    offset = max(offset, log_.start_offset)
                    continue
                if not entries:
                    break
                full = False
                for entry in entries:
                    messages = self.sources.decoded(source, entry).messages
                    start = max(offset, entry.base_offset)
                    for off in range(start, entry.base_offset + entry.count):
                        offset = off + 1
                        if cursor.is_acked(off):
                            continue
                        pos = ids.position(source, off)
                        if pos in self.leases:
                            continue
                        message = messages[off - entry.base_offset]
                        msize = len(message)
                        if out and size + msize > max_bytes:
                            offset = off
                            full = True
                            break
                        out.append((pos, message, msize))
                        size += msize
                        if len(out) >= max_msgs:
                            full = True
                            break
                    if full:
                        break
                if full:
                    break
            self.read_offsets[source] = offset
            if len(out) >= max_msgs or (out and size >= max_bytes):
                break
        return out

    def _message_at(self, source: int, offset: int) -> bytes | None:
        try:
            entry = self.sources.logs[source].entry_at(offset)
        except OffsetOutOfRange:
            return None
        return self.sources.decoded(source, entry).messages[offset - entry.base_offset]

    def _requeue(self, pos: int) -> None:
        if pos not in self._redeliver_set:
            self._redeliver_set.add(pos)
            heapq.heappush(self._redeliver, pos)

    def _release(self, pos: int) -> bool:
        lease = self.leases.release(pos)
        if lease is None:
            return False
        consumer = self.consumers.get(lease.consumer)
        if consumer is not None:
            consumer.returned(lease.size)
            consumer.stalled = False
        return True

    # --- acks and deadlines -------------------------------------------------------------------

    def decode(self, ack_id: str) -> tuple[int, int]:
        return ids.decode_ack_id(ack_id, self.incarnation)

    def acknowledge(self, positions: list[int]) -> None:
        by_source: dict[int, list[int]] = defaultdict(list)
        freed = False
        for pos in positions:
            freed |= self._release(pos)
            self.leases.forget(pos)
            by_source[ids.source_of(pos)].append(ids.offset_of(pos))
        for source, offsets in by_source.items():
            if source in self.journal.cursors:
                self.forwarder.record_acks(self.journal, source, offsets)
        self.acked += len(positions)
        if freed:
            self.schedule_pump()

    def modify_deadline(self, positions: list[tuple[int, int]], seconds: int) -> None:
        """Extend leases to now + seconds; 0 is a nack (redeliver now)."""
        if seconds == 0:
            nacked = False
            for pos, generation in positions:
                lease = self.leases.get(pos)
                if lease is not None and lease.generation == generation:
                    self._release(pos)
                    self._requeue(pos)
                    nacked = True
            if nacked:
                self.schedule_pump()
            return
        now = time.monotonic()
        revived = False
        for pos, generation in positions:
            lease = self.leases.get(pos)
            if lease is not None and lease.generation == generation:
                self.leases.extend(pos, now, seconds)
                consumer = self.consumers.get(lease.consumer)
                if consumer is not None and consumer.stalled:
                    consumer.stalled = False
                    revived = True
        self._arm_expiry()
        if revived:
            self.schedule_pump()

    def _arm_expiry(self) -> None:
        deadline = self.leases.next_deadline()
        if deadline is None:
            return
        if self._expiry_at is not None and self._expiry_at <= deadline:
            return
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
        self._expiry_at = deadline
        delay = max(0.0, deadline - time.monotonic())
        self._expiry_handle = self._loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self._expiry_handle = None
        self._expiry_at = None
        expired = self.leases.expired(time.monotonic())
        for pos, lease in expired:
            consumer = self.consumers.get(lease.consumer)
            if consumer is not None:
                consumer.returned(lease.size)
                if not lease.confirmed:
                    # Never acknowledged receipt: stop feeding this consumer until it shows
                    # life, so the redelivery goes to a consumer that reads.
                    consumer.stalled = True
            self._requeue(pos)
        if expired:
            self.pump()
        else:
            self._arm_expiry()

    def reset(self, states: dict[int, CursorState]) -> None:
        """Replace the ack state (Seek): forget leases and redeliveries, read from the new
        mark-delete positions. Outstanding ack IDs stop working: their leases are gone."""
        for source, state in states.items():
            self.journal.reset(source, state)
        for consumer in self.consumers.values():
            consumer.outstanding = 0
            consumer.outstanding_bytes = 0
            consumer.stalled = False
        self.leases.clear()
        self._redeliver.clear()
        self._redeliver_set.clear()
        self.read_offsets = {s: c.mark_delete for s, c in self.journal.cursors.items()}
        self.forwarder.mark_dirty(self.journal)
        self.schedule_pump()

    # --- state --------------------------------------------------------------------------------

    def backlog(self) -> int:
        """Messages not yet acked (delivered or not)."""
        total = 0
        for source, log_ in enumerate(self.sources.logs):
            cursor = self.journal.cursors.get(source)
            if cursor is not None:
                total += cursor.unacked_count(log_.end_offset)
        return total

    def close(self, error: BaseException) -> None:
        """Stop: end every stream with ``error``, answer waiting Pulls, forget leases."""
        self.forwarder.remove_commit_listener(self.topic_uid, self._listener)
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
        for consumer in list(self.consumers.values()):
            end = getattr(consumer, "end", None)
            if end is not None:
                end(error)
            elif isinstance(consumer, PullWaiter) and not consumer.future.done():
                consumer.future.set_exception(error)
        self.consumers.clear()
        self._order.clear()
        self.leases.clear()
