"""THE map from domain errors to gRPC and HTTP status, and the decorator servicers use.

Servicers raise ``PubsubError`` subclasses; ``rpc`` turns them into ``context.abort`` with the
most specific mapped status. Anything unmapped becomes INTERNAL, logged with its traceback, and
the server stays up. ``HTTP_STATUS`` is Google's HTTP code for each gRPC code, which the REST
front (api/rest/front.py) answers with. The codes match Google's for the same situation
(docs/GOOGLE_API.md §6); note that permanent errors never use a code the official clients retry
on.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from pubsubd.core.errors import (
    Aborted,
    AckIdsInvalid,
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    NotServedHere,
    OutOfRange,
    PermissionDenied,
    PubsubError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from pubsubd.observability import events, sli

log = logging.getLogger(__name__)

# Google's HTTP status for each gRPC code (google/rpc/code.proto; what its REST API answers).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}

_STATUS: dict[type[PubsubError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    InternalError: grpc.StatusCode.INTERNAL,
    DataLoss: grpc.StatusCode.DATA_LOSS,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    Aborted: grpc.StatusCode.ABORTED,
}


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, int]:
    """The (gRPC, HTTP) status for an exception, most specific class first."""
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            code = _STATUS[cls]  # type: ignore[index]
            return code, HTTP_STATUS[code]
    return grpc.StatusCode.INTERNAL, 500


def ack_failure_status(e: AckIdsInvalid) -> status_pb2.Status:
    """The google.rpc.Status the official client expects for exactly-once ack failures."""
    info = error_details_pb2.ErrorInfo(
        reason="EXACTLY_ONCE_ACKID_FAILURE", domain="pubsub.googleapis.com", metadata=e.failures
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=str(e), details=[detail])


R = TypeVar("R")


def rpc(
    fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """Wrap a unary servicer method: domain errors become the mapped status, bugs INTERNAL."""

    method = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        started = time.perf_counter()

        # Counted before the answer goes out (context.abort sends the status, then raises): a
        # client that reads the metrics after its answer finds its call counted.
        def counted(code: str | None) -> None:
            if code is not None:
                topic = sli.PUBLISH_TOPIC.get() if method == "Publish" else None
                sli.record_rpc(method, code, time.perf_counter() - started, topic)

        try:
            result = await fn(self, request, context)
        except AckIdsInvalid as e:
            code = grpc.StatusCode.INVALID_ARGUMENT.name
            events.record_error(method, code)
            counted(code)
            await context.abort_with_status(rpc_status.to_status(ack_failure_status(e)))
        except PubsubError as e:
            status, _ = to_status(e)
            events.record_error(method, status.name)
            # A non-owner's refusal is a redirect for the frontend, not the client's answer.
            counted(None if isinstance(e, NotServedHere) else status.name)
            await context.abort(status, str(e))
        except Exception as e:
            if isinstance(e, grpc.aio.AbortError):
                counted("OK")  # the servicer answered (aborted) by itself
                raise
            log.exception("%s failed", method)
            code = grpc.StatusCode.INTERNAL.name
            events.record_error(method, code)
            counted(code)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}")
        else:
            counted("OK")
            return result
        raise AssertionError("unreachable: context.abort raises")

    return wrapper


async def in_process(method: str, call: Awaitable[R]) -> R:
    """A servicer method's own work called in this process (the Pulsar front's publishes,
    pulsar/gateway.py): counted and reported as :func:`rpc` counts the method (SLIs, error
    events); a domain error is raised as it is (the caller maps it, ``to_status``), a bug is
    logged and raised as InternalError, which the RPC answers as INTERNAL."""
    started = time.perf_counter()
    try:
        result = await call
    except PubsubError as e:
        code = to_status(e)[0].name
        events.record_error(method, code)
        if not isinstance(e, NotServedHere):
            sli.record_rpc(method, code, time.perf_counter() - started)
        raise
    except Exception as e:
        log.exception("%s failed", method)
        code = grpc.StatusCode.INTERNAL.name
        events.record_error(method, code)
        sli.record_rpc(method, code, time.perf_counter() - started)
        raise InternalError(f"internal error: {type(e).__name__}") from e
    sli.record_rpc(method, "OK", time.perf_counter() - started)
    return result


def parsing(fn: Any, cls: Any) -> Any:
    """Take raw request bytes; an unparsable body is INVALID_ARGUMENT (not UNKNOWN)."""

    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = cls.FromString(raw)
        except DecodeError:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {cls.DESCRIPTOR.full_name}"
            )
        return await fn(request, context)

    return handler


def unary_method(fn: Any, request_type: Any, response_type: Any) -> grpc.RpcMethodHandler:
    """A unary method over raw bytes: the request parsed with :func:`parsing` (``None``: the
    handler takes the bytes), the response serialized (``None``: the handler returns bytes)."""
    return grpc.unary_unary_rpc_method_handler(
        parsing(fn, request_type) if request_type is not None else fn,
        request_deserializer=None,
        response_serializer=response_type.SerializeToString if response_type is not None else None,
    )
