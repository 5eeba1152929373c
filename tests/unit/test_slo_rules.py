"""``pubsubd slo export-rules``: Prometheus accepts the rules (``promtool check rules``) and
they fire as the in-process monitor does (``promtool test rules`` over synthetic series).
promtool comes from Debian's ``prometheus`` package (``make test`` takes the binary out of it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pubsubd.observability.slo import load_slo, prometheus_rules, to_yaml

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/orders"


def _promtool() -> str:
    """``make test`` exports PROMTOOL (the system's, or the one it took out of the package)."""
    candidates = [
        os.environ.get("PROMTOOL", ""),
        shutil.which("promtool") or "",
        str(Path(__file__).resolve().parents[2] / ".tools" / "promtool"),
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    pytest.fail("promtool is missing: `make test` takes it out of Debian's prometheus package")


BULK = "projects/p/topics/bulk.v2"  # a dot: the global rule's topic!~ regex must escape it
SLO_TEXT = (
    f'publish_p99_ms = 100\n[topics."{TOPIC}"]\npublish_availability = 0.99\n'
    f'[topics."{BULK}"]\nbacklog_oldest_age_s = 3600\n'
)


def _export(tmp_path: Path) -> Path:
    slo = tmp_path / "slo.toml"
    slo.write_text(SLO_TEXT)
    rules = tmp_path / "rules.yml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pubsubd",
            "slo",
            "export-rules",
            "--slo",
            str(slo),
            "--out",
            str(rules),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return rules


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    rules = _export(tmp_path)
    done = subprocess.run(
        [_promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _annotations(slo_file: Path, slo: str, scope: str, window: str) -> dict[str, str]:
    for rule in prometheus_rules(load_slo(slo_file))["groups"][1]["rules"]:
        labels = rule["labels"]
        if (labels["slo"], labels["scope"], labels["long_window"]) == (slo, scope, window):
            return dict(rule["annotations"])
    raise AssertionError(f"no rule for {slo} {scope} {window}")


def _alert(tmp_path: Path, slo: str, scope: str, window: str) -> dict[str, object]:
    return {
        "exp_labels": {
            "alertname": "PubsubdErrorBudgetBurn",
            "slo": slo,
            "scope": scope,
            "severity": "page",
            "long_window": window,
        },
        "exp_annotations": _annotations(tmp_path / "slo.toml", slo, scope, window),
    }


def _promtool_test(tmp_path: Path, tests: dict[str, object]) -> None:
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(to_yaml(tests))
    done = subprocess.run(
        [_promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_page_on_a_fast_burn_and_stay_quiet_within_budget(tmp_path: Path) -> None:
    rules = _export(tmp_path)

    def alert(slo: str, scope: str, window: str) -> dict[str, object]:
        return _alert(tmp_path, slo, scope, window)

    ok = 'pubsubd_rpc_requests_total{method="Publish",code="OK"}'
    unavailable = 'pubsubd_rpc_requests_total{method="Publish",code="UNAVAILABLE"}'
    caller = 'pubsubd_rpc_requests_total{method="Publish",code="INVALID_ARGUMENT"}'
    topic_ok = f'pubsubd_topic_publish_requests_total{{topic="{TOPIC}",code="OK"}}'
    topic_bad = f'pubsubd_topic_publish_requests_total{{topic="{TOPIC}",code="INTERNAL"}}'
    fast = 'pubsubd_rpc_latency_seconds_bucket{method="Publish",le="0.1"}'
    every = 'pubsubd_rpc_latency_seconds_count{method="Publish"}'
    delivered_fast = 'pubsubd_delivery_latency_seconds_bucket{topic="t",le="5.0"}'
    delivered = 'pubsubd_delivery_latency_seconds_count{topic="t"}'
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "30s",
        "tests": [
            {  # 5 % of publishes fail for two hours: both page alerts of the global objective
                "interval": "30s",
                "input_series": [
                    {"series": ok, "values": "0+950x240"},
                    {"series": unavailable, "values": "0+50x240"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "1h",
                        "alertname": "PubsubdErrorBudgetBurn",
                        "exp_alerts": [
                            alert("publish_availability", "global", "1h"),
                            alert("publish_availability", "global", "6h"),
                        ],
                    }
                ],
            },
            {  # 0.05 % fail (half the budget's pace), and the caller's own errors: quiet
                "interval": "30s",
                "input_series": [
                    {"series": ok, "values": "0+1999x240"},
                    {"series": unavailable, "values": "0+1x240"},
                    {"series": caller, "values": "0+500x240"},
                ],
                "alert_rule_test": [
                    {"eval_time": "1h", "alertname": "PubsubdErrorBudgetBurn", "exp_alerts": []}
                ],
            },
            {  # one topic at 20 % errors against its own 99 % objective (burn rate 20); 20 %
                # of publishes slower than 100 ms against the global 99 % objective (20); 30 %
                # of sampled acks later than 5 s after their publish (30)
                "interval": "30s",
                "input_series": [
                    {"series": ok, "values": "0+100000x240"},
                    {"series": topic_ok, "values": "0+80x240"},
                    {"series": topic_bad, "values": "0+20x240"},
                    {"series": fast, "values": "0+800x240"},
                    {"series": every, "values": "0+1000x240"},
                    {"series": delivered_fast, "values": "0+70x240"},
                    {"series": delivered, "values": "0+100x240"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "1h",
                        "alertname": "PubsubdErrorBudgetBurn",
                        "exp_alerts": [
                            alert("publish_availability", TOPIC, "1h"),
                            alert("publish_availability", TOPIC, "6h"),
                            alert("publish_p99_ms", "global", "1h"),
                            alert("publish_p99_ms", "global", "6h"),
                            alert("delivery_p99_ms", "global", "1h"),
                            alert("delivery_p99_ms", "global", "6h"),
                        ],
                    }
                ],
            },
        ],
    }
    _promtool_test(tmp_path, tests)


AGE = "pubsubd_topic_oldest_unacked_message_age_seconds"


def _age(topic: str, instance: str) -> str:
    return f'{AGE}{{topic="{topic}",instance="{instance}"}}'


def test_the_backlog_rules_page_on_an_old_backlog_and_stay_quiet_on_a_fresh_one(
    tmp_path: Path,
) -> None:
    """The bad-time ratio of the backlog-age objective (max age over 600 s, or over the bulk
    topic's own 3600 s) over each window, from processes' gauges scraped every 15 s and
    ``pubsubd:slo_backlog_too_old`` recorded every 30 s. Within a series' first hours the
    windows reach back to its start only, as they do in the process."""
    rules = _export(tmp_path)
    backlog = "backlog_oldest_age_s"

    def alert(scope: str, window: str) -> dict[str, object]:
        return _alert(tmp_path, backlog, scope, window)

    def case(series: list[tuple[str, str]], *checks: tuple[str, list[str]]) -> dict[str, object]:
        """Input series sampled every 15 s; at each eval time, the (scope, long window) of the
        backlog alerts expected to fire."""
        return {
            "interval": "15s",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [
                {
                    "eval_time": at,
                    "alertname": "PubsubdErrorBudgetBurn",
                    "exp_alerts": [alert(*a.split(" ")) for a in expected],
                }
                for at, expected in checks
            ],
        }

    fresh = "30+0x240"  # 30 s old for an hour
    growing = "0+15x240"  # never acked: over 600 s after 10 minutes
    both = ["global 1h", "global 6h"]
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "30s",
        "tests": [
            # One process's subscription of TOPIC never acks (the worst of both processes
            # counts): from 10 minutes on every sample is bad, both pages fire globally.
            case([(_age(TOPIC, "a"), fresh), (_age(TOPIC, "b"), growing)], ("1h", both)),
            # A fresh hour, then a backlog left over 600 s: at 2 minutes the last 5 minutes
            # are 40 % bad, the hour 4 % (the 6-hour window, reaching back to the start, 4 %
            # too): quiet. At 7 minutes the hour is 12.5 % bad (under 14.4 x 1 %), the 67
            # minutes since the start 11 % (over 6 x 1 %): only the 6-hour page. At 10
            # minutes (17.5 %) the 1-hour one too.
            case(
                [(_age(TOPIC, "a"), "30+0x239 601+15x60")],
                ("1h2m", []),
                ("1h7m", ["global 6h"]),
                ("1h10m", both),
            ),
            # Fresh backlogs, and the bulk topic at 30 minutes (over the global 600 s, within
            # its own 3600 s; the global objective leaves it out): quiet.
            case([(_age(TOPIC, "a"), fresh), (_age(BULK, "a"), "1800+0x240")], ("1h", [])),
            # The bulk topic over its own threshold: its own pages, not the global ones.
            case(
                [(_age(TOPIC, "a"), fresh), (_age(BULK, "a"), "7200+0x240")],
                ("1h", [f"{BULK} 1h", f"{BULK} 6h"]),
            ),
            # A topic beyond the label bound (topic="_other") counts for the global objective;
            # a backlog that drains stops the 1-hour page within 5 minutes.
            case(
                [(_age("_other", "a"), "0+15x240 0+0x240")],
                ("1h", both),
                ("1h6m", ["global 6h"]),
            ),
        ],
    }
    _promtool_test(tmp_path, tests)


def _probes(result: str, probe: str = "publish_receive", endpoint: str = "a:8085") -> str:
    return f'pubsubd_prober_probes_total{{probe="{probe}",endpoint="{endpoint}",result="{result}"}}'


def test_the_prober_rules_page_on_failing_probes_and_stay_quiet_otherwise(tmp_path: Path) -> None:
    """The probers' objective (99 % of probes succeed) over every prober's
    ``pubsubd_prober_probes_total``: failures page; probes that all succeed, and no probes at
    all, record no NaN and fire nothing."""
    rules = _export(tmp_path)
    pages = [_alert(tmp_path, "prober_availability", "global", w) for w in ("1h", "6h")]
    ratio = 'pubsubd:slo_error_ratio:rate5m{slo="prober_availability",scope="global"}'
    every_probe = "0+2x240"  # two probes every 30 s for two hours

    def case(
        series: list[tuple[str, str]], expected: list[dict[str, object]], at: str = "1h"
    ) -> dict[str, object]:
        return {
            "interval": "30s",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [
                {"eval_time": at, "alertname": "PubsubdErrorBudgetBurn", "exp_alerts": expected}
            ],
        }

    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "30s",
        "tests": [
            # One endpoint's probes all fail, another's succeed: half of them fail, both pages.
            case(
                [
                    (_probes("failure", endpoint="a:8085"), every_probe),
                    (_probes("success", endpoint="b:8085"), every_probe),
                ],
                pages,
            ),
            # 0.5 % of the probes fail (one in 200; half the budget's pace): quiet.
            case(
                [
                    (_probes("success"), "0+199x240"),
                    (_probes("failure", "control_plane"), "0+1x240"),
                ],
                [],
            ),
            {  # Every probe succeeds (no failure series at all): the ratio is 0, quiet.
                **case([(_probes("success"), every_probe)], []),
                "promql_expr_test": [
                    {
                        "expr": ratio,
                        "eval_time": "1h",
                        "exp_samples": [{"labels": ratio, "value": 0}],
                    }
                ],
            },
            {  # A prober that failed for half an hour, then stopped: its last 5 minutes hold
                # no probe, so no ratio (not 0/0 = NaN), and no page without the short window.
                **case([(_probes("failure"), "0+2x60 120+0x180")], [], at="2h"),
                "promql_expr_test": [{"expr": ratio, "eval_time": "2h", "exp_samples": []}],
            },
            {  # No prober at all (requests only): no ratio, nothing fires.
                **case([('pubsubd_rpc_requests_total{method="Publish",code="OK"}', "0+9x240")], []),
                "promql_expr_test": [{"expr": ratio, "eval_time": "1h", "exp_samples": []}],
            },
        ],
    }
    _promtool_test(tmp_path, tests)
