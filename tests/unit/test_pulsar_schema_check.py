"""Pulsar schemas against a topic's Google schema (pulsar/schemas.py)."""

from __future__ import annotations

import json

import pytest

from pubsubd.pulsar.schemas import (
    ENCODING_BINARY,
    ENCODING_JSON,
    GOOGLE_AVRO,
    PULSAR_AVRO,
    PULSAR_JSON,
    SchemaMismatch,
    TopicSchema,
    check,
)

ORDER = {
    "type": "record",
    "name": "Order",
    "doc": "docs and defaults do not count",
    "fields": [{"name": "id", "type": "int"}, {"name": "note", "type": "string", "default": ""}],
}
SAME = json.dumps(
    {
        "name": "Order",
        "type": "record",
        "fields": [{"name": "id", "type": "int"}, {"name": "note", "type": "string"}],
    },
    indent=2,
).encode()


def _topic(encoding: int, google_type: int = GOOGLE_AVRO) -> TopicSchema:
    return TopicSchema(
        "projects/p/schemas/order@abcd1234", google_type, json.dumps(ORDER), encoding
    )


def test_the_same_schema_in_the_encodings_type_is_taken() -> None:
    check(_topic(ENCODING_BINARY), PULSAR_AVRO, SAME)
    check(_topic(ENCODING_JSON), PULSAR_JSON, SAME)
    check(_topic(0), PULSAR_JSON, SAME)  # an unspecified encoding is JSON


@pytest.mark.parametrize(
    ("topic", "kind", "data", "words"),
    [
        (
            _topic(ENCODING_BINARY),
            PULSAR_JSON,
            SAME,
            "takes Avro messages (encoding BINARY), not Json",
        ),
        (_topic(ENCODING_JSON), PULSAR_AVRO, SAME, "takes Json messages (encoding JSON), not Avro"),
        (_topic(ENCODING_BINARY), 1, SAME, "not String"),
        (_topic(ENCODING_BINARY, google_type=1), PULSAR_AVRO, SAME, "Protocol Buffer"),
        (_topic(ENCODING_BINARY), PULSAR_AVRO, b"{not json", "not an Avro definition"),
        (
            _topic(ENCODING_BINARY),
            PULSAR_AVRO,
            json.dumps(
                {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
            ).encode(),
            "is not the topic's schema projects/p/schemas/order@abcd1234",
        ),
    ],
    ids=[
        "json-on-binary",
        "avro-on-json",
        "string",
        "protobuf-topic",
        "bad-definition",
        "other-record",
    ],
)
def test_anything_else_is_refused_saying_why(
    topic: TopicSchema, kind: int, data: bytes, words: str
) -> None:
    with pytest.raises(SchemaMismatch, match=words.replace("(", r"\(").replace(")", r"\)")):
        check(topic, kind, data)
