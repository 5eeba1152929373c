"""Unit tests for the Spark reader's Arrow conversion of columnar Read pages
(pubsubd.spark.source.columns_to_record_batch, pubsubd.spark.client.columns_from_rows)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow as pa

from pubsubd._gen.pubsubd.v1 import replay_pb2 as r
from pubsubd.spark.client import columns_from_rows
from pubsubd.spark.source import ARROW_SCHEMA, columns_to_record_batch

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/orders"
T0 = 1_763_700_000_123_456  # epoch microseconds

# (offset, data, attributes in order, ordering key, publish time in microseconds)
ROWS: list[tuple[int, bytes, list[tuple[str, str]], str, int]] = [
    (7, b"a", [], "", T0),
    (8, b"", [("k", "v")], "key-1", T0),
    (9, b"\x00\xff", [("x", ""), ("y", "2"), ("z", "é")], "", T0 + 1),
    (10, b"d" * 300, [], "key-2", T0 + 2_000_001),
    (11, b"e", [("only", "one")], "", 0),
]


def columns(rows: list[tuple[int, bytes, list[tuple[str, str]], str, int]]) -> Any:
    cols = r.ReadColumns()
    for offset, data, attrs, key, micros in rows:
        cols.offsets.append(offset)
        cols.data.append(data)
        cols.ordering_keys.append(key)
        cols.publish_time_us.append(micros)
        cols.attribute_counts.append(len(attrs))
        cols.attribute_keys.extend(k for k, _ in attrs)
        cols.attribute_values.extend(v for _, v in attrs)
    return r.ReadColumns.FromString(cols.SerializeToString())  # as the client receives it


def expected(
    partition: int, rows: list[tuple[int, bytes, list[tuple[str, str]], str, int]]
) -> pa.RecordBatch:
    """What the row-by-row conversion produced: one Python value per cell."""
    return pa.RecordBatch.from_pylist(
        [
            {
                "topic": TOPIC,
                "partition": partition,
                "offset": offset,
                "message_id": str(partition << 48 | offset),
                "ordering_key": key or None,
                "data": data,
                "attributes": attrs,
                "publish_time": micros,
            }
            for offset, data, attrs, key, micros in rows
        ],
        schema=ARROW_SCHEMA,
    )


@pytest.mark.parametrize("partition", [0, 1, 15])
def test_columns_become_the_rows_arrow_batch(partition: int) -> None:
    batch = columns_to_record_batch(TOPIC, partition, columns(ROWS))
    assert batch.schema == ARROW_SCHEMA
    assert batch.equals(expected(partition, ROWS))
    got = batch.to_pylist()
    assert got[0]["message_id"] == str((partition << 48) + 7)
    assert [row["ordering_key"] for row in got] == [None, "key-1", None, "key-2", None]
    assert [row["attributes"] for row in got] == [[], [("k", "v")], ROWS[2][2], [], ROWS[4][2]]
    assert batch.column("ordering_key").null_count == 3
    assert batch.column("attributes").null_count == 0  # no attributes: an empty map, not null
    assert got[3]["publish_time"].timestamp() * 1_000_000 == pytest.approx(T0 + 2_000_001)


def test_pages_without_keys_attributes_or_rows() -> None:
    plain = [(i, b"m%d" % i, [], "", T0 + i) for i in range(1000)]
    batch = columns_to_record_batch(TOPIC, 0, columns(plain))
    assert batch.equals(expected(0, plain))
    assert batch.column("ordering_key").null_count == 1000
    empty = columns_to_record_batch(TOPIC, 2, r.ReadColumns())
    assert empty.num_rows == 0 and empty.schema == ARROW_SCHEMA


def test_misaligned_columns_are_refused() -> None:
    short = columns(ROWS)
    del short.data[-1]
    with pytest.raises(ValueError, match="different lengths"):
        columns_to_record_batch(TOPIC, 0, short)
    extra = columns(ROWS)
    extra.attribute_keys.append("dangling")
    with pytest.raises(ValueError, match="different lengths"):
        columns_to_record_batch(TOPIC, 0, extra)


def test_rows_from_a_server_without_columns_convert_alike() -> None:
    messages = []
    for offset, data, attrs, key, micros in ROWS:
        m = r.ReplayMessage(offset=offset, message_id=str(offset), data=data, ordering_key=key)
        m.attributes.update(dict(attrs))
        m.publish_time.seconds, micros_left = divmod(micros, 1_000_000)
        m.publish_time.nanos = micros_left * 1000
        messages.append(m)
    batch = columns_to_record_batch(TOPIC, 0, columns_from_rows(messages))
    # Map order is not kept by the row form: compare attributes as dicts.
    want = expected(0, ROWS).to_pylist()
    got = batch.to_pylist()
    for row in (*want, *got):
        row["attributes"] = dict(row["attributes"])
    assert got == want
