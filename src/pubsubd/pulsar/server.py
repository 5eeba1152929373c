"""The Pulsar port: accepts connections and serves each (connection.py) until it closes.

With ``ssl`` the port speaks TLS only (the clients' ``pulsar+ssl://`` URLs); with a token
``verifier`` every connection must authenticate in its CONNECT (connection.py). With
``open_in_process`` its consumers' StreamingPulls are opened in this process (streams.py), with
``publish_in_process`` its producers' publishes are made in it (gateway.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from ssl import SSLContext

from pubsubd.core.tokens import TokenVerifier
from pubsubd.pulsar.connection import Connection, ServerState
from pubsubd.pulsar.gateway import Gateway, PublishInProcess
from pubsubd.pulsar.streams import OpenInProcess

log = logging.getLogger(__name__)


class PulsarServer:
    def __init__(
        self,
        grpc_address: str,
        server_version: str,
        *,
        ssl: SSLContext | None = None,
        verifier: TokenVerifier | None = None,
        open_in_process: OpenInProcess | None = None,
        publish_in_process: PublishInProcess | None = None,
    ) -> None:
        self.state = ServerState(
            Gateway(grpc_address, publish_in_process),
            uuid.uuid4().hex[:8],
            server_version,
            verifier=verifier,
            tls=ssl is not None,
            open_in_process=open_in_process,
        )
        self._ssl = ssl
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); the bound port."""
        self._server = await asyncio.start_server(
            self._serve, host, port, limit=1 << 20, ssl=self._ssl
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await Connection(self.state, reader, writer).serve()
        except Exception:
            log.exception("pulsar connection failed")
        finally:
            self._connections.discard(task)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.state.gateway.close()
