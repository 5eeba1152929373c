"""SLOs and burn-rate alerts (observability/slo.py) over the request SLI tallies
(observability/sli.py): the file format, the multi-window evaluation, the label bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsubd.observability.sli import OTHER, Indicator, LabelBudget, SliCounts
from pubsubd.observability.slo import (
    BURN_WINDOWS,
    SAMPLE_S,
    SloFileError,
    SloMonitor,
    load_slo,
    objectives,
)

TOPIC = "projects/p/topics/t"
SUB = "projects/p/subscriptions/s"


def _file(tmp_path: Path, text: str, name: str = "slo.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_file_sets_objectives_globally_and_per_topic(tmp_path: Path) -> None:
    config = load_slo(
        _file(
            tmp_path,
            f'publish_availability = 0.99\npublish_p99_ms = 200\n[topics."{TOPIC}"]\n'
            "publish_availability = 0.9999\npublish_p95_ms = 20\n",
        )
    )
    found = {(o.name, o.scope): o for o in objectives(config)}
    assert found[("publish_availability", "global")].target == 0.99
    assert found[("publish_p99_ms", "global")].indicator == Indicator("publish", "latency", 0.2)
    assert found[("publish_availability", TOPIC)].indicator.topic == TOPIC
    assert found[("publish_availability", TOPIC)].target == 0.9999
    latency = found[("publish_p95_ms", TOPIC)]
    assert (latency.target, latency.indicator.threshold_s) == (0.95, 0.02)
    assert found[("pull_availability", "global")].target == 0.999  # the default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("publish_availibility = 0.99\n", "unknown SLO keys"),
        ("publish_availability = 1.5\n", "between 0 and 1"),
        ("publish_availability = 'high'\n", "must be a number"),
        ("publish_p99_ms = 30\n", "not a latency bucket bound"),
        (f'[topics."{TOPIC}"]\npull_availability = 0.9\n', "unknown SLO keys"),
        ("publish_p99_ms = [\n", "slo.toml"),
    ],
)
def test_a_bad_file_is_refused_with_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SloFileError, match=message):
        load_slo(_file(tmp_path, text))


def test_the_spark_report_reads_the_same_file(tmp_path: Path) -> None:
    from pubsubd.spark.sli import slo as report_slo

    path = _file(tmp_path, f'error_rate = 0.02\n[topics."{TOPIC}"]\npublish_p99_ms = 20\n')
    assert report_slo.load_slo(path).target("publish_p99_ms", TOPIC) == 20
    assert load_slo(path).target("error_rate") == 0.02


def _monitor(config_text: str = "", tmp_path: Path | None = None) -> tuple[SloMonitor, SliCounts]:
    config = load_slo(_file(tmp_path, config_text) if tmp_path else None)
    counts = SliCounts()
    return SloMonitor(config, counts), counts


def _publish(counts: SliCounts, ok: int, failed: int, seconds: float = 0.001) -> None:
    for _ in range(ok):
        counts.record("Publish", "OK", seconds, TOPIC)
    for _ in range(failed):
        counts.record("Publish", "UNAVAILABLE", seconds, TOPIC)


def _state(monitor: SloMonitor, now: float, name: str, scope: str = "global") -> dict:
    states = monitor.alerts(now)["objectives"]
    return next(s for s in states if s["slo"] == name and s["scope"] == scope)


def _run(
    monitor: SloMonitor, counts: SliCounts, now: float, seconds: float, ok: int, bad: int
) -> float:
    """``seconds`` of traffic, ``ok`` and ``bad`` publishes every sample interval."""
    for _ in range(int(seconds / SAMPLE_S)):
        _publish(counts, ok, bad)
        now += SAMPLE_S
        monitor.sample(now)
    return now


def _firing(monitor: SloMonitor, now: float) -> set[tuple[str, str]]:
    alerts = monitor.alerts(now)["firing"]
    return {(a["slo"], a["why"].split(" over ")[1].split(" ")[0]) for a in alerts}


def test_a_fast_burn_pages_once_both_windows_burn() -> None:
    monitor, counts = _monitor()
    monitor.sample(0.0)
    now = _run(monitor, counts, 0.0, 3600, 1999, 1)  # an hour at 0.05 % errors
    assert _firing(monitor, now) == set()
    now = _run(monitor, counts, now, 300, 1960, 40)  # five minutes at 2 %: burn rate 20
    one_hour = _state(monitor, now, "publish_availability")["windows"][0]
    assert one_hour["short_burn_rate"] == pytest.approx(20.0)
    assert one_hour["long_burn_rate"] < 14.4  # the hour is still mostly good
    assert _firing(monitor, now) == set()
    now = _run(monitor, counts, now, 2400, 1960, 40)  # 45 minutes: the hour crosses 14.4
    assert ("publish_availability", "1h") in _firing(monitor, now)
    why = monitor.alerts(now)["firing"][0]["why"]
    assert "14.4" in why and "2% of the 30-day error budget in 1h" in why


def test_a_burn_that_stopped_stops_paging() -> None:
    """The short windows confirm: once errors stop, the 1-hour alert clears within 5 minutes
    and the 6-hour one within 30, although their long windows still remember the errors."""
    monitor, counts = _monitor()
    monitor.sample(0.0)
    now = _run(monitor, counts, 0.0, 1800, 50, 50)
    assert _firing(monitor, now) == {("publish_availability", "1h"), ("publish_availability", "6h")}
    now = _run(monitor, counts, now, 315, 100, 0)
    state = _state(monitor, now, "publish_availability")
    assert state["windows"][0]["long_burn_rate"] > 14.4
    assert state["windows"][0]["short_burn_rate"] == 0
    assert _firing(monitor, now) == {("publish_availability", "6h")}
    now = _run(monitor, counts, now, 1800, 100, 0)
    assert _firing(monitor, now) == set()


def test_budget_remaining_counts_every_event_since_start() -> None:
    monitor, counts = _monitor()
    monitor.sample(0.0)
    _publish(counts, 9995, 5)  # 0.05 % errors of a 0.1 % budget: half spent
    state = _state(monitor, 10.0, "publish_availability")
    assert state["error_budget_remaining"] == pytest.approx(0.5)
    assert (state["good"], state["total"]) == (9995, 10000)


def test_latency_counts_only_successful_requests_against_the_threshold(tmp_path: Path) -> None:
    monitor, counts = _monitor("publish_p99_ms = 10\n", tmp_path)
    monitor.sample(0.0)
    for _ in range(98):
        counts.record("Publish", "OK", 0.005, TOPIC)
    for _ in range(2):
        counts.record("Publish", "OK", 0.05, TOPIC)  # slow
    counts.record("Publish", "INVALID_ARGUMENT", 0.0001, TOPIC)  # neither fast nor slow
    state = _state(monitor, 1.0, "publish_p99_ms")
    assert (state["good"], state["total"]) == (98, 100)
    assert state["windows"][0]["long_burn_rate"] == pytest.approx(2.0)
    availability = _state(monitor, 1.0, "publish_availability")
    assert (availability["good"], availability["total"]) == (101, 101)  # the caller's error


def test_per_topic_objectives_count_only_their_topic(tmp_path: Path) -> None:
    monitor, counts = _monitor(f'[topics."{TOPIC}"]\npublish_availability = 0.99\n', tmp_path)
    monitor.sample(0.0)
    _publish(counts, 90, 10)
    counts.record("Publish", "UNAVAILABLE", 0.001, "projects/p/topics/other")
    counts.record("CreateTopic", "INTERNAL", 0.001, None)
    topic = _state(monitor, 1.0, "publish_availability", TOPIC)
    assert (topic["good"], topic["total"]) == (90, 100)
    everything = _state(monitor, 1.0, "publish_availability")
    assert (everything["good"], everything["total"]) == (90, 101)
    control = _state(monitor, 1.0, "control_plane_availability")
    assert (control["good"], control["total"]) == (0, 1)
    scopes = {(a["slo"], a["scope"]) for a in monitor.alerts(1.0)["firing"]}
    assert ("publish_availability", TOPIC) in scopes


def test_windows_keep_only_what_the_longest_needs() -> None:
    monitor, _ = _monitor()
    longest = max(w.long_s for w in BURN_WINDOWS)
    for i in range(int(2 * longest / SAMPLE_S)):
        monitor.sample(i * SAMPLE_S)
    assert len(monitor._samples) <= longest / SAMPLE_S + 2


def test_the_label_budget_bounds_topics_and_keeps_pinned_ones() -> None:
    budget = LabelBudget(2, pinned=["pinned"])
    assert [budget.label(t) for t in ("a", "b", "c", "a", "pinned", "d")] == [
        "a",
        "b",
        OTHER,
        "a",
        "pinned",
        OTHER,
    ]
    assert (budget.admitted, budget.refused) == (2, 2)


def test_sampled_acks_feed_the_delivery_latency_objective() -> None:
    from pubsubd.observability import sli

    recorder = sli.configure(10)
    monitor = SloMonitor(load_slo(None), recorder.counts)
    monitor.sample(0.0)
    published = {pos: 1_000_000 * pos for pos in range(100)}  # position p published at p s
    # Acked at 100 s: positions 0-49 waited over 50 s, 96-99 under the 5 s threshold.
    sli.record_acks(TOPIC, SUB, list(range(50)), published.__getitem__, 100e6)
    sli.record_acks(TOPIC, SUB, [96, 97, 98, 99], published.__getitem__, 100e6)
    sli.record_acks(TOPIC, SUB, [], published.__getitem__, 100e6)  # nothing to sample
    sli.record_acks(TOPIC, SUB, [1000], published.__getitem__, 100e6)  # trimmed: not measurable
    state = _state(monitor, 1.0, "delivery_p99_ms")
    assert (state["good"], state["total"]) == (2, 4)  # two samples per batch
    assert "sampled acks" in state["objective"]


def _delivery_samples(subscription: str) -> float:
    """Sampled acks counted so far in the subscription label's delivery latency series."""
    from pubsubd.observability import sli

    return sum(
        s.value
        for m in sli.SUBSCRIPTION_DELIVERY_LATENCY.collect()
        for s in m.samples
        if s.name.endswith("_count") and s.labels["subscription"] == subscription
    )


def test_sampled_acks_are_counted_per_subscription_within_the_label_budget() -> None:
    from pubsubd.observability import sli

    recorder = sli.configure(10, max_subscriptions=1)
    own, later = "projects/p/subscriptions/unit-own", "projects/p/subscriptions/unit-later"
    other_before = _delivery_samples(OTHER)  # the series are the process's, shared by tests
    published = {pos: 1_000_000 * pos for pos in range(100)}
    sli.record_acks(TOPIC, own, list(range(10)), published.__getitem__, 100e6)  # 2 sampled
    sli.record_acks(TOPIC, own, [99], published.__getitem__, 100e6)  # 1 s: the only one
    sli.record_acks(TOPIC, later, [97, 98, 99], published.__getitem__, 100e6)  # over the bound
    sli.record_acks(TOPIC, later, [1000], published.__getitem__, 100e6)  # not measurable
    assert _delivery_samples(own) == 3
    assert _delivery_samples(later) == 0  # no series of its own
    assert _delivery_samples(OTHER) - other_before == 2
    assert recorder.status()["subscription_labels"] == 1
    # The backlog gauges share the budget: the subscription acked first keeps its label.
    backlog = sli.BacklogCollector(
        lambda: [(later, 4, 40, 1.0), (own, 2, 20, 3.0)], recorder.subscriptions
    )
    messages = {s.labels["subscription"]: s.value for s in backlog.collect()[0].samples}
    assert messages == {own: 2, OTHER: 4}


def test_the_sli_report_takes_any_threshold_the_alerts_do_not(tmp_path: Path) -> None:
    from pubsubd.spark.sli import slo as report_slo

    path = _file(tmp_path, "publish_p99_ms = 30\n")
    assert report_slo.load_slo(path).target("publish_p99_ms") == 30
    with pytest.raises(SloFileError, match="not a latency bucket bound"):
        load_slo(path)
