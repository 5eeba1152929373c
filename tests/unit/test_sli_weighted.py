"""Volume-weighted quantiles of the SLI job (pubsubd.spark.sli.quantiles), without Spark."""

from __future__ import annotations

import pytest

from pubsubd.spark.sli.quantiles import weighted_quantile


def test_busy_interval_outweighs_quiet_one() -> None:
    # A quiet interval: 3 calls, 3 slow samples; a busy one: 10,000 calls, 4 fast samples.
    values = [900.0, 950.0, 1000.0, 1.0, 2.0, 3.0, 4.0]
    weights = [1.0, 1.0, 1.0] + [10_000 / 4] * 4
    assert weighted_quantile(values, [1.0] * 7, 0.5) == 4.0  # unweighted: a sample median
    assert weighted_quantile(values, weights, 0.5) == 3.0  # 5,000 of 10,003 at or below 2.0
    assert weighted_quantile(values, weights, 0.99) == 4.0  # 3 slow calls of 10,003
    assert weighted_quantile(values, weights, 0.9999) == 950.0
    assert weighted_quantile(values, weights, 1.0) == 1000.0
    assert weighted_quantile(values, weights, 0.0) == 1.0


def test_ties_zero_weights_and_bad_input() -> None:
    assert weighted_quantile([5.0, 5.0, 7.0], [1.0, 1.0, 2.0], 0.5) == 5.0  # exactly half
    assert weighted_quantile([5.0, 7.0], [1.0, 1.0 + 1e-12], 0.5) == 5.0  # float slack
    assert weighted_quantile([1.0, 9.0], [0.0, 3.0], 0.01) == 9.0  # no weight, no say
    assert weighted_quantile([], [], 0.5) is None
    with pytest.raises(ValueError, match="quantile"):
        weighted_quantile([1.0], [1.0], 1.5)
    with pytest.raises(ValueError, match="length"):
        weighted_quantile([1.0], [], 0.5)
