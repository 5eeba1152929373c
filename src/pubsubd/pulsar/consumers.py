"""A Pulsar consumer on one connection (asyncio): a StreamingPull stream of its subscription.

The stream's ``client_id`` is the consumer, so pubsubd's subscription types (shared, exclusive,
failover, key_shared) decide who receives, as for any StreamingPull client; an exclusive
subscription's refusal (FAILED_PRECONDITION) is the client's ConsumerBusy. What the stream
delivers waits here until the client's FLOW permits allow a MESSAGE (one permit per message;
delivered messages are never batched). The stream holds at most ``MAX_OUTSTANDING`` unacked
messages. Pulsar has no ack deadline, so the leases of everything this consumer holds are
extended every ``EXTEND_EVERY_S``; closing the consumer (or losing its connection) nacks them,
so they are redelivered at once. The redelivery count is the stream's ``delivery_attempt`` - 1
(subscriptions carry ``pubsubd-delivery-attempts: always``).

A consumer of partition N (``TOPIC-partition-N``) opens its stream with the request header
``pubsubd-sources: N``, so the server hands it only source N's messages. A reader's consumer
(``auto_ack``) acknowledges what it sends at once: a reader's position is the client's, which
it sends again when it resubscribes (``start_message_id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

from pubsubd.core import pb
from pubsubd.core.errors import STREAM_ACCEPTED
from pubsubd.core.ids import OFFSET_BITS, OFFSET_MASK
from pubsubd.core.publish_sources import STREAM_SOURCES_HEADER
from pubsubd.pulsar import commands, errors, ids, messages
from pubsubd.pulsar.errors import PulsarError
from pubsubd.pulsar.gateway import Gateway, requests_from

log = logging.getLogger(__name__)

MAX_OUTSTANDING = 20000
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
    ) -> None:
        self.gateway = gateway
        self.write = write
        self.consumer_id = consumer_id
        self.subscription = subscription
        self.topic = topic
        self.sources = sources  # the partition's source; None: every source
        self.auto_ack = auto_ack  # a reader: acked as sent
        self.client_id = client_id
        self.cumulative_ok = cumulative_ok
        self.permits = 0
        self._buffer: deque[Any] = deque()  # ReceivedMessages waiting for permits
        self._sent: dict[tuple[int, int], str] = {}  # (ledger, entry) -> ack ID
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self.closing = False
        self.paused = False  # during a seek: nothing goes to the client
        self.on_lost: Callable[[Consumer], None] | None = None

    async def open(self) -> None:
        """Open the stream; PulsarError if the subscription refuses this consumer."""
        self._requests.put_nowait(
            pb.StreamingPullRequest(
                subscription=self.subscription,
                stream_ack_deadline_seconds=STREAM_DEADLINE_S,
                max_outstanding_messages=MAX_OUTSTANDING,
                client_id=self.client_id,
            )
        )
        metadata = self.gateway.metadata
        if self.sources is not None:
            header = (STREAM_SOURCES_HEADER, ",".join(map(str, sorted(self.sources))))
            metadata = (*(metadata or ()), header)
        self._call = self.gateway.streaming_pull(requests_from(self._requests), metadata=metadata)
        headers = await self._call.initial_metadata()
        if STREAM_ACCEPTED not in tuple(headers or ()):
            code = await self._call.code()
            details = await self._call.details()
            raise errors.from_status(code, details or "", subscription=True)
        self._tasks = [
            asyncio.create_task(self._read(), name=f"pulsar_consumer_{self.consumer_id}"),
            asyncio.create_task(self._extend(), name=f"pulsar_leases_{self.consumer_id}"),
        ]

    def flow(self, permits: int) -> None:
        self.permits += permits
        self._pump()

    def _pump(self) -> None:
        buffer, sent, consumer_id = self._buffer, self._sent, self.consumer_id
        partition = next(iter(self.sources)) if self.sources is not None else -1
        count = 0 if self.paused else min(self.permits, len(buffer))
        if not count:
            return
        out = []
        acked: list[str] = []
        auto_ack, take, frame = self.auto_ack, buffer.popleft, messages.message_frame
        for _ in range(count):  # once per delivered message: kept lean
            received = take()
            message = received.message
            pos = int(message.message_id)  # a position: source << 48 | offset (ids.py)
            ledger, entry = pos >> OFFSET_BITS, pos & OFFSET_MASK
            if auto_ack:
                acked.append(received.ack_id)
            else:
                sent[(ledger, entry)] = received.ack_id
            attempt = received.delivery_attempt
            redelivery = attempt - 1 if attempt > 1 else 0
            out.append(frame(consumer_id, ledger, entry, redelivery, message, partition))
        self.permits -= count
        self.write(b"".join(out))
        if acked:
            self._requests.put_nowait(pb.StreamingPullRequest(ack_ids=acked))

    def ack(self, cmd: Any) -> None:
        """ACK individual (a list of IDs) or cumulative (everything up to an ID, same source)."""
        ack_ids: list[str] = []
        if cmd.ack_type == cmd.Cumulative:
            if not self.cumulative_ok:
                log.info("cumulative ack on a shared subscription %s ignored", self.subscription)
                return
            for mid in cmd.message_id:
                ledger, entry = ids.key(mid)
                done = [k for k in self._sent if k[0] == ledger and k[1] <= entry]
                ack_ids += [self._sent.pop(k) for k in done]
        else:
            pop = self._sent.pop
            for mid in cmd.message_id:
                ack_id = pop(ids.key(mid), None)
                if ack_id is not None:
                    ack_ids.append(ack_id)
        if ack_ids:
            self._requests.put_nowait(pb.StreamingPullRequest(ack_ids=ack_ids))
        if cmd.HasField("request_id"):
            self.write(commands.ack_response(self.consumer_id, cmd.request_id))

    def redeliver(self, cmd: Any) -> None:
        """Negative acks / ack timeout: the listed messages, or (no list) all this one holds."""
        if cmd.message_ids:
            keys = [ids.key(mid) for mid in cmd.message_ids]
            ack_ids = [a for a in (self._sent.pop(k, None) for k in keys) if a is not None]
        else:
            ack_ids = list(self._sent.values()) + [r.ack_id for r in self._buffer]
            self._sent.clear()
            self._buffer.clear()
        self._nack(ack_ids)

    def _nack(self, ack_ids: list[str]) -> None:
        if ack_ids:
            self._requests.put_nowait(
                pb.StreamingPullRequest(
                    modify_deadline_ack_ids=ack_ids, modify_deadline_seconds=[0] * len(ack_ids)
                )
            )

    async def close(self) -> None:
        """End the stream, then give back what this consumer holds (redelivered at once).

        The nack goes after the stream has ended (a unary ModifyAckDeadline): nacked on the
        open stream, the messages could be sent straight back to it while it closes."""
        if self.closing:
            return
        self.closing = True
        self._requests.put_nowait(None)  # half-close: the server ends the stream
        for task in self._tasks:
            if task.get_name().startswith("pulsar_leases"):
                task.cancel()
        reader = [t for t in self._tasks if t.get_name().startswith("pulsar_consumer")]
        if reader:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(reader[0]), 5)
        if self._call is not None:
            self._call.cancel()
        for task in self._tasks:
            task.cancel()
        held = list(self._sent.values()) + [r.ack_id for r in self._buffer]
        self._sent.clear()
        self._buffer.clear()
        log.debug("closed Pulsar consumer %d: giving back %d", self.consumer_id, len(held))
        if held:
            try:
                await self.gateway.nack(self.subscription, held)
            except PulsarError as e:  # the subscription is gone: nothing to give back
                log.info("Pulsar consumer %d: give-back failed: %s", self.consumer_id, e)

    async def _read(self) -> None:
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                self._buffer.extend(response.received_messages)
                self._pump()
        except grpc.aio.AioRpcError as e:
            if not self.closing:
                log.info("stream of Pulsar consumer %d ended: %s", self.consumer_id, e.code())
        except asyncio.CancelledError:
            return
        if not self.closing and self.on_lost is not None:
            self.on_lost(self)

    async def _extend(self) -> None:
        while True:
            await asyncio.sleep(EXTEND_EVERY_S)
            held = list(self._sent.values()) + [r.ack_id for r in self._buffer]
            for start in range(0, len(held), 2500):
                part = held[start : start + 2500]
                self._requests.put_nowait(
                    pb.StreamingPullRequest(
                        modify_deadline_ack_ids=part,
                        modify_deadline_seconds=[STREAM_DEADLINE_S] * len(part),
                    )
                )


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
