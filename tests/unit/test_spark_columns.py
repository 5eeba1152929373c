"""Unit tests for the Spark reader's Arrow conversion of columnar Read pages
(pubsubd.spark.source.columns_to_record_batch, pubsubd.spark.client.columns_from_rows)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pubsubd._gen.pubsubd.v1 import replay_pb2 as r
from pubsubd.spark.client import columns_from_rows
from pubsubd.spark.source import (
    ARROW_SCHEMA,
    DEFAULT_SCHEMA,
    FULL,
    SchemaError,
    columns_to_record_batch,
    projection_for,
)

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


def test_the_default_schema_reads_every_column() -> None:
    assert projection_for(None) is FULL
    assert projection_for(DEFAULT_SCHEMA) is FULL
    assert FULL.names == tuple(ARROW_SCHEMA.names)


def test_a_user_schema_selects_columns_in_its_order() -> None:
    schema = StructType(
        [
            StructField("data", BinaryType()),
            StructField("Offset", LongType(), nullable=False),  # names match case-insensitively
            StructField("attributes", MapType(StringType(), StringType())),
            StructField("publish_time", TimestampType()),
        ]
    )
    projection = projection_for(schema)
    assert projection.names == ("data", "offset", "attributes", "publish_time")
    batch = columns_to_record_batch(TOPIC, 3, columns(ROWS), projection)
    # Spark compares the batch's schema with its own Arrow schema of the user's schema exactly.
    assert batch.schema.names == ["data", "Offset", "attributes", "publish_time"]
    assert not batch.schema.field("Offset").nullable
    full = expected(3, ROWS)
    for name, want in zip(batch.schema.names, projection.names, strict=True):
        assert batch.column(name).equals(full.column(want)), name


@pytest.mark.parametrize("partition", [0, 5])
def test_every_single_column_alone_equals_the_full_batch_column(partition: int) -> None:
    full = expected(partition, ROWS)
    for spark_field in DEFAULT_SCHEMA.fields:
        projection = projection_for(StructType([spark_field]))
        batch = columns_to_record_batch(TOPIC, partition, columns(ROWS), projection)
        assert batch.num_columns == 1 and batch.num_rows == len(ROWS)
        assert batch.column(0).equals(full.column(spark_field.name)), spark_field.name


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([StructField("value", BinaryType())], "no column 'value'"),
        ([StructField("data", StringType())], "is binary, not string"),
        ([StructField("offset", LongType()), StructField("OFFSET", LongType())], "twice"),
        ([StructField("ordering_key", StringType(), nullable=False)], "may be null"),
        ([], "selects no column"),
    ],
)
def test_schemas_that_are_no_selection_are_refused(fields: list[StructField], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        projection_for(StructType(fields))


def test_misaligned_columns_are_refused_whatever_the_projection() -> None:
    short = columns(ROWS)
    del short.data[-1]
    only_offsets = projection_for(StructType([StructField("offset", LongType())]))
    with pytest.raises(ValueError, match="different lengths"):
        columns_to_record_batch(TOPIC, 0, short, only_offsets)
