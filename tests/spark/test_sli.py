"""The SLI analytics job (pubsubd.spark.sli) over a real server's monitoring events.

The SLO rules and the report page without Spark: tests/unit/test_sli_slo.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pubsubd.cli.main import app
from pubsubd.observability.events import EVENTS_TOPIC
from pubsubd.spark import sli
from pubsubd.spark.client import ReplayClient
from tests.conftest import make_publisher, make_subscriber
from tests.spark.helpers import create_topics, publish
from tests.support.server import ServerProcess

pytestmark = pytest.mark.spark

PROJECT = "sli-test"
TOPICS = [f"projects/{PROJECT}/topics/orders", f"projects/{PROJECT}/topics/payments"]
SUB = f"projects/{PROJECT}/subscriptions/orders-worker"
READER = f"projects/{PROJECT}/subscriptions/orders-reader"  # pulls and acks everything


def _pull_and_ack(endpoint: str, subscription: str, wanted: int) -> None:
    subscriber = make_subscriber(endpoint)
    acked = 0
    deadline = time.monotonic() + 30
    while acked < wanted:
        assert time.monotonic() < deadline, f"only {acked} of {wanted} pulled"
        resp = subscriber.pull(
            request={"subscription": subscription, "max_messages": 100}, timeout=10
        )
        ack_ids = [m.ack_id for m in resp.received_messages]
        if ack_ids:
            subscriber.acknowledge(request={"subscription": subscription, "ack_ids": ack_ids})
        acked += len(ack_ids)


def _events(endpoint: str) -> list[dict[str, Any]]:
    client = ReplayClient(endpoint)
    try:
        out: list[dict[str, Any]] = []
        for partition, b in client.topic_bounds(EVENTS_TOPIC).items():
            cur = b.earliest
            while cur < b.latest:
                messages, cur = client.read(EVENTS_TOPIC, partition, cur, b.latest, 1000)
                out.extend(json.loads(m.data) for m in messages)
        return out
    finally:
        client.close()


@pytest.fixture(scope="module")
def sli_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server emitting SLI events every second, with publishes, an error, a backlog and a
    subscription that acks what it gets (delivery latency)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PUBSUBD_SLI_EVENTS_S", "1")
    srv = ServerProcess(tmp_path_factory.mktemp("sli") / "data").start()
    mp.undo()
    try:
        endpoint = srv.endpoint
        create_topics(endpoint, *TOPICS)
        make_subscriber(endpoint).create_subscription(name=SUB, topic=TOPICS[0])
        make_subscriber(endpoint).create_subscription(name=READER, topic=TOPICS[0])
        for round_ in range(3):
            for topic in TOPICS:
                publish(endpoint, topic, round_ * 20, 20)
        _pull_and_ack(endpoint, READER, 60)
        with pytest.raises(Exception, match=r"(?i)not found"):
            make_publisher(endpoint).publish(f"projects/{PROJECT}/topics/missing", b"x").result(30)
        deadline = time.monotonic() + 30
        while True:
            got = _events(endpoint)
            kinds = {(e["kind"], e.get("topic") or e.get("method")) for e in got}
            wanted = {("publish", t) for t in TOPICS} | {("error", "Publish")}
            kinds |= {(e["kind"], e["subscription"]) for e in got if e["kind"] == "delivery"}
            wanted.add(("delivery", READER))
            if wanted <= kinds and any(e["kind"] == "backlog" for e in got):
                break
            assert time.monotonic() < deadline, f"events never arrived: {kinds}"
            time.sleep(0.5)
        yield srv
    finally:
        srv.kill()


def test_events_on_the_internal_topic(sli_server: ServerProcess) -> None:
    got = _events(sli_server.endpoint)
    pub = [e for e in got if e["kind"] == "publish" and e["topic"] == TOPICS[0]]
    assert sum(e["count"] for e in pub) >= 3  # 60 messages in at least 3 Publish calls
    assert all(0 < x < 30_000 for e in pub for x in e["latency_ms"])
    err = [e for e in got if e["kind"] == "error" and e["method"] == "Publish"]
    assert {e["code"] for e in err} == {"NOT_FOUND"}
    backlog = [e for e in got if e["kind"] == "backlog" and e["subscription"] == SUB]
    assert max(e["messages"] for e in backlog) == 60
    assert backlog[-1]["topic"] == TOPICS[0]
    delivery = [e for e in got if e["kind"] == "delivery"]
    assert {e["subscription"] for e in delivery} == {READER}  # SUB never acks
    assert sum(e["count"] for e in delivery) == 60
    assert {e["topic"] for e in delivery} == {TOPICS[0]}
    samples = [x for e in delivery for x in e["latency_ms"]]
    assert len(samples) == 60 and all(0 < x < 60_000 for x in samples)


def test_job_writes_minutes_rollups_and_verdicts(
    spark: Any, sli_server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = sli.run(spark, sli_server.endpoint, out)

    minutes = spark.read.parquet(str(out / "publish_minute")).collect()
    assert {r["topic"] for r in minutes} == set(TOPICS)
    for r in minutes:
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] < 30_000
        assert r["latency_sketch"] is not None and r["failed"] == 0 and r["error_rate"] == 0
    assert sum(r["publishes"] for r in minutes if r["topic"] == TOPICS[0]) >= 3
    hours = spark.read.parquet(str(out / "publish_hour")).collect()
    assert {r["topic"] for r in hours} == set(TOPICS)
    for h in hours:  # merged sketches: the hour's p99 lies within its minutes' range
        ms = [r for r in minutes if r["topic"] == h["topic"]]
        assert h["publishes"] == sum(r["publishes"] for r in ms)
        assert min(r["p50_ms"] for r in ms) <= h["p99_ms"] <= max(r["p99_ms"] for r in ms) * 1.01
    errors = spark.read.parquet(str(out / "errors_minute")).collect()
    assert {(r["method"], r["code"]) for r in errors} >= {("Publish", "NOT_FOUND")}
    backlog = spark.read.parquet(str(out / "backlog_minute")).where(f"subscription = '{SUB}'")
    assert backlog.agg({"max_messages": "max"}).first()[0] == 60
    delivery = spark.read.parquet(str(out / "delivery_minute")).collect()
    assert {(r["subscription"], r["topic"]) for r in delivery} == {(READER, TOPICS[0])}
    assert sum(r["acked"] for r in delivery) == 60 == sum(r["samples"] for r in delivery)
    for r in delivery:
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] < 60_000
        assert r["latency_sketch"] is not None
    assert result.delivery_rows == len(delivery)
    (dhour,) = spark.read.parquet(str(out / "delivery_hour")).collect()
    assert dhour["acked"] == 60
    assert min(r["p50_ms"] for r in delivery) <= dhour["p99_ms"]
    assert dhour["p99_ms"] <= max(r["p99_ms"] for r in delivery) * 1.01

    verdicts = {(c.slo, c.scope): c for c in result.checks}
    assert verdicts[("publish_p99_ms", TOPICS[0])].status == "PASS"  # 100 ms by default
    assert verdicts[("backlog_oldest_age_s", SUB)].status == "PASS"
    assert verdicts[("error_rate", "all RPCs")].actual > 0
    d99 = verdicts[("delivery_p99_ms", READER)]
    assert d99.target == sli.DEFAULT_SLO["delivery_p99_ms"]
    assert d99.actual == pytest.approx(dhour["p99_ms"], rel=0.01)
    assert ("delivery_p95_ms", READER) in verdicts and ("delivery_p99_ms", SUB) not in verdicts
    slo_rows = spark.read.parquet(str(out / "slo")).collect()
    assert len(slo_rows) == len(result.checks)
    page = result.report.read_text()
    assert "<table class='summary'>" in page and "<svg" in page
    assert page.index("summary") < page.index("<svg")  # the verdicts come first
    assert "p99 delivery latency by subscription" in page and "orders-reader" in page


def test_absurd_targets_fail_and_per_topic_overrides_apply(
    spark: Any, sli_server: ServerProcess, tmp_path: Path
) -> None:
    slo_file = tmp_path / "slo.toml"
    slo_file.write_text(
        "publish_p99_ms = 0.000001\nerror_rate = 0.5\ndelivery_p95_ms = 1e9\n"
        f'[topics."{TOPICS[1]}"]\npublish_p99_ms = 1e9\n'
        f'[topics."{TOPICS[0]}"]\ndelivery_p99_ms = 0.000001\n'
    )
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "sli-report",
            "--endpoint",
            sli_server.endpoint,
            "--out",
            str(out),
            "--slo",
            str(slo_file),
        ],
    )
    assert res.exit_code == 2, res.output  # an SLO failed
    assert f"FAIL publish_p99_ms {TOPICS[0]}" in res.output
    assert f"PASS publish_p99_ms {TOPICS[1]}" in res.output
    assert "PASS error_rate" in res.output
    assert f"FAIL delivery_p99_ms {READER}" in res.output  # the topic's override
    assert f"PASS delivery_p95_ms {READER}" in res.output
    rows = {
        (r["slo"], r["scope"]): r["status"] for r in spark.read.parquet(str(out / "slo")).collect()
    }
    assert rows[("publish_p99_ms", TOPICS[0])] == "FAIL"
    page = (out / "report.html").read_text()
    assert "SLO checks FAIL" in page and "class='FAIL'" in page
