"""The Spark reader asks for Arrow pages (ReadRequest.arrow) and falls back to the columnar form
when the server cannot build Arrow (pyarrow not installed): a Spark task's read of a range
(``source.read_range``) gives the same batches from both servers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow as pa
from google.cloud import pubsub_v1

from pubsubd.spark.client import ReplayClient
from pubsubd.spark.source import RangePartition, read_range
from tests.conftest import make_publisher
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

TOPIC = "projects/arrow/topics/fallback"


def _without_pyarrow(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import pyarrow, as on a server installed without it."""
    shim = tmp_path / "no-pyarrow" / "pyarrow"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("pyarrow is not installed here")\n')
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(shim.parent), path) if p)}


def _publish(endpoint: str) -> None:
    pub = make_publisher(
        endpoint,
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=25, max_latency=0.005),
    )
    pub.create_topic(name=TOPIC)
    futures = []
    for i in range(120):
        attrs = {"n": str(i)} if i % 3 == 0 else {}
        key = "key-a" if i % 5 == 0 else ""
        futures.append(pub.publish(TOPIC, b"m%d" % i, ordering_key=key, **attrs))
    for f in futures:
        f.result(timeout=30)


def _read(endpoint: str) -> tuple[list[dict[str, Any]], bool]:
    """Every row through the Spark task's reader (pages of 7), and whether the server answered
    in Arrow."""
    client = ReplayClient(endpoint)
    page, _ = client.read_page(TOPIC, 0, 0, 120, 7)
    client.close()
    p = RangePartition(
        topic=TOPIC, partition=0, start=0, end=120, endpoint=endpoint, fetch_size=7,
        fail_on_data_loss=True,
    )  # fmt: skip
    rows = pa.Table.from_batches(list(read_range(p))).to_pylist()
    for row in rows:
        row["attributes"] = dict(row["attributes"])
    return rows, isinstance(page, bytes)


def test_a_server_without_pyarrow_serves_the_reader_columns(tmp_path: Path) -> None:
    plain = ServerProcess(tmp_path / "plain", env=_without_pyarrow(tmp_path)).start()
    try:
        _publish(plain.endpoint)
        fallback, arrow = _read(plain.endpoint)
    finally:
        plain.kill()
    assert not arrow  # columnar pages: the server has no pyarrow
    server = ServerProcess(tmp_path / "arrow").start()
    try:
        _publish(server.endpoint)
        rows, arrow = _read(server.endpoint)
    finally:
        server.kill()
    assert arrow
    # The publisher batches keyed and unkeyed messages apart, so the two logs' orders may
    # differ: compare the rows by their data, and every column but the position.
    for got in (rows, fallback):
        assert [r["offset"] for r in got] == list(range(120))
        assert [r["message_id"] for r in got] == [str(i) for i in range(120)]
        assert {r["topic"] for r in got} == {TOPIC} and {r["partition"] for r in got} == {0}

    def by_data(got: list[dict[str, Any]]) -> list[tuple[bytes, Any, Any]]:
        return sorted((r["data"], r["ordering_key"], r["attributes"]) for r in got)

    want = [
        (b"m%d" % i, "key-a" if i % 5 == 0 else None, {"n": str(i)} if i % 3 == 0 else {})
        for i in range(120)
    ]
    assert by_data(rows) == by_data(fallback) == sorted(want)
