"""A Pulsar consumer on one connection (asyncio): a StreamingPull stream of its subscription.

The stream's ``client_id`` is the consumer, so pubsubd's subscription types (shared, exclusive,
failover, key_shared) decide who receives, as for any StreamingPull client; an exclusive
subscription's refusal (FAILED_PRECONDITION) is the client's ConsumerBusy. What the stream
delivers waits here until the client's FLOW permits allow a MESSAGE (one permit per message).

Batches: consecutive positions of one source with the same delivery attempt and publish time
go out as one MESSAGE holding a Pulsar batch (at most ``MAX_BATCH`` messages,
``MAX_BATCH_BYTES``), at entry = the first position, so message i is position entry + i (ids.py),
as for a producer's batch; the client splits it. The consumer keeps each delivery's ack IDs
under its (ledger, entry). The client acks a batch as Pulsar's does: with batch-index acks off
(pulsar-client's default) one ACK of (ledger, entry) once the application has acked every
message of it; with ``batch_index_ack_enabled`` an ACK of (ledger, entry) with ``ack_set``, the
batch's bits still unacked, as each is acked. Cumulative: (ledger, entry) covers the whole
batch, with ``ack_set`` up to its first unacked message; without batch-index acks a partial
batch is acked as (ledger, entry - 1). A REDELIVER (a nack, an ack timeout, the client's
dead-letter path) names (ledger, entry): what the consumer still holds of that batch is nacked,
so with batch-index acks only the unacked messages come back; without them the client has not
said which were acked, and the whole batch comes back (Pulsar's behaviour too). A reader's
consumer gets one message per MESSAGE (its client compares message IDs with
GET_LAST_MESSAGE_ID's, which names single positions).

Flow: the stream's window (``max_outstanding_messages``, which pubsubd lets a later request
move) is what this consumer holds unacked plus the client's unused permits, as a Pulsar broker
dispatches no more than the permits: a FLOW widens it, an ack or nack narrows it by what it
settles (in the same request), so the server never hands this consumer more than its client
asked for, and another consumer of a Shared subscription gets the rest; in process the
window also holds what the consumer reads ahead (READ_AHEAD_MAX: leased, planned, not sent,
and given back uncounted once its client stops sending FLOWs). Once the stream is
open, acks are settled in slices of ``ACK_SLICE`` messages, one per turn of the loop (a
grouped ACK names tens of thousands), so FLOWs read meanwhile are answered at once; an acked
message counts as held until settled, and a nack, a seek, a receipt or closing settles every
ack due first. At most
``MAX_OUTSTANDING`` unacked messages, and at least 1 (0 would mean no limit): a consumer
holding nothing with no permits may be handed one message ahead. Pulsar has no ack deadline,
so the leases of everything this consumer holds are extended every ``EXTEND_EVERY_S``; closing
the consumer (or losing its connection) nacks them, so they are redelivered at once. The
redelivery count is the stream's ``delivery_attempt`` - 1 (subscriptions carry
``pubsubd-delivery-attempts: always``).

A Failover consumer's stream asks for failover notices (core/active_notices.py): the server
tells it, in order with its messages, when it becomes or stops being a receiver of its source
(or of the subscription), and the consumer sends ACTIVE_CONSUMER_CHANGE.

A consumer of partition N (``TOPIC-partition-N``) opens its stream with the request header
``pubsubd-sources: N``, so the server hands it only source N's messages. A reader's consumer
(``auto_ack``) acknowledges what it sends at once: a reader's position is the client's, which
it sends again when it resubscribes (``start_message_id``).

The stream is a leg (streams.py): a StreamingPull call through the gateway, whose deliveries
are ReceivedMessages settled by ack ID (``_pump``), or in this process, whose responses are
raw (deliveries.RawDeliveries: the planner's columns), each message settled by (position,
generation) (``_pump_raw``, which writes the same frames for the same messages).
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any, TypeAlias

from pubsubd.core import active_notices, pb
from pubsubd.core.failover_rank import FailoverRank
from pubsubd.core.ids import OFFSET_BITS, OFFSET_MASK
from pubsubd.pulsar import commands, ids, messages, stored, streams
from pubsubd.pulsar.deliveries import DeliveryRun, RawDeliveries
from pubsubd.pulsar.errors import PulsarError
from pubsubd.pulsar.gateway import Gateway

log = logging.getLogger(__name__)

# What settles a delivered message: its ack ID over gRPC, (position, lease generation) over
# an in-process stream (streams.py), where a DeliveryRun settles a batch's (deliveries.py).
AckRef: TypeAlias = str | tuple[int, int] | DeliveryRun

# Unacked messages per consumer, as a Pulsar broker's ``maxUnackedMessagesPerConsumer`` default:
# the client acks in groups (every 100 ms), so a fast consumer holds 100 ms of messages it has
# acked; at 20,000 it stalled for the next group (BENCHMARKS.md, PC4).
MAX_OUTSTANDING = 50_000
# Messages whose acks are settled in one turn of the loop (Consumer._settle_some_acks): a few
# milliseconds of the planner's work.
ACK_SLICE = 4096
MAX_BATCH = 1000  # messages per delivered batch (the client's own batching default)
# In process, a consumer whose client asks for more than one message at a time reads ahead:
# the stream may lease it, beyond its client's permits, up to its client's largest FLOW (the
# receiver queue) and at most READ_AHEAD_MAX, so the next FLOW is answered from messages already
# planned, and the planning after it overlaps the client's work (BENCHMARKS.md, PC7). Messages
# read ahead were never sent: they go back without counting a delivery attempt when the
# client sends no FLOW for READ_AHEAD_IDLE_S (so a stalled consumer of a Shared subscription
# holds no more than its own receiver queue for long), when it closes, on a redeliver-all, and
# when a Failover consumer stops being the active one.
READ_AHEAD_MAX = MAX_BATCH
READ_AHEAD_IDLE_S = 0.25
MAX_BATCH_BYTES = 1024 * 1024  # payload bytes per delivered batch
STREAM_DEADLINE_S = 60
EXTEND_EVERY_S = 20.0


class Consumer:
    def __init__(
        self,
        gateway: Gateway,
        write: Callable[[bytes], None],
        consumer_id: int,
        subscription: str,
        client_id: str,
        cumulative_ok: bool,
        topic: str = "",
        sources: frozenset[int] | None = None,
        auto_ack: bool = False,
        failover: FailoverRank | None = None,
        open_in_process: streams.OpenInProcess | None = None,
    ) -> None:
        self.gateway = gateway
        self.write = write
        self.consumer_id = consumer_id
        self.subscription = subscription
        self.topic = topic
        self.sources = sources  # the partition's source; None: every source
        self.auto_ack = auto_ack  # a reader: acked as sent
        # A Failover consumer: how it ranks (core/failover_rank.py); it is told when it becomes
        # or stops being the active consumer.
        self.failover = failover
        self.client_id = client_id
        self.cumulative_ok = cumulative_ok
        self.permits = 0
        self._held_count = 0  # messages delivered to the client and not settled
        self._window = 1  # the stream's max_outstanding_messages as last sent
        # What waits for permits: ReceivedMessages; in process, RawDeliveries (deliveries.py),
        # holding ``_raw_buffered`` messages.
        self._buffer: deque[Any] = deque()
        self._raw_buffered = 0
        # (ledger, entry) of each MESSAGE the client holds -> the ack IDs of its messages
        # (index i: position entry + i), None once acked.
        # In process, a batch taken from one response is held as a DeliveryRun until part of
        # it is settled (_listed).
        self._sent: dict[tuple[int, int], list[AckRef | None] | DeliveryRun] = {}
        self.batching = not auto_ack
        # The stream under this consumer (streams.py): in this process when the server
        # allows it, else a StreamingPull on the gateway's channel.
        self._leg: streams.GrpcLeg | streams.LocalLeg = (
            streams.LocalLeg(
                open_in_process, subscription, client_id, STREAM_DEADLINE_S, sources, failover
            )
            if open_in_process is not None
            else streams.GrpcLeg(
                gateway, subscription, client_id, STREAM_DEADLINE_S, sources, failover
            )
        )
        # Its deliveries unframed (streams.LocalLeg.read): RawDeliveries, each message settled
        # as (position, generation), not ack IDs.
        self._raw = isinstance(self._leg, streams.LocalLeg)
        self._tasks: list[asyncio.Task[None]] = []
        self.closing = False
        self.paused = False  # during a seek: nothing goes to the client
        self.on_lost: Callable[[Consumer], None] | None = None
        # Acks read and not yet settled on the stream (settled in slices, _settle_some_acks),
        # and how to run the next slice in a later turn of the loop (set once the stream is
        # open; without it, acks are settled as read).
        self._acks_due: deque[AckRef] = deque()
        self._acks_scheduled = False
        self._defer: Callable[[Callable[[], None]], Any] | None = None
        # Reading ahead (READ_AHEAD_IDLE_S): what the stream may hold beyond the permits
        # (0: not now), the client's largest FLOW, when its last FLOW came (the loop's clock)
        # and the timer that ends reading ahead once it stops sending them.
        self._read_ahead = 0
        self._read_ahead_max = READ_AHEAD_MAX
        self._largest_flow = 0
        self._last_flow = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    async def open(self) -> None:
        """Open the stream; PulsarError if the subscription refuses this consumer."""
        await self._leg.open()
        self._loop = asyncio.get_running_loop()
        self._defer = self._loop.call_soon
        self._tasks = [
            asyncio.create_task(self._read(), name=f"pulsar_consumer_{self.consumer_id}"),
            asyncio.create_task(self._extend(), name=f"pulsar_leases_{self.consumer_id}"),
        ]

    def flow(self, permits: int) -> None:
        self.permits += permits
        if self._raw and permits > 1:  # a client with a receiver queue: read ahead
            self._largest_flow = min(max(self._largest_flow, permits), self._read_ahead_max)
            self._read_ahead = self._largest_flow
            if self._loop is not None:
                self._last_flow = self._loop.time()
                if self._idle_timer is None:
                    self._idle_timer = self._loop.call_later(READ_AHEAD_IDLE_S, self._idle_check)
        self._pump()
        window = self._wanted_window()
        if window > self._window:
            self._window = window
            self._leg.set_window(window)
            # In process, what the wider window delivers is written in this FLOW's step, not
            # after two turns of the loop (the dispatcher's pump, then the reader's).
            ready = self._leg.ready()
            if ready:
                self._buffered_more(ready)
                self._pump()

    def _buffered_more(self, received: Sequence[Any]) -> None:
        self._buffer.extend(received)
        if self._raw:
            self._raw_buffered += sum(map(len, received))

    def _wanted_window(self) -> int:
        """What the stream may hold for this consumer: its unsettled messages and the client's
        unused permits (what the buffer holds up to those is what the permits will take),
        and what it reads ahead."""
        return max(1, min(self._held_count + self.permits, MAX_OUTSTANDING) + self._read_ahead)

    def _idle_check(self) -> None:
        """The read-ahead timer: stop reading ahead once no FLOW came for READ_AHEAD_IDLE_S."""
        self._idle_timer = None
        loop = self._loop
        if loop is None or self.closing or not self._read_ahead:
            return
        idle = loop.time() - self._last_flow
        if idle < READ_AHEAD_IDLE_S or self.paused:
            self._idle_timer = loop.call_later(
                max(READ_AHEAD_IDLE_S - idle, 0.05), self._idle_check
            )
            return
        self.stop_reading_ahead()

    def told(self, active: bool) -> None:
        """A failover notice, in order with the deliveries: tell the client; a consumer that
        stops being active gives back what it read ahead (the active one takes it)."""
        self.write(commands.active_consumer_change(self.consumer_id, active))
        if not active and self._read_ahead:
            self.stop_reading_ahead()

    def stop_reading_ahead(self) -> None:
        """The stream holds no more than the permits for this consumer, and what it read
        ahead goes back without counting a delivery attempt (until the next FLOW)."""
        self._read_ahead = 0
        window = self._wanted_window()
        if window != self._window:
            self._window = window
            self._leg.set_window(window)
        unsent = self._unsent()
        if unsent:
            self._leg.give_back_unsent(unsent)

    def _settle(self, acks: list[AckRef], nacks: list[AckRef], settled: int) -> None:
        """Send ``acks`` or ``nacks`` (of ``settled`` held messages) with the window they
        narrow: settled messages make no room for more."""
        self._held_count = max(0, self._held_count - settled)
        window = self._wanted_window()
        moved = window != self._window
        self._window = window
        self._leg.settle(acks, nacks, window if moved else None)

    def _permitted(self) -> int:
        """How many buffered messages go out now (the permits they take are spent)."""
        buffered = self._raw_buffered if self._raw else len(self._buffer)
        count = 0 if self.paused else min(self.permits, buffered)
        self.permits -= count
        return count

    def _pump(self) -> None:
        if self._raw:
            self._pump_raw()
            return
        count = self._permitted()
        if not count:
            return
        buffer, sent, consumer_id = self._buffer, self._sent, self.consumer_id
        partition = next(iter(self.sources)) if self.sources is not None else -1
        out = []
        acked: list[AckRef] = []
        auto_ack, take = self.auto_ack, buffer.popleft
        held = 0
        max_batch = MAX_BATCH if self.batching else 1
        while count:  # once per delivered message: kept lean
            received = take()
            message = received.message
            pos = int(message.message_id)  # a position: source << 48 | offset (ids.py)
            ledger, entry = pos >> OFFSET_BITS, pos & OFFSET_MASK
            attempt = received.delivery_attempt
            redelivery = attempt - 1 if attempt > 1 else 0
            count -= 1
            batch = [message]
            ack_ids: list[AckRef | None] = [received.ack_id]
            # The batch takes the next messages while they are the next positions of the
            # source, with the same delivery attempt and publish time (a batch carries one).
            published, size, expected = message.publish_time, len(message.data), pos + 1
            while count and len(batch) < max_batch and size < MAX_BATCH_BYTES:
                nxt = buffer[0]
                m = nxt.message
                if (
                    int(m.message_id) != expected
                    or nxt.delivery_attempt != attempt
                    or m.publish_time != published
                ):
                    break
                take()
                batch.append(m)
                ack_ids.append(nxt.ack_id)
                size += len(m.data)
                expected += 1
                count -= 1
            if len(batch) > 1:
                sent[(ledger, entry)] = ack_ids
                held += len(ack_ids)
                out.append(
                    messages.batch_frame(consumer_id, ledger, entry, redelivery, batch, partition)
                )
                continue
            if auto_ack:
                acked.append(received.ack_id)
            else:
                sent[(ledger, entry)] = ack_ids
                held += 1
            out.append(
                messages.message_frame(consumer_id, ledger, entry, redelivery, message, partition)
            )
        self._held_count += held
        self.write(b"".join(out))
        if acked:  # a reader's: settled as sent, so the permits they took are gone too
            self._settle(acked, [], 0)

    def _pump_raw(self) -> None:
        """:meth:`_pump` over an in-process stream's responses (RawDeliveries, deliveries.py):
        a message is a plain entry's data with its publish time ``stamp``
        (``planner.Delivery.stamps``) or a serialized PubsubMessage (stamp None), batched from
        its bytes when plain (``stored.plain``), else parsed. A run of plain messages with one
        publish time, one attempt and consecutive positions joins a batch at once
        (``RawDeliveries.run``). The same frames as ``_pump`` for the same messages (a unit
        test and a property test compare them)."""
        count = self._permitted()
        if not count:
            return
        self._raw_buffered -= count
        chunks, sent, consumer_id = self._buffer, self._sent, self.consumer_id
        partition = next(iter(self.sources)) if self.sources is not None else -1
        out = []
        acked: list[AckRef] = []
        auto_ack, take = self.auto_ack, chunks.popleft
        held = 0
        max_batch = MAX_BATCH if self.batching else 1
        plain, plain_at, parse = stored.plain, stored.plain_at, pb.PubsubMessage.FromString
        while count:  # once per delivered batch (or message that is not plain)
            chunk: RawDeliveries = chunks[0]
            i = chunk.start
            pos = chunk.positions[i]
            attempt = chunk.attempt(i)
            raw = chunk.stored[i]
            stamp = chunk.stamp(i)
            delivery = (pos, chunk.first + i)
            chunk.start = i + 1
            if not chunk:
                take()
            ledger, entry = pos >> OFFSET_BITS, pos & OFFSET_MASK
            redelivery = attempt - 1 if attempt > 1 else 0
            count -= 1
            message: Any = None  # the first message parsed, if it is not plain
            if stamp is not None:  # a plain entry's data
                item: Any = raw
            else:
                first = plain(raw)
                if first is None:
                    message = parse(raw)
                    item, stamp = message, message.publish_time.SerializeToString()
                else:
                    item, stamp = first
            size = len(item) if message is None else len(message.data)
            batch = [item]
            # The batch's deliveries: one run while their generations follow each other
            # (as within one response), else a list.
            run_generation, run_count = delivery[1], 1
            listed: list[AckRef | None] | None = None
            expected = pos + 1
            time = b""  # stored.time_field(stamp), made when a serialized message follows
            # As _pump: the next positions of the source, same attempt and publish time.
            while count and len(batch) < max_batch and size < MAX_BATCH_BYTES:
                chunk = chunks[0]
                i = chunk.start
                if chunk.positions[i] != expected or chunk.attempt(i) != attempt:
                    break
                next_stamp = chunk.stamp(i)
                if next_stamp is not None:  # a plain entry's data: its time is the entry's
                    if next_stamp is not stamp and next_stamp != stamp:
                        break
                    k = chunk.run(i, min(count, max_batch - len(batch), len(chunk)))
                    data = chunk.stored[i : i + k]
                    # As one by one: a message joins while the batch is under the byte cap.
                    sums = list(accumulate(map(len, data), initial=size))
                    k = bisect_left(sums, MAX_BATCH_BYTES, 0, k)
                    batch += data[:k]
                    size = sums[k]
                    generation = chunk.first + i
                    if listed is None and generation == run_generation + run_count:
                        run_count += k
                    else:
                        if listed is None:
                            listed = [*DeliveryRun(pos, run_generation, run_count).pairs()]
                        listed += chunk.refs(i, i + k)
                else:
                    k = 1
                    next_raw = chunk.stored[i]
                    if not time:
                        time = stored.time_field(stamp)
                    one = plain_at(next_raw, time)  # plain, with this publish time
                    if one is not None:
                        batch.append(one)
                        size += len(one)
                    elif plain(next_raw) is not None:  # plain, another publish time
                        break
                    else:
                        m = parse(next_raw)
                        if m.publish_time.SerializeToString() != stamp:
                            break
                        batch.append(m)
                        size += len(m.data)
                    generation = chunk.first + i
                    if listed is None and generation == run_generation + run_count:
                        run_count += 1
                    else:
                        if listed is None:
                            listed = [*DeliveryRun(pos, run_generation, run_count).pairs()]
                        listed.append((expected, generation))
                chunk.start = i + k
                if not chunk:
                    take()
                expected += k
                count -= k
            if len(batch) > 1:
                sent[(ledger, entry)] = (
                    DeliveryRun(pos, run_generation, run_count) if listed is None else listed
                )
                held += len(batch)
                out.append(
                    messages.stored_batch_frame(
                        consumer_id,
                        ledger,
                        entry,
                        redelivery,
                        stored.publish_ms(stamp),
                        batch,
                        partition,
                    )
                )
                continue
            if auto_ack:
                acked.append(delivery)
            else:
                sent[(ledger, entry)] = [delivery]
                held += 1
            single = message if message is not None else parse(stored.message(item, stamp))
            out.append(
                messages.message_frame(consumer_id, ledger, entry, redelivery, single, partition)
            )
        self._held_count += held
        self.write(b"".join(out))
        if acked:  # a reader's: settled as sent, so the permits they took are gone too
            self._settle(acked, [], 0)

    def ack(self, cmd: Any) -> None:
        """ACK individual (a list of IDs, each a MESSAGE's (ledger, entry), with ``ack_set``
        for the batch's messages still unacked) or cumulative (everything up to an ID, same
        source)."""
        ack_ids: list[AckRef] = []
        if cmd.ack_type == cmd.Cumulative:
            if not self.cumulative_ok:
                log.info("cumulative ack on a shared subscription %s ignored", self.subscription)
                return
            for mid in cmd.message_id:
                self._take_through(mid.ledgerId, self._last_acked(mid), ack_ids)
        else:
            sent = self._sent
            for mid in cmd.message_id:
                key = (mid.ledgerId, mid.entryId)
                held = sent.get(key)
                if held is None:
                    self._take_position(mid.ledgerId, ids.key(mid)[1], ack_ids)
                elif mid.ack_set:  # batch-index ack: bit i set = message i not acked yet
                    words = mid.ack_set
                    held = self._listed(key)
                    for i, ack_id in enumerate(held):
                        if ack_id is not None and not _bit(words, i):
                            ack_ids.append(ack_id)
                            held[i] = None
                    if not any(held):
                        del sent[key]
                elif mid.batch_index >= 0 and len(held) > 1:
                    self._take_position(mid.ledgerId, mid.entryId + mid.batch_index, ack_ids)
                else:
                    del sent[key]
                    _take_all(held, ack_ids)
        if ack_ids:
            self._acks_due.extend(ack_ids)
            if cmd.HasField("request_id") or self._defer is None:
                self.settle_acks()  # before the receipt
            elif not self._acks_scheduled:
                self._acks_scheduled = True
                self._defer(self._settle_some_acks)
        if cmd.HasField("request_id"):
            self.write(commands.ack_response(self.consumer_id, cmd.request_id))

    def _settle_some_acks(self) -> None:
        """Settle at most ``ACK_SLICE`` messages of the acks due, the rest in a later turn of
        the loop: a grouped ACK of tens of thousands of messages does not hold the loop, and a
        FLOW read meanwhile is answered at once. Until settled, an acked message counts as held
        (the window stays as wide), so the stream never hands this consumer more than its
        client's permits."""
        self._acks_scheduled = False
        due = self._acks_due
        refs: list[AckRef] = []
        count = 0
        while due and count < ACK_SLICE:
            ref = due.popleft()
            refs.append(ref)
            count += ref.count if isinstance(ref, DeliveryRun) else 1
        if refs:
            self._settle(refs, [], count)
        if due and self._defer is not None:
            self._acks_scheduled = True
            self._defer(self._settle_some_acks)

    def settle_acks(self) -> None:
        """Settle every ack due now: before a nack, a seek or the end of the stream, which must
        find them settled (the client's order)."""
        due = self._acks_due
        if due:
            refs = list(due)
            due.clear()
            self._settle(refs, [], settled_count(refs))

    def _last_acked(self, mid: Any) -> int:
        """The last entry a cumulative ack of ``mid`` covers: a whole delivered batch, or with
        ``ack_set`` up to its first unacked message; else the position the ID names."""
        held = self._sent.get((mid.ledgerId, mid.entryId))
        if held is None:
            return int(ids.key(mid)[1])
        if mid.ack_set:
            first_unacked = next((i for i in range(len(held)) if _bit(mid.ack_set, i)), len(held))
            return int(mid.entryId) + first_unacked - 1
        if mid.batch_index >= 0:
            return int(mid.entryId + mid.batch_index)
        return int(mid.entryId) + len(held) - 1

    def _take_through(self, ledger: int, last: int, ack_ids: list[AckRef]) -> None:
        """Move the ack IDs of every held message of ``ledger`` at an entry up to ``last`` to
        ``ack_ids``."""
        sent = self._sent
        for key in [k for k in sent if k[0] == ledger and k[1] <= last]:
            if last - key[1] + 1 >= len(sent[key]):  # all of it
                _take_all(sent.pop(key), ack_ids)
                continue
            held = self._listed(key)
            for i in range(min(len(held), last - key[1] + 1)):
                ack_id = held[i]
                if ack_id is not None:
                    ack_ids.append(ack_id)
                    held[i] = None
            if not any(held):
                del sent[key]

    def _listed(self, key: tuple[int, int]) -> list[AckRef | None]:
        """The deliveries of the MESSAGE at ``key`` as a list, to settle some of them."""
        held = self._sent[key]
        if isinstance(held, DeliveryRun):
            held = self._sent[key] = [*held.pairs()]
        return held

    def _take_position(self, ledger: int, entry: int, ack_ids: list[AckRef]) -> None:
        """Move the ack ID of the one message at (ledger, entry), in whichever delivery holds it
        (an ID the client built itself, or one with a batch index), to ``ack_ids``."""
        for key, found in self._sent.items():
            if key[0] == ledger and key[1] <= entry < key[1] + len(found):
                held = self._listed(key)
                ack_id = held[entry - key[1]]
                if ack_id is not None:
                    ack_ids.append(ack_id)
                    held[entry - key[1]] = None
                if not any(held):
                    del self._sent[key]
                return

    def redeliver(self, cmd: Any) -> None:
        """Negative acks / ack timeout: the listed deliveries (what this consumer still holds of
        each), or (no list) all this one holds."""
        self.settle_acks()
        if cmd.message_ids:
            ack_ids: list[AckRef] = []
            for mid in cmd.message_ids:
                held = self._sent.pop((mid.ledgerId, mid.entryId), None)
                if held is None:  # not a delivery's ID: the message at that position
                    self._take_position(mid.ledgerId, ids.key(mid)[1], ack_ids)
                else:
                    _take_all(held, ack_ids)
        else:
            unsent = self._unsent()
            if unsent:  # never sent: not an attempt (over gRPC it is: GrpcLeg)
                self._leg.give_back_unsent(unsent)
            ack_ids = self._delivered()
            self._sent.clear()
        if ack_ids:
            self._settle([], ack_ids, settled_count(ack_ids))

    def _delivered(self) -> list[AckRef]:
        """The ack IDs of what this consumer delivered and its client has not acked."""
        held: list[AckRef] = []
        for ack_ids in self._sent.values():
            if isinstance(ack_ids, DeliveryRun):
                held += ack_ids.pairs()
            else:
                held += [a for a in ack_ids if a is not None]
        return held

    def _unsent(self) -> list[AckRef]:
        """Empty the buffer (what waits for permits); the ack IDs of what it held."""
        if self._raw:
            unsent = [d for c in self._buffer for d in c.refs(c.start, len(c.positions))]
        else:
            unsent = [r.ack_id for r in self._buffer]
        self._buffer.clear()
        self._raw_buffered = 0
        return unsent

    def _held(self) -> list[AckRef]:
        """The ack IDs of everything this consumer holds: delivered and unacked, or waiting
        for permits."""
        held = self._delivered()
        if self._raw:
            return held + [d for c in self._buffer for d in c.refs(c.start, len(c.positions))]
        return held + [r.ack_id for r in self._buffer]

    async def close(self) -> None:
        """End the stream, then give back what this consumer holds (redelivered at once).

        The nack goes after the stream has ended (``StreamLeg.give_back``: a unary
        ModifyAckDeadline, or in process the forwarder's call): nacked on the open stream, the
        messages could be sent straight back to it while it closes."""
        if self.closing:
            return
        self.closing = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.settle_acks()  # on the stream, before it ends
        reader = None
        for task in self._tasks:
            if task.get_name().startswith("pulsar_consumer"):
                reader = task
            else:
                task.cancel()
        await streams.end_reader(reader, self._leg)
        unsent = self._unsent()
        held = self._delivered()
        self._sent.clear()
        if self._raw:  # never sent: not an attempt
            if unsent:
                self._leg.give_back_unsent(unsent)
        else:  # over gRPC a give-back counts anyway (GrpcLeg.give_back_unsent)
            held += unsent
        log.debug(
            "closed Pulsar consumer %d: giving back %d, %d unsent",
            self.consumer_id,
            len(held),
            len(unsent),
        )
        if held:
            try:
                await self._leg.give_back(held)
            except PulsarError as e:  # the subscription is gone: nothing to give back
                log.info("Pulsar consumer %d: give-back failed: %s", self.consumer_id, e)

    async def _read(self) -> None:
        leg = self._leg
        try:
            while True:
                received = await leg.read()
                if received is None:
                    break
                if isinstance(received, active_notices.ActiveNotice):
                    self.told(received.active)
                    continue
                self._buffered_more(received)
                self._pump()
        except asyncio.CancelledError:
            return
        if not self.closing and self.on_lost is not None:
            self.on_lost(self)

    async def _extend(self) -> None:
        while True:
            await asyncio.sleep(EXTEND_EVERY_S)
            held = self._held()
            for start in range(0, len(held), 2500):
                self._leg.extend(held[start : start + 2500], STREAM_DEADLINE_S)


def _take_all(held: list[AckRef | None] | DeliveryRun, ack_ids: list[AckRef]) -> None:
    """Move what a MESSAGE's deliveries still hold to ``ack_ids``."""
    if isinstance(held, DeliveryRun):
        ack_ids.append(held)
    elif None in held:
        ack_ids += [a for a in held if a is not None]
    else:
        ack_ids += held  # type: ignore[arg-type]  # no None in it


def settled_count(refs: list[AckRef]) -> int:
    """How many deliveries ``refs`` names (a DeliveryRun names its count)."""
    return len(refs) + sum(r.count - 1 for r in refs if isinstance(r, DeliveryRun))


def _bit(words: Any, i: int) -> bool:
    """Bit ``i`` of a Pulsar ack set (64-bit words, least significant bit first)."""
    word = i >> 6
    return word < len(words) and bool((words[word] >> (i & 63)) & 1)


def check_subscription(existing: Any, topic: str, wanted_type: str, type_label: str) -> None:
    """An existing subscription must be of the topic and type the consumer asks for."""
    if existing.topic != topic:
        raise PulsarError(
            "NotAllowedError",
            f"subscription {existing.name} belongs to topic {existing.topic}, not {topic}",
        )
    actual = existing.labels.get(type_label, "shared")
    if actual != wanted_type:
        raise PulsarError(
            "NotAllowedError",
            f"subscription {existing.name} is of type {actual}; subscribe with that type",
        )
