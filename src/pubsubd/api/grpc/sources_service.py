"""pubsubd.internal.v1.Sources servicer: what a publishing forwarder offers the subscribing
forwarders of its topics in other processes (proto/pubsubd/internal/v1/sources.proto).

Tail streams one source's committed entries, as stored (no decoding, no re-encoding), then each
new commit; the ack-state calls go to the same ``PublishingForwarderApi`` calls an in-process
subscribing forwarder makes. Which forwarder serves a topic is the router's choice: a topic owned
elsewhere answers UNAVAILABLE "not served here" (``Routes.publishing``).

With authentication on, only the cluster's identity calls these methods (api/grpc/authn.py);
a Tail goes on only while its token is valid and its caller still that identity (checked at
each response, so within a heartbeat): then it ends (UNAUTHENTICATED, PERMISSION_DENIED) and
its reader opens it again with the token now in its file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError

from pubsubd._gen.pubsubd.internal.v1 import sources_pb2 as s
from pubsubd.api.grpc.authn import LongCall
from pubsubd.api.grpc.status import rpc, to_status, unary_method
from pubsubd.control.router import Routes
from pubsubd.core.errors import InvalidArgument, PubsubError
from pubsubd.core.internal_token import InternalIdentity
from pubsubd.data import sources_wire as wire
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange
from pubsubd.storage.framing import encode_entry

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# Frames per Tail response when the request sets no bound, and the most it may ask for.
DEFAULT_TAIL_BYTES = 1 << 20
MAX_TAIL_BYTES = 8 << 20
# An idle Tail sends a heartbeat (its offsets, no frames) this often, so the reader learns of
# trims and a dead stream is found by the write failing.
HEARTBEAT_S = 5.0
# A damaged range is re-read from the storage nodes (cluster) or waits for its policy: try again.
DAMAGED_RETRY_S = 0.5


def _check(request: Any) -> None:
    if not request.protocol_version:
        raise InvalidArgument("protocol_version: required")
    if not request.topic_uid:
        raise InvalidArgument("topic_uid: required")


def _subscription(request: Any) -> tuple[str, str]:
    _check(request)
    if not request.subscription_uid:
        raise InvalidArgument("subscription_uid: required")
    return request.topic_uid, request.subscription_uid


class SourcesServicer:
    def __init__(self, routes: Routes, internal: InternalIdentity | None = None) -> None:
        """``internal``: with authentication on, the identity a Tail's caller must stay."""
        self.routes = routes
        self.internal = internal

    # --- Tail -----------------------------------------------------------------------------

    async def Tail(self, raw: bytes, context: Context) -> AsyncIterator[Any]:
        try:
            try:
                request = s.TailRequest.FromString(raw)
            except DecodeError:
                raise InvalidArgument("request: not a valid TailRequest") from None
            _check(request)
            publishing = self.routes.publishing(request.topic_uid)
            topic, source = request.topic_uid, request.source
            if source >= publishing.source_count(topic):
                raise InvalidArgument(f"source {source}: the topic has fewer sources")
            max_bytes = min(request.max_bytes or DEFAULT_TAIL_BYTES, MAX_TAIL_BYTES)
        except PubsubError as e:
            await context.abort(to_status(e)[0], str(e))
        caller = LongCall(self.internal, wire.SERVICE)
        committed = asyncio.Event()

        def listener(_offset: int) -> None:
            committed.set()

        publishing.add_commit_listener(topic, listener)
        offset = request.from_offset
        try:
            while True:
                # Still ours? A moved topic ends the stream with "not served here".
                try:
                    self.routes.publishing(topic)
                except PubsubError as e:
                    await context.abort(to_status(e)[0], str(e))
                refused = caller.refusal()
                if refused is not None:
                    await context.abort(to_status(refused)[0], str(refused))
                committed.clear()
                start = publishing.start_offset(topic, source)
                offset = max(offset, start)
                entries = []
                if offset < publishing.committed_offset(topic, source):
                    try:
                        entries = publishing.read(topic, source, offset, 10_000, max_bytes)
                    except OffsetOutOfRange:
                        continue  # trimmed meanwhile: from the new start
                    except DamagedEntries:
                        await asyncio.sleep(DAMAGED_RETRY_S)
                        continue
                yield s.TailResponse(
                    source_count=publishing.source_count(topic),
                    start_offset=start,
                    committed_offset=publishing.committed_offset(topic, source),
                    first_offset=entries[0].base_offset if entries else offset,
                    frames=b"".join(encode_entry(e) for e in entries),
                    damage_policy=publishing.damage_policy(topic).value,
                )
                if entries:
                    offset = entries[-1].next_offset
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HEARTBEAT_S):  # never swallows a cancellation
                        await committed.wait()
        finally:
            with contextlib.suppress(PubsubError):
                publishing.remove_commit_listener(topic, listener)

    # --- ack state --------------------------------------------------------------------------

    @rpc
    async def Attach(self, request: Any, context: Context) -> Any:
        topic, sub = _subscription(request)
        publishing = self.routes.publishing(topic)
        states = publishing.attach(topic, sub, dict(request.start_offsets))
        return s.AttachResponse(
            cursors=wire.cursors_to_wire(states), source_count=publishing.source_count(topic)
        )

    @rpc
    async def Detach(self, request: Any, context: Context) -> Any:
        topic, sub = _subscription(request)
        await self.routes.publishing(topic).detach(topic, sub)
        return s.Done()

    @rpc
    async def RecordAcks(self, request: Any, context: Context) -> Any:
        topic, sub = _subscription(request)
        try:
            acks = wire.acks_from_wire(request.acks)
        except ValueError as e:
            raise InvalidArgument(f"acks: {e}") from None
        publishing = self.routes.publishing(topic)
        for source, ranges in acks.items():
            publishing.record_acks(topic, sub, source, ranges)
        return s.Done()

    @rpc
    async def FlushAcks(self, request: Any, context: Context) -> Any:
        topic, sub = _subscription(request)
        await self.routes.publishing(topic).flush_acks(topic, sub)
        return s.Done()

    @rpc
    async def ResetCursors(self, request: Any, context: Context) -> Any:
        topic, sub = _subscription(request)
        try:
            states = wire.cursors_from_wire(request.cursors)
        except ValueError as e:
            raise InvalidArgument(f"cursors: {e}") from None
        publishing = self.routes.publishing(topic)
        publishing.reset_cursors(topic, sub, states)
        await publishing.flush_acks(topic, sub)
        return s.Done()

    @rpc
    async def CursorStates(self, request: Any, context: Context) -> Any:
        topic, sub = _subscription(request)
        publishing = self.routes.publishing(topic)
        return s.AttachResponse(
            cursors=wire.cursors_to_wire(publishing.cursor_states(topic, sub)),
            source_count=publishing.source_count(topic),
        )

    @rpc
    async def SetPublishBlock(self, request: Any, context: Context) -> Any:
        topic, sub = _subscription(request)
        self.routes.publishing(topic).set_publish_block(
            topic, sub, request.reason or None, request.from_us
        )
        return s.Done()


def handlers(servicer: SourcesServicer) -> grpc.GenericRpcHandler:
    sub, attach = s.SubscriptionRequest, s.AttachResponse
    return grpc.method_handlers_generic_handler(
        wire.SERVICE,
        {
            "Tail": grpc.unary_stream_rpc_method_handler(
                servicer.Tail,
                request_deserializer=None,
                response_serializer=s.TailResponse.SerializeToString,
            ),
            "Attach": unary_method(servicer.Attach, s.AttachRequest, attach),
            "Detach": unary_method(servicer.Detach, sub, s.Done),
            "RecordAcks": unary_method(servicer.RecordAcks, s.RecordAcksRequest, s.Done),
            "FlushAcks": unary_method(servicer.FlushAcks, sub, s.Done),
            "ResetCursors": unary_method(servicer.ResetCursors, s.ResetCursorsRequest, s.Done),
            "CursorStates": unary_method(servicer.CursorStates, sub, attach),
            "SetPublishBlock": unary_method(
                servicer.SetPublishBlock, s.SetPublishBlockRequest, s.Done
            ),
        },
    )
