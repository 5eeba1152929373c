"""Pulsar schemas (``AvroSchema``, ``JsonSchema``) of the official ``pulsar-client`` against a
topic's Google schema, on a real ``pubsubd serve --pulsar-port 0`` (pulsar/schemas.py)."""

from __future__ import annotations

import json
import uuid

import _pulsar
import pulsar
import pytest
from google.pubsub_v1 import types as T
from google.pubsub_v1.services.schema_service import SchemaServiceClient
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema

from tests.conftest import emulator_host, make_publisher
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

PROJECT = "test-project"


class Order(Record):
    id = Integer(required=True)
    customer = String(required=True)


class Other(Record):
    id = Integer(required=True)


class Optional(Record):
    id = Integer(required=True)
    note = String()  # optional: the union ["null", "string"]


def _schema_topic(server: ServerProcess, encoding: int, record: type[Record] = Order) -> str:
    """A topic whose Google schema is ``record``'s Avro definition, with ``encoding``."""
    local = f"schema-{uuid.uuid4().hex[:8]}"
    with emulator_host(server.endpoint):
        schemas = SchemaServiceClient()
    definition = AvroSchema(record).schema_info().schema()
    schema = schemas.create_schema(
        parent=f"projects/{PROJECT}",
        schema_id=local,
        schema=T.Schema(type_=T.Schema.Type.AVRO, definition=definition),
    )
    make_publisher(server.endpoint).create_topic(
        request={
            "name": f"projects/{PROJECT}/topics/{local}",
            "schema_settings": {"schema": schema.name, "encoding": encoding},
        }
    )
    return f"persistent://{PROJECT}/default/{local}"


def test_an_avro_schema_is_checked_against_the_topics(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    topic = _schema_topic(pulsar_server, T.Encoding.BINARY)
    consumer = pulsar_client.subscribe(
        topic, "orders", consumer_type=pulsar.ConsumerType.Shared, schema=AvroSchema(Order)
    )
    producer = pulsar_client.create_producer(topic, schema=AvroSchema(Order))
    producer.send(Order(id=7, customer="alice"))
    got = consumer.receive(5000).value()
    assert (got.id, got.customer) == (7, "alice")
    # Another record, or the JSON form of this one: refused clearly.
    with pytest.raises(pulsar.IncompatibleSchema):
        pulsar_client.create_producer(topic, schema=AvroSchema(Other))
    with pytest.raises(pulsar.IncompatibleSchema):
        pulsar_client.create_producer(topic, schema=JsonSchema(Order))
    with pytest.raises(pulsar.IncompatibleSchema):
        pulsar_client.subscribe(topic, "others", schema=AvroSchema(Other))
    # GET_SCHEMA: the topic's schema as Pulsar's Avro schema.
    info = pulsar_client._client.get_schema_info(topic, -1)
    assert info.schema_type() == _pulsar.SchemaType.AVRO
    assert json.loads(info.schema()) == json.loads(AvroSchema(Order).schema_info().schema())


def test_a_json_schema_is_the_topics_json_encoding(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    topic = _schema_topic(pulsar_server, T.Encoding.JSON)
    consumer = pulsar_client.subscribe(
        topic, "orders", consumer_type=pulsar.ConsumerType.Shared, schema=JsonSchema(Order)
    )
    producer = pulsar_client.create_producer(topic, schema=JsonSchema(Order))
    producer.send(Order(id=8, customer="bob"))
    got = consumer.receive(5000).value()
    assert (got.id, got.customer) == (8, "bob")
    with pytest.raises(pulsar.IncompatibleSchema):
        pulsar_client.create_producer(topic, schema=AvroSchema(Order))
    info = pulsar_client._client.get_schema_info(topic, -1)
    assert info.schema_type() == _pulsar.SchemaType.JSON


def test_a_message_the_topics_schema_refuses_fails_alone(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    """JsonSchema writes a union's value plain ("x"), which Google's (Avro) JSON encoding
    writes {"string": "x"}: the publish check refuses it. The send fails (ChecksumError: the
    only SEND_ERROR the C++ client fails one message for, where any other would make it resend
    forever), and the producer goes on."""
    topic = _schema_topic(pulsar_server, T.Encoding.JSON, Optional)
    consumer = pulsar_client.subscribe(topic, "s", schema=JsonSchema(Optional))
    producer = pulsar_client.create_producer(topic, schema=JsonSchema(Optional))
    with pytest.raises(pulsar.ChecksumError):
        producer.send(Optional(id=1, note="x"))
    producer.send(Optional(id=2))  # null is the same in both
    got = consumer.receive(5000).value()
    assert (got.id, got.note) == (2, None)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(300)


def test_a_topic_without_a_schema_takes_any_unchecked(pulsar_client: pulsar.Client) -> None:
    """No Google schema: any Pulsar schema is taken; GET_SCHEMA answers the first one declared
    (the Avro consumer asks for its writer schema with each message it decodes), and a topic
    nobody declared one for is TopicNotFound, as Pulsar answers."""
    topic = f"persistent://{PROJECT}/default/plain-{uuid.uuid4().hex[:8]}"
    consumer = pulsar_client.subscribe(topic, "s", schema=AvroSchema(Order))
    producer = pulsar_client.create_producer(topic, schema=AvroSchema(Other))
    producer.send(Other(id=1))
    assert consumer.receive(5000).data() == AvroSchema(Other).encode(Other(id=1))
    info = pulsar_client._client.get_schema_info(topic, -1)
    assert info.schema_type() == _pulsar.SchemaType.AVRO
    assert json.loads(info.schema()) == json.loads(AvroSchema(Order).schema_info().schema())
    bare = f"persistent://{PROJECT}/default/bare-{uuid.uuid4().hex[:8]}"
    text = pulsar_client.subscribe(bare, "s", schema=StringSchema())
    pulsar_client.create_producer(bare, schema=StringSchema()).send("text")
    assert text.receive(5000).value() == "text"
    with pytest.raises(pulsar.TopicNotFound):
        pulsar_client._client.get_schema_info(bare, -1)
