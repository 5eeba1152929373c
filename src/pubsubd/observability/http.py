"""The HTTP endpoint for people and probes: /healthz, /readyz, /metrics (Prometheus text),
/status and the role's other JSON documents (``json_routes``: /alerts for a serving process),
the JSON API the dashboard reads (``api_routes``: handlers given the query string) and the
dashboard's pages and their files (``pages``: path -> a file of ``static/``).

/healthz and /readyz answer 200 while the process serves. A condition that a restart would not
cure (a full disk: storage/disk_space.py) keeps them at 200 and names itself in the body
("degraded: ..."): a liveness probe must not restart a process that only lacks disk space (the
restart would not free any, and start-up needs to write), and a readiness probe must not take
it out of service, because subscribers pulling and acking are what lets it trim its logs and
free space. Alerts read the ``pubsubd_disk_full`` gauge or /status.

Connections are HTTP/1.1 with keep-alive (``http_conn.py``: h11, bounded heads and bodies).
Paths under ``/v1/`` go to the REST front when one is given (``rest``: api/rest/front.py);
every other path answers GET (and HEAD) only.

With authentication on (``authenticate``: the process's token check, core/tokens.py), every
path but :data:`OPEN_PATHS` (/healthz, /readyz: probes carry no token) needs
``Authorization: Bearer T``; a request without a valid one answers 401 with Google's JSON error
body and a ``WWW-Authenticate: Bearer`` header, before anything else is looked at. The REST
front passes the header on to the gRPC call, so the call runs as the same caller. With TLS
(``start(..., ssl=...)``) the port speaks HTTPS only.

A browser cannot add a bearer header to the dashboard's page loads, so the dashboard signs in
with a cookie: ``/login`` (open) shows a form that POSTs a token; a valid one is set as the
``pubsubd-token`` cookie (HttpOnly, SameSite=Strict, Secure with TLS, for the browser session)
and the browser goes to ``/``; ``/logout`` clears it. The cookie is accepted in place of the
header only for GET and HEAD outside ``/v1/`` (the dashboard's pages, files and JSON API,
/status, /metrics: reads), never for REST calls, so a page elsewhere cannot make the browser
change anything with it. A dashboard page asked for without a valid token redirects to
``/login``; other paths answer 401 as above.

Files are served only by exact known names (:data:`STATIC_FILES`, under ``/static/``): a path
never reaches the file system, so no request can read anything else. An API handler raising
``LookupError`` answers 404, ``ValueError`` 400, both as ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from ssl import SSLContext
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pubsubd.core.errors import Unauthenticated
from pubsubd.observability.http_conn import Handler, Request, Response, serve_connection

log = logging.getLogger(__name__)

# Requests under /v1/ go to the REST front (api/rest/) when the role serves one. Google accepts
# a Publish of up to 10 MB, whose messages' data is base64 in JSON (4/3 larger): a body up to
# MAX_REST_BODY reaches the service, which applies Google's limits to the decoded request.
REST_PREFIX = "/v1/"
MAX_REST_BODY = 16 << 20
MAX_OTHER_BODY = 64 << 10
NO_CACHE = (("Cache-Control", "no-cache"),)
STATIC_DIR = Path(__file__).parent / "static"
# Every file /static/ may serve, with its Content-Type; nothing else is ever opened.
STATIC_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "vendor/uplot/uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "vendor/uplot/uPlot.min.css": "text/css; charset=utf-8",
    "vendor/uplot/LICENSE": "text/plain; charset=utf-8",
}
HTML = "text/html; charset=utf-8"
# Paths that answer without a token when authentication is on: liveness and readiness probes.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# The dashboard's sign-in with authentication on (see the module docstring).
LOGIN_PATH, LOGOUT_PATH = "/login", "/logout"
TOKEN_COOKIE = "pubsubd-token"
_COOKIE_SAFE = re.compile(r"[A-Za-z0-9._~+/=-]{1,4096}")  # JWTs; static tokens of these characters

Query = Mapping[str, str]
ApiHandler = Callable[[Query], Any | Awaitable[Any]]


def parse_target(target: str) -> tuple[str, dict[str, str]]:
    """A request target's percent-decoded path and query parameters (the last of a repeated
    name wins); ValueError if it is not a URL."""
    parts = urlsplit(target)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    return unquote(parts.path) or "/", query


class HttpEndpoint:
    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        problem: Callable[[], str | None] = lambda: None,
        json_routes: dict[str, Callable[[], Any]] | None = None,
        api_routes: dict[str, ApiHandler] | None = None,
        pages: dict[str, str] | None = None,
        rest: Handler | None = None,
        authenticate: Callable[[str | None], object] | None = None,
    ) -> None:
        self._status = status
        self._problem = problem  # a degraded condition to name in /healthz, /readyz
        self._json = {"/status": status, **(json_routes or {})}
        self._api = dict(api_routes or {})
        self._pages = dict(pages or {})  # path -> HTML file name in STATIC_DIR
        self._files: dict[str, bytes] = {}  # read once, on first use
        self.rest = rest  # the REST front's handler for /v1/... (api/rest/front.py)
        # Checks an Authorization header, raising Unauthenticated (None: authentication off).
        self.authenticate = authenticate
        self._server: asyncio.base_events.Server | None = None
        self._secure = False
        self._connections: set[asyncio.Task[Any]] = set()

    async def start(self, host: str, port: int, ssl: SSLContext | None = None) -> int:
        """Listen on host:port (0: any free port), with TLS when ``ssl`` is given; the bound
        port."""
        self._secure = ssl is not None  # the token cookie is Secure over HTTPS
        self._server = await asyncio.start_server(self._handle, host, port, ssl=ssl)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        # Kept-alive connections (and requests in flight) end with the endpoint.
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=5)

    def _file(self, name: str) -> bytes:
        body = self._files.get(name)
        if body is None:
            body = self._files[name] = (STATIC_DIR / name).read_bytes()
        return body

    async def respond(self, target: str) -> tuple[str, str, bytes]:
        """(status line, Content-Type, body) for a GET of ``target``."""
        try:
            path, query = parse_target(target)
        except ValueError as e:  # e.g. "//h[": a bracketed host that is no IPv6 address
            return "400 Bad Request", "text/plain", f"malformed request target: {e}\n".encode()
        if path in ("/healthz", "/readyz"):
            problem = self._problem()
            text = "ok\n" if problem is None else f"degraded: {problem}\n"
            return "200 OK", "text/plain", text.encode()
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest()
        if path in self._json:
            return "200 OK", "application/json", _json(self._json[path]())
        if path in self._api:
            try:
                value = self._api[path](query)
                if inspect.isawaitable(value):
                    value = await value
            except LookupError as e:
                return "404 Not Found", "application/json", _json({"error": _message(e)})
            except ValueError as e:
                return "400 Bad Request", "application/json", _json({"error": _message(e)})
            return "200 OK", "application/json", _json(value)
        if path in self._pages:
            return "200 OK", HTML, self._file(self._pages[path])
        name = path.removeprefix("/static/")
        if path.startswith("/static/") and name in STATIC_FILES:
            return "200 OK", STATIC_FILES[name], self._file(name)
        return "404 Not Found", "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await serve_connection(reader, writer, self._dispatch, self._max_body, _error)
        finally:
            if task is not None:
                self._connections.discard(task)

    def _is_rest(self, target: str) -> bool:
        return self.rest is not None and target.startswith(REST_PREFIX)

    def _max_body(self, target: str) -> int:
        return MAX_REST_BODY if self._is_rest(target) else MAX_OTHER_BODY

    async def _dispatch(self, request: Request) -> Response:
        if self.authenticate is not None:
            path = _path(request.target)
            if path == LOGIN_PATH:
                return self._login(request)
            if path == LOGOUT_PATH:
                return _redirect(LOGIN_PATH, self._cookie("", expire=True))
            refused = self._refuse(request)
            if refused is not None:
                return refused
        if self.rest is not None and self._is_rest(request.target):
            return await self.rest(request)
        if request.method not in ("GET", "HEAD"):
            return Response(405, "text/plain", b"only GET is served here\n", (("Allow", "GET"),))
        try:
            code, ctype, body = await self.respond(request.target)
        except Exception:
            log.exception("HTTP GET %s failed", request.target[:200])
            code, ctype, body = "500 Internal Server Error", "text/plain", b"error\n"
        return Response(int(code.split(" ", 1)[0]), ctype, body, NO_CACHE)

    def _refuse(self, request: Request) -> Response | None:
        """401 for a request that needs a token and has no valid one; None to go on."""
        assert self.authenticate is not None
        path = _path(request.target)
        if path in OPEN_PATHS:
            return None
        header = request.headers.get("authorization")
        reads = request.method in ("GET", "HEAD") and not path.startswith(REST_PREFIX)
        if header is None and reads:  # the dashboard's cookie: reads only
            token = _cookie_token(request.headers.get("cookie"))
            header = f"Bearer {token}" if token else None
        try:
            self.authenticate(header)
        except Unauthenticated as e:
            if reads and path in self._pages:  # a person at a browser: sign in first
                return _redirect(LOGIN_PATH)
            error = {"code": 401, "message": str(e), "status": "UNAUTHENTICATED"}
            body = (json.dumps({"error": error}, indent=2) + "\n").encode()
            headers = (("WWW-Authenticate", "Bearer"), *NO_CACHE)
            return Response(401, "application/json; charset=UTF-8", body, headers)
        return None

    def _login(self, request: Request) -> Response:
        """GET: the sign-in form. POST: a valid token becomes the cookie (303 to ``/``); an
        invalid one answers 401 with the reason."""
        assert self.authenticate is not None
        if request.method != "POST":
            return Response(200, HTML, self._file("login.html"), NO_CACHE)
        fields = dict(parse_qsl(request.body.decode("utf-8", "replace")))
        token = fields.get("token", "").strip()
        try:
            if not _COOKIE_SAFE.fullmatch(token):
                raise Unauthenticated("the token has characters a cookie cannot hold")
            self.authenticate(f"Bearer {token}")
        except Unauthenticated as e:
            text = f"not signed in: {e}\n(back to {LOGIN_PATH})\n"
            return Response(401, "text/plain; charset=utf-8", text.encode(), NO_CACHE)
        return _redirect("/", self._cookie(token))

    def _cookie(self, token: str, *, expire: bool = False) -> tuple[str, str]:
        attributes = "; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if self._secure else "")
        if expire:
            attributes += "; Max-Age=0"
        return ("Set-Cookie", f"{TOKEN_COOKIE}={token}{attributes}")


def _path(target: str) -> str:
    try:
        return parse_target(target)[0]
    except ValueError:
        return ""


def _cookie_token(header: str | None) -> str | None:
    """The dashboard's token in a ``Cookie`` header (None: none, or a malformed header)."""
    if not header:
        return None
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(header)
    except CookieError:
        return None
    morsel = cookies.get(TOKEN_COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


def _redirect(location: str, *headers: tuple[str, str]) -> Response:
    return Response(303, "text/plain", b"", (("Location", location), *headers, *NO_CACHE))


def _error(status: int, text: str) -> Response:
    return Response(status, "text/plain", f"{text}\n".encode())


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=2).encode()


def _message(e: Exception) -> str:
    return str(e.args[0]) if e.args else type(e).__name__
