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
import contextlib
import hashlib
import heapq
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from pubsubd.acks.cursor import Cursor, CursorState
from pubsubd.acks.journal import AckJournal
from pubsubd.control import quotas
from pubsubd.core import filters, ids, wire
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.errors import DataLoss, FailedPrecondition, InternalError, PubsubError
from pubsubd.data.publish.delays import DelayTracker, DueListener
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe import queue_settings
from pubsubd.data.subscribe.consumers import Consumer, PullWaiter, StreamConsumer
from pubsubd.data.subscribe.dead_letter import dead_letter_request, should_dead_letter
from pubsubd.data.subscribe.leases import LeaseTable
from pubsubd.data.subscribe.ordering import KeyOrdering
from pubsubd.data.subscribe.queue_settings import SubscriptionType
from pubsubd.data.subscribe.retry import DelayQueue, backoff_s
from pubsubd.observability import background, events, metrics
from pubsubd.storage.damage import DamagedRange
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange
from pubsubd.storage.log import SourceLog

log = logging.getLogger(__name__)

# Entries read from a log per step while filling a response.
READ_ENTRIES = 64
# A message whose dead-letter topic is missing (or whose forwarding failed) waits this long
# before the next try.
DEAD_LETTER_RETRY_S = 10.0


class SubscriptionDispatcher:
    # One per subscription, so no per-instance __dict__ (BENCHMARKS.md, "Scale of names").
    __slots__ = (
        "_damaged_positions",
        "_dead_lettering",
        "_delayed",
        "_delayed_keys",
        "_filter",
        "_filter_text",
        "_listener",
        "_loop",
        "_next_source",
        "_order",
        "_outstanding_bytes",
        "_pump_scheduled",
        "_redeliver",
        "_redeliver_set",
        "_rr",
        "_stuck",
        "_tasks",
        "_timer",
        "_timer_at",
        "acked",
        "consumers",
        "dead_lettered",
        "delays",
        "delivered",
        "forwarder",
        "generation_floor",
        "incarnation",
        "journal",
        "last_activity",
        "leases",
        "lost",
        "ordering",
        "read_offsets",
        "resolve_topic",
        "settings",
        "sources",
        "subscription",
        "topic_uid",
        "uid",
    )

    def __init__(
        self,
        subscription: Any,
        uid: str,
        topic_uid: str,
        forwarder: PublishingForwarder,
        journal: AckJournal,
        resolve_topic: Callable[[str], str | None] = lambda _name: None,
    ) -> None:
        self.subscription = subscription  # google.pubsub.v1.Subscription (raw protobuf)
        self.uid = uid
        self.incarnation = uid[:8]
        self.topic_uid = topic_uid
        self.forwarder = forwarder
        self.sources = forwarder.open_topic(topic_uid)
        self.journal = journal
        self.resolve_topic = resolve_topic  # topic name -> storage uid (dead-letter topics)
        self.leases = LeaseTable()
        # Ack IDs with a lease generation below this predate the last Seek and ack nothing.
        self.generation_floor = 0
        self.ordering = KeyOrdering()
        self.consumers: dict[int, Consumer] = {}
        self._order: list[int] = []  # consumer ids in round-robin order
        self._rr = 0
        self._next_source = 0  # the source _take reads new messages from first
        self._redeliver: list[int] = []  # heap of positions to deliver again
        self._redeliver_set: set[int] | None = None  # created on first requeue
        self._delayed = DelayQueue()  # positions waiting out a retry backoff
        # Delayed messages (deliver_at): skipped while not due, handed back by the topic's
        # tracker (which exists only once the topic has delayed messages).
        self.delays: DelayTracker | None = None
        if topic_uid in forwarder.delays:
            self._delay_tracker()
        self._delayed_keys = DelayQueue()  # keyed positions whose key waits out a backoff
        # Created by the first dead letter (most subscriptions never have one).
        self._dead_lettering: set[int] | None = None
        self._tasks: set[asyncio.Task[None]] | None = None
        self.read_offsets = {s: c.mark_delete for s, c in journal.cursors.items()}
        self._pump_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._filter_text = ""
        self.settings = queue_settings.parse(subscription.labels)
        self._outstanding_bytes = 0
        self._filter: filters.Filter | None = None
        self.delivered = 0
        self.acked = 0
        self.dead_lettered = 0
        # Damaged stored messages (core/damage_policy.py): the damage this pump's reads
        # stopped at (stop policy), positions whose redelivery found them damaged, and how
        # many damaged messages were skipped (acked as lost).
        self._stuck: tuple[int, DamagedRange] | None = None
        self._damaged_positions: set[int] | None = None
        self.lost = 0
        self.last_activity = time.time()
        self._listener = self._on_commit
        forwarder.add_commit_listener(topic_uid, self._listener)

    @property
    def name(self) -> str:
        return str(self.subscription.name)

    def refresh_settings(self) -> None:
        """The subscription was updated: re-read its queue settings (labels)."""
        self.settings = queue_settings.parse(self.subscription.labels)
        self.schedule_pump()

    # --- consumers ----------------------------------------------------------------------------

    def admit(self, client_id: str) -> None:
        """Refuse a second StreamingPull client of an exclusive subscription. An admitted one
        holds the subscription: waiting Pulls end with FAILED_PRECONDITION (``admit_pull``)."""
        if self.settings.type is not SubscriptionType.EXCLUSIVE:
            return
        for c in self.consumers.values():
            if isinstance(c, StreamConsumer) and c.client_id != client_id and not c.closed:
                raise FailedPrecondition(
                    f"subscription {self.name} is exclusive and already has a consumer "
                    f"(client_id {c.client_id})"
                )
        for c in [c for c in self.consumers.values() if isinstance(c, PullWaiter)]:
            self.remove_consumer(c)
            c.closed = True
            if not c.future.done():
                c.future.set_exception(self._held_by_stream(client_id))

    def admit_pull(self) -> None:
        """A Pull has no client_id, so it never matches a stream: on an exclusive subscription
        it is refused while any StreamingPull client holds it. (Failover: a Pull is admitted
        and ranks after every stream, so it receives only while no stream is open.)"""
        if self.settings.type is not SubscriptionType.EXCLUSIVE:
            return
        streams = self._streams()
        if streams:
            raise self._held_by_stream(streams[0].client_id)

    def _held_by_stream(self, client_id: str) -> FailedPrecondition:
        return FailedPrecondition(
            f"subscription {self.name} is exclusive and held by a StreamingPull consumer "
            f"(client_id {client_id}); Pull is refused while it is connected"
        )

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers[consumer.id] = consumer
        if isinstance(consumer, PullWaiter):
            self._order.insert(0, consumer.id)  # a waiting Pull is served first
        else:
            self._order.append(consumer.id)
        self.last_activity = time.time()
        self.pump()

    def remove_consumer(self, consumer: Consumer) -> None:
        if self.consumers.pop(consumer.id, None) is not None:
            self._order.remove(consumer.id)
            if isinstance(consumer, StreamConsumer):
                # Failover/key_shared: the next consumer (a stream or a waiting Pull) takes over
                # now, not at the next publish or timer.
                self.schedule_pump()

    @property
    def ack_deadline_s(self) -> int:
        return int(self.subscription.ack_deadline_seconds)

    # --- delivery -----------------------------------------------------------------------------

    def _on_commit(self, _committed: int) -> None:
        self.schedule_pump()

    def schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._background, "pump", self.pump)

    def pump(self) -> None:
        """Deliver as much as the consumers can take, round-robin, one response at a time."""
        self._pump_scheduled = False
        self._stuck = None
        if self._damaged_positions:
            self._requeue_restored()
        settings = self.settings
        active = self._active_consumer()
        key_owner = self._key_owner if settings.type is SubscriptionType.KEY_SHARED else None
        idle = 0
        while idle < len(self._order):
            if self._rr >= len(self._order):
                self._rr = 0
            consumer = self.consumers[self._order[self._rr]]
            self._rr += 1
            max_msgs, max_bytes = self._room(consumer, settings)
            if max_msgs <= 0 or (active is not None and consumer is not active):
                idle += 1
                continue
            batch = self._take(max_msgs, max_bytes, consumer, key_owner)
            if not batch:
                if self._stuck is not None and not consumer.outstanding:
                    # Stopped at damaged messages with nothing else for this consumer: tell it
                    # (DATA_LOSS) instead of leaving it waiting without a word.
                    self._fail_consumer(consumer, self._stuck_error(*self._stuck))
                    continue
                idle += 1
                continue
            idle = 0
            self._deliver(consumer, batch)
            if isinstance(consumer, PullWaiter):
                self.remove_consumer(consumer)
        self._arm_timer()

    def _room(self, consumer: Consumer, settings: queue_settings.QueueSettings) -> tuple[int, int]:
        """What ``consumer`` may take now: its flow control within the subscription's caps."""
        max_msgs, max_bytes = consumer.room()
        if settings.consumer_max_outstanding_messages:
            max_msgs = min(
                max_msgs, settings.consumer_max_outstanding_messages - consumer.outstanding
            )
        if settings.max_outstanding_messages:
            max_msgs = min(max_msgs, settings.max_outstanding_messages - len(self.leases))
        # Byte caps: nothing once reached; below one, at least one message (it may cross it).
        if settings.consumer_max_outstanding_bytes:
            left = settings.consumer_max_outstanding_bytes - consumer.outstanding_bytes
            if left <= 0:
                return 0, 0
            max_bytes = min(max_bytes, left)
        if settings.max_outstanding_bytes:
            left = settings.max_outstanding_bytes - self._outstanding_bytes
            if left <= 0:
                return 0, 0
            max_bytes = min(max_bytes, left)
        return max_msgs, max_bytes

    def _streams(self) -> list[StreamConsumer]:
        return [
            c for c in self.consumers.values() if isinstance(c, StreamConsumer) and not c.closed
        ]

    def _active_consumer(self) -> Consumer | None:
        """Failover and exclusive: the one stream that receives (first by client_id);
        None means every consumer may receive."""
        if self.settings.type not in (SubscriptionType.FAILOVER, SubscriptionType.EXCLUSIVE):
            return None
        streams = self._streams()
        if not streams:
            return None
        return min(streams, key=lambda c: (c.client_id, c.id))

    def _key_owner(self, key: str) -> int | None:
        """Key_Shared: the consumer id owning ``key`` (rendezvous hash over client IDs)."""
        streams = self._streams()
        if not streams:
            return None
        best = max(streams, key=lambda c: (_weight(c.client_id, key), c.id))
        return best.id

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
        self._outstanding_bytes += total
        self.delivered += len(batch)
        consumer.deliver(received, [pos for pos, _, _ in batch])

    def _current_filter(self) -> filters.Filter | None:
        text = self.subscription.filter
        if text != self._filter_text:
            self._filter_text = text
            self._filter = filters.parse(text) if text else None
        return self._filter

    def _take(
        self,
        max_msgs: int,
        max_bytes: int,
        consumer: Consumer,
        key_owner: Callable[[str], int | None] | None = None,
    ) -> list[tuple[int, bytes, int]]:
        """Up to max_msgs messages (at least one if any, then up to max_bytes) to deliver next:
        free ordering keys' queues first, then redeliveries, then new messages from the log.
        With ``key_owner`` (Key_Shared) a key's messages go only to the consumer owning it."""
        out: list[tuple[int, bytes, int]] = []
        size = 0
        ordered = bool(self.subscription.enable_message_ordering) or key_owner is not None

        def mine(key: str) -> bool:
            if key_owner is None:
                return True
            owner = key_owner(key)
            return owner is None or owner == consumer.id

        batch_keys: set[str] = set()  # keys this response already carries (one batch per key)
        if ordered:
            for key, positions in self.ordering.take_ready(max_msgs, mine):
                for j, pos in enumerate(positions):
                    message = self._message_at(pos)
                    if message is None or self._is_dead_lettering(pos):
                        self.ordering.forget(pos)
                        continue
                    if out and size + len(message) > max_bytes:
                        self.ordering.give_back(key, positions[j:])
                        return out
                    out.append((pos, message, len(message)))
                    size += len(message)
                    self.ordering.delivered(key, pos)
                batch_keys.add(key)
        # Redeliveries, oldest position first.
        while self._redeliver and len(out) < max_msgs:
            pos = heapq.heappop(self._redeliver)
            if self._redeliver_set is not None:
                self._redeliver_set.discard(pos)
            if pos in self.leases or self._is_dead_lettering(pos):
                continue
            message = self._message_at(pos)
            if message is None:
                continue
            if out and size + len(message) > max_bytes:
                self._requeue(pos)
                return out
            out.append((pos, message, len(message)))
            size += len(message)
        # New messages from each source's read offset.
        flt = self._current_filter()
        auto_acked: list[int] = []
        lost: list[int] = []
        for source, log_ in self._sources_in_turn():
            cursor = self.journal.cursors[source]
            offset = self.read_offsets.get(source, cursor.mark_delete)
            full = False
            while not full and len(out) < max_msgs and offset < log_.committed_offset:
                try:
                    entries = log_.read(offset, max_entries=READ_ENTRIES)
                except OffsetOutOfRange:
                    offset = max(offset, log_.start_offset)
                    continue
                except DamagedEntries as e:
                    if not self._past_damage(source, e.damaged, lost):
                        self._stuck = (source, e.damaged)
                        break
                    offset = max(offset, e.damaged.end_offset)
                    continue
                if not entries:
                    break
                for entry in entries:
                    decoded = self.sources.decoded(source, entry)
                    messages = decoded.messages
                    delays = decoded.deliver_at
                    key = decoded.ordering_key if ordered else ""
                    start = max(offset, entry.base_offset)
                    for off in range(start, entry.base_offset + entry.count):
                        offset = off + 1
                        if cursor.is_acked(off):
                            continue
                        pos = ids.position(source, off)
                        if pos in self.leases:
                            continue
                        i = off - entry.base_offset
                        if flt is not None and not flt.matches(decoded.parsed[i].attributes):
                            auto_acked.append(pos)  # never delivered, never backlog
                            continue
                        message = messages[i]
                        if delays is not None:
                            at = delays[i]
                            if at is not None and not self._delay_tracker().is_due(at, pos):
                                continue  # not due: the delay tracker hands it back then
                        if key and (
                            self.ordering.has_pending(key)
                            or (self.ordering.outstanding(key) and key not in batch_keys)
                            or not mine(key)
                        ):
                            self.ordering.hold(key, pos)
                            continue
                        if out and size + len(message) > max_bytes:
                            offset = off
                            full = True
                            break
                        out.append((pos, message, len(message)))
                        size += len(message)
                        if key:
                            self.ordering.delivered(key, pos)
                            batch_keys.add(key)
                        if len(out) >= max_msgs:
                            full = True
                            break
                    if full:
                        break
            self.read_offsets[source] = offset
            if full:
                break
        if auto_acked:
            self._ack_positions(auto_acked)
        if lost:
            self._ack_lost(lost)
        return out

    def _sources_in_turn(self) -> list[tuple[int, Any]]:
        """(source, log) to read new messages from, starting one further each call, so a busy
        source cannot starve the others (each source's order is unaffected)."""
        logs = self.sources.logs
        if len(logs) == 1:
            return [(0, logs[0])]
        first = self._next_source % len(logs)
        self._next_source = first + 1
        order = list(range(first, len(logs))) + list(range(first))
        return [(s, logs[s]) for s in order]

    def _locate(self, pos: int) -> tuple[Any, int] | None:
        source, offset = ids.source_of(pos), ids.offset_of(pos)
        if source >= len(self.sources.logs):
            return None
        try:
            entry = self.sources.logs[source].entry_at(offset)
        except OffsetOutOfRange:
            return None
        except DamagedEntries as e:
            # A redelivery (or dead letter) of a message found damaged since its delivery.
            lost: list[int] = []
            if self._past_damage(source, e.damaged, lost):
                if lost:
                    self._ack_lost(lost)
            else:
                if self._damaged_positions is None:
                    self._damaged_positions = set()
                self._damaged_positions.add(pos)  # requeued if the bytes are restored
            return None
        return self.sources.decoded(source, entry), offset - entry.base_offset

    def _message_at(self, pos: int) -> bytes | None:
        cursor = self.journal.cursors.get(ids.source_of(pos))
        if cursor is None or cursor.is_acked(ids.offset_of(pos)):
            return None
        found = self._locate(pos)
        if found is None:
            return None
        decoded, i = found
        message: bytes = decoded.messages[i]
        return message

    # --- damaged messages (core/damage_policy.py) ----------------------------------------------

    def _past_damage(self, source: int, damaged: DamagedRange, lost: list[int]) -> bool:
        """Whether delivery may go on past ``damaged`` in ``source``: every message in it is
        acked already, or the topic's policy skips them (their positions go to ``lost``)."""
        cursor = self.journal.cursors[source]
        offset = cursor.next_unacked(damaged.first_offset)
        if offset >= damaged.end_offset:
            return True
        if self.sources.damage_policy is not DamagePolicy.SKIP:
            return False
        while offset < damaged.end_offset:
            lost.append(ids.position(source, offset))
            offset = cursor.next_unacked(offset + 1)
        return True

    def _ack_lost(self, positions: list[int]) -> None:
        """Acknowledge damaged messages skipped by policy or by the operator: lost for good."""
        self.lost += len(positions)
        metrics.LOST_MESSAGES.labels(reason="damaged").inc(len(positions))
        log.warning(
            "subscription %s: %d damaged messages skipped (acknowledged as lost), positions %d..%d",
            self.name,
            len(positions),
            positions[0],
            positions[-1],
        )
        if self._damaged_positions:
            self._damaged_positions.difference_update(positions)
        self._ack_positions(positions)

    def skip_damaged(self, damaged: list[tuple[int, DamagedRange]]) -> int:
        """The operator skips these damaged ranges: acknowledge their unacked messages as lost
        (``pubsubd topics skip-damaged``). Returns how many were."""
        lost: list[int] = []
        for source, damaged_range in damaged:
            cursor = self.journal.cursors.get(source)
            if cursor is None:
                continue
            offset = cursor.next_unacked(damaged_range.first_offset)
            while offset < damaged_range.end_offset:
                lost.append(ids.position(source, offset))
                offset = cursor.next_unacked(offset + 1)
        if lost:
            self._ack_lost(lost)
        self.schedule_pump()
        return len(lost)

    def damage_status(self) -> dict[str, Any]:
        """For /status: the damaged ranges holding unacked messages of this subscription
        (delivery stops at them unless the topic's policy skips them)."""
        found = []
        for source, log_ in enumerate(self.sources.logs):
            cursor = self.journal.cursors.get(source)
            if cursor is None:
                continue
            for damaged in log_.damaged_ranges():
                unacked = cursor.unacked_count(damaged.end_offset) - cursor.unacked_count(
                    damaged.first_offset
                )
                if unacked:
                    found.append(
                        {
                            "source": source,
                            "first_offset": damaged.first_offset,
                            "end_offset": damaged.end_offset,
                            "unacked": unacked,
                        }
                    )
        if not found:
            return {}
        return {"stopped_at_damage": found, "damage_policy": self.sources.damage_policy.value}

    def _requeue_restored(self) -> None:
        """Redeliveries that found their message damaged: those readable again (restored
        bytes) go back for delivery."""
        assert self._damaged_positions is not None
        for pos in list(self._damaged_positions):
            log_ = self.sources.logs[ids.source_of(pos)]
            try:
                log_.entry_at(ids.offset_of(pos))
            except DamagedEntries:
                continue
            except OffsetOutOfRange:
                pass
            else:
                self._requeue(pos)
            self._damaged_positions.discard(pos)

    def _stuck_error(self, source: int, damaged: DamagedRange) -> DataLoss:
        topic = self.subscription.topic
        return DataLoss(
            f"subscription {self.name} is stopped at damaged messages: {damaged.messages} "
            f"messages at {damaged.describe()}, publish message source {source} of topic "
            f"{topic}. Restore the file's bytes (delivery resumes by itself), or skip them: "
            f"`pubsubd topics skip-damaged {topic}` once, or the topic label "
            f"pubsubd-damaged-entries=skip"
        )

    def _fail_consumer(self, consumer: Consumer, error: PubsubError) -> None:
        """End a consumer with ``error``: a stream's RPC ends with it, a Pull answers it."""
        self.remove_consumer(consumer)
        if isinstance(consumer, PullWaiter):
            consumer.closed = True
            if not consumer.future.done():
                consumer.future.set_exception(error)
                consumer.future.exception()  # retrieved: a Pull gone meanwhile logs nothing
        elif isinstance(consumer, StreamConsumer):
            consumer.end(error)

    def _delay_tracker(self) -> DelayTracker:
        tracker = self.delays
        if tracker is None:
            tracker = self.delays = self.forwarder.delay_tracker(self.topic_uid)
            tracker.add_listener(id(self), DueListener(self._on_due, lambda: len(self._redeliver)))
        return tracker

    def _on_due(self, positions: list[int]) -> None:
        """Delayed messages fell due: those already read past go back for delivery (those
        above the read offset are delivered when the log read reaches them)."""
        queued = False
        for pos in positions:
            source, offset = ids.source_of(pos), ids.offset_of(pos)
            cursor = self.journal.cursors.get(source)
            if cursor is None or offset >= self.read_offsets.get(source, cursor.mark_delete):
                continue
            if cursor.is_acked(offset) or pos in self.leases:
                continue
            self._requeue(pos)
            queued = True
        if queued:
            self.schedule_pump()

    def _requeue(self, pos: int) -> None:
        if self._redeliver_set is None:
            self._redeliver_set = set()
        if pos not in self._redeliver_set:
            self._redeliver_set.add(pos)
            heapq.heappush(self._redeliver, pos)

    def _is_dead_lettering(self, pos: int) -> bool:
        return self._dead_lettering is not None and pos in self._dead_lettering

    def _release(self, pos: int) -> bool:
        lease = self.leases.release(pos)
        if lease is None:
            return False
        self._outstanding_bytes -= lease.size
        consumer = self.consumers.get(lease.consumer)
        if consumer is not None:
            consumer.returned(lease.size)
            consumer.stalled = False
        return True

    def _failed(self, pos: int, now: float, nack: bool = False) -> None:
        """A delivery of ``pos`` was nacked or expired (its lease already ended): dead-letter it,
        or schedule its redelivery after the retry policy's backoff, keeping key order."""
        deliveries = self.leases.attempts(pos)
        if should_dead_letter(self.subscription, deliveries):
            self._dead_letter(pos, deliveries)
            return
        delay = backoff_s(self.subscription, deliveries)
        if nack:
            delay = max(delay, float(self.settings.nack_delay_s))
        key = self.ordering.key_of(pos)
        if key is not None:
            for later in self.ordering.fail(pos):
                if later != pos:
                    self._release(later)
            if delay > 0:
                self.ordering.block(key)
                self._delayed_keys.add(pos, now + delay)
            return
        if delay > 0:
            self._delayed.add(pos, now + delay)
        else:
            self._requeue(pos)

    def give_back(self, consumer_id: int, positions: list[int]) -> int:
        """Consumer ``consumer_id`` never received ``positions`` (a cancelled Pull, a response
        that could not be sent to a vanished client, a stream's unsent responses): end its
        leases on them without counting a delivery attempt and deliver them again at once. A
        keyed message goes back to the front of its key's queue with the key's later
        outstanding messages, as after a nack but with no backoff. Positions acked, nacked,
        expired or leased to someone else meanwhile are left alone. Returns how many came back."""
        back = 0
        giving = set(positions)
        ordering = self.ordering
        for pos in sorted(giving):
            lease = self.leases.give_back(pos, consumer_id)
            if lease is None:
                continue
            back += 1
            self._outstanding_bytes -= lease.size
            consumer = self.consumers.get(consumer_id)
            if consumer is not None:
                consumer.returned(lease.size)
            if ordering.key_of(pos) is None:
                self._requeue(pos)
                continue
            for later in ordering.fail(pos):
                if later not in giving:  # (cannot happen: a key's batch has one consumer)
                    self._release(later)
        if back:
            self.delivered -= back
            self.schedule_pump()
        return back

    # --- dead letters -------------------------------------------------------------------------

    def _dead_letter(self, pos: int, deliveries: int) -> None:
        if self._dead_lettering is None:
            self._dead_lettering = set()
        if self._tasks is None:
            self._tasks = set()
        self._dead_lettering.add(pos)
        task = asyncio.create_task(self._forward_dead_letter(pos, deliveries))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward_dead_letter(self, pos: int, deliveries: int) -> None:
        topic = self.subscription.dead_letter_policy.dead_letter_topic
        try:
            uid = self.resolve_topic(topic)
            found = self._locate(pos)
            if uid is None or found is None:
                if found is not None:
                    log.warning("dead-letter topic %s of %s is missing", topic, self.name)
                    self._delayed.add(pos, time.monotonic() + DEAD_LETTER_RETRY_S)
                return
            decoded, i = found
            payload = dead_letter_request(self.name, decoded.parsed[i], deliveries, topic)
            await self.router_publish(uid, payload)
            self.dead_lettered += 1
            self._ack_positions([pos])
        except Exception:
            log.exception("dead-lettering %s of %s failed", pos, self.name)
            self._delayed.add(pos, time.monotonic() + DEAD_LETTER_RETRY_S)
        finally:
            if self._dead_lettering is not None:
                self._dead_lettering.discard(pos)
            self._arm_timer()

    async def router_publish(self, topic_uid: str, payload: bytes) -> None:
        await self.forwarder.publish(topic_uid, payload, 1)

    # --- acks and deadlines -------------------------------------------------------------------

    def decode(self, ack_id: str) -> tuple[int, int]:
        return ids.decode_ack_id(ack_id, self.incarnation)

    def acknowledge(self, positions: list[int]) -> None:
        self.last_activity = time.time()
        events.record_acks(self, positions)  # delivery-latency SLI; O(1) per batch
        self._ack_positions(positions)

    def _ack_positions(self, positions: list[int]) -> None:
        by_source: dict[int, list[int]] = defaultdict(list)
        freed = False
        ordering = self.ordering
        for pos in positions:
            freed |= self._release(pos)
            self.leases.forget(pos)
            ordering.acked(pos)
            by_source[ids.source_of(pos)].append(ids.offset_of(pos))
        for source, offsets in by_source.items():
            if source in self.journal.cursors:
                self.forwarder.record_acks(self.journal, source, offsets)
        self.acked += len(positions)
        if freed or self.subscription.enable_message_ordering:
            self.schedule_pump()

    def current(self, pos: int, generation: int) -> bool:
        """Whether (pos, generation) is the live lease (exactly-once checks)."""
        lease = self.leases.get(pos)
        return lease is not None and lease.generation == generation

    def modify_deadline(self, positions: list[tuple[int, int]], seconds: int) -> None:
        """Extend leases to now + seconds; 0 is a nack (redeliver, after any retry backoff)."""
        self.last_activity = time.time()
        now = time.monotonic()
        if seconds == 0:
            failed = False
            for pos, generation in positions:
                lease = self.leases.get(pos)
                if lease is not None and lease.generation == generation:
                    self._release(pos)
                    self._failed(pos, now, nack=True)
                    failed = True
            if failed:
                self.schedule_pump()
            return
        revived = False
        for pos, generation in positions:
            lease = self.leases.get(pos)
            if lease is not None and lease.generation == generation:
                self.leases.extend(pos, now, seconds)
                consumer = self.consumers.get(lease.consumer)
                if consumer is not None and consumer.stalled:
                    consumer.stalled = False
                    revived = True
        self._arm_timer()
        if revived:
            self.schedule_pump()

    # --- timers -------------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        """One timer for the earliest of: a lease deadline, a backoff ending."""
        due = [
            t
            for t in (
                self.leases.next_deadline(),
                self._delayed.next_due(),
                self._delayed_keys.next_due(),
            )
            if t is not None
        ]
        if not due:
            return
        at = min(due)
        if self._timer_at is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_later(
            max(0.0, at - time.monotonic()), self._background, "lease timer", self._on_timer
        )

    def _background(self, task: str, step: Callable[[], None]) -> None:
        """Run a scheduled pump or timer. A failure is reported (observability/background.py)
        and ends every consumer with INTERNAL, so no client waits on a stalled subscription
        without a word (the official clients reconnect and the next pump tries again)."""
        try:
            step()
        except Exception as exc:
            background.report(f"subscription {task}", exc)
            error = InternalError(
                f"delivery of subscription {self.name} failed ({type(exc).__name__}: {exc}); "
                "see the server log"
            )
            for consumer in list(self.consumers.values()):
                self._fail_consumer(consumer, error)
            self._timer = None
            self._timer_at = None
            self._arm_timer_safely()

    def _arm_timer_safely(self) -> None:
        try:
            self._arm_timer()
        except Exception as exc:  # the lease table itself is broken: nothing left to try
            background.report("subscription lease timer", exc)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        now = time.monotonic()
        changed = False
        for pos, lease in self.leases.expired(now):
            self._outstanding_bytes -= lease.size
            consumer = self.consumers.get(lease.consumer)
            if consumer is not None:
                consumer.returned(lease.size)
                if not lease.confirmed:
                    # Never acknowledged receipt: stop feeding this consumer until it shows
                    # life, so the redelivery goes to a consumer that reads.
                    consumer.stalled = True
            self._failed(pos, now)
            changed = True
        for pos in self._delayed.due(now):
            self._requeue(pos)
            changed = True
        for pos in self._delayed_keys.due(now):
            key = self.ordering.key_of(pos)
            if key is not None:
                self.ordering.unblock(key)
                changed = True
        if changed:
            self.pump()
        else:
            self._arm_timer()

    def reset(self, states: dict[int, CursorState]) -> None:
        """Replace the ack state (Seek): forget leases and redeliveries, read from the new
        mark-delete positions. Outstanding ack IDs stop working: their leases are gone."""
        for source, state in states.items():
            self.journal.reset(source, state)
        for consumer in self.consumers.values():
            consumer.outstanding = 0
            consumer.outstanding_bytes = 0
            consumer.stalled = False
        self.generation_floor = self.leases.next_generation
        self.leases.clear()
        self._outstanding_bytes = 0
        self.ordering.clear()
        self._redeliver.clear()
        self._redeliver_set = None
        self._delayed.clear()
        self._delayed_keys.clear()
        self.read_offsets = {s: c.mark_delete for s, c in self.journal.cursors.items()}
        self.forwarder.mark_dirty(self.journal)
        self.last_activity = time.time()
        self.schedule_pump()

    # --- state --------------------------------------------------------------------------------

    def backlog_stats(self, now_us: int) -> quotas.Backlog:
        """Unacked messages, their stored bytes and the age of the oldest (backlog quotas).

        Bytes come from the log's index: the unacked range's stored bytes minus those of the
        acked ranges above the mark-delete position (a stored batch's bytes are shared evenly
        by its messages); past ``MAX_EXACT_ACKED_RANGES`` ranges, the rest is prorated."""
        messages = 0
        size = 0.0
        oldest_us = now_us
        for source, log_ in enumerate(self.sources.logs):
            cursor = self.journal.cursors.get(source)
            if cursor is None:
                continue
            unacked = cursor.unacked_count(log_.end_offset)
            messages += unacked
            if unacked:
                size += _unacked_bytes(log_, cursor, unacked)
            first = cursor.next_unacked(cursor.mark_delete)
            if first < log_.committed_offset:
                with contextlib.suppress(OffsetOutOfRange, DamagedEntries):
                    oldest_us = min(oldest_us, log_.entry_at(first).publish_time_us)
        return quotas.Backlog(messages, int(size), max(0.0, (now_us - oldest_us) / 1e6))

    def evict_oldest(self, count: int, older_than_us: int | None = None) -> int:
        """Acknowledge the ``count`` oldest unacked messages, and any published before
        ``older_than_us`` (backlog quota ``evict_oldest``); return how many."""
        evicted: list[int] = []
        for source, log_ in enumerate(self.sources.logs):
            cursor = self.journal.cursors.get(source)
            if cursor is None:
                continue
            offset = cursor.next_unacked(cursor.mark_delete)
            while offset < log_.committed_offset:
                if len(evicted) >= count:
                    if older_than_us is None:
                        break
                    try:
                        if log_.entry_at(offset).publish_time_us >= older_than_us:
                            break
                    except (OffsetOutOfRange, DamagedEntries):
                        break
                evicted.append(ids.position(source, offset))
                offset = cursor.next_unacked(offset + 1)
        if evicted:
            self._ack_positions(evicted)
        return len(evicted)

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
        if self.delays is not None:
            self.delays.remove_listener(id(self))
        if self._timer is not None:
            self._timer.cancel()
        for task in self._tasks or ():
            task.cancel()
        for consumer in list(self.consumers.values()):
            end = getattr(consumer, "end", None)
            if end is not None:
                end(error)
            elif isinstance(consumer, PullWaiter) and not consumer.future.done():
                consumer.future.set_exception(error)
                consumer.future.exception()  # retrieved: a Pull gone meanwhile logs nothing
        self.consumers.clear()
        self._order.clear()
        self.leases.clear()


def _weight(client_id: str, key: str) -> bytes:
    return hashlib.blake2b(f"{client_id}\x00{key}".encode(), digest_size=8).digest()


MAX_EXACT_ACKED_RANGES = 256


def _unacked_bytes(log_: SourceLog, cursor: Cursor, unacked: int) -> float:
    """Stored bytes of ``cursor``'s unacked messages in ``log_`` (see backlog_stats)."""
    start, end = cursor.mark_delete, log_.end_offset
    total = log_.stored_bytes(start, end)
    ranges = cursor.acked_ranges()
    if len(ranges) > MAX_EXACT_ACKED_RANGES:  # many gaps: share the range's bytes evenly
        return total * unacked / (end - start)
    for first, stop in ranges:
        total -= log_.stored_bytes(first, stop)
    return max(total, 0.0)
