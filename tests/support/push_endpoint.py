"""Push endpoints for tests: small HTTP servers on 127.0.0.1 ephemeral ports, in threads.

``PushEndpoint`` records every request (arrival time, path, headers, body) and answers with the
status its ``respond`` function picks for the n-th request (0-based). ``RawEndpoint`` accepts TCP
connections and answers with fixed bytes (garbage, or nothing at all). ``dead_port`` is a port on
which nothing listens (connection refused).
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    at: float  # time.monotonic() on arrival
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int  # what we answered

    def json(self) -> Any:
        return json.loads(self.body)

    def data(self) -> bytes:
        """The message data of a wrapped push."""
        return base64.b64decode(self.json()["message"]["data"])


class PushEndpoint:
    def __init__(self, respond: Callable[[int], int] = lambda _n: 200) -> None:
        self.respond = respond
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with endpoint.lock:
                    n = len(endpoint.requests)
                    status = endpoint.respond(n)
                    endpoint.requests.append(
                        Request(
                            time.monotonic(),
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            status,
                        )
                    )
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/push"

    def start(self) -> PushEndpoint:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def snapshot(self) -> list[Request]:
        with self.lock:
            return list(self.requests)

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def acked_data(self) -> list[bytes]:
        """Data of the wrapped pushes this endpoint acknowledged."""
        return [r.data() for r in self.snapshot() if r.status < 300]


class RawEndpoint:
    """Accepts connections, reads what comes, answers ``reply`` (b"" = never answer) and closes."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.connections = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/push"

    def start(self) -> RawEndpoint:
        self.thread.start()
        return self

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            if not self.reply:
                self._held.append(conn)  # never answer
                continue
            try:
                conn.settimeout(2)
                conn.recv(65536)
                conn.sendall(self.reply)
            except OSError:
                pass
            finally:
                conn.close()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        for c in self._held:
            c.close()
        self.sock.close()


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port
