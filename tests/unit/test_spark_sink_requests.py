"""Unit tests for the Spark sink's requests (pubsubd.spark.sink.publish_batches) over a fake
client: rows become PublishDeduplicated requests straight from Arrow columns, up to two in
flight per task, one at a time when rows carry ordering keys (no server, no Spark)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")

import grpc
import pyarrow as pa

from pubsubd._gen.pubsubd.v1 import replay_pb2
from pubsubd.spark import sink
from pubsubd.spark.client import ReplayError
from pubsubd.spark.options import SinkOptions

pytestmark = pytest.mark.unit

T = "projects/p/topics/t"


class _Pending:
    def __init__(self, client: _Client, request: Any) -> None:
        self.client = client
        self.request = request

    def result(self) -> tuple[int, int]:
        self.client.in_flight -= 1
        if self.client.fail:
            raise ReplayError("PublishDeduplicated", grpc.StatusCode.INTERNAL, "boom")
        return len(self.request.messages), 1


class _Client:
    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.raw: list[bytes] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail = False

    def start_publish(self, request: Any) -> _Pending:
        if isinstance(request, bytes):  # data-only rows: encoded by the sink itself
            self.raw.append(request)
            request = replay_pb2.PublishDeduplicatedRequest.FromString(request)
        self.requests.append(request)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return _Pending(self, request)


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> _Client:
    fake = _Client()
    monkeypatch.setattr(sink, "get_client", lambda endpoint, security=None: fake)
    return fake


def _opts(batch_size: int = 1000) -> SinkOptions:
    return SinkOptions.parse(
        {"endpoint": "127.0.0.1:1", "topic": T, "publishBatchSize": batch_size}
    )


def test_rows_become_requests_with_run_dedup_ids(client: _Client) -> None:
    batches = [
        pa.RecordBatch.from_pydict({"data": [f"r{i}".encode() for i in range(s, s + 700)]})
        for s in (0, 700, 1400)
    ]
    commit = sink.publish_batches(_opts(), iter(batches), "q:7:1", 1)
    assert [len(r.messages) for r in client.requests] == [1000, 1000, 100]
    sent = [m for r in client.requests for m in r.messages]
    assert [m.dedup_id for m in sent] == [f"q:7:1:{i}" for i in range(2100)]
    assert [m.data for m in sent] == [f"r{i}".encode() for i in range(2100)]
    assert all(r.topic == T for r in client.requests)
    assert client.most_in_flight == 2 and client.in_flight == 0
    assert (commit.partition_id, commit.published, commit.duplicates) == (1, 2100, 3)


def test_string_data_attributes_keys_and_own_dedup_ids(client: _Client) -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "data": ["a", None, "c"],
            "attributes": pa.array(
                [[("k", "v")], None, [("x", "1"), ("y", "2")]], pa.map_(pa.string(), pa.string())
            ),
            "ordering_key": ["", None, "key"],
            "dedup_id": ["mine", None, ""],
        }
    )
    sink.publish_batches(_opts(), iter([batch]), "w:0", 0)
    (request,) = client.requests
    got = [(m.dedup_id, m.data, dict(m.attributes), m.ordering_key) for m in request.messages]
    assert got == [
        ("mine", b"a", {"k": "v"}, ""),
        ("w:0:1", b"", {}, ""),
        ("w:0:2", b"c", {"x": "1", "y": "2"}, "key"),
    ]


def test_ordered_rows_go_one_request_at_a_time(client: _Client) -> None:
    batch = pa.RecordBatch.from_pydict({"data": [b"x"] * 50, "ordering_key": ["k"] * 50})
    sink.publish_batches(_opts(batch_size=10), iter([batch]), "q:0:0", 0)
    assert len(client.requests) == 5
    assert client.most_in_flight == 1


def test_a_failed_request_fails_the_task(client: _Client) -> None:
    client.fail = True
    batch = pa.RecordBatch.from_pydict({"data": [b"x"] * 30})
    with pytest.raises(ReplayError, match="INTERNAL"):
        sink.publish_batches(_opts(batch_size=10), iter([batch]), "q:0:0", 0)


def test_data_only_rows_are_encoded_as_protobuf_would(client: _Client) -> None:
    data = [b"x" * (i % 200 + 1) for i in range(2500)] + [None]
    batches = [
        pa.RecordBatch.from_pydict({"data": data[:1300], "value": list(range(1300))}),
        pa.RecordBatch.from_pydict({"data": data[1300:]}),
    ]
    sink.publish_batches(_opts(), iter(batches), "q:é:3", 3)
    assert len(client.raw) == 3 == len(client.requests)
    sent = [m for r in client.requests for m in r.messages]
    assert [m.dedup_id for m in sent] == [f"q:é:3:{i}" for i in range(2501)]
    assert [m.data for m in sent] == [d or b"" for d in data]
    for raw, request in zip(client.raw[:2], client.requests, strict=False):
        assert raw == request.SerializeToString()  # byte for byte, so the server reads it flat
    # An empty row is sent as an explicit empty field (the server refuses it, as before).


def test_data_only_requests_stay_within_the_request_size(
    client: _Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink, "_MAX_REQUEST_BYTES", 1000)
    batch = pa.RecordBatch.from_pydict({"data": [b"y" * 90] * 40 + [b"z" * 5000]})
    sink.publish_batches(_opts(), iter([batch]), "q:0:0", 0)
    assert [len(r.messages) for r in client.requests] == [7, 7, 7, 7, 7, 5, 1]
    assert all(len(r) <= 1000 for r in client.raw[:-1])
    sent = [m.dedup_id for r in client.requests for m in r.messages]
    assert sent == [f"q:0:0:{i}" for i in range(41)]
