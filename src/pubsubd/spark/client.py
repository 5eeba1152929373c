"""Client of pubsubd's replay API (``pubsubd.v1.Replay``) for the Spark connector.

One gRPC channel per (process, endpoint), created on first use in whichever process needs it: the
driver's streaming-source runner or an executor's Python worker. Readers and writers are pickled by
Spark, so they hold only the endpoint string and call :func:`get_client` inside ``read()`` /
``write()`` / ``commit()``. Python workers are reused across tasks, so the channel outlives a task;
gRPC reconnects an idle or broken channel by itself, and every call has a deadline.

The endpoint may name several servers (a cluster's frontends): ``ipv4:A,B`` as gRPC and the
official client take it, or a plain ``A,B`` list, which :func:`channel_target` turns into that
form. Calls are then spread over them (``round_robin``), and a call that fails because a server
went away (UNAVAILABLE) is sent again, to another one, until the call's deadline: every replay
call may be repeated (reads, head offsets and cursor reads change nothing; a cursor commit sets
the same positions again; ``PublishDeduplicated`` carries dedup IDs, so the server drops what
the first attempt stored).
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from pubsubd._gen.pubsubd.v1 import replay_pb2
from pubsubd.core.client_security import ClientSecurity
from pubsubd.spark.offsets import SourceBounds

_SERVICE = "/pubsubd.v1.Replay/"
DEFAULT_ENDPOINT = "127.0.0.1:8085"
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
]


# A call that failed with one of these codes is sent again (see the module docstring): the
# server or the frontend in between went away, or the connection broke before the answer.
_RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})
_RETRY_FIRST_S = 0.05  # backoff before the first retry, doubled up to _RETRY_MAX_S
_RETRY_MAX_S = 1.0


class EndpointError(ValueError):
    """An ``endpoint`` that names no server gRPC can reach."""


def channel_target(endpoint: str) -> str:
    """The gRPC target for ``endpoint``: ``host:port`` and gRPC targets (``ipv4:A,B``,
    ``dns:...``, ``unix:...``) as they are; a comma list of ``IP:port`` addresses as
    ``ipv4:A,B`` (or ``ipv6:[A]:p,...``). gRPC resolves a list only of IP addresses, so a list
    with a host name raises :class:`EndpointError`."""
    text = endpoint.strip()
    if "," not in text or _has_scheme(text):
        return text
    hosts = [a.strip() for a in text.split(",") if a.strip()]
    families = {_ip_family(a) for a in hosts}
    if None in families or len(families) != 1:
        raise EndpointError(
            f"endpoint {endpoint!r}: a list must be IP:port addresses of one family "
            "(127.0.0.1:8085,127.0.0.1:8086), or give a gRPC target such as dns:HOST:PORT"
        )
    return f"{families.pop()}:{','.join(hosts)}"


def _has_scheme(target: str) -> bool:
    scheme, sep, _ = target.partition(":")
    return bool(sep) and scheme in ("ipv4", "ipv6", "dns", "unix", "unix-abstract", "vsock")


def _ip_family(address: str) -> str | None:
    """``ipv4`` / ``ipv6`` for ``IP:port`` / ``[IP]:port``, None for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        return None
    if ip.version == 6 and not host.startswith("["):
        return None
    return f"ipv{ip.version}"


def _several(target: str) -> bool:
    return _has_scheme(target) and "," in target


class ReplayError(RuntimeError):
    """A replay API call failed; ``code`` is the gRPC status code."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"pubsubd {method} failed: {code.name}: {details}")
        self.code = code
        self.details = details


@dataclass(frozen=True)
class OutgoingMessage:
    """One message for :meth:`ReplayClient.publish_deduplicated`."""

    dedup_id: str
    data: bytes
    attributes: Mapping[str, str] | None = None
    ordering_key: str = ""


def resolve_endpoint(option: str | None) -> str:
    """The ``endpoint`` option, else ``PUBSUB_EMULATOR_HOST``, else 127.0.0.1:8085 (resolved on the
    driver, so executors need no environment of their own), as a gRPC target
    (:func:`channel_target`; :class:`EndpointError` if it is not one)."""
    return channel_target(option or os.environ.get("PUBSUB_EMULATOR_HOST") or DEFAULT_ENDPOINT)


class ReplayClient:
    """Blocking calls to one pubsubd. Thread-safe (a gRPC channel is)."""

    def __init__(
        self, endpoint: str, timeout: float = 30.0, security: ClientSecurity | None = None
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        target = channel_target(endpoint)
        options: list[tuple[str, Any]] = list(_CHANNEL_OPTIONS)
        if _several(target):  # a cluster's frontends: spread the calls, skip a dead one
            options.append(("grpc.lb_policy_name", "round_robin"))
        # Plaintext, or TLS and a bearer token (the caFile, token, tokenFile options).
        self._channel = (security or ClientSecurity()).channel(target, options)
        self.retries = 0  # calls sent again after a retriable failure (tests, logs)
        self._calls: dict[str, Any] = {}

    def close(self) -> None:
        self._channel.close()

    def _stub(self, method: str, response_type: Any) -> Any:
        stub = self._calls.get(method)
        if stub is None:
            stub = self._channel.unary_unary(
                _SERVICE + method,
                request_serializer=_serialize,
                response_deserializer=response_type.FromString,
            )
            self._calls[method] = stub
        return stub

    def _call(self, method: str, request: Any, response_type: Any) -> Any:
        stub = self._stub(method, response_type)
        deadline = time.monotonic() + self.timeout
        backoff = _RETRY_FIRST_S
        while True:
            left = deadline - time.monotonic()
            try:
                return stub(request, timeout=max(left, 0.001), wait_for_ready=True)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                details = exc.details() if hasattr(exc, "details") else str(exc)
                if code not in _RETRY_CODES or time.monotonic() + backoff >= deadline:
                    raise ReplayError(method, code, details or "") from exc
            time.sleep(backoff)
            backoff = min(backoff * 2, _RETRY_MAX_S)
            self.retries += 1

    def topic_bounds(self, topic: str) -> dict[int, SourceBounds]:
        """Earliest retained and latest committed offset of every partition, in one call."""
        resp = self._call(
            "GetTopicRanges",
            replay_pb2.GetTopicRangesRequest(topic=topic),
            replay_pb2.GetTopicRangesResponse,
        )
        return {r.source: SourceBounds(r.earliest_offset, r.latest_offset) for r in resp.sources}

    def lookup_offsets(self, topic: str, micros: int) -> dict[int, int]:
        """Per partition, the first offset published at or after ``micros`` (epoch microseconds)."""
        ts = timestamp_pb2.Timestamp(seconds=micros // 1_000_000, nanos=(micros % 1_000_000) * 1000)
        resp = self._call(
            "LookupOffsets",
            replay_pb2.LookupOffsetsRequest(topic=topic, time=ts),
            replay_pb2.LookupOffsetsResponse,
        )
        return dict(resp.offsets)

    def _read(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        max_messages: int,
        columnar: bool,
        arrow: bool = False,
    ) -> Any:
        request = replay_pb2.ReadRequest(
            topic=topic,
            source=partition,
            start_offset=start,
            end_offset=end,
            max_messages=max_messages,
            columnar=columnar,
            arrow=arrow,
        )
        return self._call("Read", request, replay_pb2.ReadResponse)

    def read(
        self, topic: str, partition: int, start: int, end: int, max_messages: int = 0
    ) -> tuple[Sequence[Any], int]:
        """One page of ``[start, end)``: (messages, next offset)."""
        resp = self._read(topic, partition, start, end, max_messages, columnar=False)
        return resp.messages, resp.next_offset

    def read_columns(
        self, topic: str, partition: int, start: int, end: int, max_messages: int = 0
    ) -> tuple[Any, int]:
        """One page of ``[start, end)`` in the columnar form: (``ReadColumns``, next offset).

        Row i's message ID is not sent: it is ``str(partition << 48 | offsets[i])``."""
        resp = self._read(topic, partition, start, end, max_messages, columnar=True)
        if resp.messages:  # a server from before columnar reads ignored the request's field
            return columns_from_rows(resp.messages), resp.next_offset
        return resp.columns, resp.next_offset

    def read_page(
        self, topic: str, partition: int, start: int, end: int, max_messages: int = 0
    ) -> tuple[bytes | Any, int]:
        """One page of ``[start, end)``, asked for as Arrow: (``ReadResponse.arrow_ipc`` bytes,
        next offset) when the server answered so, else (``ReadColumns``, next offset) as
        :meth:`read_columns` returns (a server without pyarrow, or from before Arrow reads)."""
        resp = self._read(topic, partition, start, end, max_messages, columnar=True, arrow=True)
        if resp.arrow_ipc:
            return resp.arrow_ipc, resp.next_offset
        if resp.messages:  # a server from before columnar reads
            return columns_from_rows(resp.messages), resp.next_offset
        return resp.columns, resp.next_offset

    def get_cursor(self, topic: str, name: str) -> dict[int, int]:
        """A named cursor's positions; empty when the cursor does not exist yet."""
        try:
            resp = self._call(
                "GetCursor",
                replay_pb2.GetCursorRequest(topic=topic, name=name),
                replay_pb2.Cursor,
            )
        except ReplayError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                return {}
            raise
        return dict(resp.offsets)

    def commit_cursor(self, topic: str, name: str, positions: Mapping[int, int]) -> dict[int, int]:
        resp = self._call(
            "CommitCursor",
            replay_pb2.CommitCursorRequest(topic=topic, name=name, offsets=dict(positions)),
            replay_pb2.Cursor,
        )
        return dict(resp.offsets)

    def list_cursors(self, topic: str) -> dict[str, dict[int, int]]:
        """Every named cursor of the topic and its positions, in name order."""
        resp = self._call(
            "ListCursors",
            replay_pb2.ListCursorsRequest(topic=topic),
            replay_pb2.ListCursorsResponse,
        )
        return {c.name: dict(c.offsets) for c in resp.cursors}

    def delete_cursor(self, topic: str, name: str) -> None:
        """Delete a named cursor, releasing the data it pins; :class:`ReplayError` with code
        NOT_FOUND if the topic has no such cursor."""
        self._call(
            "DeleteCursor",
            replay_pb2.DeleteCursorRequest(topic=topic, name=name),
            replay_pb2.DeleteCursorResponse,
        )

    def publish_deduplicated(
        self, topic: str, messages: Iterable[OutgoingMessage]
    ) -> tuple[list[str], int]:
        """Publish one request's worth; returns (message IDs, how many were duplicates)."""
        req = replay_pb2.PublishDeduplicatedRequest(topic=topic)
        for m in messages:
            pb = req.messages.add(dedup_id=m.dedup_id, data=m.data, ordering_key=m.ordering_key)
            if m.attributes:
                pb.attributes.update(m.attributes)
        resp = self._call("PublishDeduplicated", req, replay_pb2.PublishDeduplicatedResponse)
        return list(resp.message_ids), int(resp.duplicates)

    def start_publish(self, request: Any) -> PendingPublish:
        """Send a ``PublishDeduplicatedRequest`` without waiting for its answer (the sink keeps
        a few in flight); :meth:`PendingPublish.result` waits, and sends it again as
        :meth:`_call` does if it failed with a retriable code."""
        response_type = replay_pb2.PublishDeduplicatedResponse
        future = self._stub("PublishDeduplicated", response_type).future(
            request, timeout=self.timeout, wait_for_ready=True
        )
        return PendingPublish(self, request, future)


def _serialize(message: Any) -> bytes:
    """A request message's bytes; bytes pass as they are (requests the sink encoded itself)."""
    return message if isinstance(message, bytes) else message.SerializeToString()  # type: ignore[no-any-return]


class PendingPublish:
    """A ``PublishDeduplicated`` call in flight."""

    def __init__(self, client: ReplayClient, request: Any, future: Any) -> None:
        self._client = client
        self._request = request
        self._future = future

    def result(self) -> tuple[int, int]:
        """(messages answered, how many of them were duplicates); :class:`ReplayError`."""
        try:
            resp = self._future.result()
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            if code not in _RETRY_CODES:
                details = exc.details() if hasattr(exc, "details") else str(exc)
                raise ReplayError("PublishDeduplicated", code, details or "") from exc
            self._client.retries += 1
            resp = self._client._call(
                "PublishDeduplicated", self._request, replay_pb2.PublishDeduplicatedResponse
            )
        return len(resp.message_ids), int(resp.duplicates)


def columns_from_rows(messages: Sequence[Any]) -> Any:
    """``ReplayMessage`` rows -> the ``ReadColumns`` a columnar Read returns for them."""
    cols = replay_pb2.ReadColumns()
    for m in messages:
        cols.offsets.append(m.offset)
        cols.data.append(m.data)
        cols.ordering_keys.append(m.ordering_key)
        ts = m.publish_time
        cols.publish_time_us.append(ts.seconds * 1_000_000 + ts.nanos // 1000)
        attrs = m.attributes
        cols.attribute_counts.append(len(attrs))
        for key in attrs:
            cols.attribute_keys.append(key)
            cols.attribute_values.append(attrs[key])
    return cols


_clients: dict[tuple[int, str, ClientSecurity], ReplayClient] = {}
_lock = threading.Lock()


def get_client(endpoint: str, security: ClientSecurity | None = None) -> ReplayClient:
    """This process's client for ``endpoint`` (a forked worker never reuses its parent's)."""
    security = security or ClientSecurity()
    key = (os.getpid(), endpoint, security)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = ReplayClient(endpoint, security=security)
                _clients[key] = client
    return client


def close_clients() -> None:
    """Close this process's channels (the driver's source calls it from ``stop()``)."""
    pid = os.getpid()
    with _lock:
        for key in [k for k in _clients if k[0] == pid]:
            _clients.pop(key).close()
