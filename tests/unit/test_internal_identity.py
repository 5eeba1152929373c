"""The cluster's identity (core/internal_token.py ``InternalIdentity``, ``internal_only``) and
the authentication interceptor that lets only it call a forwarder's internal methods
(api/grpc/authn.py ``AuthInterceptor(verifier, internal, only=internal_only)``), on an
in-process grpc.aio server: a client's or an admin's valid token calling ``Sources/Attach`` is
refused PERMISSION_DENIED before the handler runs, the internal token passes, google.pubsub.v1
methods and ``Forwarder/GiveBack`` stay open to any valid token, and ``Forwarder/Identify`` to
anyone. When the internal token file is replaced by a token of another subject the identity
follows it (the old subject stays accepted for the grace, ``Succession``, then is refused); a
file that cannot be read, or holds a token this process refuses, keeps the identity read before.
A long call (``LongCall``: a forwarder's Tail) is refused once its token expires or its caller
is no longer the identity."""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pubsubd.api.grpc.authn import AuthInterceptor, LongCall
from pubsubd.core import internal_token
from pubsubd.core.errors import NotInternalCaller, Unauthenticated
from pubsubd.core.internal_token import InternalIdentity, Succession, internal_only
from pubsubd.core.principal import CALLER, CALLER_UNTIL, Principal, caller
from pubsubd.core.tokens import TokenSettings, TokenVerifier, create_token

pytestmark = pytest.mark.unit

SECRET = b"k" * 32
ATTACH = "/pubsubd.internal.v1.Sources/Attach"
TAIL = "/pubsubd.internal.v1.Sources/Tail"
CURSORS = "/pubsubd.internal.v1.Forwarder/SubscriptionCursors"
GIVE_BACK = "/pubsubd.internal.v1.Forwarder/GiveBack"
IDENTIFY = "/pubsubd.internal.v1.Forwarder/Identify"
PUBLISH = "/google.pubsub.v1.Publisher/Publish"


def _token(subject: str) -> str:
    return create_token(subject, secret=SECRET, expires_in_s=600, now=time.time())


def _write(path: Path, token: str) -> None:
    """Replace ``path`` as an operator would (a new file renamed over the old one)."""
    fresh = path.with_suffix(".new")
    fresh.write_text(token + "\n")
    os.replace(fresh, path)


@pytest.fixture(autouse=True)
def _no_recheck_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internal_token, "RECHECK_S", 0.0)


def test_internal_only_names_every_internal_method_but_identify_and_give_back() -> None:
    for method in (ATTACH, TAIL, CURSORS, "/pubsubd.internal.v1.StorageNode/Append"):
        assert internal_only(method), method
    for method in (GIVE_BACK, IDENTIFY, PUBLISH, "/google.iam.v1.IAMPolicy/GetIamPolicy"):
        assert not internal_only(method), method


def test_the_identity_follows_its_file_to_another_subject(tmp_path: Path) -> None:
    verifier = TokenVerifier(TokenSettings(SECRET))
    path = tmp_path / "internal.token"
    path.write_text(_token("cluster-a"))
    identity = InternalIdentity(verifier, path, grace_s=0)
    a, b = Principal.from_subject("cluster-a"), Principal.from_subject("cluster-b")
    assert identity.principals() == {a}
    _write(path, _token("cluster-b"))
    assert identity.allows(b) and not identity.allows(a)
    # Unreadable, or a token this process refuses: the last identity stays.
    _write(path, create_token("mallory", secret=b"x" * 32, now=time.time()))
    assert identity.principals() == {b}
    path.unlink()
    assert identity.principals() == {b}
    path.write_text(_token("cluster-a"))
    assert identity.principals() == {a}


A, B, C = (Principal.from_subject(f"cluster-{x}") for x in "abc")


def test_a_replaced_identity_is_accepted_until_its_grace_ends() -> None:
    succession = Succession(A, grace_s=60)
    assert succession.principals(0.0) == {A}
    assert not succession.follow(A, 1.0)  # the same subject again: nothing replaced
    assert succession.follow(B, 10.0)
    assert succession.principals(10.0) == {A, B}
    assert succession.principals(69.9) == {A, B}
    assert succession.principals(70.0) == {B}  # the grace is over: refused from then on
    assert succession.principals(1e9) == {B}


def test_each_replaced_identity_has_its_own_grace_and_coming_back_ends_it() -> None:
    succession = Succession(A, grace_s=10)
    succession.follow(B, 0.0)
    succession.follow(C, 5.0)
    assert succession.principals(5.0) == {A, B, C}
    assert succession.principals(10.0) == {B, C}  # A's grace ran from 0, B's from 5
    assert succession.principals(15.0) == {C}
    succession.follow(B, 20.0)  # back to B: current again, C in its grace
    succession.follow(C, 21.0)  # and back to C: B's grace starts anew, C is not "previous"
    assert succession.principals(30.9) == {B, C}
    assert succession.principals(31.0) == {C}


def test_no_grace_refuses_the_replaced_identity_at_once() -> None:
    succession = Succession(A, grace_s=0)
    succession.follow(B, 0.0)
    assert succession.principals(0.0) == {B}
    with pytest.raises(ValueError, match="negative"):
        Succession(A, grace_s=-1)


def test_the_identity_keeps_the_old_subject_for_the_grace_on_its_clock(tmp_path: Path) -> None:
    """InternalIdentity over a fake clock: the file names cluster-b, cluster-a stays accepted
    for the grace, then only cluster-b is; a file that cannot be read meanwhile does not stop
    the grace running out."""
    now = [100.0]
    path = tmp_path / "internal.token"
    path.write_text(_token("cluster-a"))
    identity = InternalIdentity(
        TokenVerifier(TokenSettings(SECRET)), path, grace_s=30, clock=lambda: now[0]
    )
    _write(path, _token("cluster-b"))
    now[0] = 101.0
    assert identity.principals() == {A, B}
    path.unlink()
    now[0] = 130.9  # the grace runs from when the change was seen (101)
    assert identity.principals() == {A, B}
    now[0] = 131.0
    assert identity.principals() == {B}
    assert identity.allows(B) and not identity.allows(A)


def test_the_identity_is_looked_at_again_only_every_recheck_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(internal_token, "RECHECK_S", 3600.0)
    path = tmp_path / "internal.token"
    path.write_text(_token("cluster-a"))
    identity = InternalIdentity(TokenVerifier(TokenSettings(SECRET)), path)
    _write(path, _token("cluster-b"))
    assert identity.principals() == {Principal.from_subject("cluster-a")}


def test_a_forwarder_without_an_internal_token_lets_nobody_in(tmp_path: Path) -> None:
    identity = InternalIdentity(TokenVerifier(TokenSettings(SECRET)), None)
    assert identity.principals() == frozenset()


@pytest.fixture
async def forwarder(tmp_path: Path) -> AsyncIterator[tuple[str, Path, list[str]]]:
    """A server with the forwarder's interceptor; every method answers its caller."""
    path = tmp_path / "internal.token"
    path.write_text(_token("cluster"))
    verifier = TokenVerifier(TokenSettings(SECRET))
    reached: list[str] = []

    class Any_(grpc.GenericRpcHandler):  # type: ignore[misc]
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
            async def unary(request: bytes, context: Any) -> bytes:
                reached.append(details.method)
                return caller().member.encode()

            return grpc.unary_unary_rpc_method_handler(unary)

    srv = grpc.aio.server(
        interceptors=[
            AuthInterceptor(verifier, InternalIdentity(verifier, path, grace_s=0), internal_only)
        ]
    )
    srv.add_generic_rpc_handlers([Any_()])
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    yield f"127.0.0.1:{port}", path, reached
    await srv.stop(None)


async def _call(address: str, method: str, token: str | None) -> bytes | grpc.StatusCode:
    md = (("authorization", f"Bearer {token}"),) if token is not None else ()
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            answer: bytes = await channel.unary_unary(method)(b"", metadata=md, timeout=10)
            return answer
        except grpc.aio.AioRpcError as e:
            return e.code()


async def test_only_the_internal_principal_calls_a_forwarders_internal_methods(
    forwarder: tuple[str, Path, list[str]],
) -> None:
    address, _, reached = forwarder
    admin = _token("admin@pubsubd.local")
    for method in (ATTACH, TAIL, CURSORS):
        assert await _call(address, method, admin) == grpc.StatusCode.PERMISSION_DENIED
        assert await _call(address, method, None) == grpc.StatusCode.UNAUTHENTICATED
    assert reached == []
    assert await _call(address, ATTACH, _token("cluster")) == b"user:cluster"
    # A client's own calls: google.pubsub.v1 and the give-back of its unsent Pull response.
    assert await _call(address, PUBLISH, admin) == b"user:admin@pubsubd.local"
    assert await _call(address, GIVE_BACK, admin) == b"user:admin@pubsubd.local"
    assert await _call(address, IDENTIFY, None) == b"allUsers"
    assert reached == [ATTACH, PUBLISH, GIVE_BACK, IDENTIFY]


async def test_a_rotated_internal_token_changes_who_may_call_internal_methods(
    forwarder: tuple[str, Path, list[str]],
) -> None:
    address, path, _ = forwarder
    old, new = _token("cluster"), _token("cluster-2")
    assert await _call(address, ATTACH, new) == grpc.StatusCode.PERMISSION_DENIED
    _write(path, new)
    assert await _call(address, ATTACH, new) == b"user:cluster-2"
    assert await _call(address, ATTACH, old) == grpc.StatusCode.PERMISSION_DENIED


def test_a_long_call_is_refused_once_its_token_expires_or_its_caller_is_replaced(
    tmp_path: Path,
) -> None:
    """``LongCall`` (a forwarder's Tail): read as the call starts, asked as it goes."""
    verifier = TokenVerifier(TokenSettings(SECRET))
    path = tmp_path / "internal.token"
    path.write_text(_token("cluster"))
    identity = InternalIdentity(verifier, path, grace_s=0)
    cluster = Principal.from_subject("cluster")

    def started(until: float) -> LongCall:
        def make() -> LongCall:
            CALLER.set(cluster)
            CALLER_UNTIL.set(until)
            return LongCall(identity, "pubsubd.internal.v1.Sources")

        return contextvars.copy_context().run(make)

    assert LongCall(identity, "s").refusal() is None  # authentication off: no caller
    going = started(time.time() + 600)
    assert going.refusal() is None
    expired = started(time.time() - 1)
    assert isinstance(expired.refusal(), Unauthenticated)
    _write(path, _token("cluster-2"))
    refused = going.refusal()
    assert isinstance(refused, NotInternalCaller) and "user:cluster is not" in str(refused)
