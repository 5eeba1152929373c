"""The gRPC servicer of ``pubsubd.internal.v1.StorageNode`` over a :class:`LedgerStore`.

Refusals become a status and trailing metadata through ``refusals.refusal`` (THE map from the
node's domain errors; ``storage/node_client.py`` turns them back into typed errors). Requests
arrive as raw bytes and are parsed here, so an unparsable request is INVALID_ARGUMENT; every
request's ``protocol_version`` is checked first. Streamed appends are answered by
``appends.answer_append``, as on the append port (``append_port.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.core.errors import PubsubError
from pubsubd.core.internal_token import InternalIdentity
from pubsubd.core.principal import CALLER, CALLER_UNTIL
from pubsubd.storagenode.appends import answer_append, check_version
from pubsubd.storagenode.ledger_store import LedgerStore
from pubsubd.storagenode.protocol import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, SERVICE
from pubsubd.storagenode.refusals import refusal

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


Handler: TypeAlias = Callable[[Any, Context], Awaitable[Any]]


def _method(fn: Handler, request_type: Any, response_type: Any) -> grpc.RpcMethodHandler:
    """A unary handler over raw bytes: parse, check the version, map refusals."""
    name = request_type.DESCRIPTOR.name.removesuffix("Request")

    @functools.wraps(fn)
    async def handler(raw: bytes, context: Context) -> Any:
        try:
            request = request_type.FromString(raw)
        except DecodeError:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request: not a valid {request_type.DESCRIPTOR.full_name}",
            )
        try:
            check_version(request.protocol_version)
            return await fn(request, context)
        except PubsubError as exc:
            code, md = refusal(exc)
            await context.abort(code, str(exc), trailing_metadata=md)
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("%s failed", name)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
        raise AssertionError("unreachable: context.abort raises")

    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=None, response_serializer=response_type.SerializeToString
    )


class StorageNodeServicer:
    def __init__(
        self,
        store: LedgerStore,
        node_id: str,
        zone: str,
        internal: InternalIdentity | None = None,
    ) -> None:
        """``internal``: with authentication on, the only principals an open AppendStream may
        keep appending as (the interceptor checked its first request)."""
        self.store = store
        self.node_id = node_id
        self.zone = zone
        self.internal = internal

    async def Append(self, request: pb.AppendRequest, context: Context) -> pb.AppendResponse:
        end = await self.store.append(
            request.ledger_id,
            request.epoch,
            request.first_offset,
            request.frames,
            request.last_add_confirmed,
        )
        return pb.AppendResponse(end_offset=end)

    async def AppendStream(self, requests: Any, context: Context) -> None:
        await _AppendStreamHandler(self.store, context, self.internal).run()

    async def Fence(self, request: pb.FenceRequest, context: Context) -> pb.FenceResponse:
        r = await self.store.fence(request.ledger_id, request.epoch)
        return pb.FenceResponse(
            exists=r.exists,
            first_offset=r.first_offset,
            end_offset=r.end_offset,
            last_add_confirmed=r.last_add_confirmed,
            fenced_epoch=r.fenced_epoch,
        )

    async def Read(self, request: pb.ReadRequest, context: Context) -> pb.ReadResponse:
        frames, end = await self.store.read(
            request.ledger_id, request.start_offset, request.end_offset, request.max_bytes
        )
        return pb.ReadResponse(frames=frames, node_end_offset=end)

    async def ListLedgers(
        self, request: pb.ListLedgersRequest, context: Context
    ) -> pb.ListLedgersResponse:
        return pb.ListLedgersResponse(
            ledgers=[
                pb.LedgerInfo(
                    ledger_id=s.ledger_id,
                    first_offset=s.first_offset,
                    end_offset=s.end_offset,
                    last_add_confirmed=s.last_add_confirmed,
                    fenced_epoch=s.fenced_epoch,
                    bytes=s.bytes,
                    digest=s.digest,
                    healthy_disks=s.healthy_disks,
                )
                for s in self.store.summaries()
            ],
            fenced_only=self.store.fenced_only(),
        )

    async def DeleteLedger(
        self, request: pb.DeleteLedgerRequest, context: Context
    ) -> pb.DeleteLedgerResponse:
        return pb.DeleteLedgerResponse(deleted=await self.store.delete(request.ledger_id))

    async def Health(self, request: pb.HealthRequest, context: Context) -> pb.HealthResponse:
        store = self.store
        return pb.HealthResponse(
            node_id=self.node_id,
            zone=self.zone,
            protocol_version=PROTOCOL_VERSION,
            min_protocol_version=MIN_PROTOCOL_VERSION,
            disks=[
                pb.Disk(path=d.path, healthy=d.healthy, free_bytes=d.free_bytes, error=d.error)
                for d in store.disk_health()
            ],
            free_bytes=store.free_bytes(),
            ledgers=store.ledger_count,
            serving=store.opened and not store.stopping,
        )


class _AppendStreamHandler:
    """One AppendStream call: every request read is started at once (in arrival order, so a
    ledger's appends reach the store in the order the writer sent them); answers are written
    as they complete, by one writer. A request that arrives after the call's token expired
    (``CALLER_UNTIL``, authentication on) is not started: the stream stops reading, answers
    what it started and ends (OK), and the writer sends that request again on a call with its
    current token, as the append port's writers do. So does a request that arrives once the
    call's principal is no longer the cluster's identity (the internal token file changed to
    another subject)."""

    def __init__(
        self, store: LedgerStore, context: Context, internal: InternalIdentity | None = None
    ) -> None:
        self.store = store
        self.context = context
        self.until = CALLER_UNTIL.get()  # when the call's token expires (wall clock)
        self.internal = internal
        self.caller = CALLER.get()  # None: authentication off
        self.answers: asyncio.Queue[pb.AppendStreamResponse | None] = asyncio.Queue()
        self.in_flight = 0
        self.reading = True

    async def run(self) -> None:
        reader = asyncio.ensure_future(self._read())
        try:
            while True:
                answer = await self.answers.get()
                if answer is None:
                    break
                await self.context.write(answer)
        finally:
            reader.cancel()
        await reader  # re-raises the reader's abort (a request that does not parse)

    async def _read(self) -> None:
        try:
            while True:
                raw = await self.context.read()
                if raw is grpc.aio.EOF:
                    break
                try:
                    request = pb.AppendStreamRequest.FromString(raw)
                except DecodeError:
                    await self.context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "request: not a valid pubsubd.internal.v1.AppendStreamRequest",
                    )
                if self.until != math.inf and time.time() >= self.until:
                    log.info("AppendStream: the call's token expired: ending the stream")
                    break
                if (
                    self.internal is not None
                    and self.caller is not None
                    and not self.internal.allows(self.caller)
                ):
                    log.info(
                        "AppendStream: %s is no longer the cluster's identity: ending it",
                        self.caller.member,
                    )
                    break
                self.in_flight += 1
                task = asyncio.ensure_future(answer_append(self.store, request))
                task.add_done_callback(self._done)
        except asyncio.CancelledError:
            raise
        finally:
            self.reading = False
            if self.in_flight == 0:
                self.answers.put_nowait(None)

    def _done(self, task: asyncio.Future[pb.AppendStreamResponse]) -> None:
        self.in_flight -= 1
        if not task.cancelled():
            self.answers.put_nowait(task.result())
        if not self.reading and self.in_flight == 0:
            self.answers.put_nowait(None)


def handlers(servicer: StorageNodeServicer) -> grpc.GenericRpcHandler:
    s = servicer
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Append": _method(s.Append, pb.AppendRequest, pb.AppendResponse),
            "AppendStream": grpc.stream_stream_rpc_method_handler(
                s.AppendStream,
                request_deserializer=None,
                response_serializer=pb.AppendStreamResponse.SerializeToString,
            ),
            "Fence": _method(s.Fence, pb.FenceRequest, pb.FenceResponse),
            "Read": _method(s.Read, pb.ReadRequest, pb.ReadResponse),
            "ListLedgers": _method(s.ListLedgers, pb.ListLedgersRequest, pb.ListLedgersResponse),
            "DeleteLedger": _method(
                s.DeleteLedger, pb.DeleteLedgerRequest, pb.DeleteLedgerResponse
            ),
            "Health": _method(s.Health, pb.HealthRequest, pb.HealthResponse),
        },
    )
