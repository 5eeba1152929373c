"""Token checking (core/tokens.py): JWTs HS256 and RS256 through PyJWT, static tokens, the
bearer header, and the reasons a token is refused."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from pubsubd.core import tokens
from pubsubd.core.errors import Unauthenticated
from pubsubd.core.principal import Principal
from pubsubd.core.tokens import (
    TokenSettings,
    TokenVerifier,
    bearer_token,
    create_token,
    load_static_tokens,
)

pytestmark = pytest.mark.unit

SECRET = b"s" * 32
OTHER_SECRET = b"t" * 32


def _rsa() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def _refused(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(Unauthenticated) as e:
        verifier.verify(token)
    return str(e.value)


def test_hs256_token_names_its_subject_as_an_iam_member() -> None:
    verifier = TokenVerifier(TokenSettings(secret=SECRET))
    token = create_token("alice@example.com", secret=SECRET, expires_in_s=60, now=time.time())
    assert verifier.verify(token) == Principal("user:alice@example.com")
    sa = create_token("serviceAccount:ingest@p.iam", secret=SECRET, now=time.time())
    assert verifier.verify(sa) == Principal("serviceAccount:ingest@p.iam")


def test_bad_signature_expired_and_not_yet_valid_are_refused_with_their_reason() -> None:
    verifier = TokenVerifier(TokenSettings(secret=SECRET))
    now = time.time()
    forged = create_token("alice", secret=OTHER_SECRET, now=now)
    assert "signature" in _refused(verifier, forged)
    expired = create_token("alice", secret=SECRET, expires_in_s=60, now=now - 120)
    assert "expired" in _refused(verifier, expired)
    early = jwt.encode({"sub": "alice", "nbf": int(now) + 3600}, SECRET, algorithm="HS256")
    assert "not valid yet" in _refused(verifier, early)
    assert "not a valid JWT" in _refused(verifier, "not-a-jwt")
    no_subject = jwt.encode({"exp": int(now) + 60}, SECRET, algorithm="HS256")
    assert "sub" in _refused(verifier, no_subject)


def test_a_remembered_token_is_refused_once_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    verifier = TokenVerifier(TokenSettings(secret=SECRET))
    now = time.time()
    token = create_token("alice", secret=SECRET, expires_in_s=30, now=now)
    assert verifier.verify(token).member == "user:alice"
    assert verifier.verify(token).member == "user:alice"  # from memory
    monkeypatch.setattr(tokens.time, "time", lambda: now + 31)
    assert "expired" in _refused(verifier, token)


def test_verify_until_says_when_a_token_stops_being_accepted(tmp_path: Path) -> None:
    """exp plus the leeway (remembered or not); never for a JWT without exp or a static token
    (the Pulsar front challenges ahead of it, pulsar/credentials.py)."""
    verifier = TokenVerifier(TokenSettings(secret=SECRET, leeway_s=5.0))
    now = time.time()
    token = create_token("alice@example.com", secret=SECRET, expires_in_s=60, now=now)
    alice = Principal("user:alice@example.com")
    assert verifier.verify_until(token) == (alice, int(now + 60) + 5.0)
    assert verifier.verify_until(token) == (alice, int(now + 60) + 5.0)  # remembered
    forever = create_token("alice@example.com", secret=SECRET, now=now)
    assert verifier.verify_until(forever) == (alice, float("inf"))
    static = tmp_path / "tokens"
    static.write_text("static-token ci@example.com\n")
    verifier = TokenVerifier(TokenSettings(static_tokens=load_static_tokens(static)))
    assert verifier.verify_until("static-token") == (
        Principal("user:ci@example.com"),
        float("inf"),
    )


def test_rs256_with_the_public_key_and_algorithms_not_configured_are_refused() -> None:
    private, public = _rsa()
    verifier = TokenVerifier(TokenSettings(public_key=public))
    token = create_token("bob", private_key=private, expires_in_s=60, now=time.time())
    assert verifier.verify(token) == Principal("user:bob")
    # An HS256 token (e.g. signed with the public key as a secret) is not accepted here.
    hs = create_token("bob", secret=SECRET, now=time.time())
    assert "HS256" in _refused(verifier, hs)
    none = jwt.encode({"sub": "bob"}, None, algorithm="none")
    assert "accepts RS256" in _refused(verifier, none)


def test_audience_and_issuer_are_required_when_configured() -> None:
    verifier = TokenVerifier(TokenSettings(secret=SECRET, audience="pubsubd", issuer="ops"))
    now = time.time()
    good = create_token("a", secret=SECRET, audience="pubsubd", issuer="ops", now=now)
    assert verifier.verify(good).member == "user:a"
    wrong_aud = create_token("a", secret=SECRET, audience="other", issuer="ops", now=now)
    assert "audience" in _refused(verifier, wrong_aud)
    wrong_iss = create_token("a", secret=SECRET, audience="pubsubd", issuer="x", now=now)
    assert "issuer" in _refused(verifier, wrong_iss)
    missing = create_token("a", secret=SECRET, now=now)
    assert "missing" in _refused(verifier, missing)


def test_static_tokens_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# operators\n\nabc123 carol@example.com\ndef456 serviceAccount:ci@p\n")
    verifier = TokenVerifier(TokenSettings(static_tokens=load_static_tokens(path)))
    assert verifier.verify("abc123") == Principal("user:carol@example.com")
    assert verifier.verify("def456") == Principal("serviceAccount:ci@p")
    assert "accepts none" in _refused(verifier, create_token("x", secret=SECRET, now=0))
    path.write_text("only-a-token\n")
    with pytest.raises(ValueError, match="tokens:1"):
        load_static_tokens(path)


def test_bearer_header() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    for header in (None, ""):
        with pytest.raises(Unauthenticated, match="no credentials"):
            bearer_token(header)
    for header in ("Basic abc", "Bearer ", "Bearerabc"):
        with pytest.raises(Unauthenticated, match="not a bearer token"):
            bearer_token(header)


def test_settings_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match="needs a secret"):
        TokenSettings()
    with pytest.raises(ValueError, match="32 bytes"):
        TokenSettings(secret=b"short")
    with pytest.raises(ValueError, match="PEM public key"):
        TokenVerifier(TokenSettings(public_key=b"junk"))
    with pytest.raises(ValueError, match="either"):
        create_token("a", now=0)
