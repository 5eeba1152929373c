"""The Pulsar front's auth refresh rules (pulsar/credentials.py): when a connection is
challenged, which fresh credentials it accepts, and when they have run out."""

from __future__ import annotations

import pytest

from pubsubd.core.errors import Unauthenticated
from pubsubd.core.principal import Principal
from pubsubd.pulsar.credentials import (
    CHALLENGE_LEAD_S,
    NEVER,
    Credentials,
    check_method,
)

pytestmark = pytest.mark.unit

ALICE = Principal.from_subject("alice@example.com")


def _credentials(until: float, verified_at: float = 1000.0, who: Principal = ALICE) -> Credentials:
    return Credentials(who, "t", until, verified_at)


def test_an_hour_long_token_is_challenged_the_lead_before_it_expires() -> None:
    hour = _credentials(until=1000.0 + 3600)
    assert hour.challenge_at(refreshable=True) == 1000.0 + 3600 - CHALLENGE_LEAD_S


def test_a_short_token_is_challenged_halfway_through_its_remaining_life() -> None:
    short = _credentials(until=1004.0)
    assert short.challenge_at(refreshable=True) == 1002.0
    spent = _credentials(until=1000.0, verified_at=1001.0)  # verified after exp (the leeway)
    assert spent.challenge_at(refreshable=True) == 1000.0


def test_no_challenge_for_a_client_that_cannot_refresh_or_a_token_that_never_expires() -> None:
    assert _credentials(until=1004.0).challenge_at(refreshable=False) == NEVER
    assert _credentials(until=NEVER).challenge_at(refreshable=True) == NEVER


def test_the_same_principals_fresh_token_replaces_the_credentials() -> None:
    old = _credentials(until=1004.0)
    new = _credentials(until=1010.0, verified_at=1003.0)
    assert old.refreshed(new) is new
    assert new.challenge_at(refreshable=True) == 1006.5


def test_another_principals_token_is_refused() -> None:
    old = _credentials(until=1004.0)
    bob = _credentials(until=1010.0, who=Principal.from_subject("bob@example.com"))
    with pytest.raises(Unauthenticated, match=r"user:bob@example.com.*user:alice@example.com"):
        old.refreshed(bob)


def test_only_the_token_method_may_refresh() -> None:
    check_method("token")
    for method in ("", "athenz", "TOKEN"):
        with pytest.raises(Unauthenticated):
            check_method(method)


def test_credentials_have_expired_from_their_until_on() -> None:
    c = _credentials(until=1004.0)
    assert not c.expired(1003.999)
    assert c.expired(1004.0)
    assert not _credentials(until=NEVER).expired(1e12)
