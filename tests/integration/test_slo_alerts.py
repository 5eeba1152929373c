"""SLIs, SLOs and burn-rate alerts on a real server: publishes refused by the service show on
/metrics (per method and per topic, within the label bound, beside the backlog gauges and the
storage write latency), /alerts says what fires and why,
and ``pubsubd alerts`` exits 3 while an alert fires; an unacked backlog older than its
threshold pages (globally and per topic) and stops paging once acked. The official (generated)
client makes the calls."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions

from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support.raw import gapic_publisher, http_get
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

WATCHED = f"projects/{PROJECT}/topics/watched"


@pytest.fixture
def slo_server(tmp_path: Path) -> Iterator[ServerProcess]:
    slo = tmp_path / "slo.toml"
    slo.write_text(f'[topics."{WATCHED}"]\npublish_availability = 0.99\n')
    server = ServerProcess(
        tmp_path / "data",
        args=["--slo", str(slo)],
        env={"PUBSUBD_METRICS_MAX_TOPICS": "1", "PUBSUBD_METRICS_MAX_SUBSCRIPTIONS": "1"},
    ).start()
    yield server
    server.kill()


def _metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_refused_publishes_burn_the_budget_and_fire_the_alerts(slo_server: ServerProcess) -> None:
    pub = make_publisher(slo_server.endpoint)
    pub.create_topic(request={"name": WATCHED, "labels": {"pubsubd-backlog-quota-messages": "5"}})
    pub.create_topic(name=f"projects/{PROJECT}/topics/first")
    pub.create_topic(name=f"projects/{PROJECT}/topics/second")
    sub = make_subscriber(slo_server.endpoint)
    sub.create_subscription(name=f"projects/{PROJECT}/subscriptions/watched", topic=WATCHED)
    for name in ("first", "second"):  # beyond the subscription label bound: under _other
        sub.create_subscription(
            name=f"projects/{PROJECT}/subscriptions/{name}",
            topic=f"projects/{PROJECT}/topics/{name}",
        )
    gapic = gapic_publisher(slo_server.endpoint)
    for i in range(5):
        gapic.publish(request={"topic": WATCHED, "messages": [{"data": b"m%d" % i}]}, timeout=10)
    for _ in range(20):  # over the backlog quota: RESOURCE_EXHAUSTED, the service's refusal
        with pytest.raises(exceptions.ResourceExhausted):
            gapic.publish(
                request={"topic": WATCHED, "messages": [{"data": b"over"}]}, retry=None, timeout=10
            )
    for name in ("first", "second"):
        topic = f"projects/{PROJECT}/topics/{name}"
        gapic.publish(request={"topic": topic, "messages": [{"data": b"x"}]}, timeout=10)
    with pytest.raises(exceptions.NotFound):  # the caller's error: not the service's fault
        gapic.publish(
            request={"topic": f"projects/{PROJECT}/topics/none", "messages": [{"data": b"x"}]},
            retry=None,
            timeout=10,
        )

    status, body = http_get(slo_server, "/metrics")
    text = body.decode()
    assert status == 200
    requests = "pubsubd_rpc_requests_total"
    assert _metric(text, requests, method="Publish", code="OK") == 7
    assert _metric(text, requests, method="Publish", code="RESOURCE_EXHAUSTED") == 20
    assert _metric(text, requests, method="Publish", code="NOT_FOUND") == 1
    assert _metric(text, requests, method="CreateTopic", code="OK") == 3
    per_topic = "pubsubd_topic_publish_requests_total"
    assert _metric(text, per_topic, topic=WATCHED, code="RESOURCE_EXHAUSTED") == 20
    # One label besides the pinned topic: the first other topic, then "_other".
    assert _metric(text, per_topic, topic=f"projects/{PROJECT}/topics/first", code="OK") == 1
    assert _metric(text, per_topic, topic="_other", code="OK") == 1
    assert f'topic="projects/{PROJECT}/topics/second"' not in text
    assert 'pubsubd_rpc_latency_seconds_bucket{le="0.1",method="Publish"}' in text
    backlog = "pubsubd_subscription_backlog_messages"
    assert _metric(text, backlog, subscription=f"projects/{PROJECT}/subscriptions/watched") == 5
    assert _metric(text, backlog, subscription="_other") == 2  # first and second, one each
    assert f'subscription="projects/{PROJECT}/subscriptions/first"' not in text
    age = "pubsubd_subscription_oldest_unacked_message_age_seconds"
    assert (_metric(text, age, subscription="_other") or 0) > 0
    assert (_metric(text, "pubsubd_subscription_backlog_bytes", subscription="_other") or 0) > 0
    assert (_metric(text, "pubsubd_log_write_seconds_count") or 0) >= 7

    status, body = http_get(slo_server, "/alerts")
    alerts = json.loads(body)
    firing = {
        (a["slo"], a["scope"], a["why"].split(" over ")[1].split(" ")[0]) for a in alerts["firing"]
    }
    assert firing == {
        ("publish_availability", "global", "1h"),
        ("publish_availability", "global", "6h"),
        ("publish_availability", WATCHED, "1h"),
        ("publish_availability", WATCHED, "6h"),
    }
    state = next(
        o
        for o in alerts["objectives"]
        if (o["slo"], o["scope"]) == ("publish_availability", WATCHED)
    )
    assert (state["good"], state["total"]) == (5, 25)
    assert state["error_budget_remaining"] == pytest.approx(1 - 0.8 / 0.01)

    cli = subprocess.run(
        [sys.executable, "-m", "pubsubd", "alerts", "--http", f"127.0.0.1:{slo_server.http_port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 3, cli.stderr
    assert "FIRING" in cli.stdout and WATCHED in cli.stdout


def test_a_quiet_server_fires_nothing(server: ServerProcess) -> None:
    pub = make_publisher(server.endpoint)
    topic = f"projects/{PROJECT}/topics/quiet"
    pub.create_topic(name=topic)
    sub = make_subscriber(server.endpoint)
    subscription = f"projects/{PROJECT}/subscriptions/quiet"
    sub.create_subscription(name=subscription, topic=topic)
    pub.publish(topic, b"x").result(timeout=30)
    response = sub.pull(subscription=subscription, max_messages=10, timeout=30)
    sub.acknowledge(
        subscription=subscription, ack_ids=[m.ack_id for m in response.received_messages]
    )
    _, body = http_get(server, "/alerts")
    alerts = json.loads(body)
    assert alerts["firing"] == []
    delivery = next(o for o in alerts["objectives"] if o["slo"] == "delivery_p99_ms")
    assert (delivery["good"], delivery["total"]) == (1, 1)  # acked within 5 s of its publish
    prober = next(o for o in alerts["objectives"] if o["slo"] == "prober_availability")
    assert (prober["total"], prober["sli"], prober["firing"]) == (0, None, False)  # no prober
    _, body = http_get(server, "/metrics")
    assert f'pubsubd_delivery_latency_seconds_count{{topic="{topic}"}} 1.0' in body.decode()
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "pubsubd",
            "alerts",
            "--all",
            "--http",
            f"127.0.0.1:{server.http_port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert "no alert fires" in cli.stdout and "publish_availability" in cli.stdout
    assert "prober_availability" in cli.stdout


def test_a_bad_slo_file_stops_serve_with_the_reason(tmp_path: Path) -> None:
    slo = tmp_path / "slo.toml"
    slo.write_text("publish_p99_ms = 30\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pubsubd",
            "serve",
            "--port",
            "0",
            "--http-port",
            "-1",
            "--data-dir",
            str(tmp_path / "d"),
            "--slo",
            str(slo),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "not a latency bucket bound" in done.stderr


STALE = f"projects/{PROJECT}/topics/stale"
RELAXED = f"projects/{PROJECT}/topics/relaxed"
PLAIN = f"projects/{PROJECT}/topics/plain"
BACKLOG = "backlog_oldest_age_s"


@pytest.fixture
def backlog_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """Backlog ages over 1 s are bad (2 s for STALE, 3600 s for RELAXED); the monitor samples
    every 0.2 s and its windows are divided by 300 (1 h: 12 s, 5 min: 1 s, 6 h: 72 s, 30 min:
    6 s), the burn thresholds staying 14.4 and 6."""
    slo = tmp_path / "slo.toml"
    slo.write_text(
        f'backlog_oldest_age_s = 1\n[topics."{STALE}"]\nbacklog_oldest_age_s = 2\n'
        f'[topics."{RELAXED}"]\nbacklog_oldest_age_s = 3600\n'
    )
    server = ServerProcess(
        tmp_path / "data",
        args=["--slo", str(slo)],
        env={"PUBSUBD_SLO_SAMPLE_S": "0.2", "PUBSUBD_TEST_SLO_WINDOW_DIVISOR": "300"},
    ).start()
    yield server
    server.kill()


def _backlog_alerts(server: ServerProcess) -> set[tuple[str, str]]:
    """(scope, long window) of the backlog alerts firing now."""
    _, body = http_get(server, "/alerts")
    return {
        (a["scope"], a["why"].split(" over ")[1].split(" ")[0])
        for a in json.loads(body)["firing"]
        if a["slo"] == BACKLOG
    }


def _wait_for(
    server: ServerProcess, check: Callable[[set[tuple[str, str]]], bool], timeout: float
) -> set[tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        firing = _backlog_alerts(server)
        if check(firing) or time.monotonic() > deadline:
            return firing
        time.sleep(0.2)


def test_an_old_backlog_pages_and_a_drained_one_stops(backlog_server: ServerProcess) -> None:
    """Unacked messages on three topics: the plain topic's (over 1 s) fires the global
    objective, STALE's (over its own 2 s) its own, RELAXED's (within its 3600 s) nothing; once
    they are acked both pages stop within the short windows (1 s and 6 s)."""
    pub = make_publisher(backlog_server.endpoint)
    sub = make_subscriber(backlog_server.endpoint)
    subscriptions = {}
    for topic in (PLAIN, STALE, RELAXED):
        pub.create_topic(name=topic)
        name = topic.replace("/topics/", "/subscriptions/")
        sub.create_subscription(name=name, topic=topic)
        subscriptions[topic] = name
    for topic in subscriptions:
        pub.publish(topic, b"waits").result(timeout=30)

    expected = {(scope, w) for scope in ("global", STALE) for w in ("12s", "72s")}
    started = time.monotonic()
    firing = _wait_for(backlog_server, lambda f: f >= expected, 20)
    assert firing == expected, f"after {time.monotonic() - started:.1f} s"
    _, body = http_get(backlog_server, "/alerts")
    states = {(o["slo"], o["scope"]): o for o in json.loads(body)["objectives"]}
    relaxed = states[(BACKLOG, RELAXED)]
    assert relaxed["good"] == relaxed["total"] > 0  # 3600 s: its backlog is young
    assert states[(BACKLOG, STALE)]["error_budget_remaining"] < 0  # overspent
    assert "older than 2 s" in states[(BACKLOG, STALE)]["objective"]

    _, metrics = http_get(backlog_server, "/metrics")
    gauge = "pubsubd_topic_oldest_unacked_message_age_seconds"
    assert (_metric(metrics.decode(), gauge, topic=STALE) or 0) > 2
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "pubsubd",
            "alerts",
            "--http",
            f"127.0.0.1:{backlog_server.http_port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 3, cli.stderr
    assert f"FIRING page {BACKLOG} ({STALE})" in cli.stdout

    for topic in (PLAIN, STALE):  # RELAXED's message keeps waiting: within its objective
        response = sub.pull(subscription=subscriptions[topic], max_messages=10, timeout=30)
        sub.acknowledge(
            subscription=subscriptions[topic],
            ack_ids=[m.ack_id for m in response.received_messages],
        )
    drained = time.monotonic()
    firing = _wait_for(backlog_server, lambda f: not f, 20)
    assert firing == set(), f"still firing {time.monotonic() - drained:.1f} s after the acks"
    _, body = http_get(backlog_server, "/alerts")
    assert [a for a in json.loads(body)["firing"] if a["slo"] == BACKLOG] == []
