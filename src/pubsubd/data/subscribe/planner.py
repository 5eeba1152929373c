"""Delivery planner of one subscription: every delivery rule, no I/O (pure).

What it decides: which consumer is served next (round-robin; failover/exclusive: one active
client, or on failover one per source when every stream reads one source, roster.py;
key_shared: rendezvous owner of each key), which messages it gets (ready ordering keys
first, then redeliveries, then new messages from each source's read offset, skipping acked,
filtered, not-yet-due and damaged ones), within which caps (the consumer's flow control, the
subscription's and the consumer's outstanding messages and bytes), under which lease (ack ID
generation, deadline), and what a failure leads to (retry backoff, nack delay, dead letter,
ordering-key requeue). Inputs come in as calls with ``now`` (monotonic seconds) passed in;
what must happen outside comes out as :class:`Effects` for the asyncio shell
(``dispatcher.py``) to carry out, in this order: record acks, end consumers, hand out
deliveries, publish dead letters, arm the timer at :meth:`DeliveryPlanner.next_wakeup`.

Rules:
1. A position is delivered to at most one consumer at a time (one lease); a lease ends by
   ack, nack, expiry or give-back. Only expiry and nack count toward dead-lettering (the lease
   table's attempt counts); a give-back (the client never got it) does not.
2. Ordering keys (ordered subscriptions and key_shared): one outstanding batch per key; a
   failed message and every later outstanding one of its key go back to the front of the
   key's queue; a client's ack for one of those later ones before it is delivered again is
   dropped (it names the ended delivery), so the key is redelivered from the failed one on.
3. Acks change the planner's cursor (a mirror of the ack state the publishing forwarder
   journals); every newly acked range is an effect, so the two never diverge.
4. A consumer that took nothing while delivery is stopped at damaged messages (topic label
   ``pubsubd-damaged-entries=stop``) and has nothing outstanding is ended with DATA_LOSS.
5. A lease that expires without ever having been extended marks its consumer stalled: it
   gets nothing until it shows life (the official clients confirm receipt of every message).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from typing import Any, Protocol, TypeAlias

from pubsubd.acks.cursor import Cursor, CursorState
from pubsubd.core import filters, ids, queue_settings, wire
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.errors import PubsubError
from pubsubd.core.queue_settings import SubscriptionType
from pubsubd.core.records import Entry
from pubsubd.data.decoding import DecodedEntry
from pubsubd.data.subscribe import damaged
from pubsubd.data.subscribe.budget import DeliveryBudget
from pubsubd.data.subscribe.consumer import Consumer
from pubsubd.data.subscribe.dead_letter import should_dead_letter
from pubsubd.data.subscribe.leases import Lease, LeaseTable
from pubsubd.data.subscribe.ordering import KeyOrdering
from pubsubd.data.subscribe.retry import DelayQueue, backoff_s
from pubsubd.data.subscribe.roster import Roster, held_by_stream, room, same_client
from pubsubd.storage.damage import DamagedRange
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange

# A message taken for delivery: position, the message (a serialized PubsubMessage, or for a
# raw consumer a plain entry's data), the size flow control counts (the serialized message's,
# in either form), and None or the plain message's publish time (``Delivery.stamps``).
Taken: TypeAlias = tuple[int, bytes, int, bytes | None]


class TakenColumns:
    """The messages taken for one response (``DeliveryPlanner._take``), as columns of their
    ``Taken`` fields: a run of one entry joins by four C-level extends, and the response's
    Delivery takes the columns as they are."""

    __slots__ = ("messages", "positions", "sizes", "stamps")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.messages: list[bytes] = []
        self.sizes: list[int] = []
        self.stamps: list[bytes | None] = []

    def __len__(self) -> int:
        return len(self.positions)

    def add(self, pos: int, message: bytes, size: int, stamp: bytes | None) -> None:
        self.positions.append(pos)
        self.messages.append(message)
        self.sizes.append(size)
        self.stamps.append(stamp)

    def extend_run(
        self, first: int, messages: Sequence[bytes], sizes: Sequence[int], stamp: bytes | None
    ) -> None:
        """The messages at positions first, first + 1, ... with one publish time."""
        k = len(messages)
        self.positions += range(first, first + k)
        self.messages += messages
        self.sizes += sizes
        self.stamps += repeat(stamp, k)


# Entries read from a source per step while filling a response: FIRST_READ_ENTRIES first,
# twice as many each further step, at most READ_ENTRIES. A producer's batch is one entry, so
# one or two usually fill a response; the log's read costs per entry it returns (BENCHMARKS.md,
# PC7), and the entries of a read not taken were read for nothing (they are read again).
FIRST_READ_ENTRIES = 2
READ_ENTRIES = 64
# A message whose dead-letter topic is missing (or whose forwarding failed) waits this long
# before the next try.
DEAD_LETTER_RETRY_S = 10.0


class SourceReader(Protocol):
    """What the planner reads: the topic's publish message sources (synchronous).

    ``read`` and ``entry_at`` raise ``OffsetOutOfRange`` below the retained range and
    ``DamagedEntries`` inside a damaged range (storage/errors.py)."""

    def source_count(self) -> int: ...

    def start_offset(self, source: int) -> int: ...

    def committed_offset(self, source: int) -> int: ...

    def read(self, source: int, offset: int, max_entries: int) -> list[Entry]: ...

    def entry_at(self, source: int, offset: int) -> Entry: ...

    def decoded(self, source: int, entry: Entry) -> DecodedEntry:
        """The entry's messages (decoded once per topic, cached)."""
        ...

    def damage_policy(self) -> DamagePolicy: ...

    def delay_due(self, at_us: int, position: int) -> bool:
        """Whether a message delayed until ``at_us`` may be delivered now (delay tracker)."""
        ...


@dataclass(slots=True)
class Delivery:
    """One response: framed ReceivedMessages for ``consumer`` and the positions leased. For a
    ``raw`` consumer, ``received`` are the stored messages themselves, message i leased at
    generation ``first_generation`` + i (its ack ID's), with ``attempts`` its delivery
    attempts (None: not reported, as 0) and ``stamps`` the form of each: None, a serialized
    PubsubMessage (``DecodedEntry.messages``), else the message's data alone, its publish time
    the serialized Timestamp ``stamps[i]`` (a plain entry's, ``DecodedEntry.plain``: no
    attributes, no ordering key; one object per entry)."""

    consumer: Consumer
    received: list[bytes]
    positions: list[int]
    first_generation: int = 0
    attempts: list[int] | None = None
    stamps: list[bytes | None] | None = None


@dataclass(slots=True)
class Effects:
    """What the shell must do after a planner call, drained by :meth:`DeliveryPlanner.effects`."""

    acks: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # source -> new ranges
    ended: list[tuple[Consumer, PubsubError]] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    dead_letters: list[tuple[int, int]] = field(default_factory=list)  # (position, attempts)
    lost: list[int] = field(default_factory=list)  # damaged messages acked without delivery
    pump: bool = False  # deliver again soon (something was freed or requeued)

    def __bool__(self) -> bool:
        return bool(
            self.acks or self.ended or self.deliveries or self.dead_letters or self.lost
        ) or (self.pump)


class DeliveryPlanner:
    """The delivery state and rules of one subscription (see the module docstring)."""

    # One per subscription: no per-instance __dict__ (BENCHMARKS.md, "Scale of names").
    __slots__ = (
        "_damaged_positions",
        "_dead_lettering",
        "_delayed",
        "_delayed_keys",
        "_effects",
        "_filter",
        "_filter_text",
        "_next_source",
        "_outstanding_bytes",
        "_redeliver",
        "_redeliver_set",
        "_stuck",
        "acked",
        "budget",
        "budget_limited",
        "cursors",
        "dead_letter_failures",
        "dead_lettered",
        "delivered",
        "generation_floor",
        "incarnation",
        "leases",
        "lost",
        "ordering",
        "read_offsets",
        "reader",
        "roster",
        "served_sources",
        "settings",
        "subscription",
    )

    def __init__(
        self,
        subscription: Any,
        incarnation: str,
        cursors: dict[int, CursorState],
        reader: SourceReader,
        budget: DeliveryBudget | None = None,
        served_sources: frozenset[int] | None = None,
    ) -> None:
        self.subscription = subscription  # google.pubsub.v1.Subscription (raw protobuf)
        # The sources this subscribing forwarder serves of a spread subscription (None: all):
        # every consumer takes only their messages, so the others are never read here.
        self.served_sources = served_sources
        # The bound on outstanding deliveries of every subscription (budget.py), if any; a
        # plan that stopped at it sets ``budget_limited``.
        self.budget = budget
        self.budget_limited = False
        self.incarnation = incarnation
        self.reader = reader
        # The subscription's ack state, per source (a mirror of what the publishing forwarder
        # journals: every change here becomes an ``Effects.acks`` entry).
        self.cursors = {s: Cursor.from_state(st) for s, st in cursors.items()}
        self.read_offsets = {s: c.mark_delete for s, c in self.cursors.items()}
        self.settings = queue_settings.parse(subscription.labels)
        self.leases = LeaseTable()
        # Ack IDs with a lease generation below this predate the last Seek and ack nothing.
        self.generation_floor = 0
        self.ordering = KeyOrdering()
        self.roster = Roster()
        self._next_source = 0  # the source new messages are read from first
        self._redeliver: list[int] = []  # heap of positions to deliver again
        self._redeliver_set: set[int] | None = None  # created on first requeue
        self._delayed = DelayQueue()  # positions waiting out a retry backoff
        self._delayed_keys = DelayQueue()  # keyed positions whose key waits out a backoff
        self._dead_lettering: set[int] | None = None  # being republished to the DLQ topic
        self._damaged_positions: set[int] | None = None  # redeliveries found damaged
        self._stuck: tuple[int, DamagedRange] | None = None  # damage this plan stopped at
        self._outstanding_bytes = 0
        self._filter_text = ""
        self._filter: filters.Filter | None = None
        self._effects = Effects()
        self.delivered = 0
        self.acked = 0
        self.dead_lettered = 0
        self.dead_letter_failures = 0  # copies not published (each tried again later)
        self.lost = 0

    @property
    def name(self) -> str:
        return str(self.subscription.name)

    def effects(self) -> Effects:
        """Take the effects accumulated since the last call."""
        taken, self._effects = self._effects, Effects()
        return taken

    def configure(self, subscription: Any) -> None:
        """The subscription changed (UpdateSubscription): re-read its settings."""
        self.subscription = subscription
        self.settings = queue_settings.parse(subscription.labels)
        self._effects.pump = True

    @property
    def outstanding_bytes(self) -> int:
        return self._outstanding_bytes

    # --- consumers ----------------------------------------------------------------------------

    @property
    def consumers(self) -> dict[int, Consumer]:
        return self.roster.consumers

    def admit(self, client_id: str) -> None:
        """Refuse a second StreamingPull client of an exclusive subscription. An admitted one
        holds the subscription: waiting Pulls end with FAILED_PRECONDITION."""
        for pull in self.roster.check_stream(self.settings, client_id, self.name):
            self.end_consumer(pull, held_by_stream(self.name, client_id))

    def admit_pull(self) -> None:
        """A Pull has no client_id, so it never matches a stream: on an exclusive subscription
        it is refused while any StreamingPull client holds it (roster.py, rule 2)."""
        self.roster.check_pull(self.settings, self.name)

    def add_consumer(self, consumer: Consumer) -> None:
        served = self.served_sources
        if served is not None:
            consumer.sources = served if consumer.sources is None else consumer.sources & served
        self.roster.add(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if self.roster.remove(consumer) and consumer.is_stream:
            # Failover/key_shared: the next consumer (a stream or a waiting Pull) takes over
            # now, not at the next publish or timer.
            self._effects.pump = True

    def active_changes(self) -> list[tuple[Consumer, bool]]:
        """Failover: the streams that asked for notices and became, or stopped being, a
        receiver since they were last told (each is marked told)."""
        if self.settings.type is not SubscriptionType.FAILOVER:
            return []
        streams = [c for c in self.roster.streams() if c.active_notices]
        if not streams:
            return []
        receivers = self.roster.receivers(self.settings)
        changes = []
        for c in streams:
            active = receivers is None or c.id in receivers
            if c.notified_active is not active:
                c.notified_active = active
                changes.append((c, active))
        return changes

    def end_consumer(self, consumer: Consumer, error: PubsubError) -> None:
        """Remove ``consumer`` and have the shell end it with ``error``."""
        self.remove_consumer(consumer)
        self._effects.ended.append((consumer, error))

    def revive(self, consumer: Consumer) -> None:
        """Any sign of life from a stalled consumer (a request on its stream)."""
        if consumer.stalled:
            consumer.stalled = False
            self._effects.pump = True

    @property
    def ack_deadline_s(self) -> int:
        return int(self.subscription.ack_deadline_seconds)

    # --- delivery -----------------------------------------------------------------------------

    def plan(self, now: float) -> None:
        """Deliver as much as the consumers can take, round-robin, one response at a time."""
        self._stuck = None
        self.budget_limited = False
        if self._damaged_positions:
            self._requeue_restored()
        settings = self.settings
        budget = self.budget
        roster = self.roster
        receivers = roster.receivers(settings)
        key_owner = roster.key_owner if settings.type is SubscriptionType.KEY_SHARED else None
        idle = 0
        while idle < len(roster):
            consumer = roster.next()
            max_msgs, max_bytes = room(
                consumer, settings, len(self.leases), self._outstanding_bytes
            )
            if max_msgs <= 0 or (receivers is not None and consumer.id not in receivers):
                idle += 1
                continue
            if budget is not None:
                left, left_bytes = budget.room()
                if left <= 0:
                    self.budget_limited = True  # nothing more for anyone until room frees
                    break
                max_msgs, max_bytes = min(max_msgs, left), min(max_bytes, left_bytes)
            batch = self._take(max_msgs, max_bytes, consumer, key_owner)
            if not batch:
                if self._stuck is not None and not consumer.outstanding and consumer.has_client:
                    # Stopped at damaged messages with nothing else for this consumer: tell it
                    # (DATA_LOSS) instead of leaving it waiting without a word.
                    source, damage = self._stuck
                    self.end_consumer(
                        consumer,
                        damaged.stopped(self.name, self.subscription.topic, source, damage),
                    )
                    continue
                idle += 1
                continue
            idle = 0
            self._deliver(consumer, batch, now)
            if consumer.is_pull:
                self.remove_consumer(consumer)

    def _deliver(self, consumer: Consumer, batch: TakenColumns, now: float) -> None:
        report = (
            self.subscription.HasField("dead_letter_policy") or self.settings.always_report_attempts
        )
        positions, stored, sizes, stamps = (
            batch.positions,
            batch.messages,
            batch.sizes,
            batch.stamps,
        )
        # One lease run per response (leases.py): generations first, first + 1, ...
        first = self.leases.grant_run(positions, sizes, now, consumer.ack_deadline_s, consumer.id)
        if consumer.raw:
            # Unframed, for an in-process stream: the same leases and attempts, no ack IDs.
            self._delivered(consumer, sizes)
            self._effects.deliveries.append(
                Delivery(
                    consumer,
                    stored,
                    positions,
                    first,
                    self.leases.attempts_of_leased(positions) if report else None,
                    stamps,
                )
            )
            return
        received_message = wire.received_message
        mask = ids.OFFSET_MASK
        incarnation = self.incarnation
        if report:
            attempts = self.leases.attempts
            received = [
                received_message(
                    f"{incarnation}-{pos >> ids.OFFSET_BITS}-{pos & mask}-{gen}".encode(),
                    message,
                    attempts(pos),
                )
                for gen, (pos, message) in enumerate(zip(positions, stored, strict=True), first)
            ]
        else:
            received = [
                received_message(
                    f"{incarnation}-{pos >> ids.OFFSET_BITS}-{pos & mask}-{gen}".encode(), message
                )
                for gen, (pos, message) in enumerate(zip(positions, stored, strict=True), first)
            ]
        self._delivered(consumer, sizes)
        self._effects.deliveries.append(Delivery(consumer, received, positions))

    def _delivered(self, consumer: Consumer, sizes: list[int]) -> None:
        """Count a response of messages of ``sizes`` against the consumer and the budgets."""
        total = sum(sizes)
        consumer.taken(len(sizes), total)
        self._outstanding_bytes += total
        if self.budget is not None:
            self.budget.taken(self, len(sizes), total)
        self.delivered += len(sizes)

    def _current_filter(self) -> filters.Filter | None:
        text = self.subscription.filter
        if text != self._filter_text:
            self._filter_text = text
            self._filter = filters.parse(text) if text else None
        return self._filter

    def _cursor(self, source: int) -> Cursor:
        """The cursor of ``source``; a source added to the topic after the subscription was
        attached is empty, so all of it is after the sync point (cursor at 0)."""
        cursor = self.cursors.get(source)
        if cursor is None:
            cursor = self.cursors[source] = Cursor(0)
        return cursor

    def _take(
        self,
        max_msgs: int,
        max_bytes: int,
        consumer: Consumer,
        key_owner: Callable[[str], Consumer | None] | None = None,
    ) -> TakenColumns:
        """Up to max_msgs messages (at least one if any, then up to max_bytes) to deliver next:
        free ordering keys' queues first, then redeliveries, then new messages from the log.
        With ``key_owner`` (Key_Shared) a key's messages go only to the client owning it; a
        consumer with ``sources`` takes only those sources' messages. A raw consumer takes a
        plain entry's messages as their data (``Taken``); every other message, and every
        message a framed consumer takes, as ``DecodedEntry.messages`` has it."""
        out = TakenColumns()
        size = 0
        raw = consumer.raw
        ordered = bool(self.subscription.enable_message_ordering) or key_owner is not None
        sources = consumer.sources

        def mine(key: str) -> bool:
            if sources is not None:
                head = self.ordering.head(key)
                if head is not None and ids.source_of(head) not in sources:
                    return False
            if key_owner is None:
                return True
            owner = key_owner(key)
            return owner is None or same_client(consumer, owner)

        batch_keys: set[str] = set()  # keys this response already carries (one batch per key)
        if ordered:
            for key, positions in self.ordering.take_ready(max_msgs, mine):
                for j, pos in enumerate(positions):
                    taken = self._message_at(pos, raw)
                    if taken is None or self._is_dead_lettering(pos):
                        self.ordering.forget(pos)
                        continue
                    if out and size + taken[2] > max_bytes:
                        self.ordering.give_back(key, positions[j:])
                        return out
                    out.add(*taken)
                    size += taken[2]
                    self.ordering.delivered(key, pos)
                batch_keys.add(key)
        # Redeliveries, oldest position first.
        others: list[int] = []  # another source's, for another consumer
        bytes_full = False
        while self._redeliver and len(out) < max_msgs:
            pos = heapq.heappop(self._redeliver)
            if sources is not None and ids.source_of(pos) not in sources:
                others.append(pos)
                continue
            if self._redeliver_set is not None:
                self._redeliver_set.discard(pos)
            if pos in self.leases or self._is_dead_lettering(pos):
                continue
            taken = self._message_at(pos, raw)
            if taken is None:
                continue
            if out and size + taken[2] > max_bytes:
                self._requeue(pos)
                bytes_full = True
                break
            out.add(*taken)
            size += taken[2]
        for pos in others:
            heapq.heappush(self._redeliver, pos)
        if bytes_full:
            return out
        # New messages from each source's read offset.
        flt = self._current_filter()
        auto_acked: list[int] = []
        lost: list[int] = []
        reader = self.reader
        leased = self.leases.leased
        for source in self._sources_in_turn():
            if sources is not None and source not in sources:
                continue
            cursor = self._cursor(source)
            offset = self.read_offsets.get(source, cursor.mark_delete)
            committed = reader.committed_offset(source)
            full = False
            # [unacked, acked_at): a run of unacked offsets (offsets only grow below); the
            # cursor does not change while this loop reads it
            unacked: int = 0
            acked_at: int | None = -1
            source_bits = source << ids.OFFSET_BITS
            read_entries = FIRST_READ_ENTRIES
            while not full and len(out) < max_msgs and offset < committed:
                try:
                    entries = reader.read(source, offset, read_entries)
                    read_entries = min(2 * read_entries, READ_ENTRIES)
                except OffsetOutOfRange:
                    offset = max(offset, reader.start_offset(source))
                    continue
                except DamagedEntries as e:
                    if e.restoring:
                        break  # read back from the storage nodes: delivery goes on after
                    if not self._past_damage(source, e.damaged, lost):
                        self._stuck = (source, e.damaged)
                        break
                    offset = max(offset, e.damaged.end_offset)
                    continue
                if not entries:
                    break
                for entry in entries:
                    decoded = reader.decoded(source, entry)
                    plain = decoded.plain() if raw else None
                    if plain is None:
                        messages, sizes, stamp = decoded.messages, None, None
                    else:
                        messages, sizes, stamp = plain
                    delays = decoded.deliver_at
                    key = decoded.ordering_key if ordered else ""
                    start = max(offset, entry.base_offset)
                    end = entry.base_offset + entry.count
                    if flt is None and delays is None and not key and start < end:
                        # No filter, delay or key: a run of unacked, unleased messages is
                        # taken at once, as the loop below would take it one by one.
                        if acked_at is not None and start >= acked_at:
                            unacked, acked_at = cursor.unacked_run(start)
                        stop = min(end, start + max_msgs - len(out))
                        if acked_at is not None:
                            stop = min(stop, acked_at)
                        first = source_bits | start
                        if (
                            start >= unacked
                            and stop > start
                            and not any(
                                map(leased.__contains__, range(first, first + stop - start))
                            )
                        ):
                            i, j = start - entry.base_offset, stop - entry.base_offset
                            run_sizes = (
                                list(map(len, messages[i:j])) if sizes is None else sizes[i:j]
                            )
                            # sums[k]: the response's bytes with k more of the run
                            sums = list(accumulate(run_sizes, initial=size))
                            k = bisect_right(sums, max_bytes) - 1
                            if not out:
                                k = max(k, 1)  # the first message, however big
                            k = max(k, 0)
                            out.extend_run(first, messages[i : i + k], run_sizes[:k], stamp)
                            size = sums[k]
                            offset = start + k
                            if start + k < stop or len(out) >= max_msgs:
                                full = True  # by bytes, or by count
                                break
                            if stop == end:
                                continue
                            start = stop  # the rest of the entry one by one
                    for off in range(start, end):
                        offset = off + 1
                        if acked_at is not None and off >= acked_at:
                            unacked, acked_at = cursor.unacked_run(off)
                        if off < unacked:
                            continue  # acked
                        pos = source_bits | off
                        if pos in leased:
                            continue
                        i = off - entry.base_offset
                        if flt is not None and not flt.matches(decoded.parsed[i].attributes):
                            auto_acked.append(pos)  # never delivered, never backlog
                            continue
                        message = messages[i]
                        message_size = len(message) if sizes is None else sizes[i]
                        if delays is not None:
                            at = delays[i]
                            if at is not None and not reader.delay_due(at, pos):
                                continue  # not due: the delay tracker hands it back then
                        if key and (
                            self.ordering.has_pending(key)
                            or (self.ordering.outstanding(key) and key not in batch_keys)
                            or not mine(key)
                        ):
                            self.ordering.hold(key, pos)
                            continue
                        if out and size + message_size > max_bytes:
                            offset = off
                            full = True
                            break
                        out.add(pos, message, message_size, stamp)
                        size += message_size
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

    def _sources_in_turn(self) -> Iterable[int]:
        """The sources to read new messages from, starting one further each call, so a busy
        source cannot starve the others (each source's order is unaffected)."""
        count = self.reader.source_count()
        if count == 1:
            return (0,)
        first = self._next_source % count
        self._next_source = first + 1
        return [*range(first, count), *range(first)]

    def locate(self, pos: int) -> tuple[DecodedEntry, int] | None:
        """The decoded entry holding ``pos`` and its index in it; None if it is gone (trimmed,
        unknown source) or damaged (remembered, and requeued if its bytes are restored)."""
        source, offset = ids.source_of(pos), ids.offset_of(pos)
        if source >= self.reader.source_count():
            return None
        try:
            entry = self.reader.entry_at(source, offset)
        except OffsetOutOfRange:
            return None
        except DamagedEntries as e:
            lost: list[int] = []
            if not e.restoring and self._past_damage(source, e.damaged, lost):
                if lost:
                    self._ack_lost(lost)
            else:
                if self._damaged_positions is None:
                    self._damaged_positions = set()
                self._damaged_positions.add(pos)
            return None
        return self.reader.decoded(source, entry), offset - entry.base_offset

    def _message_at(self, pos: int, raw: bool) -> Taken | None:
        """The unacked message at ``pos`` as ``_take`` hands it out (``raw``: for a raw
        consumer), or None."""
        cursor = self.cursors.get(ids.source_of(pos))
        if cursor is None or cursor.is_acked(ids.offset_of(pos)):
            return None
        found = self.locate(pos)
        if found is None:
            return None
        decoded, i = found
        plain = decoded.plain() if raw else None
        if plain is not None:
            return pos, plain.data[i], plain.sizes[i], plain.stamp
        message: bytes = decoded.messages[i]
        return pos, message, len(message), None

    def delayed_due(self, positions: list[int]) -> None:
        """Delayed messages fell due: those already read past go back for delivery (those
        above the read offset are delivered when the log read reaches them)."""
        queued = False
        for pos in positions:
            source, offset = ids.source_of(pos), ids.offset_of(pos)
            cursor = self.cursors.get(source)
            if cursor is None or offset >= self.read_offsets.get(source, cursor.mark_delete):
                continue
            if cursor.is_acked(offset) or pos in self.leases:
                continue
            self._requeue(pos)
            queued = True
        if queued:
            self._effects.pump = True

    def pending_redeliveries(self) -> int:
        return len(self._redeliver)

    def _requeue(self, pos: int) -> None:
        if self._redeliver_set is None:
            self._redeliver_set = set()
        if pos not in self._redeliver_set:
            self._redeliver_set.add(pos)
            heapq.heappush(self._redeliver, pos)

    def _is_dead_lettering(self, pos: int) -> bool:
        return self._dead_lettering is not None and pos in self._dead_lettering

    def _release(self, pos: int) -> bool:
        # Runs once per acked message: _returned's work inlined, one consumer lookup.
        lease = self.leases.release(pos)
        if lease is None:
            return False
        self._outstanding_bytes -= lease.size
        consumer = self.roster.consumers.get(lease.consumer)
        if consumer is not None:
            consumer.returned(lease.size)
            consumer.stalled = False
        return True

    def _returned(self, lease: Lease) -> None:
        self._outstanding_bytes -= lease.size
        consumer = self.consumers.get(lease.consumer)
        if consumer is not None:
            consumer.returned(lease.size)

    def _failed(self, pos: int, now: float, nack: bool = False) -> None:
        """A delivery of ``pos`` was nacked or expired (its lease already ended): dead-letter it,
        or schedule its redelivery after the retry policy's backoff, keeping key order."""
        deliveries = self.leases.attempts(pos)
        if should_dead_letter(self.subscription, deliveries):
            if self._dead_lettering is None:
                self._dead_lettering = set()
            self._dead_lettering.add(pos)
            self._effects.dead_letters.append((pos, deliveries))
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
            self._returned(lease)
            if ordering.key_of(pos) is None:
                self._requeue(pos)
                continue
            for later in ordering.fail(pos):
                if later not in giving:  # (cannot happen: a key's batch has one consumer)
                    self._release(later)
        if back:
            self.delivered -= back
            self._effects.pump = True
        return back

    def give_back_deliveries(self, deliveries: list[tuple[int, int]]) -> int:
        """(position, generation) pairs from ack IDs a frontend could not hand to its client:
        :meth:`give_back` for those whose lease is still that delivery's and was not acted on
        by the client (a deadline change shows it did arrive)."""
        by_consumer: dict[int, list[int]] = {}
        for pos, generation in deliveries:
            lease = self.leases.get(pos)
            if lease is not None and lease.generation == generation and not lease.confirmed:
                by_consumer.setdefault(lease.consumer, []).append(pos)
        return sum(self.give_back(c, positions) for c, positions in by_consumer.items())

    # --- dead letters -------------------------------------------------------------------------

    def dead_letter_done(self, pos: int) -> None:
        """The dead-letter copy of ``pos`` is published: it is acked here."""
        if self._dead_lettering is not None:
            self._dead_lettering.discard(pos)
        self.dead_lettered += 1
        self._ack_positions([pos])

    def dead_letter_failed(self, pos: int, now: float) -> None:
        """Publishing the dead-letter copy failed (refused, or its topic is missing): the
        message stays and is tried again later (redelivered after ``DEAD_LETTER_RETRY_S``, then
        dead-lettered again at its next failure)."""
        if self._dead_lettering is not None:
            self._dead_lettering.discard(pos)
        self.dead_letter_failures += 1
        self._delayed.add(pos, now + DEAD_LETTER_RETRY_S)

    # --- acks and deadlines -------------------------------------------------------------------

    def decode(self, ack_id: str) -> tuple[int, int]:
        return ids.decode_ack_id(ack_id, self.incarnation)

    def acknowledge(self, positions: list[int], spans: list[tuple[int, int]] | None = None) -> None:
        """The client's acks. One for a keyed message that waits to be delivered again behind
        an earlier failed message of its key is dropped: its ack ID is from the delivery the
        failure ended, and taking it would let the key's redelivery skip the message.
        ``spans``: the same positions as (first, count) runs of consecutive positions (a
        Pulsar batch's), which the cursors take as ranges."""
        ordering = self.ordering
        if ordering.awaits_any():
            positions = [p for p in positions if not ordering.awaits_redelivery(p)]
            spans = None
        self._ack_positions(positions, spans)

    def evict(self, positions: list[int]) -> None:
        """Acknowledge ``positions`` for the server's own reasons (backlog quota)."""
        self._ack_positions(positions)

    def _ack_positions(
        self, positions: list[int], spans: list[tuple[int, int]] | None = None
    ) -> None:
        # Runs once per acked message: the leases end in one call, what they held is given
        # back per consumer (as _release does one by one), offsets are grouped per source.
        returned = self.leases.forget_all(positions)  # consumer -> [messages, bytes]
        if returned:
            consumers = self.roster.consumers
            for consumer_id, (count, size) in returned.items():
                self._outstanding_bytes -= size
                consumer = consumers.get(consumer_id)
                if consumer is not None:
                    consumer.returned_many(count, size)
                    consumer.stalled = False
        ordering = self.ordering
        if ordering.tracks_positions():
            for pos in positions:
                ordering.acked(pos)
        if spans is None:
            self._ack_offsets(positions)
        else:
            self._ack_spans(spans)
        self.acked += len(positions)
        if returned or self.subscription.enable_message_ordering:
            self._effects.pump = True

    def _ack_offsets(self, positions: list[int]) -> None:
        """The cursors' part of ``_ack_positions``: offsets grouped per source."""
        by_source: dict[int, list[int]] = defaultdict(list)
        bits, mask = ids.OFFSET_BITS, ids.OFFSET_MASK
        if positions and min(positions) >> bits == max(positions) >> bits:  # one source
            by_source[positions[0] >> bits] = list(map(mask.__and__, positions))
        else:
            for pos in positions:
                by_source[pos >> bits].append(pos & mask)
        acks = self._effects.acks
        for source, offsets in by_source.items():
            cursor = self.cursors.get(source)
            if cursor is None:
                continue
            ranges = cursor.ack(offsets)
            if ranges:
                acks.setdefault(source, []).extend(ranges)

    def _ack_spans(self, spans: list[tuple[int, int]]) -> None:
        """:meth:`_ack_offsets` for (first, count) runs of consecutive positions (one source
        each: a source's offsets never reach the next source's): each merged run is one range,
        as ``Cursor.ack`` collapses single offsets into runs."""
        bits, mask = ids.OFFSET_BITS, ids.OFFSET_MASK
        merged: list[list[int]] = []  # [start, end) positions, sorted, not touching
        for first, count in sorted(spans):
            if merged and first <= merged[-1][1] and first >> bits == merged[-1][0] >> bits:
                merged[-1][1] = max(merged[-1][1], first + count)
            else:
                merged.append([first, first + count])
        acks = self._effects.acks
        for start, end in merged:
            source = start >> bits
            cursor = self.cursors.get(source)
            if cursor is None:
                continue
            ranges = cursor.ack_range(start & mask, ((end - 1) & mask) + 1)
            if ranges:
                acks.setdefault(source, []).extend(ranges)

    def ack_below(self, source: int, cut: int) -> bool:
        """Acknowledge every offset of ``source`` below ``cut`` (messages older than the
        subscription's retention leave its backlog); True if anything changed."""
        cursor = self.cursors.get(source)
        if cursor is None or cut <= cursor.mark_delete:
            return False
        ranges = cursor.ack_range(cursor.mark_delete, cut)
        if ranges:
            self._effects.acks.setdefault(source, []).extend(ranges)
        self.read_offsets[source] = max(self.read_offsets.get(source, cut), cut)
        self._effects.pump = True
        return bool(ranges)

    def current(self, pos: int, generation: int) -> bool:
        """Whether (pos, generation) is the live lease (exactly-once checks)."""
        return self.leases.is_current(pos, generation)

    def modify_deadline(self, positions: list[tuple[int, int]], seconds: int, now: float) -> None:
        """Extend leases to now + seconds; 0 is a nack (redeliver, after any retry backoff)."""
        if seconds == 0:
            failed = False
            for pos, generation in positions:
                if self.leases.is_current(pos, generation):
                    self._release(pos)
                    self._failed(pos, now, nack=True)
                    failed = True
            if failed:
                self._effects.pump = True
            return
        consumers = self.roster.consumers
        for holder in self.leases.extend_all(positions, now, seconds):
            consumer = consumers.get(holder)
            if consumer is not None and consumer.stalled:
                consumer.stalled = False
                self._effects.pump = True

    # --- time ---------------------------------------------------------------------------------

    def next_wakeup(self) -> float | None:
        """The earliest of: a lease deadline, a backoff ending (monotonic seconds)."""
        at = self.leases.next_deadline()
        for t in (self._delayed.next_due(), self._delayed_keys.next_due()):
            if t is not None and (at is None or t < at):
                at = t
        return at

    def tick(self, now: float) -> bool:
        """Time passed: expire leases, end backoffs. True if there is something to deliver."""
        changed = False
        for pos, lease in self.leases.expired(now):
            self._returned(lease)
            consumer = self.consumers.get(lease.consumer)
            if consumer is not None and not lease.confirmed:
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
        return changed

    def reset(self, states: dict[int, CursorState]) -> None:
        """Replace the ack state (Seek): forget leases and redeliveries, read from the new
        mark-delete positions. Outstanding ack IDs stop working: their leases are gone."""
        for source, state in states.items():
            self._cursor(source).reset(state.mark_delete, state.ranges)
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
        self.read_offsets = {s: c.mark_delete for s, c in self.cursors.items()}
        self._effects.pump = True

    def cursor_states(self) -> dict[int, CursorState]:
        return {s: c.snapshot() for s, c in self.cursors.items()}

    # --- damaged messages (core/damage_policy.py) ----------------------------------------------

    def _past_damage(self, source: int, damage: DamagedRange, lost: list[int]) -> bool:
        """Whether delivery may go on past ``damaged`` in ``source``: every message in it is
        acked already, or the topic's policy skips them (their positions go to ``lost``)."""
        cursor = self._cursor(source)
        if damaged.all_acked(cursor, damage):
            return True
        if self.reader.damage_policy() is not DamagePolicy.SKIP:
            return False
        lost.extend(damaged.unacked_positions(cursor, source, damage))
        return True

    def _ack_lost(self, positions: list[int]) -> None:
        """Acknowledge damaged messages skipped by policy or by the operator: lost for good."""
        self.lost += len(positions)
        self._effects.lost.extend(positions)
        if self._damaged_positions:
            self._damaged_positions.difference_update(positions)
        self._ack_positions(positions)

    def skip_damaged(self, ranges: list[tuple[int, DamagedRange]]) -> int:
        """The operator skips these damaged ranges: acknowledge their unacked messages as lost
        (``pubsubd topics skip-damaged``). Returns how many were."""
        lost: list[int] = []
        for source, damage in ranges:
            cursor = self.cursors.get(source)
            if cursor is not None:
                lost.extend(damaged.unacked_positions(cursor, source, damage))
        if lost:
            self._ack_lost(lost)
        self._effects.pump = True
        return len(lost)

    def damage_status(self, ranges: list[tuple[int, DamagedRange]]) -> list[dict[str, int]]:
        """The damaged ranges holding unacked messages of this subscription."""
        found = []
        for source, d in ranges:
            cursor = self.cursors.get(source)
            unacked = damaged.unacked_count(cursor, d) if cursor is not None else 0
            if unacked:
                found.append(
                    {
                        "source": source,
                        "first_offset": d.first_offset,
                        "end_offset": d.end_offset,
                        "unacked": unacked,
                    }
                )
        return found

    def _requeue_restored(self) -> None:
        """Redeliveries that found their message damaged: those readable again (restored
        bytes) go back for delivery."""
        assert self._damaged_positions is not None
        for pos in list(self._damaged_positions):
            self._damaged_positions.discard(pos)
            # Still damaged: remembered again, or lost if the policy skips it (a restore from
            # the storage nodes that was under way when it was found may have failed since).
            if self.locate(pos) is not None:
                self._requeue(pos)

    # --- backlog ------------------------------------------------------------------------------

    def unacked_positions(
        self, count: int, older_than: Callable[[int, int], bool] | None
    ) -> list[int]:
        """The ``count`` oldest unacked positions, and beyond them any for which
        ``older_than(source, offset)`` holds (backlog quota ``evict_oldest``)."""
        evicted: list[int] = []
        reader = self.reader
        for source in range(reader.source_count()):
            cursor = self.cursors.get(source)
            if cursor is None:
                continue
            offset = cursor.next_unacked(cursor.mark_delete)
            committed = reader.committed_offset(source)
            while offset < committed:
                if len(evicted) >= count and (older_than is None or not older_than(source, offset)):
                    break
                evicted.append(ids.position(source, offset))
                offset = cursor.next_unacked(offset + 1)
        return evicted

    def close(self, error: PubsubError) -> None:
        """Stop: every consumer is ended with ``error``, leases are forgotten."""
        for consumer in list(self.consumers.values()):
            self._effects.ended.append((consumer, error))
        self.roster.clear()
        self.leases.clear()
