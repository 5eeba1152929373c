"""SLOs and burn-rate alerts (observability/slo.py) over the request SLI tallies
(observability/sli.py): the file format, the multi-window evaluation, the label bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

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
        ("backlog_age_objective = 1.0\n", "backlog_age_objective in the top level must be between"),
        ("backlog_age_objective = 0\n", "must be between 0 and 1"),
        (
            "backlog_age_objective = 'most'\n",
            "backlog_age_objective in the top level must be a num",
        ),
        ("backlog_oldest_age_s = -5\n", "backlog_oldest_age_s in the top level must be a positive"),
        ("backlog_oldest_age_s = 0\n", "must be a positive number of seconds"),
        ("backlog_oldest_age_s = inf\n", "must be a positive number of seconds"),
        ("backlog_oldest_age_s = nan\n", "must be a positive number of seconds"),
        (f'[topics."{TOPIC}"]\nbacklog_age_objective = 1.5\n', f"in topic {TOPIC} must be betw"),
        ("backlog_age_objectve = 0.9\n", "unknown SLO keys"),
        ("prober_availability = 1\n", "prober_availability in the top level must be between"),
        ("prober_availability = 0.0\n", "must be between 0 and 1"),
        ("prober_availability = true\n", "must be a number"),
        (f'[topics."{TOPIC}"]\nprober_availability = 0.9\n', "unknown SLO keys"),
    ],
)
def test_a_bad_file_is_refused_with_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SloFileError, match=message):
        load_slo(_file(tmp_path, text))


@pytest.mark.parametrize("text", ["backlog_oldest_age_s = -1\n", "backlog_age_objective = 2\n"])
def test_the_sli_report_refuses_the_same_bad_backlog_values(tmp_path: Path, text: str) -> None:
    from pubsubd.spark.sli import slo as report_slo

    with pytest.raises(SloFileError):
        report_slo.load_slo(_file(tmp_path, text))


def test_the_spark_report_reads_the_same_file(tmp_path: Path) -> None:
    from pubsubd.spark.sli import slo as report_slo

    path = _file(
        tmp_path,
        f"error_rate = 0.02\nbacklog_oldest_age_s = 900\nbacklog_age_objective = 0.95\n"
        f'[topics."{TOPIC}"]\npublish_p99_ms = 20\nbacklog_oldest_age_s = 30.5\n',
    )
    report = report_slo.load_slo(path)
    assert report.target("publish_p99_ms", TOPIC) == 20
    assert report.target("backlog_oldest_age_s", TOPIC) == 30.5
    assert report.target("backlog_oldest_age_s") == 900
    assert load_slo(path).target("error_rate") == 0.02
    assert load_slo(path).target("backlog_age_objective", TOPIC) == 0.95  # the global one


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
        lambda: [
            sli.BacklogRow(later, TOPIC, 4, 40, 1.0),
            sli.BacklogRow(own, TOPIC, 2, 20, 3.0),
        ],
        recorder.subscriptions,
    )
    messages = {s.labels["subscription"]: s.value for s in backlog.collect()[0].samples}
    assert messages == {own: 2, OTHER: 4}


def test_the_sli_report_takes_any_threshold_the_alerts_do_not(tmp_path: Path) -> None:
    from pubsubd.spark.sli import slo as report_slo

    path = _file(tmp_path, "publish_p99_ms = 30\n")
    assert report_slo.load_slo(path).target("publish_p99_ms") == 30
    with pytest.raises(SloFileError, match="not a latency bucket bound"):
        load_slo(path)


# -- the backlog-age (freshness) objective ----------------------------------------------------

BACKLOG = "backlog_oldest_age_s"
OTHER_TOPIC = "projects/p/topics/other"
RELAXED = "projects/p/topics/relaxed"


def _ages(monitor: SloMonitor, now: float, seconds: float, ages: list[tuple[str, float]]) -> float:
    """``seconds`` of samples, each seeing these (topic, oldest unacked age) subscriptions."""
    for _ in range(round(seconds / SAMPLE_S)):
        now += SAMPLE_S
        monitor.sample(now, ages)
    return now


def _backlog_firing(monitor: SloMonitor, now: float) -> set[tuple[str, str]]:
    """(scope, long window) of the backlog alerts firing."""
    return {
        (a["scope"], a["why"].split(" over ")[1].split(" ")[0])
        for a in monitor.alerts(now)["firing"]
        if a["slo"] == BACKLOG
    }


FRESH = [(TOPIC, 30.0), (OTHER_TOPIC, 0.0)]
STALE = [(TOPIC, 30.0), (OTHER_TOPIC, 601.0)]  # one subscription over the 600 s default


def test_an_old_backlog_pages_only_once_both_windows_cross() -> None:
    """Six fresh hours, then one subscription's oldest unacked message stays over 600 s: the
    1-hour page needs 14.4 x 1 % of the hour's 240 samples bad (35), not only of the last
    5 minutes' 20 (3); the 6-hour page needs 6 % of 1440 samples (87)."""
    monitor, _ = _monitor()
    monitor.sample(0.0, FRESH)
    now = _ages(monitor, 0.0, 6 * 3600, FRESH)
    assert _backlog_firing(monitor, now) == set()
    now = _ages(monitor, now, 34 * SAMPLE_S, STALE)
    state = _state(monitor, now, BACKLOG)
    assert state["windows"][0]["short_burn_rate"] == pytest.approx(100.0)  # 20 of 20 bad
    assert state["windows"][0]["long_burn_rate"] == pytest.approx(34 / 240 / 0.01, abs=1e-3)
    assert _backlog_firing(monitor, now) == set()
    now = _ages(monitor, now, SAMPLE_S, STALE)  # the 35th
    assert _backlog_firing(monitor, now) == {("global", "1h")}
    alert = next(a for a in monitor.alerts(now)["firing"] if a["slo"] == BACKLOG)
    assert "older than 600 s" in alert["objective"] and "2% of the 30-day" in alert["why"]
    now = _ages(monitor, now, 51 * SAMPLE_S, STALE)  # 86 bad samples
    assert _backlog_firing(monitor, now) == {("global", "1h")}
    now = _ages(monitor, now, SAMPLE_S, STALE)  # 87: 6.04 % of six hours
    assert _backlog_firing(monitor, now) == {("global", "1h"), ("global", "6h")}
    state = _state(monitor, now, BACKLOG)
    assert (state["good"], state["total"]) == (1441, 1441 + 87)
    # 87 bad samples of 1528 spent 5.7 times the 1 % budget since start
    assert state["error_budget_remaining"] == pytest.approx(1 - 87 / 1528 / 0.01, abs=1e-6)


def test_a_drained_backlog_stops_paging() -> None:
    monitor, _ = _monitor()
    monitor.sample(0.0, FRESH)
    now = _ages(monitor, 0.0, 1800, STALE)
    assert _backlog_firing(monitor, now) == {("global", "1h"), ("global", "6h")}
    now = _ages(monitor, now, 300, FRESH)  # acked: the last 5 minutes are fresh
    state = _state(monitor, now, BACKLOG)
    assert state["windows"][0]["long_burn_rate"] > 14.4  # the hour still remembers
    assert state["windows"][0]["short_burn_rate"] == 0
    assert _backlog_firing(monitor, now) == {("global", "6h")}
    now = _ages(monitor, now, 1800, FRESH)
    assert _backlog_firing(monitor, now) == set()


def test_no_subscription_is_a_fresh_sample() -> None:
    monitor, _ = _monitor()
    monitor.sample(0.0)
    _ages(monitor, 0.0, 60, [])
    state = _state(monitor, 60.0, BACKLOG)
    assert (state["good"], state["total"]) == (5, 5)  # the first sample counts too
    assert state["error_budget_remaining"] == 1.0


def test_a_topic_with_its_own_backlog_objective_is_judged_by_it_alone(tmp_path: Path) -> None:
    """The topic's worst subscription against its own threshold and target; the global
    objective judges the other topics only, so a relaxed topic never pages globally."""
    monitor, _ = _monitor(
        f'backlog_age_objective = 0.95\n[topics."{TOPIC}"]\nbacklog_oldest_age_s = 60\n'
        f'[topics."{RELAXED}"]\nbacklog_oldest_age_s = 3600\nbacklog_age_objective = 0.999\n'
        f'[topics."{OTHER_TOPIC}"]\npublish_availability = 0.99\n',
        tmp_path,
    )
    found = {(o.name, o.scope): o for o in monitor.objectives if o.name == BACKLOG}
    assert set(found) == {(BACKLOG, "global"), (BACKLOG, TOPIC), (BACKLOG, RELAXED)}
    assert found[(BACKLOG, "global")].indicator.exclude == {TOPIC, RELAXED}
    assert found[(BACKLOG, TOPIC)].indicator.threshold_s == 60
    assert found[(BACKLOG, TOPIC)].target == 0.95  # the global target, the topic's threshold
    assert found[(BACKLOG, RELAXED)].target == 0.999
    monitor.sample(0.0)
    # Two subscriptions of TOPIC (the worst is over 60 s), RELAXED over 600 s but within its
    # 3600, and the other topic fresh.
    ages = [(TOPIC, 10.0), (TOPIC, 61.0), (RELAXED, 3000.0), (OTHER_TOPIC, 5.0)]
    now = _ages(monitor, 0.0, 600, ages)
    assert _backlog_firing(monitor, now) == {(TOPIC, "1h"), (TOPIC, "6h")}
    assert _state(monitor, now, BACKLOG, RELAXED)["good"] == 41
    assert _state(monitor, now, BACKLOG)["good"] == 41
    # A stale subscription of a topic without an objective of its own is the global one's.
    # Half an hour of it: 120 bad samples of 160 (over 14.4 x the 5 % budget) since start;
    # the topic's own alerts have cleared meanwhile.
    now = _ages(monitor, now, 1800, [(TOPIC, 0.0), (RELAXED, 3000.0), (OTHER_TOPIC, 700.0)])
    assert _backlog_firing(monitor, now) == {("global", "1h"), ("global", "6h")}
    assert (
        "any topic without its own backlog objective" in _state(monitor, now, BACKLOG)["objective"]
    )


def test_scaled_windows_keep_the_burn_thresholds() -> None:
    from pubsubd.observability.slo import scaled_windows

    assert scaled_windows(1) == BURN_WINDOWS
    for real, scaled in zip(BURN_WINDOWS, scaled_windows(300), strict=True):
        assert (scaled.long_s, scaled.short_s) == (real.long_s / 300, real.short_s / 300)
        assert scaled.factor == pytest.approx(real.factor)


def test_a_monitor_with_short_windows_fires_and_clears_in_seconds() -> None:
    """What the real-server test runs: windows divided by 300 (1 h: 12 s, 5 min: 1 s, 6 h:
    72 s, 30 min: 6 s), a sample every 0.2 s."""
    from pubsubd.observability.slo import scaled_windows

    monitor = SloMonitor(load_slo(None), SliCounts(), windows=scaled_windows(300), sample_s=0.2)
    now = 0.0
    for _ in range(20):  # four fresh seconds
        now += 0.2
        monitor.sample(now, FRESH)
    for _ in range(5):  # one stale second
        now += 0.2
        monitor.sample(now, STALE)
    assert _backlog_firing(monitor, now) == {("global", "12s"), ("global", "72s")}
    for _ in range(31):  # 6.2 fresh seconds: both short windows are clean
        now += 0.2
        monitor.sample(now, FRESH)
    assert _backlog_firing(monitor, now) == set()


def test_the_backlog_gauges_take_the_worst_subscription_of_each_topic() -> None:
    from pubsubd.observability.sli import BacklogCollector, BacklogRow, LabelBudget

    rows = [
        BacklogRow("projects/p/subscriptions/a", TOPIC, 3, 30, 12.0),
        BacklogRow("projects/p/subscriptions/b", TOPIC, 1, 10, 40.0),
        BacklogRow("projects/p/subscriptions/c", OTHER_TOPIC, 1, 10, 7.0),
        BacklogRow("projects/p/subscriptions/d", RELAXED, 1, 10, 99.0),
        BacklogRow("projects/p/subscriptions/e", "projects/p/topics/late", 1, 10, 5.0),
    ]
    collector = BacklogCollector(
        lambda: rows, LabelBudget(10), max_topics=1, pinned_topics=[RELAXED]
    )
    families = {f.name: f for f in collector.collect()}
    topic_ages = {
        s.labels["topic"]: s.value
        for s in families["pubsubd_topic_oldest_unacked_message_age_seconds"].samples
    }
    # The first unpinned topic has its own label, the pinned one too, the rest are _other.
    assert topic_ages == {TOPIC: 40.0, RELAXED: 99.0, OTHER: 7.0}
    assert collector.topics.refused == 2


# -- the probers' own objective ----------------------------------------------------------------


def _probe_rounds(monitor: SloMonitor, now: float, seconds: float, ok: int, failed: int) -> float:
    """``seconds`` of probing: ``ok`` and ``failed`` probe results every sample interval."""
    from pubsubd.observability import sli

    for _ in range(int(seconds / SAMPLE_S)):
        for result in [True] * ok + [False] * failed:
            sli.record_probe(result)
        now += SAMPLE_S
        monitor.sample(now)
    return now


def _prober_monitor(tmp_path: Path, text: str = "") -> SloMonitor:
    from pubsubd.observability import sli

    recorder = sli.configure(10)
    monitor = SloMonitor(load_slo(_file(tmp_path, text)), recorder.counts)
    monitor.sample(0.0)
    return monitor


def test_the_prober_objective_is_global_with_its_file_target(tmp_path: Path) -> None:
    found = {(o.name, o.scope): o for o in objectives(load_slo(None))}
    default = found[("prober_availability", "global")]
    assert (default.target, default.indicator) == (0.99, Indicator("prober", "availability"))
    assert "of the probers' probes succeeded" in default.describe()
    config = load_slo(_file(tmp_path, f'prober_availability = 0.95\n[topics."{TOPIC}"]\n'))
    own = [o for o in objectives(config) if o.name == "prober_availability"]
    assert [(o.scope, o.target) for o in own] == [("global", 0.95)]


def test_failing_probes_page_and_succeeding_ones_do_not(tmp_path: Path) -> None:
    """Probes are their own events: requests do not count in the prober objective, probe
    results count in nothing else."""
    monitor = _prober_monitor(tmp_path)
    now = _probe_rounds(monitor, 0.0, 3600, 2, 0)
    _publish(monitor.counts, 100, 100)  # the server's own requests fail: not the probes
    state = _state(monitor, now, "prober_availability")
    assert (state["good"], state["total"]) == (480, 480)
    assert state["error_budget_remaining"] == 1.0
    assert ("prober_availability", "1h") not in _firing(monitor, now)
    assert _state(monitor, now, "publish_availability")["total"] == 200
    now = _probe_rounds(monitor, now, 300, 1, 1)  # five minutes of half the probes failing
    state = _state(monitor, now, "prober_availability")
    assert state["windows"][0]["short_burn_rate"] == pytest.approx(50.0)
    assert state["windows"][0]["long_burn_rate"] < 14.4  # the hour is mostly good: no page
    assert ("prober_availability", "1h") not in _firing(monitor, now)
    now = _probe_rounds(monitor, now, 600, 0, 2)  # then ten minutes of every probe failing
    state = _state(monitor, now, "prober_availability")
    assert (state["good"], state["total"]) == (500, 600)
    assert state["windows"][0]["long_burn_rate"] == pytest.approx(
        100 / 480 / 0.01, abs=1e-4
    )  # rounded
    assert _firing(monitor, now) >= {("prober_availability", "1h"), ("prober_availability", "6h")}
    assert state["error_budget_remaining"] < 0  # a sixth failed, of a 1 % budget
    pages = [a for a in monitor.alerts(now)["firing"] if a["slo"] == "prober_availability"]
    assert {a["scope"] for a in pages} == {"global"}
    assert "probes succeeded" in pages[0]["objective"]


def test_without_a_prober_the_objective_has_no_events(tmp_path: Path) -> None:
    monitor = _prober_monitor(tmp_path, "prober_availability = 0.999\n")
    now = _run(monitor, monitor.counts, 0.0, 3600, 0, 100)  # every publish fails
    state = _state(monitor, now, "prober_availability")
    assert (state["good"], state["total"], state["sli"]) == (0, 0, None)
    assert state["error_budget_remaining"] is None
    assert not state["firing"] and all(w["long_burn_rate"] == 0 for w in state["windows"])
    assert ("publish_availability", "1h") in _firing(monitor, now)


def test_each_probe_result_of_a_round_reaches_the_monitor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``probe_round`` (the loop of ``serve --prober-interval`` and of ``pubsubd prober``)
    tallies every result it exports as ``pubsubd_prober_probes_total``."""
    from pubsubd.prober import loop
    from pubsubd.prober.probes import ProbeResult

    endpoint = "127.0.0.1:1"  # never dialled: the probes are replaced

    def fake(ok: bool) -> object:
        return lambda clients, project: ProbeResult("fake", endpoint, ok, 0.01, 0.0, "x: y")

    monkeypatch.setattr(loop, "publish_receive", fake(True))
    monkeypatch.setattr(loop, "control_plane", fake(False))
    monitor = _prober_monitor(tmp_path)
    config = loop.ProberConfig((endpoint,))
    labels = {"probe": "fake", "endpoint": endpoint, "result": "failure"}
    exported = REGISTRY.get_sample_value("pubsubd_prober_probes_total", labels) or 0.0
    for _ in range(3):
        loop.probe_round(config, {endpoint: None})  # type: ignore[dict-item]
    state = _state(monitor, 1.0, "prober_availability")
    assert (state["good"], state["total"]) == (3, 6)
    assert REGISTRY.get_sample_value("pubsubd_prober_probes_total", labels) == exported + 3
