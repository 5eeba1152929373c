"""The web dashboard in a real browser: headless Chromium (Debian's package) loads each page of
a real ``pubsubd serve`` that carried known traffic, and what the page shows must equal the
JSON API the page reads (every whole number it shows) and the traffic itself: 30 messages
published to a topic whose name needs percent-encoding, 12 of them pulled and acked (backlog
18), one publish to a missing topic (a caller's NOT_FOUND). One test writes screenshots."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions

from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support import browser
from tests.support.raw import gapic_publisher, http_get
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(autouse=True)
def _chromium() -> None:
    browser.require()


TOPIC = f"projects/{PROJECT}/topics/orders+eu"
SUB = f"projects/{PROJECT}/subscriptions/orders+eu-audit"
IDLE_TOPIC = f"projects/{PROJECT}/topics/idle"
IDLE_SUB = f"projects/{PROJECT}/subscriptions/idle-sub"
PUBLISHED, ACKED = 30, 12


@pytest.fixture(scope="module")
def dashboard_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("dashboard") / "data").start()
    try:
        pub = make_publisher(server.endpoint)
        sub = make_subscriber(server.endpoint)
        pub.create_topic(name=TOPIC)
        pub.create_topic(name=IDLE_TOPIC)
        sub.create_subscription(name=SUB, topic=TOPIC)
        sub.create_subscription(name=IDLE_SUB, topic=IDLE_TOPIC)
        for i in range(PUBLISHED):
            pub.publish(TOPIC, b"order %d" % i).result(timeout=10)
        acked = 0
        while acked < ACKED:
            response = sub.pull(subscription=SUB, max_messages=ACKED - acked, timeout=10)
            ids = [m.ack_id for m in response.received_messages]
            if ids:
                sub.acknowledge(subscription=SUB, ack_ids=ids, timeout=10)
            acked += len(ids)
        with pytest.raises(exceptions.NotFound):
            gapic_publisher(server.endpoint).publish(
                request={"topic": f"{TOPIC}-none", "messages": [{"data": b"x"}]},
                retry=None,
                timeout=10,
            )
        yield server
    finally:
        server.kill()


def api(server: ServerProcess, path: str) -> Any:
    status, body = http_get(server, path)
    assert status == 200
    return json.loads(body)


def url(server: ServerProcess, path: str, name: str | None = None) -> str:
    query = "" if name is None else "?name=" + urllib.parse.quote(name, safe="")
    return f"http://{server.host}:{server.http_port}{path}{query}"


def load(server: ServerProcess, path: str, name: str | None = None) -> browser.Shown:
    shown = browser.read(browser.dump_dom(url(server, path, name)))
    assert int(shown.body.get("data-loaded", "0")) >= 1, "the page never rendered its data"
    assert shown.error == "", shown.error
    return shown


def resolve(doc: Any, path: str) -> Any:
    for key in path.split("."):
        doc = len(doc) if key == "length" else doc[key]
    return doc


def assert_numbers_match(shown: browser.Shown, doc: Any) -> int:
    """Every whole number the page shows equals the API document's; returns how many."""
    checked = 0
    for key, text in shown.metrics.items():
        if shown.formats.get(key) == "int":
            assert text == str(resolve(doc, key)), key
            checked += 1
    return checked


def test_overview_shows_what_the_api_says(dashboard_server: ServerProcess) -> None:
    shown = load(dashboard_server, "/")
    overview = api(dashboard_server, "/api/overview")
    assert assert_numbers_match(shown, overview) >= 9
    assert shown.metrics["totals.published"] == str(PUBLISHED)
    assert shown.metrics["totals.delivered"] == str(ACKED)
    assert shown.metrics["totals.acked"] == str(ACKED)
    assert shown.metrics["totals.caller_errors"] == "1"
    assert shown.metrics["totals.errors"] == "0"
    assert shown.metrics["mode"] == "single process"
    assert overview["errors_by_code"] == {"NOT_FOUND": 1}
    # Latency: the page shows the API's bucket bound
    p99 = overview["publish_latency_ms"]["p99"]
    assert shown.metrics["publish_latency_ms.p99"] == f"{p99:.1f}"
    topics = {t["name"]: t for t in api(dashboard_server, "/api/topics")["topics"]}
    rows = shown.rows["topics"]
    assert rows[TOPIC]["published"] == str(topics[TOPIC]["published"]) == str(PUBLISHED)
    assert rows[IDLE_TOPIC]["published"] == "0"
    subs = shown.rows["subscriptions"]
    assert subs[SUB]["backlog_messages"] == str(PUBLISHED - ACKED)
    assert subs[SUB]["acked"] == str(ACKED)
    assert subs[IDLE_SUB]["backlog_messages"] == "0"
    for o in overview["slos"]:
        row = shown.rows["slos"][f"{o['slo']} {o['scope']}"]
        assert row["total"] == str(o["total"])
        assert row["error_budget_remaining"] == f"{o['error_budget_remaining'] * 100:.3f}"
    slos = {s["slo"]: s for s in overview["slos"] if s["scope"] == "global"}
    assert slos["publish_availability"]["total"] == PUBLISHED + 1  # NOT_FOUND counts, as good
    assert slos["publish_availability"]["error_budget_remaining"] == 1.0


def test_topic_page(dashboard_server: ServerProcess) -> None:
    shown = load(dashboard_server, "/ui/topic", TOPIC)
    topic = api(dashboard_server, "/api/topic?name=" + urllib.parse.quote(TOPIC, safe=""))
    assert topic["name"] == TOPIC
    assert assert_numbers_match(shown, topic) == 3
    assert shown.metrics["published"] == str(PUBLISHED)
    assert shown.metrics["subscriptions.length"] == "1"
    # Up to two acks sampled from each ack batch.
    delivery = topic["delivery_latency_ms"]
    assert 1 <= delivery["samples"] <= ACKED
    assert shown.metrics["delivery_latency_ms.p99"] == f"{delivery['p99']:.1f}"
    row = shown.rows["subscriptions"][SUB]
    assert row["backlog_messages"] == str(PUBLISHED - ACKED)
    assert row["delivered"] == row["acked"] == str(ACKED)


def test_subscription_page(dashboard_server: ServerProcess) -> None:
    before = time.monotonic()
    shown = load(dashboard_server, "/ui/subscription", SUB)
    sub = api(dashboard_server, "/api/subscription?name=" + urllib.parse.quote(SUB, safe=""))
    elapsed = time.monotonic() - before
    assert assert_numbers_match(shown, sub) == 5
    assert shown.metrics["backlog_messages"] == str(PUBLISHED - ACKED)
    assert shown.metrics["delivered"] == shown.metrics["acked"] == str(ACKED)
    assert shown.metrics["consumers"] == shown.metrics["outstanding"] == "0"
    assert shown.metrics["topic"] == TOPIC
    # The oldest unacked message ages while we look: the page read it a moment before the API.
    age = float(shown.metrics["oldest_unacked_age_s"])
    assert sub["oldest_unacked_age_s"] - elapsed - 0.1 <= age <= sub["oldest_unacked_age_s"] + 0.1
    assert sub["backlog_bytes"] > 0


def test_alerts_page(dashboard_server: ServerProcess) -> None:
    shown = load(dashboard_server, "/ui/alerts")
    alerts = api(dashboard_server, "/alerts")
    assert shown.metrics["firing_count"] == str(len(alerts["firing"])) == "0"
    rows = shown.rows["objectives"]
    for o in alerts["objectives"]:
        for w in o["windows"]:
            row = rows[f"{o['slo']} {o['scope']} {w['long_window']}"]
            assert row["error_budget_remaining"] == f"{o['error_budget_remaining'] * 100:.3f}"
            assert row["long_burn_rate"] == f"{w['long_burn_rate']:.1f}"
            assert row["window_firing"] == ("yes" if w["firing"] else "no")
    assert len(rows) == sum(len(o["windows"]) for o in alerts["objectives"]) >= 10
    assert shown.rows["firing"] == {}  # no alert fires; the table says so
    assert "nothing is firing" in browser.dump_dom(url(dashboard_server, "/ui/alerts"))


def test_cluster_page_says_one_process(dashboard_server: ServerProcess) -> None:
    shown = load(dashboard_server, "/ui/cluster")
    assert api(dashboard_server, "/api/cluster") == {"mode": "single process", "cluster": None}
    assert shown.metrics["mode"] == "single process"
    html = browser.dump_dom(url(dashboard_server, "/ui/cluster"))
    assert 'id="single">' in html and "This is one process" in html


def test_api_errors_and_files(dashboard_server: ServerProcess) -> None:
    def status(path: str) -> tuple[int, bytes]:
        try:
            return http_get(dashboard_server, path)
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    code, body = status("/api/topic?name=projects%2Fp%2Ftopics%2Fnone")
    assert code == 404 and json.loads(body)["error"].startswith("no topic")
    assert status("/api/subscription")[0] == 400
    assert status("/static/../app.py")[0] == 404
    code, body = status("/static/vendor/uplot/uPlot.iife.min.js")
    assert code == 200 and b"uPlot" in body


def test_charts_render_and_screenshots(dashboard_server: ServerProcess, tmp_path: Path) -> None:
    html = browser.dump_dom(url(dashboard_server, "/"))
    assert html.count('class="uplot') >= 3  # uPlot (served by pubsubd) drew the charts
    for page, name in (
        ("/", None),
        ("/ui/topic", TOPIC),
        ("/ui/subscription", SUB),
        ("/ui/alerts", None),
        ("/ui/cluster", None),
    ):
        png = tmp_path / f"{page.strip('/').replace('/', '-') or 'overview'}.png"
        browser.screenshot(url(dashboard_server, page, name), png)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
