"""The storage node's append port: AppendStream's messages over a plain TCP connection.

Appends are the one call a writer makes thousands of times a second, and a gRPC message costs
each side of it several times what the append's own work does here (BENCHMARKS.md, "Replicated
storage"). So a node also serves them the way BookKeeper serves its entries: the same versioned
messages of ``proto/pubsubd/internal/v1/storage.proto``, length-prefixed on a connection of
their own. A connection starts with :data:`~pubsubd.storage.node_client.APPEND_PORT_MAGIC`;
then every frame is 4 bytes of length (big-endian) and an ``AppendStreamRequest``, answered by
frames of ``AppendStreamResponse`` in completion order, exactly as on ``AppendStream``. A frame
that is too long or does not parse closes that connection (and only that one); every other
refusal is an answer.

With authentication on (a ``TokenVerifier``), a connection must start with
:data:`~pubsubd.storage.node_client.APPEND_PORT_TOKEN_MAGIC` and a valid token of one of the
``internal`` principals (the cluster's identity, ``core/internal_token.py``), checked when the
connection opens: on any other connection every append is answered UNAUTHENTICATED (no valid
token) or PERMISSION_DENIED (another principal's) and none reaches the store. A token that
expires (``exp``) ends its connection then: the connection is closed, appends not yet answered
fail on the writer's side, which sends them again (as after any lost connection) and connects
anew with its current token (``storage/append_link.py``). So does a frame that arrives once the
connection's principal is no longer the cluster's identity (the internal token file changed
subject: ``InternalIdentity``). Without authentication both preambles
are accepted and a token is ignored.

The node registers the port's address in ZooKeeper (``append_address``);
writers that do not know it use gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from ssl import SSLContext

from google.protobuf.message import DecodeError

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.api.grpc.status import to_status
from pubsubd.core.errors import PermissionDenied, Unauthenticated
from pubsubd.core.internal_token import InternalIdentity, require_internal
from pubsubd.core.principal import Principal
from pubsubd.core.tokens import TokenVerifier
from pubsubd.storage.node_client import (
    APPEND_PORT_MAGIC,
    APPEND_PORT_TOKEN_MAGIC,
    MAX_MESSAGE_BYTES,
    MAX_TOKEN_BYTES,
)
from pubsubd.storagenode.appends import start_append
from pubsubd.storagenode.ledger_store import LedgerStore

log = logging.getLogger(__name__)

__all__ = ["AppendPort", "BadPreamble", "read_preamble"]

SERVICE = "the append port"  # how a refusal names what was called

Refusal = Callable[[int], pb.AppendStreamResponse]


class BadPreamble(Exception):
    """A connection did not open with a preamble the port takes (the message says how): the
    port closes it."""


async def read_preamble(reader: asyncio.StreamReader) -> str | None:
    """The token a connection opens with (None: the plain preamble, no token). Raises
    BadPreamble, or IncompleteReadError when the connection ends first."""
    magic = await reader.readexactly(len(APPEND_PORT_MAGIC))
    if magic == APPEND_PORT_MAGIC:
        return None
    if magic != APPEND_PORT_TOKEN_MAGIC:
        raise BadPreamble("it did not start with the append port's preamble")
    size = int.from_bytes(await reader.readexactly(4), "big")
    if size > MAX_TOKEN_BYTES:
        raise BadPreamble(f"a token of {size} bytes (at most {MAX_TOKEN_BYTES})")
    return (await reader.readexactly(size)).decode(errors="replace")


class AppendPort:
    """A TCP listener taking appends for ``store``; :meth:`start` returns its port."""

    def __init__(
        self,
        store: LedgerStore,
        host: str,
        port: int = 0,
        ssl: SSLContext | None = None,
        verifier: TokenVerifier | None = None,
        internal: InternalIdentity | None = None,
    ) -> None:
        self.store = store
        self.verifier = verifier  # authentication on: every connection shows a valid token
        self.internal = internal  # ... of its principals now (None: any)
        self._ssl = ssl  # TLS when the node's ports speak it
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.refused_connections = 0
        self.unauthenticated_connections = 0
        self.denied_connections = 0  # a valid token of a principal not let in
        self.expired_connections = 0  # closed when their token expired
        self.revoked_connections = 0  # closed when their principal was no longer let in

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, self.port, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop listening and drop every connection (writers see them end and go elsewhere)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the writer went away
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            token = await read_preamble(reader)
        except BadPreamble as e:
            self._refuse(peer, str(e))
            return
        denied, until, principal = self.authenticate(peer, token)
        expiry: asyncio.TimerHandle | None = None
        if math.isfinite(until):
            expiry = asyncio.get_running_loop().call_later(
                max(0.0, until - time.time()), self._expire, writer, peer
            )
        try:
            await self._appends(reader, writer, peer, denied, until, principal)
        finally:
            if expiry is not None:
                expiry.cancel()

    async def _appends(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: object,
        denied: Refusal | None,
        until: float,
        principal: Principal | None,
    ) -> None:
        """Serve a connection's appends; ``until``: when its token expires (wall clock);
        ``principal``: who it authenticated as (None: authentication off)."""

        def answered(answer: pb.AppendStreamResponse) -> None:
            if writer.is_closing():
                return
            body = answer.SerializeToString()
            writer.write(len(body).to_bytes(4, "big") + body)

        while True:
            size = int.from_bytes(await reader.readexactly(4), "big")
            if size > MAX_MESSAGE_BYTES:
                self._refuse(peer, f"a frame of {size} bytes (at most {MAX_MESSAGE_BYTES})")
                return
            body = await reader.readexactly(size)
            try:
                request = pb.AppendStreamRequest.FromString(body)
            except DecodeError:
                self._refuse(peer, "a frame that is not an AppendStreamRequest")
                return
            if denied is not None:
                answered(denied(request.request_id))
                continue
            if until != math.inf and time.time() >= until:
                self._expire(writer, peer)  # before the timer: this append is not taken
                return
            if (
                principal is not None
                and self.internal is not None
                and not self.internal.allows(principal)
            ):
                self._revoke(writer, peer, principal)  # the internal token changed subject
                return
            # Queued in arrival order: a ledger's appends reach the store in the order sent.
            start_append(self.store, request, answered)

    def authenticate(
        self, peer: object, token: str | None
    ) -> tuple[Refusal | None, float, Principal | None]:
        """How each of the connection's appends is answered (None: they may append), when
        its token expires (wall clock; ``inf``: never, or authentication off) and whom it
        names (None: authentication off, or refused)."""
        if self.verifier is None:
            return None, math.inf, None
        try:
            if token is None:
                self.verifier.principal(None)  # raises: the connection carries no token
            assert token is not None
            principal, until = self.verifier.verify_until(token)
            if self.internal is not None:
                require_internal(principal, self.internal.principals(), SERVICE)
        except Unauthenticated as e:
            self.unauthenticated_connections += 1
            log.warning("append port: the connection from %s is unauthenticated: %s", peer, e)
            return _refusal(e), math.inf, None
        except PermissionDenied as e:
            self.denied_connections += 1
            log.warning("append port: the connection from %s is refused: %s", peer, e)
            return _refusal(e), math.inf, None
        return None, until, principal

    def _expire(self, writer: asyncio.StreamWriter, peer: object) -> None:
        """End a connection whose token expired: the writer reconnects with its current one."""
        if writer.is_closing():
            return
        self.expired_connections += 1
        log.info("append port: the token of the connection from %s expired: closing it", peer)
        writer.close()

    def _revoke(self, writer: asyncio.StreamWriter, peer: object, principal: Principal) -> None:
        """End a connection whose principal is no longer the cluster's identity: its writer
        reconnects with the token now in its file."""
        self.revoked_connections += 1
        log.info(
            "append port: %s (the connection from %s) is no longer the cluster's identity: "
            "closing it",
            principal.member,
            peer,
        )
        writer.close()

    def _refuse(self, peer: object, why: str) -> None:
        self.refused_connections += 1
        log.warning("append port: closing the connection from %s: %s", peer, why)


def _refusal(error: Unauthenticated | PermissionDenied) -> Refusal:
    """Every append of a refused connection answered with ``error``'s status and message."""
    message = str(error)
    code = to_status(error)[0].value[0]

    def refused(request_id: int) -> pb.AppendStreamResponse:
        return pb.AppendStreamResponse(request_id=request_id, code=code, message=message)

    return refused
