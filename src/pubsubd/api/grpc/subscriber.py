"""google.pubsub.v1.Subscriber servicer: subscription admin, Pull, StreamingPull, acks.

StreamingPull runs two halves: a reader task applies the client's stream requests (the first one
opens the consumer; later ones carry heartbeats, acks, deadline changes), while the handler itself
writes the consumer's responses. A stream is never ended with OK by the server: the official
client treats that as a fatal error, so shutdown ends streams with UNAVAILABLE and clients
reconnect. An open stream is held to its caller's token and permission
(``core/stream_guard.py``): it ends UNAVAILABLE when the token expires (the client reopens it
with fresh credentials) and PERMISSION_DENIED when a policy change revokes consume.

Every admin call (subscriptions, snapshots, Seek) first applies what other processes wrote
before it (``Catalog.caught_up``), as the publisher's do. A write to a subscription (delete,
update, push config) is answered once the other forwarders serving it have applied it too
(``after_write``: api/grpc/serving_catch_up.py in a cluster of forwarders).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError

from pubsubd.api.grpc.status import parsing, rpc, to_status, unary_method
from pubsubd.control.catalog import Catalog
from pubsubd.control.router import Routes
from pubsubd.control.snapshots import Snapshots
from pubsubd.control.update_retry import retry_update
from pubsubd.core import active_notices, failover_rank, names, pb, stream_guard, validation, wire
from pubsubd.core.errors import (
    STREAM_ACCEPTED,
    FailedPrecondition,
    InvalidArgument,
    NotServedHere,
    PubsubError,
)
from pubsubd.core.failover_rank import FailoverRank
from pubsubd.core.publish_sources import STREAM_SOURCES_HEADER, stream_sources
from pubsubd.core.roles import StreamHandle, SubscribingForwarderApi
from pubsubd.observability import metrics, sli
from pubsubd.storage.metadata import SubscriptionRecord

log = logging.getLogger(__name__)
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# A Pull with no deadline waits at most this long for the first message; with a deadline it
# answers (empty) this much before it, so the client never sees DEADLINE_EXCEEDED.
MAX_PULL_WAIT_S = 60.0
PULL_DEADLINE_MARGIN_S = 1.0


class _HalfClosed(Exception):
    """The client closed its side of the stream."""


# Called with a subscription's record after a write to it, before the write is answered.
AfterWrite: TypeAlias = Callable[[SubscriptionRecord], Awaitable[None]]


async def no_catch_up(_record: SubscriptionRecord) -> None:
    """One process (or one serving process): nobody else serves the subscription."""


class SubscriberServicer:
    def __init__(
        self,
        catalog: Catalog,
        snapshots: Snapshots,
        routes: Routes,
        after_write: AfterWrite = no_catch_up,
    ) -> None:
        self.catalog = catalog
        self.snapshots = snapshots
        self.routes = routes
        self.after_write = after_write

    async def _written(self, name: str) -> None:
        """After a write to subscription ``name``: the forwarders serving it catch up."""
        entry = self.catalog.subscriptions.get(name)
        if entry is not None:
            await self.after_write(entry.record)

    def _forwarder(self, name: str) -> tuple[SubscribingForwarderApi, Any]:
        entry = self.catalog.subscription(name)
        if entry.subscription.detached:
            raise FailedPrecondition(f"subscription {name} is detached")
        return self.routes.subscribing(entry.record.uid), entry

    # --- admin --------------------------------------------------------------------------------

    @rpc
    async def CreateSubscription(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.catalog.create_subscription(request)

    @rpc
    async def GetSubscription(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.catalog.subscription(request.subscription).subscription

    @rpc
    async def UpdateSubscription(self, request: Any, context: Context) -> Any:
        if not request.HasField("subscription"):
            raise InvalidArgument("subscription: required")
        updated = await retry_update(
            self.catalog.caught_up,
            lambda: self.catalog.update_subscription(request.subscription, request.update_mask),
        )
        await self._written(request.subscription.name)
        return updated

    @rpc
    async def DeleteSubscription(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        entry = self.catalog.subscriptions.get(request.subscription)
        await self.catalog.delete_subscription(request.subscription)
        if entry is not None:
            await self.after_write(entry.record)
        return pb.Empty()

    @rpc
    async def ListSubscriptions(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        subs, token = self.catalog.list_subscriptions(
            request.project, request.page_size, request.page_token
        )
        return pb.ListSubscriptionsResponse(subscriptions=subs, next_page_token=token)

    # --- snapshots and seek (control/snapshots.py) --------------------------------------------

    @rpc
    async def CreateSnapshot(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return await self.snapshots.create_now(request)

    @rpc
    async def GetSnapshot(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.snapshots.get(request.snapshot)

    @rpc
    async def UpdateSnapshot(self, request: Any, context: Context) -> Any:
        return await retry_update(self.catalog.caught_up, lambda: self.snapshots.update(request))

    @rpc
    async def DeleteSnapshot(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        self.snapshots.delete(request.snapshot)
        return pb.Empty()

    @rpc
    async def ListSnapshots(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        snaps, token = self.snapshots.list_project(
            request.project, request.page_size, request.page_token
        )
        return pb.ListSnapshotsResponse(snapshots=snaps, next_page_token=token)

    @rpc
    async def Seek(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        await self.snapshots.seek(request)
        return pb.SeekResponse()

    # --- data ---------------------------------------------------------------------------------

    @rpc
    async def Pull(self, request: Any, context: Context) -> Any:
        names.subscription(request.subscription)
        if request.max_messages <= 0:
            raise InvalidArgument("max_messages: must be greater than 0")
        forwarder, _ = self._forwarder(request.subscription)
        if request.return_immediately:
            wait = 0.0
        else:
            remaining = context.time_remaining()
            wait = MAX_PULL_WAIT_S
            if remaining is not None:
                wait = max(0.0, min(wait, remaining - PULL_DEADLINE_MARGIN_S))
        pulled = await forwarder.pull(request.subscription, request.max_messages, wait)
        # Pull is served as a server-streaming method with one response (the same on the wire as
        # a unary answer) so that the handler learns whether the response went out: a unary
        # handler cannot, and a write fails if the client is gone before the response is
        # written to its connection (cancelled, deadline passed, process killed, not reading).
        # Those messages were never delivered; they go back at once, not after their deadline.
        try:
            await context.write(b"".join(pulled.messages))  # a serialized PullResponse
        except asyncio.CancelledError:
            pulled.give_back()
            raise
        except Exception:
            pulled.give_back()
            log.debug("Pull response not sent: the client is gone", exc_info=True)
            # End the RPC as cancelled by the peer, which it was (grpc logs this at debug).
            raise asyncio.CancelledError() from None
        metrics.DELIVERED_MESSAGES.inc(len(pulled.messages))

    @rpc
    async def Acknowledge(self, request: Any, context: Context) -> Any:
        names.subscription(request.subscription)
        if not request.ack_ids:
            raise InvalidArgument("ack_ids: must not be empty")
        forwarder, _ = self._forwarder(request.subscription)
        metrics.ACKED_MESSAGES.inc(len(request.ack_ids))
        await forwarder.acknowledge_checked(request.subscription, list(request.ack_ids))
        return pb.Empty()

    @rpc
    async def ModifyAckDeadline(self, request: Any, context: Context) -> Any:
        names.subscription(request.subscription)
        if not request.ack_ids:
            raise InvalidArgument("ack_ids: must not be empty")
        forwarder, _ = self._forwarder(request.subscription)
        await forwarder.modify_ack_deadline_checked(
            request.subscription, list(request.ack_ids), request.ack_deadline_seconds
        )
        return pb.Empty()

    @rpc
    async def ModifyPushConfig(self, request: Any, context: Context) -> Any:
        names.subscription(request.subscription)
        await retry_update(
            self.catalog.caught_up,
            lambda: self.catalog.modify_push_config(request.subscription, request.push_config),
        )
        await self._written(request.subscription)
        return pb.Empty()

    async def StreamingPull(
        self, raw_requests: AsyncIterator[Any], context: Context
    ) -> AsyncIterator[Any]:
        requests = _parsed(raw_requests)
        stream: StreamHandle | None = None
        reader: asyncio.Task[None] | None = None
        guard: stream_guard.StreamGuard | None = None
        metrics.OPEN_STREAMS.inc()
        code: str | None = "OK"  # the stream's outcome for the SLIs (None: not recorded)
        try:
            try:
                first = await anext(requests)
            except StopAsyncIteration:
                return
            except InvalidArgument as e:
                code = grpc.StatusCode.INVALID_ARGUMENT.name
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                raise  # unreachable: abort raises
            try:
                forwarder, entry, stream = self._open_stream(
                    first,
                    _stream_sources(context),
                    _wants_active_notices(context),
                    _failover_rank(context),
                )
            except PubsubError as e:
                code = None if isinstance(e, NotServedHere) else to_status(e)[0].name
                await context.abort(to_status(e)[0], str(e))
                raise  # unreachable: abort raises
            guard = stream_guard.watch(stream.end)  # its token's expiry, its permission
            props = wire.subscription_properties(
                pb.StreamingPullResponse.SubscriptionProperties(
                    message_ordering_enabled=entry.subscription.enable_message_ordering,
                    exactly_once_delivery_enabled=entry.subscription.enable_exactly_once_delivery,
                ).SerializeToString()
            )
            # Accepted: headers now, before any message (a frontend holds the client's later
            # requests until a forwarder says so, frontend/proxy.py).
            await context.send_initial_metadata((STREAM_ACCEPTED,))
            reader = asyncio.create_task(
                self._read_stream(requests, forwarder, first.subscription, stream),
                name="streaming_pull_reader",
            )
            while True:
                item = await stream.next_response()
                if isinstance(item, _HalfClosed):
                    return
                if isinstance(item, BaseException):
                    status, _ = to_status(item)
                    # A token that expired is the client's to renew: not a server fault.
                    expired = isinstance(item, stream_guard.TokenExpired)
                    code = None if expired else status.name
                    await context.abort(status, str(item))
                    raise item  # unreachable: abort raises
                if isinstance(item, active_notices.ActiveNotice):
                    yield active_notices.encode(item.active)
                    continue
                messages = item[0]  # framed: this stream is not raw
                metrics.DELIVERED_MESSAGES.inc(len(messages))
                messages.append(props)
                yield b"".join(messages)  # a serialized StreamingPullResponse (core/wire.py)
        finally:
            metrics.OPEN_STREAMS.dec()
            if guard is not None:
                guard.close()
            if code is not None:
                sli.record_rpc("StreamingPull", code, 0.0)
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
            if stream is not None:
                log.debug("stream %d closed; %d outstanding", stream.id, stream.outstanding)
                stream.close()

    def open_in_process(
        self,
        first: Any,
        sources: frozenset[int] | None,
        notices: bool = False,
        rank: FailoverRank | None = None,
    ) -> tuple[SubscribingForwarderApi, StreamHandle]:
        """A StreamingPull for a caller in this process (the Pulsar front, pulsar/streams.py):
        the handler's own checks of ``first`` and opening, no transport, its responses raw
        (``StreamHandle.next_response``); the caller applies later requests as
        ``_read_stream`` does. Raises PubsubError as the handler answers."""
        forwarder, _, stream = self._open_stream(first, sources, notices, rank, raw=True)
        return forwarder, stream

    def _open_stream(
        self,
        first: Any,
        sources: frozenset[int] | None,
        notices: bool = False,
        rank: FailoverRank | None = None,
        raw: bool = False,
    ) -> tuple[SubscribingForwarderApi, Any, StreamHandle]:
        if not first.subscription:
            raise InvalidArgument("subscription: the first request of a stream must name it")
        names.subscription(first.subscription)
        if first.max_outstanding_messages < 0 or first.max_outstanding_bytes < 0:
            raise InvalidArgument("max_outstanding_messages/bytes: must not be negative")
        forwarder, entry = self._forwarder(first.subscription)
        deadline = first.stream_ack_deadline_seconds
        if deadline == 0:
            deadline = entry.subscription.ack_deadline_seconds
        validation.ack_deadline("stream_ack_deadline_seconds", deadline)
        # Validate the first request's own acks before the stream opens.
        _check_modacks(first)
        stream = forwarder.open_stream(
            first.subscription,
            deadline,
            first.max_outstanding_messages,
            first.max_outstanding_bytes,
            first.client_id,
            sources,
            notices,
            rank,
            raw,
        )
        try:
            self._apply(forwarder, first.subscription, first)
        except PubsubError:
            stream.close()
            raise
        return forwarder, entry, stream

    @staticmethod
    def _apply(forwarder: SubscribingForwarderApi, name: str, request: Any) -> None:
        if request.ack_ids:
            forwarder.acknowledge(name, list(request.ack_ids))
            metrics.ACKED_MESSAGES.inc(len(request.ack_ids))
        if request.modify_deadline_ack_ids:
            all_seconds = request.modify_deadline_seconds
            lowest = min(all_seconds)
            if lowest == max(all_seconds):
                # One deadline for all (the clients' receipts and lease extensions): one call.
                forwarder.modify_ack_deadline(name, list(request.modify_deadline_ack_ids), lowest)
                return
            by_seconds: dict[int, list[str]] = defaultdict(list)
            for ack_id, seconds in zip(request.modify_deadline_ack_ids, all_seconds, strict=True):
                by_seconds[seconds].append(ack_id)
            for seconds, ack_ids in by_seconds.items():
                forwarder.modify_ack_deadline(name, ack_ids, seconds)

    async def _read_stream(
        self,
        requests: AsyncIterator[Any],
        forwarder: SubscribingForwarderApi,
        name: str,
        stream: StreamHandle,
    ) -> None:
        """Apply the client's later stream requests until it half-closes or the stream fails."""
        try:
            async for request in requests:
                if request.subscription and request.subscription != name:
                    raise InvalidArgument("subscription: must not change within a stream")
                _check_modacks(request)
                stream.alive()  # any request, even a heartbeat, shows the client reads
                self._apply(forwarder, name, request)
                if request.max_outstanding_messages:
                    # pubsubd's extension (Google reads it on the first request only): a later
                    # request may move the stream's message window, as the Pulsar front does
                    # to follow its client's FLOW permits.
                    if request.max_outstanding_messages < 0:
                        raise InvalidArgument("max_outstanding_messages: must not be negative")
                    stream.set_max_messages(request.max_outstanding_messages)
                if request.stream_ack_deadline_seconds:
                    stream.set_ack_deadline(
                        validation.ack_deadline(
                            "stream_ack_deadline_seconds", request.stream_ack_deadline_seconds
                        )
                    )
        except PubsubError as e:
            stream.end(e)
        except asyncio.CancelledError:
            raise
        except Exception:  # the transport failed: the client is gone
            log.debug("stream reader ended", exc_info=True)
            stream.end(_HalfClosed())
        else:
            stream.end(_HalfClosed())


def _stream_sources(context: Context) -> frozenset[int] | None:
    """The ``pubsubd-sources`` request header: the stream takes only these sources' messages."""
    for key, value in context.invocation_metadata() or ():
        if key == STREAM_SOURCES_HEADER:
            return stream_sources(value if isinstance(value, str) else value.decode())
    return None


def _wants_active_notices(context: Context) -> bool:
    """The ``pubsubd-active-notices`` request header (core/active_notices.py)."""
    for key, value in context.invocation_metadata() or ():
        if key == active_notices.HEADER:
            return active_notices.wanted(value)
    return False


def _failover_rank(context: Context) -> FailoverRank | None:
    """The ``pubsubd-failover-rank`` request header (core/failover_rank.py)."""
    for key, value in context.invocation_metadata() or ():
        if key == failover_rank.HEADER:
            return failover_rank.decode(value)
    return None


async def _parsed(raw: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    async for body in raw:
        try:
            yield pb.StreamingPullRequest.FromString(body)
        except DecodeError:
            raise InvalidArgument("request: not a valid StreamingPullRequest") from None


def _check_modacks(request: Any) -> None:
    if len(request.modify_deadline_ack_ids) != len(request.modify_deadline_seconds):
        raise InvalidArgument(
            "modify_deadline_seconds: must have as many entries as modify_deadline_ack_ids"
        )
    all_seconds = request.modify_deadline_seconds
    if (
        all_seconds
        and min(all_seconds) >= 0
        and max(all_seconds) <= validation.MAX_MODIFY_DEADLINE_S
    ):
        return  # all valid (checked in bulk: a request carries one per message)
    for seconds in all_seconds:
        validation.modify_deadline(seconds)


def handlers(servicer: SubscriberServicer) -> grpc.GenericRpcHandler:
    unary = unary_method
    s = servicer
    return grpc.method_handlers_generic_handler(
        "google.pubsub.v1.Subscriber",
        {
            "CreateSubscription": unary(s.CreateSubscription, pb.Subscription, pb.Subscription),
            "GetSubscription": unary(s.GetSubscription, pb.GetSubscriptionRequest, pb.Subscription),
            "UpdateSubscription": unary(
                s.UpdateSubscription, pb.UpdateSubscriptionRequest, pb.Subscription
            ),
            "DeleteSubscription": unary(
                s.DeleteSubscription, pb.DeleteSubscriptionRequest, pb.Empty
            ),
            "ListSubscriptions": unary(
                s.ListSubscriptions, pb.ListSubscriptionsRequest, pb.ListSubscriptionsResponse
            ),
            "CreateSnapshot": unary(s.CreateSnapshot, pb.CreateSnapshotRequest, pb.Snapshot),
            "GetSnapshot": unary(s.GetSnapshot, pb.GetSnapshotRequest, pb.Snapshot),
            "UpdateSnapshot": unary(s.UpdateSnapshot, pb.UpdateSnapshotRequest, pb.Snapshot),
            "DeleteSnapshot": unary(s.DeleteSnapshot, pb.DeleteSnapshotRequest, pb.Empty),
            "ListSnapshots": unary(
                s.ListSnapshots, pb.ListSnapshotsRequest, pb.ListSnapshotsResponse
            ),
            "Seek": unary(s.Seek, pb.SeekRequest, pb.SeekResponse),
            # Pull and StreamingPull answer with bytes assembled in core/wire.py.
            "Pull": grpc.unary_stream_rpc_method_handler(  # one response: see Pull
                parsing(s.Pull, pb.PullRequest),
                request_deserializer=None,
                response_serializer=None,
            ),
            "Acknowledge": unary(s.Acknowledge, pb.AcknowledgeRequest, pb.Empty),
            "ModifyAckDeadline": unary(s.ModifyAckDeadline, pb.ModifyAckDeadlineRequest, pb.Empty),
            "ModifyPushConfig": unary(s.ModifyPushConfig, pb.ModifyPushConfigRequest, pb.Empty),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                s.StreamingPull,
                request_deserializer=None,
                response_serializer=None,
            ),
        },
    )
