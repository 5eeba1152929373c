"""Flow control (core/flow_control.py): publish rate quotas as token buckets, the memory bound
of publishes in flight."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubd.core.errors import InvalidArgument
from pubsubd.core.flow_control import (
    RATE_BYTES_LABEL,
    RATE_MESSAGES_LABEL,
    MemoryBudget,
    PublishRate,
    RateLimiter,
    TokenBucket,
    parse_rate,
)


def test_labels_give_the_rate_and_bad_values_are_named() -> None:
    assert parse_rate({}) is None
    assert parse_rate({RATE_MESSAGES_LABEL: "100"}) == PublishRate(100, 0)
    assert parse_rate({RATE_BYTES_LABEL: "2048", "other": "x"}) == PublishRate(0, 2048)
    for bad in ("0", "-1", "1.5", "lots", ""):
        with pytest.raises(InvalidArgument, match=RATE_MESSAGES_LABEL):
            parse_rate({RATE_MESSAGES_LABEL: bad})


def test_a_burst_of_one_second_passes_then_the_rate_holds() -> None:
    limiter = RateLimiter(PublishRate(messages_per_s=10))
    assert [limiter.admit(1, 100, 0.0) for _ in range(10)] == [None] * 10
    over = limiter.admit(1, 100, 0.0)
    assert over is not None and RATE_MESSAGES_LABEL in over and "10 messages/s" in over
    assert limiter.admit(1, 100, 0.05) is not None  # half a token
    assert limiter.admit(1, 100, 0.1) is None  # one token back after 0.1 s
    assert limiter.admit(1, 100, 0.1) is not None
    assert limiter.refused == 3


def test_a_request_bigger_than_a_second_passes_when_the_bucket_is_full() -> None:
    limiter = RateLimiter(PublishRate(bytes_per_s=1000))
    assert limiter.admit(1, 5000, 0.0) is None  # full: it goes, leaving a debt
    assert limiter.admit(1, 10, 1.0) is not None  # still in debt after a second
    assert limiter.admit(1, 5000, 5.0) is None  # paid back and full again


def test_both_limits_apply_and_a_refusal_takes_nothing() -> None:
    limiter = RateLimiter(PublishRate(messages_per_s=100, bytes_per_s=1000))
    assert limiter.admit(50, 900, 0.0) is None
    over = limiter.admit(10, 200, 0.0)  # messages fit, bytes do not
    assert over is not None and RATE_BYTES_LABEL in over
    assert limiter.admit(50, 100, 0.0) is None  # the refused request took no message tokens


@given(
    rate=st.integers(1, 1000),
    requests=st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 50)), max_size=200),
)
def test_what_a_bucket_admits_never_exceeds_its_rate_plus_one_burst(
    rate: int, requests: list[tuple[float, int]]
) -> None:
    bucket = TokenBucket(rate)
    now = admitted = 0.0
    for gap, cost in requests:
        now += gap
        if bucket.allows(cost, now):
            bucket.take(cost)
            admitted += cost
    # A burst of one second, the rate since, and at most one oversized request's debt.
    assert admitted <= rate + rate * now + max((c for _, c in requests), default=0)


def test_the_memory_budget_refuses_what_would_cross_it_but_never_a_lone_request() -> None:
    budget = MemoryBudget(1000)
    assert budget.acquire(5000)  # alone: it always fits
    assert not budget.acquire(1)
    budget.release(5000)
    assert budget.acquire(600) and budget.acquire(400)
    assert not budget.acquire(1)
    budget.release(600)
    assert budget.acquire(500)
    assert budget.status() == {"limit": 1000, "used": 900, "peak": 5000, "refused": 2}
    assert MemoryBudget(0).acquire(1 << 40)  # no bound
