"""A Pulsar connection's credentials over time (pure): when to challenge, what to accept.

Pulsar's auth refresh (PIP-30): a broker sends AUTH_CHALLENGE before a connection's credentials
expire and the client answers AUTH_RESPONSE with fresh ones (the official client asks its token
supplier again). Rules:

1. The credentials are the token CONNECT presented, its principal and the time it stops being
   accepted (``until``: its ``exp`` plus the verifier's leeway; never for a static token or a
   JWT without ``exp``).
2. A connection whose client said ``supports_auth_refresh`` in CONNECT is challenged at
   ``until - lead``, ``lead`` being :data:`CHALLENGE_LEAD_S` or half the token's remaining
   lifetime when verified, whichever is shorter (so a token of a few seconds is refreshed too).
   A client that cannot refresh is never challenged.
3. An AUTH_RESPONSE carrying a valid token of the same principal replaces the credentials (and
   the next challenge is planned from the new ``until``). A token of another principal, an
   invalid one or another auth method is refused: the connection is closed with
   AuthenticationError, as Pulsar's broker does.
4. Credentials not refreshed by ``until`` end the connection (AuthenticationError): the client
   reconnects with whatever token it has then, and CONNECT checks that one.

The shell (connection.py) verifies tokens, reads the clock and arms the timers: it calls
:meth:`Credentials.challenge_at` and :meth:`Credentials.refreshed` and acts on what they say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pubsubd.core.errors import Unauthenticated
from pubsubd.core.principal import Principal

# How long before the credentials expire the broker challenges, at most: long enough for a
# client on a slow network (or whose token supplier fetches from an identity service) to answer,
# short next to the hour-long tokens operators issue. Pulsar's broker checks every 60 s
# (authenticationRefreshCheckSeconds) and challenges once expired; challenging ahead of the
# expiry means the calls in between never see an expired token.
CHALLENGE_LEAD_S = 30.0
TOKEN_METHOD = "token"
NEVER = math.inf


@dataclass(frozen=True)
class Credentials:
    """What a connection authenticated as, and until when (rule 1)."""

    principal: Principal
    token: str
    until: float  # a wall-clock time (seconds since the epoch); NEVER: never expires
    verified_at: float

    def challenge_at(self, refreshable: bool) -> float:
        """When to send AUTH_CHALLENGE (rule 2); NEVER for a client that cannot refresh or a
        token that does not expire."""
        if not refreshable or self.until == NEVER:
            return NEVER
        lead = min(CHALLENGE_LEAD_S, max(0.0, self.until - self.verified_at) / 2)
        return self.until - lead

    def refreshed(self, new: Credentials) -> Credentials:
        """The credentials after an AUTH_RESPONSE whose token verified as ``new`` (rule 3);
        raises Unauthenticated for another principal."""
        if new.principal != self.principal:
            raise Unauthenticated(
                f"the refreshed token is for {new.principal.member}, this connection is "
                f"{self.principal.member}"
            )
        return new

    def expired(self, now: float) -> bool:
        """Whether the credentials are no longer accepted at ``now`` (rule 4)."""
        return now >= self.until


def check_method(method: str) -> None:
    """An AUTH_RESPONSE's auth method must be the token one (rule 3); raises Unauthenticated."""
    if method != TOKEN_METHOD:
        raise Unauthenticated(f"auth refresh with {method!r}; this connection uses token")
