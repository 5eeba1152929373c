"""The dashboard's history ring (observability/history.py): rates, gaps, windows, quantiles."""

from __future__ import annotations

import math

import pytest

from pubsubd.observability.history import History, growth, quantile

pytestmark = pytest.mark.unit


def test_rates_between_samples_with_gaps_and_resets() -> None:
    h = History(interval_s=5, keep_s=60)
    h.add(100.0, {"n": 0, "g": 3})
    h.add(105.0, {"n": 50})
    h.add(110.0, {"n": 60, "g": 7})
    h.add(115.0, {"n": 10, "g": 1})  # the counter went down: a restart, no rate
    assert h.times() == [100.0, 105.0, 110.0, 115.0]
    assert h.rates("n") == [None, 10.0, 2.0, None]
    assert h.values("g") == [3, None, 7, 1]
    assert h.rates("missing") == [None, None, None, None]


def test_the_ring_keeps_its_length() -> None:
    h = History(interval_s=5, keep_s=20)
    for i in range(10):
        h.add(float(i * 5), {"n": i})
    assert len(h) == 5
    assert h.times()[0] == 25.0


def test_rate_and_delta_over_a_window() -> None:
    h = History(interval_s=5, keep_s=900)
    for i in range(20):  # t = 0..95, n grows 3 per second
        h.add(float(i * 5), {"n": 15.0 * i})
    assert h.at_or_before(60.0) == (60.0, {"n": 180.0})
    assert h.rate("n", 60) == pytest.approx(3.0)  # from t=35 to t=95
    assert h.delta("n", 60) == pytest.approx(180.0)
    assert h.at_or_before(-10.0) == (0.0, {"n": 0.0})  # before the oldest: the oldest
    one = History()
    one.add(1.0, {"n": 1})
    assert one.rate("n", 60) is None  # a single sample gives no rate
    assert History().rate("n", 60) is None


def test_quantile_is_the_upper_bound_of_the_bucket() -> None:
    bounds = [0.001, 0.01, 0.1]
    # cumulative counts at each bound, then the total (+Inf)
    assert quantile(bounds, [50, 90, 99, 100], 0.5) == 0.001
    assert quantile(bounds, [50, 90, 99, 100], 0.9) == 0.01
    assert quantile(bounds, [50, 90, 99, 100], 0.99) == 0.1
    assert math.isinf(quantile(bounds, [50, 90, 98, 100], 0.99) or 0)
    assert quantile(bounds, [0, 0, 0, 0], 0.5) is None


def test_growth_of_cumulative_counts_between_two_reads() -> None:
    bounds = [0.001, 0.01, 0.1]
    before, after = [5, 9, 10, 10], [5, 9, 12, 14]  # 2 new in (0.01, 0.1], 2 beyond
    new = growth(before, after)
    assert new == [0, 0, 2, 4]
    assert quantile(bounds, new, 0.5) == 0.1 and math.isinf(quantile(bounds, new, 0.99) or 0)
    assert growth(None, after) == after  # nothing before: all of it
    assert growth([3, 3], [1, 4]) == [0, 1]  # never below zero
    with pytest.raises(ValueError):
        growth([1, 2], [1, 2, 3])  # not the same histogram
