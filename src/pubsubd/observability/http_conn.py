"""One HTTP/1.1 connection of the HTTP port, served over h11: requests with bodies, keep-alive,
and every size and time bounded.

h11 parses and frames (request heads, Content-Length and chunked bodies, keep-alive and
``Connection: close``, HTTP/1.0); this module only does the I/O around it:

* A request head larger than ``MAX_HEAD`` bytes answers 431, a body larger than the handler's
  limit for the path (``max_body(target)``) answers 413 before it is read (Content-Length) or
  as soon as it passes the limit (chunked); malformed HTTP answers 400. Each closes the
  connection, as does a request not complete within ``READ_TIMEOUT_S`` of its first byte
  or a client idle for ``IDLE_TIMEOUT_S`` between requests.
* While the handler works, the connection is watched: a client that closes it cancels the
  handler (an in-flight Pull then gives its messages back). Bytes of a pipelined next request
  that arrive meanwhile are kept for it (reading stops after ``MAX_HEAD`` bytes: TCP then
  holds the rest back).
* A response that cannot be written runs its ``unsent`` callback (a Pull's messages go back).
* A handler that raises answers 500 and the server stays up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import h11

from pubsubd.core.deadlines import within

log = logging.getLogger(__name__)

__all__ = ["Handler", "Request", "Response", "serve_connection"]

MAX_HEAD = 16 * 1024
READ_TIMEOUT_S = 60.0
IDLE_TIMEOUT_S = 75.0
READ_CHUNK = 256 * 1024
LINGER_S = 2.0
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


@dataclass(frozen=True)
class Request:
    method: str  # "GET", "POST", ...
    target: str  # the raw request target: path and query, still percent-encoded
    headers: Mapping[str, str]  # lower-case names; the last of a repeated name wins
    body: bytes


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    # Called when the response could not be written to the client.
    unsent: Callable[[], Awaitable[None]] | None = field(default=None, compare=False)


Handler = Callable[[Request], Awaitable[Response]]


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class _Closed(Exception):
    """The client closed the connection (or sent nothing more)."""


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: Handler,
    max_body: Callable[[str], int],
    error: Callable[[int, str], Response],
) -> None:
    """Serve requests on one connection until either side closes it. ``error(status, text)``
    builds the answer to a request refused at the HTTP level."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    try:
        while True:
            try:
                request = await _read_request(conn, reader, max_body)
            except _Refused as e:
                if await _send(conn, writer, error(e.status, e.text)):
                    await _linger(reader, writer)
                return
            except h11.RemoteProtocolError as e:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # 400, or 431 for a long head
                    text = f"malformed HTTP request: {e}"
                    await _send(conn, writer, error(e.error_status_hint, text))
                return
            response = await _handle(conn, reader, handler, request)
            if response is None:
                return  # the client went away: nobody to answer
            if not await _send(conn, writer, response, request.method == "HEAD"):
                if response.unsent is not None:
                    await response.unsent()
                return
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (_Closed, TimeoutError, OSError, h11.LocalProtocolError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _next_event(
    conn: h11.Connection, reader: asyncio.StreamReader, wait_s: float, chunk: int = READ_CHUNK
) -> object:
    """The next h11 event, reading as needed; TimeoutError if a read waits over ``wait_s``."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await within(reader.read(chunk), wait_s)
        conn.receive_data(data)  # b"" marks the end of the stream


async def _read_request(
    conn: h11.Connection, reader: asyncio.StreamReader, max_body: Callable[[str], int]
) -> Request:
    # Heads are read in MAX_HEAD pieces, so h11 holds at most twice that before it refuses.
    event = await _next_event(conn, reader, IDLE_TIMEOUT_S, MAX_HEAD)
    if not isinstance(event, h11.Request):
        raise _Closed
    head = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
    if head > MAX_HEAD:
        raise _Refused(431, f"the request head is over {MAX_HEAD} bytes")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READ_TIMEOUT_S
    method = event.method.decode("latin-1")
    target = event.target.decode("latin-1")
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
    limit = max_body(target)
    declared = headers.get("content-length")
    if declared is not None and int(declared) > limit:
        raise _Refused(413, f"the request body is {declared} bytes; at most {limit} are accepted")
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await _next_event(conn, reader, max(0.0, deadline - loop.time()))
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > limit:
                raise _Refused(413, f"the request body is over {limit} bytes")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            break
        else:
            raise _Closed
    return Request(method, target, headers, b"".join(chunks))


async def _handle(
    conn: h11.Connection, reader: asyncio.StreamReader, handler: Handler, request: Request
) -> Response | None:
    """Run the handler while watching for the client closing the connection."""
    work = asyncio.ensure_future(handler(request))
    watch = asyncio.ensure_future(_watch(conn, reader))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
        watch.cancel()
        # The watch must have let go of the reader before the next request is read from it.
        await asyncio.wait((watch,))
    if not work.done() or work.cancelled():
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        return None
    try:
        return work.result()
    except Exception:
        log.exception("HTTP %s %s failed", request.method, request.target[:200])
        return Response(500, "text/plain", b"internal error\n")


async def _watch(conn: h11.Connection, reader: asyncio.StreamReader) -> None:
    """Return when the client closes its side; keep pipelined bytes for the next request."""
    kept = 0
    while kept <= MAX_HEAD:
        data = await reader.read(READ_CHUNK)
        if not data:
            return
        conn.receive_data(data)
        kept += len(data)
    await asyncio.Event().wait()  # enough kept: stop reading (TCP pushes back on the client)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After refusing a body: read and drop what the client still sends for a moment, so that
    closing does not reset the connection before the client reads the answer."""
    with contextlib.suppress(Exception):
        writer.write_eof()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINGER_S
    with contextlib.suppress(TimeoutError, OSError):
        while await within(reader.read(READ_CHUNK), max(0.0, deadline - loop.time())):
            pass


async def _send(
    conn: h11.Connection, writer: asyncio.StreamWriter, response: Response, head: bool = False
) -> bool:
    """Write a response (its head only for a HEAD request); False if the connection failed."""
    headers = [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        *response.headers,
    ]
    reason = REASONS.get(response.status, "")
    try:
        writer.write(
            conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
            + (b"" if head else conn.send(h11.Data(data=response.body)))
            + conn.send(h11.EndOfMessage())
        )
        await writer.drain()
    except (OSError, RuntimeError):
        return False
    return True
