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


def _export(tmp_path: Path) -> Path:
    slo = tmp_path / "slo.toml"
    slo.write_text(f'publish_p99_ms = 100\n[topics."{TOPIC}"]\npublish_availability = 0.99\n')
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


def test_the_rules_page_on_a_fast_burn_and_stay_quiet_within_budget(tmp_path: Path) -> None:
    rules = _export(tmp_path)

    def alert(slo: str, scope: str, window: str) -> dict[str, object]:
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
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(to_yaml(tests))
    done = subprocess.run(
        [_promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
