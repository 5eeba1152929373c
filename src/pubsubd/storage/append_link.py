"""The writer's side of a storage node's append port (``storagenode/append_port.py``): one TCP
connection per node carrying ``AppendStreamRequest`` frames, answered by ``AppendStreamResponse``
frames matched by request ID, as on the gRPC ``AppendStream``.

Appends are written in call order (the node starts them in arrival order, so a ledger's
appends stay in order per node). When the connection ends every waiting append fails with
:class:`LinkEnded`; the client sends it again (a node accepts a retry of what it stores) and
the next append connects anew. A connection starts with the process's internal token when it
has one (:func:`preamble`, read from its file then, so a replaced token is used from the next
connection on); a node that refuses it answers every append UNAUTHENTICATED (or
PERMISSION_DENIED), and the first such answer ends the connection, so the next append
connects again with the current token. A node closes a connection whose token expires.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from google.protobuf.message import DecodeError

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.core.deadlines import within
from pubsubd.core.internal_token import INTERNAL_TOKEN
from pubsubd.core.tls import INTERNAL
from pubsubd.storage.node_client import (
    APPEND_PORT_MAGIC,
    APPEND_PORT_TOKEN_MAGIC,
    MAX_MESSAGE_BYTES,
    AnswerCallback,
    AnswerWaiters,
    EncodedAppend,
    NodeUnavailable,
    StorageNodeError,
    stream_request,
)

__all__ = ["AppendLink", "LinkEnded", "preamble"]

CONNECT_TIMEOUT_S = 5.0
# A node's answers about the connection's token rather than the append itself.
REFUSED_CREDENTIAL = frozenset(
    {grpc.StatusCode.UNAUTHENTICATED.value[0], grpc.StatusCode.PERMISSION_DENIED.value[0]}
)


class LinkEnded(NodeUnavailable):
    """The connection ended (or never came up) before the append's answer came."""


def preamble(token: str | None) -> bytes:
    """What a connection starts with: the plain preamble, or with a token (the process's
    internal token, checked by a node with authentication on) the token preamble."""
    if token is None:
        return APPEND_PORT_MAGIC
    body = token.encode()
    return APPEND_PORT_TOKEN_MAGIC + len(body).to_bytes(4, "big") + body


class AppendLink:
    """One connection to a node's append port, opened by the first append."""

    def __init__(self, address: str, append_address: str) -> None:
        self.address = address  # the node's gRPC address: how errors name it
        self.append_address = append_address
        self._waiters = AnswerWaiters(address)
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._backlog: list[tuple[bytes, bytes]] = []  # appends made before the connection
        self._reader: asyncio.Task[None] | None = None
        self.broken: StorageNodeError | None = None

    async def append(self, request: EncodedAppend, deadline_s: float) -> int:
        """Send an encoded AppendRequest; its answer's end offset, or its refusal."""
        if self.broken is not None:
            raise self.broken
        request_id, future = self._waiters.add(deadline_s)
        try:
            self._send(request_id, request)
            return await future
        finally:
            self._waiters.remove(request_id)

    def submit(self, request: EncodedAppend, deadline_s: float, answered: AnswerCallback) -> None:
        """:meth:`append` without a coroutine: the request is written now (or queued for the
        connection, in call order) and ``answered`` is called with its outcome from the
        connection's reader (no event-loop turn in between), its deadline or the link's end."""
        if self.broken is not None:
            raise self.broken
        self._send(self._waiters.add_callback(deadline_s, answered), request)

    def _send(self, request_id: int, request: EncodedAppend) -> None:
        prefix, frames = stream_request(request_id, request)
        size = len(prefix) + len(frames)
        buffers = (size.to_bytes(4, "big") + prefix, frames)
        if self._writer is not None:
            self._writer.writelines(buffers)
        else:  # written, in call order, as soon as the connection is up
            self._backlog.append(buffers)
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        host, _, port = self.append_address.rpartition(":")
        try:
            tls = INTERNAL.tls  # the append port speaks TLS when the cluster does
            reader, writer = await within(
                asyncio.open_connection(
                    host,
                    int(port),
                    ssl=tls.context() if tls is not None else None,
                    server_hostname=host.strip("[]") if tls is not None else None,
                ),
                CONNECT_TIMEOUT_S,
            )
        except (OSError, TimeoutError, ValueError) as e:  # ssl.SSLError is an OSError
            self._backlog.clear()
            self._end(LinkEnded(self.address, grpc.StatusCode.UNAVAILABLE, f"append port: {e}"))
            return
        writer.write(preamble(INTERNAL_TOKEN.current()))
        for buffers in self._backlog:  # no await from here on: nothing can overtake them
            writer.writelines(buffers)
        self._backlog.clear()
        self._writer = writer
        self._reader = asyncio.ensure_future(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why = "the node closed the connection"
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                if size > MAX_MESSAGE_BYTES:
                    why = f"an answer of {size} bytes"
                    break
                answer = pb.AppendStreamResponse.FromString(await reader.readexactly(size))
                self._waiters.settle(answer)
                if answer.code in REFUSED_CREDENTIAL:
                    # The node refused this connection's token (none, expired, forged, not
                    # the cluster's): the connection is no use. The next append connects
                    # anew with the token the process holds then (its file may have changed).
                    why = "the node refused the connection's token"
                    break
        except (asyncio.IncompleteReadError, OSError, DecodeError) as e:
            why = str(e) or type(e).__name__
        except asyncio.CancelledError:
            why = "closed"
            raise
        finally:
            self._end(LinkEnded(self.address, grpc.StatusCode.UNAVAILABLE, f"append port: {why}"))

    def _end(self, error: StorageNodeError) -> None:
        self.broken = self.broken or error
        self._waiters.fail_all(self.broken)
        if self._writer is not None:
            self._writer.close()

    async def close(self) -> None:
        self._end(LinkEnded(self.address, None, "append port: closed"))
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
