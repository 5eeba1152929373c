"""Bearer tokens: who a call's token says the caller is (authentication), and making tokens.

Rules:

1. A token is a JWT signed with HS256 (a shared secret) or RS256 (the verifier holds the public
   key), the scheme Pulsar's token authentication uses, or one of the operator's *static
   tokens* (a file of ``TOKEN SUBJECT`` lines). Checking is PyJWT's: the signature, ``exp`` and
   ``nbf`` (both optional in a token, checked when present, with ``leeway_s``), and ``aud`` /
   ``iss`` when the verifier is configured with them (then a token must carry them).
2. The subject (``sub``) is the principal, written as an IAM member (``core/principal.py``):
   ``alice@example.com`` is ``user:alice@example.com``. A JWT without ``sub`` is refused.
3. Anything that is not a valid token raises :class:`~pubsubd.core.errors.Unauthenticated`
   whose message says what was wrong (missing, not a bearer token, bad signature, expired, not
   yet valid, wrong audience or issuer), never the token itself.
4. A JWT that passed is remembered (up to ``CACHE_ENTRIES``) with its expiry, so a client that
   sends the same token on every call pays one signature check, not one per call; a remembered
   token is refused again once its ``exp`` passes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from pubsubd.core.errors import Unauthenticated
from pubsubd.core.principal import Principal

__all__ = [
    "TokenSettings",
    "TokenVerifier",
    "bearer_token",
    "create_token",
    "load_static_tokens",
]

# Verified JWTs remembered at once; past it the memory starts again (a client rarely holds
# more than one token, so even a busy server keeps far fewer).
CACHE_ENTRIES = 10_000
# RFC 7518 §3.2: an HS256 key at least as long as the hash output (256 bits).
MIN_SECRET_BYTES = 32
BEARER = "bearer "


@dataclass(frozen=True)
class TokenSettings:
    """What a verifier accepts. At least one of ``secret`` (HS256), ``public_key`` (RS256,
    PEM) or ``static_tokens`` must be set."""

    secret: bytes | None = None
    public_key: bytes | None = None
    audience: str | None = None
    issuer: str | None = None
    # sha256(token) -> principal: the operator's static tokens (load_static_tokens).
    static_tokens: Mapping[bytes, Principal] = field(default_factory=dict)
    leeway_s: float = 0.0

    def __post_init__(self) -> None:
        if self.secret is None and self.public_key is None and not self.static_tokens:
            raise ValueError("authentication needs a secret, a public key or static tokens")
        if self.secret is not None and len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"an HS256 secret must be at least {MIN_SECRET_BYTES} bytes")


def load_static_tokens(path: Path) -> dict[bytes, Principal]:
    """The static tokens of a file: one ``TOKEN SUBJECT`` per line (blank lines and ``#``
    comments skipped). Raises ValueError naming the line of a malformed one."""
    tokens: dict[bytes, Principal] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected 'TOKEN SUBJECT'")
        tokens[_digest(parts[0])] = Principal.from_subject(parts[1])
    return tokens


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer T`` value; Unauthenticated when there is none."""
    if not header:
        raise Unauthenticated("the request carries no credentials (Authorization: Bearer ...)")
    if not header[: len(BEARER)].lower() == BEARER or not header[len(BEARER) :].strip():
        raise Unauthenticated("the Authorization header is not a bearer token")
    return header[len(BEARER) :].strip()


class TokenVerifier:
    """Checks bearer tokens against one :class:`TokenSettings`."""

    def __init__(self, settings: TokenSettings) -> None:
        self.settings = settings
        self._keys: dict[str, Any] = {}
        if settings.secret is not None:
            self._keys["HS256"] = settings.secret
        if settings.public_key is not None:
            self._keys["RS256"] = _load_public_key(settings.public_key)  # fails on a bad key
        self._verified: dict[str, tuple[Principal, float]] = {}

    def principal(self, header: str | None) -> Principal:
        """The caller an ``Authorization`` header value names; raises Unauthenticated."""
        return self.verify(bearer_token(header))

    def verify(self, token: str) -> Principal:
        """The principal of a valid token; raises Unauthenticated with the reason."""
        return self.verify_until(token)[0]

    def verify_until(self, token: str) -> tuple[Principal, float]:
        """The principal of a valid token and the wall-clock time from which it is refused
        (its ``exp`` plus the leeway; ``inf`` for a static token or a JWT without ``exp``);
        raises Unauthenticated with the reason."""
        leeway = self.settings.leeway_s
        known = self._verified.get(token)
        if known is not None:
            principal, expires = known
            if time.time() < expires + leeway:
                return principal, expires + leeway
            del self._verified[token]
            raise Unauthenticated("the token has expired")
        static = self.settings.static_tokens.get(_digest(token))
        if static is not None:
            return static, float("inf")
        principal, expires = self._decode(token)
        if len(self._verified) >= CACHE_ENTRIES:
            self._verified.clear()
        self._verified[token] = (principal, expires)
        return principal, expires + leeway

    def _decode(self, token: str) -> tuple[Principal, float]:
        try:
            algorithm = jwt.get_unverified_header(token).get("alg")
        except jwt.InvalidTokenError as e:
            raise Unauthenticated(f"the token is not a valid JWT: {e}") from None
        key = self._keys.get(str(algorithm))
        if key is None:
            accepted = ", ".join(self._keys) or "none (static tokens only)"
            raise Unauthenticated(
                f"the token is signed with {algorithm!r}; this server accepts {accepted}"
            )
        s = self.settings
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[str(algorithm)],
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": ["sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("the token is not valid yet (nbf)") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("the token's signature does not verify") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated(f"the token's audience is not {s.audience!r}") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated(f"the token's issuer is not {s.issuer!r}") from None
        except jwt.InvalidTokenError as e:
            raise Unauthenticated(f"the token is not valid: {e}") from None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("the token's subject (sub) is empty")
        expires = float(claims["exp"]) if "exp" in claims else float("inf")
        return Principal.from_subject(subject), expires


def create_token(
    subject: str,
    *,
    secret: bytes | None = None,
    private_key: bytes | None = None,
    expires_in_s: float | None = None,
    audience: str | None = None,
    issuer: str | None = None,
    now: float,
) -> str:
    """A JWT for ``subject``: HS256 with ``secret`` or RS256 with ``private_key`` (PEM),
    expiring ``expires_in_s`` after ``now`` (None: never)."""
    if (secret is None) == (private_key is None):
        raise ValueError("sign with either a secret (HS256) or a private key (RS256)")
    if secret is not None and len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"an HS256 secret must be at least {MIN_SECRET_BYTES} bytes")
    claims: dict[str, Any] = {"sub": subject, "iat": int(now)}
    if expires_in_s is not None:
        claims["exp"] = int(now + expires_in_s)
    if audience is not None:
        claims["aud"] = audience
    if issuer is not None:
        claims["iss"] = issuer
    if secret is not None:
        return jwt.encode(claims, secret, algorithm="HS256")
    assert private_key is not None
    return jwt.encode(claims, private_key, algorithm="RS256")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _load_public_key(pem: bytes) -> RSAPublicKey:
    try:
        key = load_pem_public_key(pem)
    except ValueError as e:
        raise ValueError(f"not a PEM public key: {e}") from None
    if not isinstance(key, RSAPublicKey):
        raise ValueError("RS256 needs an RSA public key")
    return key
