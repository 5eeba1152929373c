"""A Pulsar producer on one connection (asyncio): SENDs become PublishDeduplicated calls.

SENDs queue in arrival order; one task publishes them, at most one call in flight per producer,
taking every queued SEND that fits one request (1,000 messages, 9 MB) so a producer's messages
are stored in the order sent, and writes the SEND_RECEIPTs in that order (the client requires
it). A batch of n messages is stored at n consecutive offsets and its receipt names the first.
Each message's dedup ID is ``pulsar/INCARNATION/PRODUCER/SEQUENCE_ID``: a SEND the client
repeats after a reconnect is stored once and acknowledged with the original ID. A producer of
partition N (``TOPIC-partition-N``) stores every message in publish message source N, and its
dedup IDs carry the partition (``pulsar/INCARNATION/partition-N/...``): the client numbers each
partition's sends on its own.

Access modes (Shared, Exclusive, WaitForExclusive, ExclusiveWithFencing) are decided per topic
by access.py before a Producer is made; a fenced producer stops with ``fence``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pubsubd.core.deadlines import within
from pubsubd.pulsar import commands, frames, ids, messages
from pubsubd.pulsar.errors import PulsarError
from pubsubd.pulsar.gateway import Gateway
from pubsubd.pulsar.messages import OutMessage

log = logging.getLogger(__name__)

MAX_REQUEST_MESSAGES = 1000
# SEND errors that are the message's own fault (errors.py: INVALID_ARGUMENT and the like, a
# payload that cannot be read): answered as ChecksumError, see Producer._answer.
_REFUSED_MESSAGE = frozenset({"NotAllowedError", "UnknownError"})
MAX_REQUEST_BYTES = 9 * 1024 * 1024


@dataclass(slots=True)
class PendingSend:
    sequence_id: int
    highest_sequence_id: int
    messages: list[OutMessage] = field(default_factory=list)
    size: int = 0
    error: PulsarError | None = None
    message_ids: list[str] = field(default_factory=list)


class Producer:
    def __init__(
        self,
        gateway: Gateway,
        write: Callable[[bytes], None],
        producer_id: int,
        topic: str,
        name: str,
        dedup_prefix: str,
        on_stored: Callable[[int], None],
        source: int | None = None,
    ) -> None:
        self.gateway = gateway
        self.write = write
        self.producer_id = producer_id
        self.topic = topic
        self.name = name
        self.dedup_prefix = dedup_prefix
        self.on_stored = on_stored  # the highest sequence ID stored so far (for reconnects)
        self.source = source  # a partition's producer: its publish message source
        self._queue: deque[PendingSend] = deque()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"pulsar_producer_{producer_id}")

    def send(self, cmd: Any, frame: frames.Frame) -> None:
        """Queue one SEND; its receipt (or error) follows in order."""
        seq = cmd.sequence_id
        highest = cmd.highest_sequence_id or seq + max(cmd.num_messages, 1) - 1
        pending = PendingSend(seq, highest)
        if frame.checksum_ok is False:
            pending.error = PulsarError("ChecksumError", "payload checksum does not match")
        elif frame.metadata is None:
            pending.error = PulsarError("UnknownError", "SEND without metadata and payload")
        else:
            try:
                out = messages.unpack_send(
                    self.name, seq, frame.metadata, frame.payload, self.dedup_prefix
                )
            except messages.BadPayload as e:
                pending.error = PulsarError("UnknownError", str(e))
            else:
                pending.messages = out
                pending.size = sum(len(m.data) for m in out) + 64 * len(out)
        self._queue.append(pending)
        self._wake.set()

    async def close(self) -> None:
        """Stop after the SENDs already queued are answered."""
        self._queue.append(PendingSend(-1, -1))  # the end marker
        self._wake.set()
        try:
            await within(asyncio.shield(self._task), 30)
        except TimeoutError:
            self._task.cancel()

    async def fence(self) -> None:
        """Stop at once (another producer took the topic, ExclusiveWithFencing): queued SENDs
        are dropped unanswered (the client sends them again when it reconnects, and is refused
        then), the publish in flight is finished and answered, so nothing of this producer is
        stored after the fencing producer's first message."""
        self._queue.clear()
        await self.close()

    def abort(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                if self._queue[0].sequence_id == -1 and self._queue[0].highest_sequence_id == -1:
                    return
                group = self._take()
                await self._publish(group)
                for pending in group:
                    self._answer(pending)

    def _take(self) -> list[PendingSend]:
        group: list[PendingSend] = []
        count = size = 0
        while self._queue:
            head = self._queue[0]
            if head.sequence_id == -1 and head.highest_sequence_id == -1:
                break
            if group and (
                count + len(head.messages) > MAX_REQUEST_MESSAGES
                or size + head.size > MAX_REQUEST_BYTES
            ):
                break
            group.append(self._queue.popleft())
            count += len(head.messages)
            size += head.size
        return group

    async def _publish(self, group: list[PendingSend]) -> None:
        batch = [m for p in group if p.error is None for m in p.messages]
        if not batch:
            return
        try:
            # A SEND of over 1,000 messages alone in its group is stored as several batches.
            found: list[str] = []
            for start in range(0, len(batch), MAX_REQUEST_MESSAGES):
                chunk = batch[start : start + MAX_REQUEST_MESSAGES]
                found += await self.gateway.publish(self.topic, chunk, self.source)
        except PulsarError as e:
            for p in group:
                p.error = p.error or e
            return
        at = 0
        for p in group:
            if p.error is None:
                p.message_ids = found[at : at + len(p.messages)]
                at += len(p.messages)

    def _answer(self, pending: PendingSend) -> None:
        if pending.error is not None:
            error = pending.error
            if error.error in _REFUSED_MESSAGE:
                # The C++ client fails one message only on a ChecksumError; any other SEND_ERROR
                # closes the connection and sends the message again, forever (it never
                # times out). A message refused for what it is (a schema, its properties, its
                # payload) is answered so; the text says why (the client logs it).
                error = PulsarError("ChecksumError", f"refused: {error.message}")
            self.write(
                commands.send_error(
                    self.producer_id, pending.sequence_id, error.code, error.message
                )
            )
            return
        ledger, entry = (
            ids.from_message_id(pending.message_ids[0]) if pending.message_ids else (0, 0)
        )
        self.on_stored(pending.highest_sequence_id)
        self.write(
            commands.send_receipt(
                self.producer_id, pending.sequence_id, pending.highest_sequence_id, ledger, entry
            )
        )
