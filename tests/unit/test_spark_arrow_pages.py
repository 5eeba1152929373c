"""Arrow Read pages (ReadRequest.arrow): the server's page batch (api/grpc/replay_arrow.py) read
back by the Spark reader (source.page_rows, source.arrow_to_record_batch) gives the batch the
columnar form gives for the same page, for every projection."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow as pa
from pyspark.sql.types import StructType

from pubsubd._gen.pubsubd.v1 import replay_pb2 as r
from pubsubd.api.grpc import replay_arrow
from pubsubd.api.grpc.replay import Page, _fill_columns
from pubsubd.core import pb
from pubsubd.core.records import Entry
from pubsubd.data.decoding import decode
from pubsubd.spark.source import (
    ARROW_SCHEMA,
    DEFAULT_SCHEMA,
    PAGE_SCHEMA,
    arrow_to_record_batch,
    columns_to_record_batch,
    page_rows,
    projection_for,
)

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/orders"
T0 = 1_763_700_000_123_456


def _decoded(base: int, micros: int, *messages: Any) -> Any:
    payload = pb.PublishRequest(topic=TOPIC, messages=messages).SerializeToString()
    return decode(
        0, Entry(base_offset=base, count=len(messages), publish_time_us=micros, payload=payload)
    )


def _page() -> Page:
    """Rows of four entries, cut as _page cuts them: a plain one (no key, no attribute) from its
    second row, a keyed one with attributes, another plain one, and one with an empty data and
    attributes on some rows only."""
    plain = _decoded(10, T0, *(pb.PubsubMessage(data=b"p%d" % i) for i in range(4)))
    keyed = _decoded(
        14,
        T0 + 1,
        pb.PubsubMessage(data=b"k0", ordering_key="key-1", attributes={"a": "1"}),
        pb.PubsubMessage(data=b"k1", ordering_key="key-1", attributes={"x": "", "y": "é"}),
    )
    plain2 = _decoded(16, T0 + 2_000_001, pb.PubsubMessage(data=b"\x00\xff" * 200))
    mixed = _decoded(
        17,
        0,
        pb.PubsubMessage(data=b"m0"),
        pb.PubsubMessage(attributes={"only": "one"}),
        pb.PubsubMessage(data=b"m2"),
    )
    return [(plain, 1, 4), (keyed, 0, 2), (plain2, 0, 1), (mixed, 0, 3)]


def _columnar(rows: Page) -> Any:
    out = r.ReadResponse()
    _fill_columns(out.columns, rows)
    return r.ReadResponse.FromString(out.SerializeToString()).columns  # as the client gets it


def _arrow(rows: Page) -> pa.RecordBatch:
    wire = replay_arrow.read_response(41, replay_arrow.page_ipc(rows))  # framed by hand
    out = r.ReadResponse.FromString(wire)
    assert out.next_offset == 41 and not out.HasField("columns") and not out.messages
    return page_rows(out.arrow_ipc)


@pytest.mark.parametrize("partition", [0, 1, 15])
def test_an_arrow_page_gives_the_columnar_pages_batch(partition: int) -> None:
    rows = _page()
    page = _arrow(rows)
    assert page.schema.equals(PAGE_SCHEMA) and page.num_rows == 3 + 2 + 1 + 3
    batch = arrow_to_record_batch(TOPIC, partition, page)
    assert batch.schema == ARROW_SCHEMA
    assert batch.equals(columns_to_record_batch(TOPIC, partition, _columnar(rows)))
    got = batch.to_pylist()
    assert [g["offset"] for g in got] == [11, 12, 13, 14, 15, 16, 17, 18, 19]
    assert got[0]["message_id"] == str(partition << 48 | 11)
    assert [g["ordering_key"] for g in got] == [None] * 3 + ["key-1"] * 2 + [None] * 4
    assert [dict(g["attributes"]) for g in got][3:7] == [
        {"a": "1"},
        {"x": "", "y": "é"},
        {},
        {},
    ]
    assert dict(got[7]["attributes"]) == {"only": "one"} and got[7]["data"] == b""
    assert batch.column("attributes").null_count == 0  # no attributes: an empty map
    assert got[5]["publish_time"].timestamp() * 1_000_000 == pytest.approx(T0 + 2_000_001)


def test_every_projection_of_an_arrow_page_matches_the_columnar_one() -> None:
    rows = _page()
    page, cols = _arrow(rows), _columnar(rows)
    for spark_field in DEFAULT_SCHEMA.fields:
        projection = projection_for(StructType([spark_field]))
        got = arrow_to_record_batch(TOPIC, 3, page, projection)
        assert got.equals(columns_to_record_batch(TOPIC, 3, cols, projection)), spark_field.name
    projection = projection_for(StructType(list(reversed(DEFAULT_SCHEMA.fields))))
    got = arrow_to_record_batch(TOPIC, 3, page, projection)
    assert got.schema.names == list(reversed(ARROW_SCHEMA.names))
    assert got.equals(columns_to_record_batch(TOPIC, 3, cols, projection))


def test_pages_without_rows_keys_or_attributes() -> None:
    empty = arrow_to_record_batch(TOPIC, 2, _arrow([]))
    assert empty.num_rows == 0 and empty.schema == ARROW_SCHEMA
    plain = [(r_, lo, hi) for r_, lo, hi in _page() if r_.plain_data() is not None]
    batch = arrow_to_record_batch(TOPIC, 0, _arrow(plain))
    assert batch.equals(columns_to_record_batch(TOPIC, 0, _columnar(plain)))
    assert batch.column("ordering_key").null_count == batch.num_rows == 4


def test_an_arrow_page_of_another_schema_is_refused() -> None:
    other = pa.record_batch([pa.array([1], pa.int32())], names=["offset"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other.schema) as writer:
        writer.write_batch(other)
    with pytest.raises(ValueError, match="Arrow page of schema"):
        page_rows(sink.getvalue().to_pybytes())
