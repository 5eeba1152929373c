"""Pulsar schemas against a topic's Google schema (pure): what a producer's or consumer's
SchemaInfo must be, and what GET_SCHEMA answers.

A topic's schema is its ``schema_settings`` (the Google API's SchemaService): an Avro
definition and an encoding. Pulsar's two record schemas map onto it: an **Avro** schema is
that definition with the ``BINARY`` encoding (Avro binary of one datum, as the client writes),
a **Json** schema is that definition with the ``JSON`` encoding (Pulsar's JsonSchema carries an
Avro definition too, and writes the record as JSON; Google's JSON encoding is Avro's JSON
encoding, the same as long as the record has no union field: a union value is
``{"string": "x"}`` there, and the client writes ``"x"``). Two definitions are the same schema
when their Avro Parsing Canonical Forms are equal (names, types, field order; not docs,
defaults or aliases).

A topic without a schema takes any Pulsar schema, unchecked (Pulsar would store the first one
as the topic's; this front does not). A Protocol Buffer topic schema, and Pulsar schemas other
than Avro and Json (String, Protobuf, KeyValue...), cannot be compared: refused on a topic with
a schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastavro.schema import to_parsing_canonical_form

# Pulsar's Schema.Type values (PulsarApi.proto)
PULSAR_JSON = 2
PULSAR_AVRO = 4
PULSAR_TYPE_NAMES = {0: "None", 1: "String", 2: "Json", 3: "Protobuf", 4: "Avro", 15: "KeyValue"}
# google.pubsub.v1: Schema.Type and Encoding
GOOGLE_AVRO = 2
ENCODING_JSON = 1
ENCODING_BINARY = 2


class SchemaMismatch(Exception):
    """The client's schema is not the topic's (answered with IncompatibleSchema)."""


@dataclass(frozen=True, slots=True)
class TopicSchema:
    """The topic's schema as the front needs it: the schema's name (with its revision), its
    Google type and definition, and the topic's encoding."""

    name: str
    google_type: int
    definition: str
    encoding: int

    @property
    def pulsar_type(self) -> int | None:
        """The Pulsar schema type this topic's messages are (None: none maps)."""
        if self.google_type != GOOGLE_AVRO:
            return None
        return PULSAR_AVRO if self.encoding == ENCODING_BINARY else PULSAR_JSON


def check(topic: TopicSchema, pulsar_type: int, data: bytes) -> None:
    """SchemaMismatch unless a Pulsar schema of ``pulsar_type`` with definition ``data`` is
    the topic's schema."""
    kind = PULSAR_TYPE_NAMES.get(pulsar_type, str(pulsar_type))
    wanted = topic.pulsar_type
    if wanted is None:
        raise SchemaMismatch(
            f"the topic's schema {topic.name} is a Protocol Buffer schema, which no Pulsar "
            f"schema maps to (this client's is {kind})"
        )
    if pulsar_type != wanted:
        raise SchemaMismatch(
            f"the topic's schema {topic.name} takes {PULSAR_TYPE_NAMES[wanted]} messages "
            f"(encoding {'BINARY' if wanted == PULSAR_AVRO else 'JSON'}), not {kind}"
        )
    try:
        theirs = canonical(data.decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise SchemaMismatch(f"the client's {kind} schema is not an Avro definition: {e}") from e
    ours = canonical(topic.definition)
    if theirs != ours:
        raise SchemaMismatch(
            f"the client's {kind} schema {theirs} is not the topic's schema {topic.name}: {ours}"
        )


def canonical(definition: str) -> str:
    """An Avro definition's Parsing Canonical Form; ValueError if it is not one."""
    try:
        return str(to_parsing_canonical_form(json.loads(definition)))
    except Exception as e:  # fastavro raises whatever it meets in a bad definition
        raise ValueError(str(e) or type(e).__name__) from e
