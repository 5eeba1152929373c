"""Unit tests for the SLI job's SLO verdicts and HTML report (pubsubd.spark.sli.slo, .report):
plain rows in, no Spark session."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pubsubd.spark.sli import report, slo

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 21, 17, 0, tzinfo=UTC)
TOPIC = "projects/p/topics/orders"
OTHER = "projects/p/topics/payments"
SUB = "projects/p/subscriptions/orders-worker"


def _minute(i: int) -> datetime:
    return T0 + timedelta(minutes=i)


def _publish(
    topic: str, i: int, p99: float, publishes: int = 10, failed: int = 0
) -> dict[str, Any]:
    return {
        "topic": topic,
        "minute": _minute(i),
        "publishes": publishes,
        "failed": failed,
        "p50_ms": p99 / 4,
        "p95_ms": p99 / 2,
        "p99_ms": p99,
    }


def _total(topic: str, p95: float, p99: float) -> dict[str, Any]:
    return {
        "topic": topic,
        "publishes": 30,
        "failed": 0,
        "p50_ms": 1.0,
        "p95_ms": p95,
        "p99_ms": p99,
    }


def test_slo_file_rejects_unknown_keys(tmp_path: Path) -> None:
    bad = tmp_path / "slo.json"
    bad.write_text(json.dumps({"publish_p99": 5}))
    with pytest.raises(ValueError, match="unknown SLO keys"):
        slo.load_slo(bad)
    good = tmp_path / "ok.json"
    good.write_text(json.dumps({"error_rate": 0.05}))
    cfg = slo.load_slo(good)
    assert cfg.target("error_rate") == 0.05
    probers = tmp_path / "probers.toml"  # the alerts' prober objective: the report takes it
    probers.write_text("prober_availability = 0.95\npublish_p99_ms = 30\n")
    assert slo.load_slo(probers).target("prober_availability") == 0.95
    assert cfg.target("publish_p99_ms") == slo.DEFAULT_SLO["publish_p99_ms"]


def test_toml_topic_overrides_apply_to_that_topic_only(tmp_path: Path) -> None:
    path = tmp_path / "slo.toml"
    path.write_text(f'publish_p99_ms = 20\n[topics."{TOPIC}"]\npublish_p99_ms = 500\n')
    cfg = slo.load_slo(path)
    assert cfg.target("publish_p99_ms", TOPIC) == 500
    assert cfg.target("publish_p99_ms", OTHER) == 20
    assert cfg.target("publish_p99_ms") == 20
    assert slo.load_slo(None).default == slo.DEFAULT_SLO


def test_latency_verdicts_use_the_window_quantile_and_count_minutes_over_target() -> None:
    cfg = slo.SloConfig(dict(slo.DEFAULT_SLO), {OTHER: {"publish_p99_ms": 1000.0}})
    publish = [_publish(TOPIC, 0, 50.0), _publish(TOPIC, 1, 150.0), _publish(OTHER, 0, 400.0)]
    totals = [_total(TOPIC, 40.0, 120.0), _total(OTHER, 30.0, 400.0)]
    checks = {(c.slo, c.scope): c for c in slo.evaluate(cfg, publish, totals, [], [])}
    p99 = checks[("publish_p99_ms", TOPIC)]
    assert (p99.target, p99.actual, p99.bad_minutes, p99.minutes) == (100.0, 120.0, 1, 2)
    assert p99.status == "FAIL"
    assert checks[("publish_p95_ms", TOPIC)].status == "PASS"  # 40 <= 50
    assert checks[("publish_p99_ms", OTHER)].status == "PASS"  # the topic's own target


def test_error_rate_counts_errors_against_successful_publishes() -> None:
    cfg = slo.load_slo(None)
    publish = [_publish(TOPIC, 0, 1.0, publishes=99), _publish(TOPIC, 1, 1.0, publishes=100)]
    errors = [{"minute": _minute(0), "method": "Publish", "code": "NOT_FOUND", "errors": 1}]
    (check,) = [c for c in slo.evaluate(cfg, publish, [], errors, []) if c.slo == "error_rate"]
    assert check.actual == pytest.approx(1 / 200)
    assert (check.bad_minutes, check.minutes, check.status) == (0, 2, "PASS")
    assert slo.error_rate(0, 0) == 0.0


def test_backlog_and_delivery_verdicts_per_subscription() -> None:
    cfg = slo.SloConfig(dict(slo.DEFAULT_SLO), {TOPIC: {"delivery_p99_ms": 10.0}})
    backlog = [
        {"subscription": SUB, "topic": TOPIC, "minute": _minute(0), "max_oldest_age_s": None},
        {"subscription": SUB, "topic": TOPIC, "minute": _minute(1), "max_oldest_age_s": 900.0},
    ]
    delivery = [
        {"subscription": SUB, "topic": TOPIC, "minute": _minute(0), "p95_ms": 5.0, "p99_ms": 20.0}
    ]
    totals = [{"subscription": SUB, "topic": TOPIC, "p95_ms": 5.0, "p99_ms": 20.0}]
    checks = {(c.slo, c.scope): c for c in slo.evaluate(cfg, [], [], [], backlog, delivery, totals)}
    age = checks[("backlog_oldest_age_s", SUB)]
    assert (age.actual, age.bad_minutes, age.minutes, age.status) == (900.0, 1, 2, "FAIL")
    assert checks[("delivery_p99_ms", SUB)].status == "FAIL"  # the topic's 10 ms override
    assert checks[("delivery_p95_ms", SUB)].status == "PASS"
    assert ("error_rate", "all RPCs") not in checks  # no publishes and no errors: no verdict


def test_report_puts_the_verdicts_first_and_escapes_names() -> None:
    cfg = slo.load_slo(None)
    publish = [_publish("projects/p/topics/<b>", i, 10.0 * (i + 1)) for i in range(3)]
    totals = [_total("projects/p/topics/<b>", 20.0, 30.0)]
    errors = [{"minute": _minute(1), "method": "Publish", "code": "NOT_FOUND", "errors": 2}]
    checks = slo.evaluate(cfg, publish, totals, errors, [])
    page = report.render_html(checks, publish, totals, errors, [], cfg, "127.0.0.1:8085")
    assert page.startswith("<!doctype html>") and page.endswith("</body></html>")
    assert page.index("<table class='summary'>") < page.index("<svg")
    assert "SLO checks FAIL" in page  # the error rate, 2 / 32
    assert "projects/p/topics/&lt;b&gt;" in page and "<b>" not in page
    assert "<td>Publish</td><td>NOT_FOUND</td><td class='num'>2</td>" in page
    assert "No acknowledged messages in this window." in page
    assert "${" not in page  # every template field was filled


def test_report_without_events_says_so() -> None:
    page = report.render_html([], [], [], [], [], slo.load_slo(None), "x")
    assert "No SLI events found" in page and "Window: no events" in page
    assert "no data in this window" in page and "<p>No errors.</p>" in page
