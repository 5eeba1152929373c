"""The HTTP endpoint's routing (observability/http.py): query strings and percent-encoding,
the dashboard API's errors, pages and static files served only by their known names."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

import pytest

from pubsubd.observability.http import STATIC_FILES, HttpEndpoint, parse_target

pytestmark = pytest.mark.unit


def test_parse_target_decodes_path_and_query() -> None:
    assert parse_target("/api/topic?name=projects%2Fp%2Ftopics%2Fa%2Bb&x=") == (
        "/api/topic",
        {"name": "projects/p/topics/a+b", "x": ""},
    )
    assert parse_target("/status?") == ("/status", {})
    assert parse_target("/ui/topic?name=a&name=b")[1] == {"name": "b"}
    assert parse_target("") == ("/", {})


def _endpoint() -> HttpEndpoint:
    def topic(query: Mapping[str, str]) -> dict[str, str]:
        name = query.get("name")
        if not name:
            raise ValueError("the name= parameter is missing")
        if name != "projects/p/topics/a b":
            raise LookupError(f"no topic {name}")
        return {"name": name}

    async def slow(query: Mapping[str, str]) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"n": 1}

    return HttpEndpoint(
        lambda: {"topics": 0},
        json_routes={"/alerts": lambda: {"firing": []}},
        api_routes={"/api/topic": topic, "/api/slow": slow},
        pages={"/": "index.html", "/ui/topic": "topic.html"},
    )


async def test_routes_with_queries() -> None:
    e = _endpoint()
    code, ctype, body = await e.respond("/status?pretty=1")
    assert (code, ctype, json.loads(body)) == ("200 OK", "application/json", {"topics": 0})
    code, _, body = await e.respond("/api/topic?name=projects%2Fp%2Ftopics%2Fa%20b")
    assert code == "200 OK" and json.loads(body) == {"name": "projects/p/topics/a b"}
    code, _, body = await e.respond("/api/topic?name=nope")
    assert code == "404 Not Found" and json.loads(body) == {"error": "no topic nope"}
    code, _, body = await e.respond("/api/topic")
    assert code == "400 Bad Request" and "name=" in json.loads(body)["error"]
    assert (await e.respond("/api/slow"))[0] == "200 OK"  # an async handler is awaited
    code, ctype, _ = await e.respond("/healthz?x=1")
    assert code == "200 OK" and ctype == "text/plain"


async def test_a_target_that_is_not_a_url_is_a_bad_request() -> None:
    # urlsplit refuses "//h[" (a bracketed host that is no IPv6 address); it answered 500
    # with a traceback in the log until fuzzing found it (tests/fuzz/corpus/http_connection).
    code, _, body = await _endpoint().respond("//vv[x")
    assert code == "400 Bad Request" and b"malformed request target" in body


async def test_pages_and_static_files_by_known_names_only() -> None:
    e = _endpoint()
    code, ctype, body = await e.respond("/ui/topic?name=projects%2Fp%2Ftopics%2Fa")
    assert code == "200 OK" and ctype.startswith("text/html") and b"dashboard.js" in body
    assert (await e.respond("/"))[1].startswith("text/html")
    for name, expected in STATIC_FILES.items():
        code, ctype, body = await e.respond(f"/static/{name}")
        assert (code, ctype) == ("200 OK", expected) and body
    code, ctype, _ = await e.respond("/static/vendor/uplot/uPlot.iife.min.js")
    assert ctype.startswith("text/javascript")
    for bad in (
        "/static/../http.py",
        "/static/%2e%2e/http.py",
        "/static/..%2fhttp.py",
        "/static/index.html",  # a page is served at its path, not as a file
        "/static/vendor/uplot/uPlot.iife.js",
        "/static//etc/passwd",
        "/static/",
        "/ui/nope",
        "/etc/passwd",
    ):
        assert (await e.respond(bad))[0] == "404 Not Found", bad


async def test_served_over_tcp_with_a_query() -> None:
    e = _endpoint()
    port = await e.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /api/topic?name=nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        response = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert response.startswith(b"HTTP/1.1 404 Not Found\r\n")
        assert b"Content-Type: application/json" in response
        assert response.endswith(b'"error": "no topic nope"\n}')
    finally:
        await e.close()
