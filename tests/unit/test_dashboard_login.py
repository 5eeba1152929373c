"""The dashboard's sign-in with authentication on (observability/http.py): ``/login`` turns a
valid token into an HttpOnly, SameSite=Strict cookie; the cookie stands in for the bearer
header on GET/HEAD reads outside ``/v1/`` only (never a REST call); a page without a valid
token redirects to ``/login``; ``/logout`` clears the cookie."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from pubsubd.core.errors import Unauthenticated
from pubsubd.observability.http import TOKEN_COOKIE, HttpEndpoint
from pubsubd.observability.http_conn import Request, Response

pytestmark = pytest.mark.unit

GOOD = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.sig-_"


def _authenticate(header: str | None) -> object:
    if header != f"Bearer {GOOD}":
        raise Unauthenticated("the token's signature does not verify")
    return "user:a"


class _Rest:
    def __init__(self) -> None:
        self.calls = 0

    async def handle(self, request: Request) -> Response:
        self.calls += 1
        return Response(200, "application/json", b"{}")


def _endpoint(rest: _Rest) -> HttpEndpoint:
    return HttpEndpoint(
        lambda: {"ok": True},
        api_routes={"/api/overview": lambda q: {"topics": 1}},
        pages={"/": "index.html"},
        rest=rest.handle,
        authenticate=_authenticate,
    )


def _request(method: str, target: str, body: bytes = b"", **headers: str) -> Request:
    return Request(method, target, {k.replace("_", "-"): v for k, v in headers.items()}, body)


def _headers(response: Response) -> dict[str, str]:
    return {k.lower(): v for k, v in response.headers}


async def test_sign_in_sets_a_cookie_the_dashboard_reads_with() -> None:
    rest = _Rest()
    e = _endpoint(rest)
    page = await e._dispatch(_request("GET", "/"))
    assert page.status == 303 and _headers(page)["location"] == "/login"
    api = await e._dispatch(_request("GET", "/api/overview"))
    assert api.status == 401 and _headers(api)["www-authenticate"] == "Bearer"
    form = await e._dispatch(_request("GET", "/login"))
    assert form.status == 200 and b'action="/login"' in form.body
    bad = await e._dispatch(_request("POST", "/login", urlencode({"token": "nope"}).encode()))
    assert bad.status == 401 and b"does not verify" in bad.body
    assert "set-cookie" not in _headers(bad)
    good = await e._dispatch(_request("POST", "/login", urlencode({"token": GOOD}).encode()))
    assert good.status == 303 and _headers(good)["location"] == "/"
    cookie = _headers(good)["set-cookie"]
    assert cookie.startswith(f"{TOKEN_COOKIE}={GOOD};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
    jar = f"other=1; {TOKEN_COOKIE}={GOOD}"
    for target in ("/", "/api/overview", "/status", "/static/dashboard.css"):
        assert (await e._dispatch(_request("GET", target, cookie=jar))).status == 200, target
    # Not for REST, whatever the method: a page elsewhere cannot use the browser's cookie.
    for method in ("GET", "POST", "DELETE"):
        refused = await e._dispatch(_request(method, "/v1/projects/p/topics/t", cookie=jar))
        assert refused.status == 401, method
    assert rest.calls == 0
    rest_ok = await e._dispatch(
        _request("GET", "/v1/projects/p/topics/t", authorization=f"Bearer {GOOD}")
    )
    assert rest_ok.status == 200 and rest.calls == 1
    forged = await e._dispatch(_request("GET", "/", cookie=f"{TOKEN_COOKIE}=forged"))
    assert forged.status == 303
    out = await e._dispatch(_request("GET", "/logout", cookie=jar))
    assert out.status == 303 and "Max-Age=0" in _headers(out)["set-cookie"]


async def test_the_cookie_is_secure_over_https_and_unused_without_authentication() -> None:
    e = _endpoint(_Rest())
    e._secure = True  # what start(ssl=...) sets
    good = await e._dispatch(_request("POST", "/login", urlencode({"token": GOOD}).encode()))
    assert "; Secure" in _headers(good)["set-cookie"]
    odd = await e._dispatch(_request("POST", "/login", b"token=a%20b%3Bc"))
    assert odd.status == 401 and b"cookie cannot hold" in odd.body
    open_endpoint = HttpEndpoint(lambda: {"ok": True}, pages={"/": "index.html"})
    assert (await open_endpoint._dispatch(_request("GET", "/"))).status == 200
    assert (await open_endpoint._dispatch(_request("GET", "/login"))).status == 404
