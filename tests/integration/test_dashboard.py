"""The web dashboard in a real browser: headless Chromium (Debian's package) loads each page of
a real ``pubsubd serve`` that carried known traffic, and what the page shows must equal the
JSON API the page reads (every whole number it shows) and the traffic itself: 30 messages
published to a topic whose name needs percent-encoding, 12 of them pulled and acked in
batches of at most 5 after a pause (backlog 18; every delivery latency over the pause), one
publish to a missing topic (a caller's NOT_FOUND). A second server with 250 topics and 120
subscriptions is read page by page, through the API and the pages' next/previous links. One
test writes screenshots."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions

from pubsubd.observability.sli import LATENCY_BUCKETS
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
ACK_BATCH = 5  # at most this many acks per Acknowledge request
PAUSE_S = 0.3  # from the last publish to the first ack: every delivery latency is longer


@dataclass
class Traffic:
    """What the dashboard server's subscription saw: the size of every Acknowledge request
    and how long all of it took (the first publish sent to the last ack answered)."""

    ack_batches: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def sampled(self) -> int:
        """Acks whose delivery latency the server measured: two of each batch."""
        return sum(min(2, n) for n in self.ack_batches)

    @property
    def longest_ms(self) -> float:
        """The bucket bound (ms) that every measured delivery latency is within."""
        return 1000 * min(b for b in LATENCY_BUCKETS if b >= self.elapsed_s)


@pytest.fixture(scope="module")
def traffic() -> Traffic:
    return Traffic()


@pytest.fixture(scope="module")
def dashboard_server(
    tmp_path_factory: pytest.TempPathFactory, traffic: Traffic
) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("dashboard") / "data").start()
    try:
        pub = make_publisher(server.endpoint)
        sub = make_subscriber(server.endpoint)
        pub.create_topic(name=TOPIC)
        pub.create_topic(name=IDLE_TOPIC)
        sub.create_subscription(name=SUB, topic=TOPIC)
        sub.create_subscription(name=IDLE_SUB, topic=IDLE_TOPIC)
        started = time.monotonic()
        for i in range(PUBLISHED):
            pub.publish(TOPIC, b"order %d" % i).result(timeout=10)
        time.sleep(PAUSE_S)
        acked = 0
        while acked < ACKED:
            wanted = min(ACK_BATCH, ACKED - acked)
            response = sub.pull(subscription=SUB, max_messages=wanted, timeout=10)
            ids = [m.ack_id for m in response.received_messages]
            if ids:
                sub.acknowledge(subscription=SUB, ack_ids=ids, timeout=10)
                traffic.ack_batches.append(len(ids))
            acked += len(ids)
        traffic.elapsed_s = time.monotonic() - started
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
    return load_url(url(server, path, name))


def load_url(address: str) -> browser.Shown:
    shown = browser.read(browser.dump_dom(address))
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
    # Three topics (ours and the SLI events'): one page, neither control leads anywhere.
    assert overview["topics"] == 3 and len(rows) == 3
    assert shown.texts["topics-range"] == "1\u20133 of 3"
    assert shown.links["topics-previous"] is None and shown.links["topics-next"] is None
    subs = shown.rows["subscriptions"]
    assert subs[SUB]["backlog_messages"] == str(PUBLISHED - ACKED)
    assert subs[SUB]["acked"] == str(ACKED)
    listed = {r["name"]: r for r in api(dashboard_server, "/api/subscriptions")["subscriptions"]}
    p99_ms = listed[SUB]["delivery_latency_ms"]["p99"]
    assert subs[SUB]["delivery_latency_ms.p99"] == f"{p99_ms:.1f}"
    assert subs[IDLE_SUB]["delivery_latency_ms.p99"] == "\u2013"  # no acks: no latency
    assert subs[IDLE_SUB]["backlog_messages"] == "0"
    for o in overview["slos"]:
        row = shown.rows["slos"][f"{o['slo']} {o['scope']}"]
        assert row["total"] == str(o["total"])
        assert row["error_budget_remaining"] == _percent(o["error_budget_remaining"])
    slos = {s["slo"]: s for s in overview["slos"] if s["scope"] == "global"}
    assert slos["prober_availability"]["total"] == 0  # no prober runs here: no events
    assert shown.rows["slos"]["prober_availability global"]["error_budget_remaining"] == "\u2013"
    assert slos["publish_availability"]["total"] == PUBLISHED + 1  # NOT_FOUND counts, as good
    assert slos["publish_availability"]["error_budget_remaining"] == 1.0


def test_topic_page(dashboard_server: ServerProcess, traffic: Traffic) -> None:
    shown = load(dashboard_server, "/ui/topic", TOPIC)
    topic = api(dashboard_server, "/api/topic?name=" + urllib.parse.quote(TOPIC, safe=""))
    assert topic["name"] == TOPIC
    assert assert_numbers_match(shown, topic) == 3
    assert shown.metrics["published"] == str(PUBLISHED)
    assert shown.metrics["subscriptions.length"] == "1"
    # Two acks sampled from each ack batch, each waited longer than the pause.
    delivery = topic["delivery_latency_ms"]
    assert delivery["samples"] == traffic.sampled
    assert 500 <= delivery["p50"] <= delivery["p99"] <= traffic.longest_ms
    assert shown.metrics["delivery_latency_ms.p99"] == f"{delivery['p99']:.1f}"
    row = shown.rows["subscriptions"][SUB]
    assert row["backlog_messages"] == str(PUBLISHED - ACKED)
    assert row["delivered"] == row["acked"] == str(ACKED)


def subscription_doc(server: ServerProcess, name: str = SUB) -> Any:
    return api(server, "/api/subscription?name=" + urllib.parse.quote(name, safe=""))


def test_subscription_page(dashboard_server: ServerProcess) -> None:
    before = time.monotonic()
    shown = load(dashboard_server, "/ui/subscription", SUB)
    sub = subscription_doc(dashboard_server)
    elapsed = time.monotonic() - before
    assert assert_numbers_match(shown, sub) == 6
    assert shown.metrics["backlog_messages"] == str(PUBLISHED - ACKED)
    assert shown.metrics["delivered"] == shown.metrics["acked"] == str(ACKED)
    assert shown.metrics["consumers"] == shown.metrics["outstanding"] == "0"
    assert shown.metrics["topic"] == TOPIC
    # The oldest unacked message ages while we look: the page read it a moment before the API.
    age = float(shown.metrics["oldest_unacked_age_s"])
    assert sub["oldest_unacked_age_s"] - elapsed - 0.1 <= age <= sub["oldest_unacked_age_s"] + 0.1
    assert sub["backlog_bytes"] > 0


def test_subscription_delivery_latency(dashboard_server: ServerProcess, traffic: Traffic) -> None:
    # The sampler charts the acks sampled since its sample before: wait for one after them.
    deadline = time.monotonic() + 15
    sub = subscription_doc(dashboard_server)
    while not any(v is not None for v in sub["history"]["delivery_p99_ms"]):
        assert time.monotonic() < deadline, "no delivery latency in the subscription's history"
        time.sleep(1)
        sub = subscription_doc(dashboard_server)
    shown = load(dashboard_server, "/ui/subscription", SUB)
    delivery = sub["delivery_latency_ms"]
    # Two acks sampled from each Acknowledge request, each waited longer than the pause
    # (bucket 0.5 s) and less than the whole traffic took.
    assert delivery["samples"] == traffic.sampled >= 6
    assert 500 <= delivery["p50"] <= delivery["p99"] <= traffic.longest_ms
    assert shown.metrics["delivery_latency_ms.samples"] == str(traffic.sampled)
    assert shown.metrics["delivery_latency_ms.p50"] == f"{delivery['p50']:.1f}"
    assert shown.metrics["delivery_latency_ms.p99"] == f"{delivery['p99']:.1f}"
    charted = [v for v in sub["history"]["delivery_p99_ms"] if v is not None]
    assert all(500 <= v <= traffic.longest_ms for v in charted)
    assert len(sub["history"]["delivery_p50_ms"]) == len(sub["history"]["t"])
    # The same samples on /metrics, under the subscription's own label.
    _, body = http_get(dashboard_server, "/metrics")
    count = f'pubsubd_subscription_delivery_latency_seconds_count{{subscription="{SUB}"}} '
    lines = [line for line in body.decode().splitlines() if line.startswith(count)]
    assert lines and float(lines[0].rsplit(" ", 1)[1]) == traffic.sampled
    # No acks, no samples (zero, not unknown: the subscription would have its own label).
    idle = subscription_doc(dashboard_server, IDLE_SUB)["delivery_latency_ms"]
    assert idle == {"samples": 0, "p50": None, "p99": None}
    html = browser.dump_dom(url(dashboard_server, "/ui/subscription", SUB))
    chart = html.split('id="chart-delivery"', 1)[1].split('class="chart"', 1)[0]
    assert 'class="uplot' in chart  # the delivery latency chart was drawn


def _percent(share: float | None) -> str:
    """A share as the pages show it: a percentage, or a dash before the first event."""
    return "\u2013" if share is None else f"{share * 100:.3f}"


def test_alerts_page(dashboard_server: ServerProcess) -> None:
    shown = load(dashboard_server, "/ui/alerts")
    alerts = api(dashboard_server, "/alerts")
    # What fires depends on the machine (a latency objective burns on a loaded one): the page
    # shows what the API says, whatever it is.
    firing = alerts["firing"]
    assert shown.metrics["firing_count"] == str(len(firing))
    rows = shown.rows["objectives"]
    for o in alerts["objectives"]:
        for w in o["windows"]:
            row = rows[f"{o['slo']} {o['scope']} {w['long_window']}"]
            assert row["error_budget_remaining"] == _percent(o["error_budget_remaining"])
            assert row["long_burn_rate"] == f"{w['long_burn_rate']:.1f}"
            assert row["window_firing"] == ("yes" if w["firing"] else "no")
    assert len(rows) == sum(len(o["windows"]) for o in alerts["objectives"]) >= 10
    dom = browser.dump_dom(url(dashboard_server, "/ui/alerts"))
    assert ("nothing is firing" in dom) == (not firing)  # the usual case: nothing


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


# --- paging -------------------------------------------------------------------------------------

PAGED_TOPICS = [f"projects/{PROJECT}/topics/page-{i:03d}" for i in range(250)]
PAGED_SUBS = [f"projects/{PROJECT}/subscriptions/reader-{i:03d}" for i in range(120)]


@pytest.fixture(scope="module")
def paging_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """250 topics, created out of name order, and 120 subscriptions on them (SLI events off:
    no topic but ours)."""
    server = ServerProcess(
        tmp_path_factory.mktemp("paging") / "data", env={"PUBSUBD_SLI_EVENTS_S": "0"}
    ).start()
    try:
        pub = make_publisher(server.endpoint)
        sub = make_subscriber(server.endpoint)
        for name in reversed(PAGED_TOPICS):
            pub.create_topic(name=name)
        for i, name in enumerate(PAGED_SUBS):
            sub.create_subscription(name=name, topic=PAGED_TOPICS[i * 2])
        yield server
    finally:
        server.kill()


def list_page(server: ServerProcess, kind: str, **params: str | int) -> Any:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v != ""})
    return api(server, f"/api/{kind}" + (f"?{query}" if query else ""))


def read_all(server: ServerProcess, kind: str, page_size: int, filter: str = "") -> list[Any]:
    """Every page of a list, following next_page_token; the pages' documents."""
    pages, token = [], ""
    while True:
        doc = list_page(server, kind, page_size=page_size, page_token=token, filter=filter)
        pages.append(doc)
        token = doc["next_page_token"]
        if not token:
            return pages
        assert len(pages) < 100, "the list never ended"


def names_of(doc: Any, kind: str) -> list[str]:
    return [row["name"] for row in doc[kind]]


def test_the_api_pages_topics_in_name_order(paging_server: ServerProcess) -> None:
    pages = read_all(paging_server, "topics", 100)
    assert [len(p["topics"]) for p in pages] == [100, 100, 50]
    assert [p["offset"] for p in pages] == [0, 100, 200]
    assert all(p["total"] == 250 for p in pages)
    shown = [name for p in pages for name in names_of(p, "topics")]
    assert shown == sorted(PAGED_TOPICS)  # every topic exactly once, in name order
    # previous_page_token: none on the first page, "" when the previous one is the first.
    assert [p["previous_page_token"] is None for p in pages] == [True, False, False]
    assert pages[1]["previous_page_token"] == ""
    back = list_page(paging_server, "topics", page_token=pages[2]["previous_page_token"])
    assert names_of(back, "topics") == names_of(pages[1], "topics")
    # The default page is 100 names; rows carry their numbers.
    first = list_page(paging_server, "topics")
    assert names_of(first, "topics") == shown[:100] and first["next_page_token"]
    assert first["topics"][0]["published"] == 0 and first["topics"][0]["subscriptions"] == 1
    assert names_of(list_page(paging_server, "topics", page_size=1000), "topics") == shown


def test_the_api_filters_and_pages_the_filtered_names(paging_server: ServerProcess) -> None:
    wanted = sorted(n for n in PAGED_TOPICS if "-1" in n)
    assert len(wanted) == 100
    pages = read_all(paging_server, "topics", 30, filter="-1")
    assert [len(p["topics"]) for p in pages] == [30, 30, 30, 10]
    assert [name for p in pages for name in names_of(p, "topics")] == wanted
    assert all(p["total"] == 100 for p in pages)
    none = list_page(paging_server, "topics", filter="no-such-name")
    assert none["topics"] == [] and none["total"] == 0 and none["next_page_token"] == ""


def test_the_api_pages_subscriptions(paging_server: ServerProcess) -> None:
    pages = read_all(paging_server, "subscriptions", 50)
    assert [len(p["subscriptions"]) for p in pages] == [50, 50, 20]
    assert [name for p in pages for name in names_of(p, "subscriptions")] == sorted(PAGED_SUBS)
    row = pages[0]["subscriptions"][0]
    assert row["topic"] == PAGED_TOPICS[0] and row["backlog_messages"] == 0
    some = list_page(paging_server, "subscriptions", filter="reader-11")
    assert names_of(some, "subscriptions") == [f"{PAGED_SUBS[0][:-3]}11{i}" for i in range(10)]


@pytest.mark.parametrize("kind", ["topics", "subscriptions"])
@pytest.mark.parametrize(
    "query",
    [
        "page_size=0",
        "page_size=1001",
        "page_size=-5",
        "page_size=ten",
        "page_size=1.5",
        "page_token=not*base64",
        "page_token=_w%3D%3D",  # base64 of a byte that is no UTF-8
    ],
)
def test_bad_paging_parameters_answer_400(
    paging_server: ServerProcess, kind: str, query: str
) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        http_get(paging_server, f"/api/{kind}?{query}")
    assert raised.value.code == 400
    error = json.loads(raised.value.read())["error"]
    assert error.startswith(query.split("=")[0] + ":")


def test_the_pages_next_and_previous_links(paging_server: ServerProcess) -> None:
    ordered = sorted(PAGED_TOPICS)
    home = url(paging_server, "/")
    first = load_url(home)
    assert list(first.rows["topics"]) == ordered[:100]
    assert first.texts["topics-range"] == "1\u2013100 of 250"
    assert first.links["topics-previous"] is None  # nothing before the first page
    assert list(first.rows["subscriptions"]) == sorted(PAGED_SUBS)[:100]
    assert first.texts["subscriptions-range"] == "1\u2013100 of 120"
    next_link = first.links["topics-next"]
    assert next_link is not None
    second = load_url(urllib.parse.urljoin(home, next_link))
    assert list(second.rows["topics"]) == ordered[100:200]
    assert second.texts["topics-range"] == "101\u2013200 of 250"
    # The topics moved on; the subscriptions' list stayed on its first page.
    assert list(second.rows["subscriptions"]) == sorted(PAGED_SUBS)[:100]
    previous = second.links["topics-previous"]
    assert previous is not None
    assert list(load_url(urllib.parse.urljoin(home, previous)).rows["topics"]) == ordered[:100]
    third_link = second.links["topics-next"]
    assert third_link is not None
    third = load_url(urllib.parse.urljoin(home, third_link))
    assert list(third.rows["topics"]) == ordered[200:]
    assert third.links["topics-next"] is None  # the end
    # A filter in the page's address narrows the list.
    narrowed = load_url(home + "?topics_filter=page-24&page_size=5")
    assert list(narrowed.rows["topics"]) == ordered[240:245]
    assert narrowed.texts["topics-range"] == "1\u20135 of 10"
