"""The HTTP port's connections (observability/http_conn.py) over loopback TCP, in-process:
keep-alive, bodies (Content-Length and chunked), the bounds, pipelining, a client that goes
away mid-request, and a response that cannot be written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pubsubd.observability import http_conn
from pubsubd.observability.http import MAX_REST_BODY, HttpEndpoint
from pubsubd.observability.http_conn import Request, Response

pytestmark = pytest.mark.unit


class Rest:
    """A stand-in REST handler: echoes what it got; "/v1/wait" waits until cancelled."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.cancelled = asyncio.Event()
        self.waiting = asyncio.Event()
        self.unsent = 0

    async def handle(self, request: Request) -> Response:
        self.requests.append(request)
        if request.target == "/v1/wait":
            self.waiting.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if request.target == "/v1/boom":
            raise RuntimeError("a bug")

        async def unsent() -> None:
            self.unsent += 1

        body = f"{request.method} {request.target} {len(request.body)}".encode()
        return Response(200, "text/plain", body, unsent=unsent)


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Rest]]:
    rest = Rest()
    endpoint = HttpEndpoint(lambda: {"ok": True}, rest=rest.handle)
    port = await endpoint.start("127.0.0.1", 0)
    yield port, rest
    await endpoint.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, await asyncio.wait_for(reader.readexactly(length), 5)


async def test_keep_alive_bodies_and_pipelining(served: tuple[int, Rest]) -> None:
    port, rest = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    assert await _read_response(reader) == (200, b"POST /v1/a 5")
    # Chunked, then two pipelined requests in one write, on the same connection.
    writer.write(
        b"PUT /v1/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    )
    assert await _read_response(reader) == (200, b"PUT /v1/b 7")
    writer.write(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\nDELETE /v1/c HTTP/1.1\r\nHost: x\r\n\r\n")
    status, body = await _read_response(reader)
    assert status == 200 and b'"ok": true' in body
    assert await _read_response(reader) == (200, b"DELETE /v1/c 0")
    # Only REST takes other verbs.
    writer.write(b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert (await _read_response(reader))[0] == 405
    writer.write(b"GET /v1/z HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert await _read_response(reader) == (200, b"GET /v1/z 0")
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed as asked
    writer.close()
    assert [r.body for r in rest.requests] == [b"hello", b"abcdefg", b"", b""]


@pytest.mark.parametrize(
    "request_bytes,status",
    [
        (
            b"POST /v1/a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_REST_BODY + 1),
            413,
        ),
        (b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n", 413),
        (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
        (b"GET /v1/a HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 5000 + b"\r\n", 431),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"POST /v1/a HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\n", 400),
        (b"POST /v1/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    ],
)
async def test_refused_requests(
    served: tuple[int, Rest], request_bytes: bytes, status: int
) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes)
    assert (await _read_response(reader))[0] == status
    writer.close()
    # The endpoint still serves.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/ok HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await _read_response(reader) == (200, b"GET /v1/ok 0")
    writer.close()


async def test_a_chunked_body_over_the_limit(
    served: tuple[int, Rest], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (40_000, b"x" * 40_000)
    writer.write(chunk + chunk)
    assert (await _read_response(reader))[0] == 413
    writer.close()


async def test_a_handler_bug_answers_500(served: tuple[int, Rest]) -> None:
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET /v1/boom HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/after HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert (await _read_response(reader))[0] == 500
    assert await _read_response(reader) == (200, b"GET /v1/after 0")
    writer.close()


async def test_a_client_that_goes_away_cancels_its_request(served: tuple[int, Rest]) -> None:
    port, rest = served
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/wait HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(rest.waiting.wait(), 5)
    writer.close()
    await asyncio.wait_for(rest.cancelled.wait(), 5)


async def test_an_unwritable_response_runs_unsent(monkeypatch: pytest.MonkeyPatch) -> None:
    rest = Rest()

    async def failing_send(*args: object, **kwargs: object) -> bool:
        return False

    monkeypatch.setattr(http_conn, "_send", failing_send)
    endpoint = HttpEndpoint(dict, rest=rest.handle)
    port = await endpoint.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert rest.unsent == 1
    finally:
        await endpoint.close()


async def test_idle_keep_alive_connections_end_with_the_endpoint() -> None:
    rest = Rest()
    endpoint = HttpEndpoint(dict, rest=rest.handle)
    port = await endpoint.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await _read_response(reader))[0] == 200
    await asyncio.wait_for(endpoint.close(), 10)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
