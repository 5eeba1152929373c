"""Topic loads (core/load.py: EWMA rates with a half-life the router chooses, weights) and a
forwarder's load report (data/load_report.py: counters from its forwarders, idle topics left
out, the router's half-life followed, backlog shares carried)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from pubsubd.core.backlog_view import BacklogShare
from pubsubd.core.load import HALF_LIFE_S, Counters, Load, Rates, chosen_half_life, weight
from pubsubd.data.load_report import LoadReporter

pytestmark = pytest.mark.unit


def test_a_steady_rate_is_approached_by_half_the_gap_every_half_life() -> None:
    rates = Rates(half_life_s=10.0)
    for second in range(0, 31, 5):  # 200 msg/s, 1 KiB each, 7 outstanding
        rates.sample(float(second), {"t": Counters(200 * second, 204_800 * second, 7)})
    load = rates.loads()["t"]
    # 30 s of samples after the first: 1 - 0.5**3 of the way from 0.
    assert load.messages_per_s == pytest.approx(200 * (1 - 0.5**3))
    assert load.bytes_per_s == pytest.approx(204_800 * (1 - 0.5**3))
    assert load.outstanding == 7
    for second in range(35, 301, 5):
        rates.sample(float(second), {"t": Counters(200 * 30, 204_800 * 30, 0)})
    assert rates.loads()["t"].messages_per_s < 0.01 and rates.loads()["t"].idle


@pytest.mark.parametrize("half_life_s", [2.0, 10.0, 60.0])
def test_any_half_life_halves_the_gap_to_a_steady_rate_once_per_half_life(
    half_life_s: float,
) -> None:
    rates = Rates(half_life_s=half_life_s)
    step = half_life_s / 4  # four samples per half-life
    for i in range(9):  # the first sample, then two half-lives
        rates.sample(i * step, {"t": Counters(int(100 * i * step), 0, 0)})
    assert rates.loads()["t"].messages_per_s == pytest.approx(100 * (1 - 0.5**2))


def test_a_longer_half_life_counts_a_burst_less_and_a_lasting_load_later() -> None:
    short, long = Rates(half_life_s=10.0), Rates(half_life_s=60.0)
    for rates in (short, long):
        rates.sample(0.0, {"t": Counters(0, 0, 0)})
        rates.sample(5.0, {"t": Counters(5 * 1000, 0, 0)})  # 5 s at 1,000 msg/s
    assert long.loads()["t"].messages_per_s < short.loads()["t"].messages_per_s / 5
    assert long.loads()["t"].messages_per_s == pytest.approx(1000 * (1 - 0.5 ** (5 / 60)))


def test_a_half_life_changed_between_samples_applies_from_the_next_one_without_a_jump() -> None:
    rates = Rates(half_life_s=10.0)
    rates.sample(0.0, {"t": Counters(0, 0, 0)})
    rates.sample(10.0, {"t": Counters(10 * 200, 0, 0)})
    reached = rates.loads()["t"].messages_per_s
    assert reached == pytest.approx(100.0)  # half of 200 after one half-life
    rates.half_life_s = 30.0
    assert rates.loads()["t"].messages_per_s == reached  # the figure so far is kept
    rates.sample(40.0, {"t": Counters(40 * 200, 0, 0)})  # one half-life of the new one
    assert rates.loads()["t"].messages_per_s == pytest.approx(150.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            rates.half_life_s = bad
    assert rates.half_life_s == 30.0


def test_the_half_life_is_the_router_s_when_it_published_a_valid_one() -> None:
    assert chosen_half_life(30.0) == 30.0
    # None published (no summary, or a router of an earlier release writes 0), or nonsense.
    for published in (None, 0.0, -5.0, math.inf, math.nan):
        assert chosen_half_life(published) == HALF_LIFE_S


def test_a_counter_that_goes_down_gives_no_negative_rate_and_topics_left_out_are_forgotten() -> (
    None
):
    rates = Rates()
    rates.sample(0.0, {"a": Counters(1000, 10, 0), "b": Counters(5, 5, 0)})
    rates.sample(HALF_LIFE_S, {"a": Counters(10, 1, 0), "b": Counters(5, 5, 0)})
    assert rates.loads()["a"].messages_per_s == 0.0
    rates.sample(2 * HALF_LIFE_S, {"b": Counters(5, 5, 0)})
    assert set(rates.loads()) == {"b"}
    with pytest.raises(ValueError):
        Rates(half_life_s=0)


def test_a_topic_weighs_one_plus_its_whole_points() -> None:
    assert weight(Load()) == 1
    assert weight(Load(messages_per_s=99.9)) == 1
    assert weight(Load(messages_per_s=1000.0)) == 11
    assert weight(Load(bytes_per_s=3 * 2**20 + 1)) == 4
    assert weight(Load(outstanding=25_000)) == 3
    assert weight(Load(50.0, 2**19, 5_000)) == 2  # half a point each, three times
    assert weight(Load(messages_per_s=math.inf)) == 1  # nonsense in a report weighs nothing
    assert Load(1, 5, 0).larger(Load(2, 1, 3)) == Load(2, 5, 3)


async def test_a_report_lists_the_busy_owned_topics_published_and_delivered() -> None:
    owned = {"busy", "idle"}
    published: dict[str, list[int]] = {"busy": [0, 0], "elsewhere": [0, 0]}
    dispatcher = SimpleNamespace(uid="sub-uid", topic_uid="busy", delivered=0, leases={})
    dispatchers = {"sub": dispatcher}
    clock = [0.0]
    written: list[tuple[dict[str, Load], float]] = []
    subscriptions: list[dict[str, Load]] = []

    async def write(
        loads: Mapping[str, Load], at: float, subs: Mapping[str, Load], shares: Any
    ) -> None:
        written.append((dict(loads), at))
        subscriptions.append(dict(subs))

    reporter = LoadReporter(
        owned=owned,
        published=published,
        dispatchers=lambda: dispatchers,
        write=write,
        monotonic=lambda: clock[0],
        wall=lambda: 1234.5,
    )
    await reporter.report()
    assert written == []  # nothing to say yet (no rate from one sample)
    for _ in range(4):
        clock[0] += 5.0
        published["busy"][0] += 5 * 300  # 300 msg/s in
        published["busy"][1] += 5 * 300 * 1000
        published["elsewhere"][0] += 10**6  # not owned here: never reported
        dispatcher.delivered += 5 * 300  # and 300 msg/s out
        dispatcher.leases = dict.fromkeys(range(40))
        await reporter.report()
    loads, at = written[-1]
    assert set(loads) == {"busy"} and at == 1234.5
    kept = 0.5 ** (20.0 / HALF_LIFE_S)  # four samples of 5 s after the first
    assert loads["busy"].messages_per_s == pytest.approx(600 * (1 - kept))
    assert loads["busy"].bytes_per_s == pytest.approx(300_000 * (1 - kept))
    assert loads["busy"].outstanding == 40
    # Its subscription, served here on the topic's own sources, is reported on its own too:
    # what it delivers and holds (what the router spreads subscriptions by).
    assert set(subscriptions[-1]) == {"sub-uid"}
    assert subscriptions[-1]["sub-uid"].messages_per_s == pytest.approx(300 * (1 - kept))
    assert subscriptions[-1]["sub-uid"].outstanding == 40
    # Quiet, then gone from here (with its subscriptions): the report says so once, then stays
    # silent.
    owned.discard("busy")
    dispatchers.clear()
    await reporter.report()
    assert written[-1][0] == {}
    count = len(written)
    await reporter.report()
    assert len(written) == count


def test_reporter_reads_the_forwarders_counters_for_owned_topics_and_every_subscription() -> None:
    dispatchers: dict[str, Any] = {
        "s1": SimpleNamespace(uid="u1", topic_uid="t", delivered=3, leases={1: 0}),
        "s2": SimpleNamespace(uid="u2", topic_uid="t", delivered=4, leases={}),
        # Served here on a copy of a topic owned elsewhere: counted on its own.
        "s3": SimpleNamespace(uid="u3", topic_uid="other", delivered=100, leases={7: 0}),
    }

    async def write(
        loads: Mapping[str, Load], at: float, subs: Mapping[str, Load], shares: Any
    ) -> None:
        raise AssertionError("not called")

    reporter = LoadReporter(
        owned={"t", "quiet"},
        published={"t": [10, 99]},
        dispatchers=lambda: dispatchers,
        write=write,
    )
    assert reporter.counters() == {
        "t": Counters(17, 99, 1),
        "quiet": Counters(0, 0, 0),
        "s:u1": Counters(3, 0, 1),
        "s:u2": Counters(4, 0, 0),
        "s:u3": Counters(100, 0, 1),
    }


async def test_a_subscription_read_on_a_copy_is_reported_on_its_own() -> None:
    dispatcher = SimpleNamespace(uid="s-uid", topic_uid="elsewhere", delivered=0, leases={})
    clock = [0.0]
    written: list[tuple[dict[str, Load], dict[str, Load]]] = []

    async def write(
        loads: Mapping[str, Load], at: float, subs: Mapping[str, Load], shares: Any
    ) -> None:
        written.append((dict(loads), dict(subs)))

    reporter = LoadReporter(
        owned=set(),
        published={},
        dispatchers=lambda: {"s": dispatcher},
        write=write,
        monotonic=lambda: clock[0],
    )
    for _ in range(3):
        await reporter.report()
        clock[0] += 5.0
        dispatcher.delivered += 5 * 1000
    await reporter.report()
    topics, subs = written[-1]
    assert topics == {} and set(subs) == {"s-uid"}
    assert weight(subs["s-uid"]) > 1  # the router weighs it among the subscribing forwarders


async def test_a_report_uses_the_half_life_the_router_asks_for_from_the_next_sample() -> None:
    dispatcher = SimpleNamespace(uid="s-uid", topic_uid="t", delivered=0, leases={})
    clock = [0.0]
    asked: list[float | None] = [None]
    written: list[dict[str, Load]] = []

    async def write(
        loads: Mapping[str, Load], at: float, subs: Mapping[str, Load], shares: Any
    ) -> None:
        written.append(dict(subs))

    async def half_life() -> float | None:
        return asked[0]

    reporter = LoadReporter(
        owned=set(),
        published={},
        dispatchers=lambda: {"s": dispatcher},
        write=write,
        monotonic=lambda: clock[0],
        half_life=half_life,
    )
    await reporter.report()
    assert reporter.rates.half_life_s == HALF_LIFE_S  # none published yet
    asked[0] = 40.0  # the router's --load-half-life
    clock[0] += 20.0
    dispatcher.delivered += 20 * 100
    await reporter.report()
    assert reporter.rates.half_life_s == 40.0
    assert written[-1]["s-uid"].messages_per_s == pytest.approx(100 * (1 - 0.5 ** (20 / 40)))
    asked[0] = None  # a router of an earlier release leads: the default again
    await reporter.report()
    assert reporter.rates.half_life_s == HALF_LIFE_S


async def test_a_report_carries_the_backlog_shares_until_there_are_none() -> None:
    share = BacklogShare("projects/p/subscriptions/s", (0, 2), 4, 7, 700, 1.5, True)
    shares = {"s-uid": share}
    written: list[Any] = []

    async def write(
        loads: Mapping[str, Load], at: float, subs: Mapping[str, Load], found: Any
    ) -> None:
        written.append(found)

    reporter = LoadReporter(
        owned=set(),
        published={},
        dispatchers=dict,
        write=write,
        shares=lambda: shares,
    )
    await reporter.report()  # no load at all, but a backlog: said
    assert written == [({"s-uid": share}, 0)]
    shares.clear()
    await reporter.report()  # gone: said once
    await reporter.report()
    assert written[1:] == [({}, 0)]
