"""Spreading subscriptions by load (core/subscription_spread.py): a subscription busy over the
spread share for the spread window is spread, a spread one quiet under the gather threshold for
the (longer) gather window is gathered back; a change restarts the windows, a load between the
thresholds changes nothing, and no load sequence makes a subscription go back and forth faster
than its windows (property tests). Also the router's view of the load reports it decides by
(control/routing_store.py: summed over the forwarders serving a subscription)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.control.routing_store import merge_reports, subscription_totals
from pubsubd.core.load import Load
from pubsubd.core.subscription_spread import (
    SpreadSettings,
    SubscriptionSpread,
    busy_width,
    quiet_width,
)

pytestmark = pytest.mark.unit

# One forwarder delivers 1,000 msg/s: spread over 500 msg/s for 30 s, gather under 250 for 300.
SETTINGS = SpreadSettings(messages_per_forwarder=1000.0, spread_after_s=30.0, gather_after_s=300.0)


def _rate(messages_per_s: float, outstanding: int = 0) -> dict[str, Load]:
    return {"s": Load(messages_per_s, 0.0, outstanding)}


def test_busy_for_the_spread_window_spreads_and_quiet_for_the_gather_window_gathers() -> None:
    spread = SubscriptionSpread(SETTINGS)
    assert not spread.decide(["s"], _rate(800), 0.0).spread
    assert not spread.decide(["s"], _rate(800), 29.9).spread
    assert spread.decide(["s"], _rate(800), 30.0).spread == {"s"}
    assert spread.spread == {"s"}
    # Spreading does not change the (summed) load; quiet only well under the spread share.
    assert not spread.decide(["s"], _rate(300), 40.0).gathered
    assert not spread.decide(["s"], _rate(200), 50.0).gathered
    assert not spread.decide(["s"], _rate(200), 349.9).gathered
    assert spread.decide(["s"], _rate(200), 350.0).gathered == {"s"}
    assert spread.spread == set() and not spread.timers()


def test_a_dip_restarts_the_spread_window_and_a_burst_the_gather_window() -> None:
    spread = SubscriptionSpread(SETTINGS)
    spread.decide(["s"], _rate(800), 0.0)
    spread.decide(["s"], _rate(400), 20.0)  # under the share: the window starts again
    assert not spread.decide(["s"], _rate(800), 25.0).spread
    assert not spread.decide(["s"], _rate(800), 54.9).spread
    assert spread.decide(["s"], _rate(800), 55.0).spread == {"s"}
    spread.decide(["s"], _rate(100), 60.0)
    spread.decide(["s"], _rate(260), 200.0)  # over the gather threshold: not quiet
    assert not spread.decide(["s"], _rate(100), 210.0).gathered
    assert not spread.decide(["s"], _rate(100), 509.9).gathered
    assert spread.decide(["s"], _rate(100), 510.0).gathered == {"s"}


def test_leases_count_as_load_and_an_unreported_subscription_is_idle() -> None:
    spread = SubscriptionSpread(SETTINGS)
    held = {"s": Load(0.0, 0.0, 60_000)}  # over half of 100,000 leases
    spread.decide(["s"], held, 0.0)
    assert spread.decide(["s"], held, 30.0).spread == {"s"}
    spread.decide(["s"], {}, 31.0)
    assert spread.decide(["s"], {}, 331.0).gathered == {"s"}


def test_a_router_taking_over_keeps_what_was_spread_and_non_candidates_are_gathered() -> None:
    spread = SubscriptionSpread(SETTINGS, spread=["s", "gone"])
    changes = spread.decide(["s"], _rate(100), 0.0)
    assert changes.gathered == {"gone"}  # deleted, or no longer spreadable: at once
    assert spread.spread == {"s"}  # quiet, but it waits out the gather window
    assert not spread.decide(["s"], _rate(100), 299.0).gathered


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        SpreadSettings(messages_per_forwarder=0)
    with pytest.raises(ValueError):
        SpreadSettings(gather_ratio=1.0)
    with pytest.raises(ValueError):
        SpreadSettings(spread_after_s=60.0, gather_after_s=30.0)  # gathering waits longer
    assert SETTINGS.gather_share == 0.25


def test_the_router_sums_a_subscription_over_its_forwarders_and_weighs_the_larger() -> None:
    one = ({"t": Load(10.0, 5.0, 1)}, {"s": Load(300.0, 0.0, 10)})
    two = ({"t": Load(20.0, 1.0, 0)}, {"s": Load(400.0, 0.0, 5), "q": Load(1.0, 0.0, 0)})
    assert subscription_totals([one, two]) == {"s": Load(700.0, 0.0, 15), "q": Load(1.0)}
    topics, subscriptions = merge_reports([one, two])
    assert topics == {"t": Load(20.0, 5.0, 1)}
    assert subscriptions == {"s": Load(400.0, 0.0, 10), "q": Load(1.0)}


LOADS = st.lists(
    st.tuples(st.floats(0.0, 2000.0), st.floats(0.1, 60.0)),  # msg/s, then seconds later
    min_size=1,
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(loads=LOADS)
def test_no_load_makes_a_subscription_change_faster_than_its_windows(
    loads: list[tuple[float, float]],
) -> None:
    """Whatever the load does: a spread comes at least the spread window after the last change
    and only after that long over the share; a gather at least the gather window after it and
    only after that long under the threshold."""
    spread = SubscriptionSpread(SETTINGS)
    now = 0.0
    last_change = -1e9
    history: list[tuple[float, float]] = []
    for rate, step in loads:
        history.append((now, rate))
        changes = spread.decide(["s"], _rate(rate), now)
        if changes.spread:
            assert now - last_change >= SETTINGS.spread_after_s
            window = [r for t, r in history if t >= now - SETTINGS.spread_after_s]
            assert all(r > 500.0 for r in window)
            last_change = now
        if changes.gathered:
            assert now - last_change >= SETTINGS.gather_after_s
            window = [r for t, r in history if t >= now - SETTINGS.gather_after_s]
            assert all(r < 250.0 for r in window)
            last_change = now
        now += step


@settings(max_examples=100, deadline=None)
@given(
    rate=st.floats(0.0, 5000.0),
    start_spread=st.booleans(),
    steps=st.integers(20, 200),
)
def test_a_steady_load_changes_at_most_once_and_between_the_thresholds_never(
    rate: float, start_spread: bool, steps: int
) -> None:
    spread = SubscriptionSpread(SETTINGS, spread=["s"] if start_spread else [])
    changes = 0
    for i in range(steps):
        done = spread.decide(["s"], _rate(rate), i * 5.0)
        changes += len(done.spread) + len(done.gathered)
    assert changes <= 1
    if 250.0 <= rate <= 500.0:
        assert changes == 0


# -- the width (how many forwarders a spread subscription is placed over) -------------------


def test_the_width_keeps_each_share_under_the_spread_share_within_the_limit() -> None:
    """500 msg/s is one forwarder's spread share: 1,200 msg/s needs 3 forwarders, 2,600 needs
    6 but the limit (live subscribing forwarders, the topic's sources) is 4."""
    spread = SubscriptionSpread(SETTINGS)
    loads = {"a": Load(1200.0), "b": Load(2600.0), "c": Load(700.0), "d": Load(900.0)}
    limits = {"a": 4, "b": 4, "c": 4, "d": 1}
    spread.decide(loads, loads, 0.0, limits)
    changes = spread.decide(loads, loads, 30.0, limits)
    assert changes.spread == {"a", "b", "c"}  # d may use one forwarder only: whole
    assert spread.widths == {"a": 3, "b": 4, "c": 2}
    assert busy_width(SETTINGS, 1.2) == 3 and quiet_width(SETTINGS, 1.2) == 5


def test_a_spread_subscription_widens_as_its_load_rises_and_narrows_when_it_fits_in_fewer() -> None:
    spread = SubscriptionSpread(SETTINGS)
    limits = {"s": 8}
    spread.decide(["s"], _rate(800), 0.0, limits)
    spread.decide(["s"], _rate(800), 30.0, limits)
    assert spread.widths == {"s": 2}
    assert not spread.decide(["s"], _rate(1900), 40.0, limits).resized  # the window starts
    assert not spread.decide(["s"], _rate(1900), 69.9, limits).resized
    assert spread.decide(["s"], _rate(1900), 70.0, limits).resized == {"s"}
    assert spread.widths == {"s": 4}
    # 700 msg/s: 2 forwarders keep each share under the gather share (250) only from 3 up, so
    # 4 narrows to 3 after the gather window, never to 2 (that would be over it at once).
    spread.decide(["s"], _rate(700), 80.0, limits)
    assert not spread.decide(["s"], _rate(700), 379.9, limits).resized
    assert spread.decide(["s"], _rate(700), 380.0, limits).resized == {"s"}
    assert spread.widths == {"s": 3}
    assert not spread.decide(["s"], _rate(700), 2000.0, limits).resized  # 700 fits 3: stays
    spread.decide(["s"], _rate(100), 2010.0, limits)
    assert spread.decide(["s"], _rate(100), 2310.0, limits).gathered == {"s"}
    assert spread.widths == {}


def test_a_width_is_kept_when_forwarders_go_and_an_unknown_one_is_the_limit() -> None:
    spread = SubscriptionSpread(SETTINGS, spread={"s": 3, "old": 0})
    spread.decide(["s", "old"], _rate(1400) | {"old": Load(1400.0)}, 0.0, {"s": 2, "old": 5})
    assert spread.widths == {"s": 3, "old": 5}  # fewer forwarders: the heads share them
    assert not spread.decide(["s"], _rate(1400), 1000.0, {"s": 2}).resized


WIDTH_LOADS = st.lists(
    st.tuples(st.floats(0.0, 6000.0), st.floats(0.1, 60.0), st.integers(1, 8)),
    min_size=1,
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(loads=WIDTH_LOADS)
def test_no_load_changes_a_width_faster_than_its_windows_or_past_its_limit(
    loads: list[tuple[float, float, int]],
) -> None:
    """Whatever the load and the limit do: a width grows only after the spread window over the
    share it would exceed, never past the limit, and by no more than the load needs; it shrinks
    only after the gather window, to a width whose shares stay under the gather share; and a
    change follows the last one by its window at least."""
    spread = SubscriptionSpread(SETTINGS)
    now = 0.0
    last_change = -1e9
    history: list[tuple[float, float]] = []
    for rate, step, limit in loads:
        history.append((now, rate))
        before = spread.widths.get("s", 1)
        spread.decide(["s"], _rate(rate), now, {"s": limit})
        after = spread.widths.get("s", 1)
        if after > before:
            assert now - last_change >= SETTINGS.spread_after_s
            assert after <= limit and after >= 2
            assert after <= busy_width(SETTINGS, rate / 1000.0)
            window = [r for t, r in history if t >= now - SETTINGS.spread_after_s]
            assert all(r > 500.0 * before for r in window)
            last_change = now
        elif after < before:
            assert now - last_change >= SETTINGS.gather_after_s
            window = [r for t, r in history if t >= now - SETTINGS.gather_after_s]
            assert all(r < 250.0 * (before - 1) + 1e-6 for r in window)
            assert rate < 250.0 * after
            last_change = now
        now += step


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(0.0, 8000.0), width=st.integers(1, 8), steps=st.integers(20, 200))
def test_a_steady_load_changes_a_width_at_most_once(rate: float, width: int, steps: int) -> None:
    spread = SubscriptionSpread(SETTINGS, spread={"s": width} if width > 1 else {})
    changes = 0
    for i in range(steps):
        done = spread.decide(["s"], _rate(rate), i * 5.0, {"s": 8})
        changes += len(done.spread) + len(done.gathered) + len(done.resized)
    assert changes <= 1
    final = spread.widths.get("s", 1)
    assert busy_width(SETTINGS, rate / 1000.0) <= final or final == 8
    assert final <= quiet_width(SETTINGS, rate / 1000.0) or final == width
