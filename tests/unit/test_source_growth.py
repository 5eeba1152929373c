"""Source growth (core/source_growth.py): a topic over its sources' capacity for the grow window
gets enough active sources to run each at the target; a quiet one loses one at a time after the
shrink window, never below its ordering-key sources; every change restarts the windows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.core.load import Load
from pubsubd.core.publish_sources import MAX_SOURCES, SourceCounts
from pubsubd.core.source_growth import GrowthSettings, SourceGrowth

pytestmark = pytest.mark.unit

SETTINGS = GrowthSettings(messages_per_source=1000.0, grow_after_s=30.0, shrink_after_s=300.0)


def _load(messages_per_s: float, bytes_per_s: float = 0.0) -> Load:
    return Load(messages_per_s, bytes_per_s, 0)


def test_over_capacity_for_the_window_grows_to_the_target() -> None:
    growth = SourceGrowth(SETTINGS)
    one = SourceCounts(1, 1)
    assert growth.decide("t", _load(3000), one, 0.0) is None
    assert growth.decide("t", _load(3000), one, 29.9) is None
    # 3 sources' worth at 0.75 of capacity each: 4 sources.
    assert growth.decide("t", _load(3000), one, 30.0) == 4
    # The change restarts the window: still over (the EWMA lags), nothing for another 30 s.
    four = SourceCounts(4, 1)
    assert growth.decide("t", _load(5000), four, 31.0) is None
    assert growth.decide("t", _load(5000), four, 60.9) is None
    assert growth.decide("t", _load(5000), four, 61.0) == 7


def test_a_dip_under_capacity_restarts_the_grow_window() -> None:
    growth = SourceGrowth(SETTINGS)
    one = SourceCounts(1, 1)
    assert growth.decide("t", _load(1500), one, 0.0) is None
    assert growth.decide("t", _load(900), one, 20.0) is None
    assert growth.decide("t", _load(1500), one, 35.0) is None
    assert growth.decide("t", _load(1500), one, 65.0) == 2  # at least one more


def test_bytes_count_too_and_growth_stops_at_the_most_sources() -> None:
    growth = SourceGrowth(SETTINGS)
    counts = SourceCounts(MAX_SOURCES - 1, 1)
    huge = _load(10.0, SETTINGS.bytes_per_source * 100)
    assert growth.decide("t", huge, counts, 0.0) is None
    assert growth.decide("t", huge, counts, 30.0) == MAX_SOURCES
    full = SourceCounts(MAX_SOURCES, 1)
    assert growth.decide("t", huge, full, 100.0) is None
    assert growth.decide("t", huge, full, 1000.0) is None


def test_quiet_shrinks_one_at_a_time_never_below_the_key_sources() -> None:
    growth = SourceGrowth(SETTINGS)
    counts = SourceCounts(6, 2, 4)  # 6 sources, 2 take keys, 4 active
    assert growth.decide("t", _load(100), counts, 0.0) is None
    assert growth.decide("t", _load(100), counts, 299.0) is None
    assert growth.decide("t", _load(100), counts, 300.0) == 3
    three = SourceCounts(6, 2, 3)
    assert growth.decide("t", _load(100), three, 301.0) is None  # the window restarted
    assert growth.decide("t", _load(100), three, 601.0) == 2
    two = SourceCounts(6, 2, 2)
    assert growth.decide("t", _load(0), two, 10_000.0) is None  # the key sources stay


def test_a_load_that_one_source_fewer_would_carry_only_above_low_keeps_them() -> None:
    growth = SourceGrowth(SETTINGS)
    counts = SourceCounts(4, 1)
    # 1,600 messages/s over 3 sources would be 0.53 of capacity each: above low (0.5).
    for t in range(0, 3000, 100):
        assert growth.decide("t", _load(1600), counts, float(t)) is None


def test_forget_drops_the_timers() -> None:
    growth = SourceGrowth(SETTINGS)
    growth.decide("t", _load(5000), SourceCounts(1, 1), 0.0)
    assert growth.topics() == {"t"}
    growth.forget("t")
    assert growth.topics() == set()
    assert growth.decide("t", _load(5000), SourceCounts(1, 1), 40.0) is None  # a new window


@pytest.mark.parametrize(
    "kwargs",
    [
        {"messages_per_source": 0.0},
        {"messages_per_source": 1.0, "bytes_per_source": -1.0},
        {"messages_per_source": 1.0, "low": 0.8, "target": 0.7},
        {"messages_per_source": 1.0, "grow_after_s": -1.0},
        {"messages_per_source": 1.0, "sample_interval_s": 0.0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GrowthSettings(**kwargs)


@settings(max_examples=200, deadline=None)
@given(
    rates=st.lists(st.floats(min_value=0, max_value=40_000), min_size=1, max_size=60),
    key_sources=st.integers(min_value=1, max_value=4),
)
def test_steady_loads_settle_and_changes_stay_in_bounds(
    rates: list[float], key_sources: int
) -> None:
    """Any load sequence: the active count stays within key sources..MAX_SOURCES, two changes
    are a window apart, and a load held steady settles (no flip-flop)."""
    growth = SourceGrowth(SETTINGS)
    counts = SourceCounts(key_sources, key_sources)
    now, last_change = 0.0, -1e9
    for rate in [*rates, *[rates[-1]] * 600]:
        now += 10.0
        active = growth.decide("t", _load(rate), counts, now)
        if active is None:
            continue
        assert key_sources <= active <= MAX_SOURCES
        assert now - last_change >= min(SETTINGS.grow_after_s, SETTINGS.shrink_after_s)
        last_change = now
        counts = SourceCounts(max(counts.sources, active), key_sources, active)
    # Held steady for 6,000 s (shrinking one source per 300 s from 16 takes 4,500): settled,
    # neither over capacity (unless at the most) nor quiet.
    steady = rates[-1]
    used = SETTINGS.utilization(_load(steady))
    serving = counts.serving
    assert used <= serving or serving == MAX_SOURCES
    assert serving == max(1, key_sources) or used > SETTINGS.low * (serving - 1)
