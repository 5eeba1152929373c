"""The StreamingPull under a Pulsar consumer (asyncio): through gRPC, or in this process.

A consumer (consumers.py) reads its subscription through one *leg*, a StreamingPull seen as
calls: open, read the next delivered messages, settle (acks and nacks, with the window they
leave), extend leases, move the window, close.

- :class:`GrpcLeg`: a StreamingPull call on the gateway's channel (gateway.py), each settle a
  stream request. The front of a frontend process, and any server whose gRPC port checks its
  callers (tokens, IAM), uses it: every call is checked as a client's.
- :class:`LocalLeg`: the same stream opened in this process by the StreamingPull handler's
  own code (``SubscriberServicer.open_in_process``: the same checks of the first request, the
  same ``SubscribingForwarderApi.open_stream``), its requests applied as the handler applies
  them (acks, then deadline changes, then the window; ``alive`` on each), its responses read
  from the stream handle. No HTTP/2 framing, no serialization of requests, no second parse of
  each response by a gRPC client. ``pubsubd serve`` uses it when nothing checks callers on its
  gRPC port. Every delivery rule (leases, attempts, ordering, filters, dead letters,
  subscription types) stays in the subscribing forwarder: both legs reach the same calls.

A leg reports the end of its stream by ``read`` returning None (the server ended it: a
deleted subscription, a shutdown); the consumer then tells its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc

from pubsubd.api.grpc.status import to_status
from pubsubd.core import active_notices, failover_rank, pb
from pubsubd.core.active_notices import ActiveNotice
from pubsubd.core.deadlines import within
from pubsubd.core.errors import STREAM_ACCEPTED, PubsubError
from pubsubd.core.failover_rank import FailoverRank
from pubsubd.core.publish_sources import STREAM_SOURCES_HEADER
from pubsubd.core.roles import StreamHandle, SubscribingForwarderApi
from pubsubd.observability import metrics
from pubsubd.pulsar import errors
from pubsubd.pulsar.deliveries import RawDeliveries, as_pairs, as_runs
from pubsubd.pulsar.gateway import Gateway, requests_from

log = logging.getLogger(__name__)

# How long a closing leg waits for the server to end its stream after the half-close.
CLOSE_WAIT_S = 5.0

# The in-process StreamingPull opener: (first request, sources, wants failover notices, failover
# rank) -> the subscribing forwarder and the stream; raises PubsubError as the handler would.
OpenInProcess = Callable[
    [Any, frozenset[int] | None, bool, FailoverRank | None],
    tuple[SubscribingForwarderApi, StreamHandle],
]


class StreamLeg(Protocol):
    async def open(self) -> None:
        """Open the stream; PulsarError if the subscription refuses it."""
        ...

    async def read(self) -> Sequence[Any] | ActiveNotice | None:
        """The next delivered messages (ReceivedMessages; in process, one response's
        RawDeliveries: ``planner.Delivery``'s columns), a failover notice, or None: the stream
        ended."""
        ...

    def settle(self, acks: list[Any], nacks: list[Any], window: int | None) -> None:
        """Acknowledge ``acks``, redeliver ``nacks`` now, then set the window (None: as is).
        Each names one delivery: an ack ID (gRPC), a (position, generation) (in process); in
        process a DeliveryRun names a batch's (deliveries.py)."""
        ...

    def extend(self, deliveries: list[Any], seconds: int) -> None: ...

    def set_window(self, window: int) -> None: ...

    def ready(self) -> list[Any]:
        """Deliveries available at once, in order before anything ``read`` returns later
        (in process: what a wider window delivers in this step; over gRPC: none)."""
        ...

    async def give_back(self, deliveries: list[Any]) -> None:
        """After ``close``: redeliver these now (PulsarError if the subscription is gone)."""
        ...

    def give_back_unsent(self, deliveries: list[Any]) -> None:
        """Deliveries the consumer never sent to its client go to any consumer now, without
        counting a delivery attempt where the leg can (in process; after ``close`` too)."""
        ...

    async def close(self) -> None:
        """End the stream: what it delivered stays leased (the consumer gives it back)."""
        ...


def _first_request(subscription: str, deadline_s: int, client_id: str) -> Any:
    return pb.StreamingPullRequest(
        subscription=subscription,
        stream_ack_deadline_seconds=deadline_s,
        max_outstanding_messages=1,
        client_id=client_id,
    )


class GrpcLeg:
    """A StreamingPull call on the gateway's channel."""

    def __init__(
        self,
        gateway: Gateway,
        subscription: str,
        client_id: str,
        deadline_s: int,
        sources: frozenset[int] | None,
        rank: FailoverRank | None,
    ) -> None:
        self.gateway = gateway
        self.subscription = subscription
        self.client_id = client_id
        self.deadline_s = deadline_s
        self.sources = sources
        self.rank = rank
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        self._call: Any = None
        self._closing = False

    async def open(self) -> None:
        self._requests.put_nowait(
            _first_request(self.subscription, self.deadline_s, self.client_id)
        )
        metadata = self.gateway.metadata
        if self.sources is not None:
            header = (STREAM_SOURCES_HEADER, ",".join(map(str, sorted(self.sources))))
            metadata = (*(metadata or ()), header)
        if self.rank is not None:
            metadata = (
                *(metadata or ()),
                (active_notices.HEADER, "1"),
                (failover_rank.HEADER, failover_rank.encode(self.rank)),
            )
        self._call = self.gateway.streaming_pull(requests_from(self._requests), metadata=metadata)
        headers = await self._call.initial_metadata()
        if STREAM_ACCEPTED not in tuple(headers or ()):
            code = await self._call.code()
            details = await self._call.details()
            await self.close()  # refused: nothing reads this leg again
            raise errors.from_status(code, details or "", subscription=True)

    async def read(self) -> Sequence[Any] | ActiveNotice | None:
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as e:
            if not self._closing:
                log.info("stream of %s ended: %s", self.subscription, e.code())
            return None
        if response is grpc.aio.EOF:
            return None
        if isinstance(response, ActiveNotice):
            return response
        return response.received_messages  # type: ignore[no-any-return]

    def settle(self, acks: list[Any], nacks: list[Any], window: int | None) -> None:
        if acks:
            request = pb.StreamingPullRequest(ack_ids=acks)
        else:
            request = pb.StreamingPullRequest(
                modify_deadline_ack_ids=nacks, modify_deadline_seconds=[0] * len(nacks)
            )
        if window is not None:
            request.max_outstanding_messages = window
        self._requests.put_nowait(request)

    def extend(self, deliveries: list[Any], seconds: int) -> None:
        self._requests.put_nowait(
            pb.StreamingPullRequest(
                modify_deadline_ack_ids=deliveries,
                modify_deadline_seconds=[seconds] * len(deliveries),
            )
        )

    def set_window(self, window: int) -> None:
        self._requests.put_nowait(pb.StreamingPullRequest(max_outstanding_messages=window))

    def ready(self) -> list[Any]:
        return []  # a response arrives only through the call's reader

    def give_back_unsent(self, deliveries: list[Any]) -> None:
        # google.pubsub.v1 has no call that gives a delivery back uncounted: a nack, on the
        # stream while it is open. Only an in-process consumer reads ahead (consumers.py), so
        # this is at most the one message a consumer is handed ahead of its permits.
        self.settle([], deliveries, None)

    def half_close(self) -> None:
        """No more requests: the server ends the stream (its reader then reads None)."""
        self._closing = True
        self._requests.put_nowait(None)

    async def give_back(self, deliveries: list[Any]) -> None:
        # A unary ModifyAckDeadline(0): the stream is over.
        await self.gateway.nack(self.subscription, deliveries)

    async def close(self) -> None:
        # The request iterator ends too: grpc.aio's task that reads it would otherwise wait
        # on the queue after a stream the server ended, and be destroyed pending.
        self._requests.put_nowait(None)
        if self._call is not None:
            self._call.cancel()


class LocalLeg:
    """The StreamingPull handler's stream, opened and driven in this process."""

    def __init__(
        self,
        open_in_process: OpenInProcess,
        subscription: str,
        client_id: str,
        deadline_s: int,
        sources: frozenset[int] | None,
        rank: FailoverRank | None,
    ) -> None:
        self._open_in_process = open_in_process
        self.subscription = subscription
        self.client_id = client_id
        self.deadline_s = deadline_s
        self.sources = sources
        self.rank = rank
        self._forwarder: SubscribingForwarderApi | None = None
        self._stream: StreamHandle | None = None
        self._incarnation = ""  # the subscription's, which its deliveries belong to
        self._closed = False

    async def open(self) -> None:
        first = _first_request(self.subscription, self.deadline_s, self.client_id)
        try:
            self._forwarder, self._stream = self._open_in_process(
                first, self.sources, self.rank is not None, self.rank
            )
        except PubsubError as e:
            raise _pulsar_error(e) from e
        self._incarnation = self._stream.incarnation
        metrics.OPEN_STREAMS.inc()

    async def read(self) -> Sequence[Any] | ActiveNotice | None:
        stream = self._stream
        assert stream is not None
        item = await stream.next_response()
        if isinstance(item, ActiveNotice):
            return item
        if isinstance(item, BaseException):
            if not self._closed:
                log.info("stream of %s ended: %s", self.subscription, item)
            return None
        return [_deliveries(item)]

    def ready(self) -> list[Any]:
        """Deliver now what the window allows (the stream's ``take_ready``) and return the
        responses queued for this leg (RawDeliveries each), as ``read`` would return them one
        at a time; a notice or the stream's end stays for ``read``."""
        stream = self._stream
        if stream is None or self._closed:
            return []
        return [_deliveries(item) for item in stream.take_ready()]

    def _apply(self, apply: Callable[[SubscribingForwarderApi, StreamHandle], None]) -> None:
        """Apply one request's worth, as the handler's reader does: a domain error ends the
        stream with it (its reader reads None)."""
        forwarder, stream = self._forwarder, self._stream
        if forwarder is None or stream is None or self._closed:
            return
        stream.alive()
        try:
            apply(forwarder, stream)
        except PubsubError as e:
            stream.end(e)

    def settle(self, acks: list[Any], nacks: list[Any], window: int | None) -> None:
        name, incarnation = self.subscription, self._incarnation

        def apply(forwarder: SubscribingForwarderApi, stream: StreamHandle) -> None:
            if acks:
                runs = as_runs(acks)
                forwarder.acknowledge_runs(name, incarnation, runs)
                metrics.ACKED_MESSAGES.inc(sum(count for _, _, count in runs))
            if nacks:
                forwarder.modify_deadline_deliveries(name, incarnation, as_pairs(nacks), 0)
            if window is not None:
                stream.set_max_messages(window)

        self._apply(apply)

    def extend(self, deliveries: list[Any], seconds: int) -> None:
        name, incarnation = self.subscription, self._incarnation
        pairs = as_pairs(deliveries)
        self._apply(
            lambda forwarder, _: forwarder.modify_deadline_deliveries(
                name, incarnation, pairs, seconds
            )
        )

    def set_window(self, window: int) -> None:
        self._apply(lambda _, stream: stream.set_max_messages(window))

    def half_close(self) -> None:
        """No more requests; ``close`` ends the stream."""

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            # Responses not yet read go back (no delivery attempt counted), as when the
            # handler's stream ends with responses it never wrote.
            self._stream.close()
            metrics.OPEN_STREAMS.dec()

    def give_back_unsent(self, deliveries: list[Any]) -> None:
        forwarder = self._forwarder
        if forwarder is None:
            return
        try:
            forwarder.give_back_deliveries(
                self.subscription, self._incarnation, as_pairs(deliveries)
            )
        except PubsubError as e:  # the subscription is gone or recreated: nothing to give back
            log.info("%s: unsent deliveries not given back: %s", self.subscription, e)

    async def give_back(self, deliveries: list[Any]) -> None:
        if self._forwarder is None:
            return
        try:
            self._forwarder.modify_deadline_deliveries(
                self.subscription, self._incarnation, as_pairs(deliveries), 0
            )
        except PubsubError as e:
            raise _pulsar_error(e) from e


def _deliveries(item: Any) -> RawDeliveries:
    """A raw response's deliveries, as its columns (deliveries.py).

    Raw (the stream was opened so): the stored messages, their positions, the first lease
    generation (message i's is first + i), the attempts and each message's form (None: a
    serialized PubsubMessage; else its data, and this its publish time)."""
    assert len(item) == 5, "an in-process stream's responses are raw"
    stored, positions, first, attempts, stamps = item
    count = len(positions)
    assert len(stored) == count and (attempts is None or len(attempts) == count)
    assert stamps is None or len(stamps) == count
    metrics.DELIVERED_MESSAGES.inc(count)
    return RawDeliveries(positions, first, attempts, stored, stamps)


def _pulsar_error(e: PubsubError) -> errors.PulsarError:
    """What the gRPC leg would have reported for ``e`` (its status, as the handler answers)."""
    return errors.from_status(to_status(e)[0], str(e), subscription=True)


async def end_reader(reader: asyncio.Task[None] | None, leg: GrpcLeg | LocalLeg) -> None:
    """Close ``leg`` under its consumer's ``reader`` task: over gRPC, half-close and let the
    reader take what the server still sends until it ends the stream (at most
    ``CLOSE_WAIT_S``); in process, stop the reader first (what it has not read goes back with
    the stream)."""
    if reader is not None and isinstance(leg, GrpcLeg):
        leg.half_close()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
            await within(asyncio.shield(reader), CLOSE_WAIT_S)
    if reader is not None:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
    await leg.close()
