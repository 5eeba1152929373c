"""``pubsubd sli-report --follow``: the SLI job as a checkpointed streaming query, run twice
against a real server (the second run reads only the new events; nothing is counted twice)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pubsubd.cli.main import app
from pubsubd.spark import sli
from pubsubd.spark.sli.stream import stored_events
from tests.conftest import make_subscriber
from tests.spark.helpers import create_topics, publish
from tests.spark.test_sli import _events, _pull_and_ack
from tests.support.server import ServerProcess

pytestmark = pytest.mark.spark

TOPIC = "projects/sli-follow/topics/orders"
SUB = "projects/sli-follow/subscriptions/orders-reader"
KEY = ("kind", "ts", "topic", "subscription", "method", "code")


def _traffic(endpoint: str, start: int, count: int, acked_total: int) -> None:
    """Publish ``count`` messages, pull and ack them, and wait for their delivery events."""
    publish(endpoint, TOPIC, start, count)
    _pull_and_ack(endpoint, SUB, count)
    deadline = time.monotonic() + 30
    while sum(e["count"] for e in _events(endpoint) if e["kind"] == "delivery") < acked_total:
        assert time.monotonic() < deadline, "delivery events never arrived"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    mp = pytest.MonkeyPatch()
    mp.setenv("PUBSUBD_SLI_EVENTS_S", "1")
    srv = ServerProcess(tmp_path_factory.mktemp("follow") / "data").start()
    mp.undo()
    try:
        create_topics(srv.endpoint, TOPIC)
        make_subscriber(srv.endpoint).create_subscription(name=SUB, topic=TOPIC)
        yield srv
    finally:
        srv.kill()


def _stored(spark: Any, out: Path) -> list[Any]:
    return stored_events(spark, out).collect()


def test_follow_twice_resumes_without_double_counting(
    spark: Any, server: ServerProcess, tmp_path: Path
) -> None:
    endpoint, out = server.endpoint, tmp_path / "out"
    _traffic(endpoint, 0, 20, 20)
    first = sli.follow(spark, endpoint, out, available_now=True)
    assert first.batches >= 1 and first.last is not None
    run1 = _stored(spark, out)
    assert len(run1) == first.events
    assert sum(r["count"] for r in run1 if r["kind"] == "delivery") == 20
    page1 = (out / "report.html").read_text()
    assert "orders-reader" in page1 and "p99 by volume" in page1

    _traffic(endpoint, 20, 30, 50)
    res = CliRunner().invoke(
        app,
        ["sli-report", "--endpoint", endpoint, "--out", str(out), "--follow", "--available-now"],
    )
    assert res.exit_code == 0, res.output
    assert "new events" in res.output and "report:" in res.output
    stored = _stored(spark, out)
    old_batches = {r["batch"] for r in run1}
    run2 = [r for r in stored if r["batch"] not in old_batches]
    assert len(stored) == len(run1) + len(run2)  # the first run's batches untouched
    assert f"{len(run2)} new events" in res.output
    assert min(r["ts"] for r in run2) >= max(r["ts"] for r in run1)  # only the new interval
    keys = [tuple(r[k] for k in KEY) for r in stored]
    assert len(keys) == len(set(keys)), "an event stored twice"
    on_server = _events(endpoint)
    assert len(stored) <= len(on_server)

    # Tables: every ack counted once (20 + 30), publishes as many as the stored events say.
    delivery = spark.read.parquet(str(out / "delivery_minute")).collect()
    assert sum(r["acked"] for r in delivery) == 50
    minutes = spark.read.parquet(str(out / "publish_minute")).where(f"topic = '{TOPIC}'").collect()
    stored_calls = sum(r["count"] for r in stored if r["kind"] == "publish" and r["topic"] == TOPIC)
    assert sum(r["publishes"] for r in minutes) == stored_calls >= 2
    # The weighted quantiles are the pure definition's, computed from the stored samples.
    for m in delivery:
        samples = [
            (x, r["count"] / len(r["latency_ms"]))
            for r in stored
            if r["kind"] == "delivery" and r["minute"] == m["minute"] and r["latency_ms"]
            for x in r["latency_ms"]
        ]
        for q, col in ((0.5, "weighted_p50_ms"), (0.99, "weighted_p99_ms")):
            want = sli.weighted_quantile([x for x, _ in samples], [w for _, w in samples], q)
            assert m[col] == pytest.approx(want)
    page2 = (out / "report.html").read_text()
    assert page2 != page1 and "orders-reader" in page2
    assert "<td class='num'>50</td>" in page2  # the subscription's acked total


def test_follow_flags_need_follow(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["sli-report", "--out", str(tmp_path), "--available-now"])
    assert res.exit_code == 1 and "need --follow" in res.output
