"""The REST v1 front: each REST call becomes the gRPC call its HTTP rule stands for, sent to the
process's own gRPC port (asyncio shell over ``routes.py`` and ``transcode.py``).

Going through the gRPC port, not the servicers, keeps one implementation of every rule: the
same validation, status codes, quotas, request SLIs and give-backs serve both APIs, and a
``pubsubd frontend`` serves REST unchanged (its port proxies each call to the forwarder that
owns the resource). The gRPC status becomes Google's HTTP code and error body (the map is
``api/grpc/status.py``), error details (the exactly-once ack failures' ErrorInfo) included.

The call's deadline is the ``X-Server-Timeout`` header's seconds (gcloud sends it on Pull),
else ``DEFAULT_TIMEOUT_S``; a Pull answers (empty) before it, as over gRPC. A client that
closes its connection while its call runs cancels the call (``observability/http_conn.py``):
a waiting Pull ends and anything it had taken is given back at once. A Pull response that
cannot be written to the client is given back too (``pubsubd.internal.v1.Forwarder/GiveBack``),
so its messages are redelivered at once, not after their ack deadline.

The request's ``Authorization`` header goes with the gRPC call as its ``authorization``
metadata, so with authentication on the call is checked, and runs, as the REST caller
(api/grpc/authn.py). With TLS on, ``target`` is the process's loopback-only Unix socket
(app.py), not its TLS port.
"""

from __future__ import annotations

import logging
import math
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from prometheus_client import Counter

from pubsubd._gen.pubsubd.internal.v1.forwarder_pb2 import GiveBackRequest
from pubsubd.api.grpc.forwarder_service import GIVE_BACK
from pubsubd.api.grpc.status import HTTP_STATUS
from pubsubd.api.rest import fields, routes
from pubsubd.api.rest.transcode import (
    RestError,
    build_request,
    error_body,
    pretty,
    response_body,
)
from pubsubd.observability.http_conn import Request, Response

log = logging.getLogger(__name__)

__all__ = ["RestFront"]

JSON = "application/json; charset=UTF-8"
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 600.0
PULL = routes.SUBSCRIBER + "Pull"
GIVE_BACK_PROTOCOL_VERSION = 1
# HTTP headers passed on to the gRPC call as metadata: who the caller is (the bearer token;
# x-pubsubd-caller, believed only by a server started with --trust-caller-header, for tests).
FORWARDED_HEADERS = ("authorization", "x-pubsubd-caller")
REQUESTS = Counter(
    "pubsubd_rest_requests",
    "REST v1 calls answered, by the gRPC method they stand for and the HTTP code",
    ["method", "code"],
)
# Registers google.rpc's detail types for the JSON of error details.
_DETAIL_TYPES = (error_details_pb2.ErrorInfo,)


def local_target(host: str, port: int) -> str:
    """The address to reach a gRPC port bound on ``host`` from this process."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class RestFront:
    """Serves ``/v1/...`` requests by calling ``target`` (this process's gRPC port)."""

    def __init__(self, target: str, max_message_bytes: int = 64 << 20) -> None:
        self.target = target
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.primary_user_agent", "pubsubd-rest"),
        ]
        self._channel: grpc.aio.Channel | None = None

    def _open(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
        return self._channel

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def handle(self, request: Request) -> Response:
        """Answer one REST call; counted in ``pubsubd_rest_requests_total{method,code}`` (code
        499: the client went away first)."""
        parts = urlsplit(request.target)
        found = routes.match(request.method, parts.path)
        method = found.rule.method.rsplit("/", 1)[-1] if found is not None else "_unmatched"
        code = "499"
        try:
            response = await self._answer(request, parts.path, parts.query, found)
            code = str(response.status)
            return response
        finally:
            REQUESTS.labels(method, code).inc()

    async def _answer(
        self, request: Request, path: str, query_string: str, found: routes.Match | None
    ) -> Response:
        if found is None:
            allowed = routes.verbs_for(path)
            text = (
                f"{request.method} is not a method of {path}; it takes {', '.join(allowed)}"
                if allowed
                else f"{path} is not a path of the Pub/Sub v1 REST API"
            )
            return _error(404, "NOT_FOUND", text)
        rule = found.rule
        query = parse_qs(query_string, keep_blank_values=True)
        try:
            message = build_request(found, query, request.body)
        except RestError as e:
            return _error(e.http, e.status, e.message, e.details)
        selection = None
        if "fields" in query:  # checked before the call: a bad selection changes nothing
            try:
                selection = fields.parse(query["fields"][-1], rule.response.DESCRIPTOR)
            except fields.FieldSelectionError as e:
                return _error(400, "INVALID_ARGUMENT", str(e))
        timeout = _timeout(request.headers.get("x-server-timeout"))
        if isinstance(timeout, RestError):
            return _error(timeout.http, timeout.status, timeout.message)
        # Who calls, for authentication and authorization (checked again by the gRPC port).
        metadata = [(h, request.headers[h]) for h in FORWARDED_HEADERS if h in request.headers]
        try:
            raw = await self._open().unary_unary(rule.method)(
                message.SerializeToString(), timeout=timeout, metadata=metadata or None
            )
        except grpc.aio.AioRpcError as e:
            return _rpc_error(e)
        try:
            answer = rule.response.FromString(raw)
        except DecodeError:
            log.exception("%s answered bytes that are not a %s", rule.method, rule.response)
            return _error(500, "INTERNAL", "the service's answer could not be decoded")
        body = response_body(answer, pretty(query), selection)
        unsent = None
        if rule.method == PULL and answer.received_messages:
            ack_ids = [m.ack_id for m in answer.received_messages]
            subscription = message.subscription

            async def unsent() -> None:
                await self._give_back(subscription, ack_ids, metadata)

        return Response(200, JSON, body, unsent=unsent)

    async def _give_back(self, subscription: str, ack_ids: list[str], metadata: Any = None) -> None:
        """A Pull response never reached its client: its messages go back at once."""
        request = GiveBackRequest(
            protocol_version=GIVE_BACK_PROTOCOL_VERSION, subscription=subscription, ack_ids=ack_ids
        )
        try:
            await self._open().unary_unary(GIVE_BACK)(
                request.SerializeToString(), timeout=10, metadata=metadata
            )
        except grpc.aio.AioRpcError as e:
            log.info("giving back %d messages of %s failed: %s", len(ack_ids), subscription, e)


def _timeout(header: str | None) -> float | RestError:
    if header is None:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(header)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= MAX_TIMEOUT_S):
        return RestError(
            400,
            "INVALID_ARGUMENT",
            f"X-Server-Timeout: {header!r} is not a number of seconds in (0, {MAX_TIMEOUT_S:g}]",
        )
    return seconds


def _error(http: int, status: str, message: str, details: Any = ()) -> Response:
    return Response(http, JSON, error_body(http, status, message, details))


def _rpc_error(e: grpc.aio.AioRpcError) -> Response:
    code = e.code()
    http = HTTP_STATUS.get(code, 500)
    return _error(http, code.name, e.details() or "", _details(e))


def _details(e: grpc.aio.AioRpcError) -> list[dict[str, Any]]:
    """The google.rpc.Status details a gRPC error carries, as JSON (``@type`` and fields)."""
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            try:
                status = status_pb2.Status.FromString(value)
                return [json_format.MessageToDict(d) for d in status.details]
            except (DecodeError, TypeError, KeyError, json_format.Error):
                log.debug("undecodable error details", exc_info=True)
    return []
