"""The HTTP endpoint for people and probes: /healthz, /readyz, /metrics (Prometheus text),
/status and the role's other JSON documents (``json_routes``: /alerts for a serving process).

/healthz and /readyz answer 200 while the process serves. A condition that a restart would not
cure (a full disk: storage/disk_space.py) keeps them at 200 and names itself in the body
("degraded: ..."): a liveness probe must not restart a process that only lacks disk space (the
restart would not free any, and start-up needs to write), and a readiness probe must not take
it out of service, because subscribers pulling and acking are what lets it trim its logs and
free space. Alerts read the ``pubsubd_disk_full`` gauge or /status.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 8192


class HttpEndpoint:
    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        problem: Callable[[], str | None] = lambda: None,
        json_routes: dict[str, Callable[[], Any]] | None = None,
    ) -> None:
        self._status = status
        self._problem = problem  # a degraded condition to name in /healthz, /readyz
        self._json = {"/status": status, **(json_routes or {})}
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            parts = head[:MAX_REQUEST_HEAD].split(b" ", 2)
            path = parts[1].decode("latin-1") if len(parts) > 1 else "/"
            if path in ("/healthz", "/readyz"):
                problem = self._problem()
                text = "ok\n" if problem is None else f"degraded: {problem}\n"
                body, ctype, code = text.encode(), "text/plain", "200 OK"
            elif path == "/metrics":
                body, ctype, code = generate_latest(), CONTENT_TYPE_LATEST, "200 OK"
            elif path in self._json:
                body = json.dumps(self._json[path](), indent=2).encode()
                ctype, code = "application/json", "200 OK"
            else:
                body, ctype, code = b"not found\n", "text/plain", "404 Not Found"
            writer.write(
                f"HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        finally:
            writer.close()
