"""Schemas with the official clients (google.pubsub.v1.SchemaService; docs/GOOGLE_API.md §6).

SchemaServiceClient creates, reads, lists, revises, rolls back and deletes schemas; topics with
``schema_settings`` accept only conforming messages (a batch with one bad message stores none)
and deliver Google's ``googclient_schema*`` attributes; REST reaches the same service. Runs in
every deployment of ``shared_server`` (in a cluster, through a frontend, schemas in ZooKeeper).
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as T
from google.pubsub_v1.services.schema_service import SchemaServiceClient

from tests.conftest import PROJECT, emulator_host
from tests.support.raw import gapic_publisher
from tests.support.rest import Rest, b64
from tests.support.server import ServerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]

AVRO = json.dumps(
    {
        "type": "record",
        "name": "State",
        "fields": [
            {"name": "name", "type": "string"},
            {"name": "post_abbr", "type": "string"},
        ],
    }
)
AVRO_V2 = json.dumps(
    {
        "type": "record",
        "name": "State",
        "fields": [
            {"name": "name", "type": "string"},
            {"name": "post_abbr", "type": "string"},
            {"name": "population", "type": ["null", "long"], "default": None},
        ],
    }
)
PROTO = 'syntax = "proto3";\nmessage Item {\n  string product_name = 1;\n  int64 sku = 2;\n}\n'
PROTO_V2 = (
    'syntax = "proto3";\nmessage Item {\n  string product_name = 1;\n  int64 sku = 2;\n'
    "  bool in_stock = 3;\n}\n"
)
PARENT = f"projects/{PROJECT}"


@pytest.fixture(scope="module")
def schema_client(shared_server: Any) -> Iterator[SchemaServiceClient]:
    with emulator_host(shared_server.endpoint):
        client = SchemaServiceClient()
    yield client


def _sid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def _create(client: SchemaServiceClient, sid: str, kind: Any, definition: str) -> Any:
    return client.create_schema(
        request={
            "parent": PARENT,
            "schema_id": sid,
            "schema": {"type_": kind, "definition": definition},
        }
    )


def _pull_all(sub: pubsub_v1.SubscriberClient, subscription: str, want: int) -> list[Any]:
    got: list[Any] = []
    for _ in range(20):
        response = sub.pull(request={"subscription": subscription, "max_messages": 100}, timeout=10)
        if response.received_messages:
            got.extend(response.received_messages)
            sub.acknowledge(
                request={
                    "subscription": subscription,
                    "ack_ids": [m.ack_id for m in response.received_messages],
                }
            )
        if len(got) >= want:
            break
    return got


def test_schema_lifecycle_revisions_rollback_and_delete(
    schema_client: SchemaServiceClient,
) -> None:
    client = schema_client
    sid = _sid("states")
    name = f"{PARENT}/schemas/{sid}"
    first = _create(client, sid, T.Schema.Type.AVRO, AVRO)
    assert first.name == name and first.definition == AVRO
    assert len(first.revision_id) == 8 and first.revision_create_time.timestamp() > 0
    with pytest.raises(exceptions.AlreadyExists):
        _create(client, sid, T.Schema.Type.AVRO, AVRO)
    with pytest.raises(exceptions.InvalidArgument, match="Avro"):
        _create(client, _sid("bad"), T.Schema.Type.AVRO, '{"type": "record"}')
    with pytest.raises(exceptions.InvalidArgument, match="name"):
        _create(client, "9starts-with-digit", T.Schema.Type.AVRO, AVRO)

    # Views: Get is FULL by default, lists BASIC (no definition).
    assert client.get_schema(name=name).definition == AVRO
    basic = client.get_schema(request={"name": name, "view": T.SchemaView.BASIC})
    assert basic.definition == "" and basic.type_ == T.Schema.Type.AVRO
    listed = [s for s in client.list_schemas(parent=PARENT) if s.name == name]
    assert len(listed) == 1 and listed[0].definition == ""

    second = client.commit_schema(
        request={
            "name": name,
            "schema": {"name": name, "type_": T.Schema.Type.AVRO, "definition": AVRO_V2},
        }
    )
    assert second.revision_id != first.revision_id and second.definition == AVRO_V2
    assert client.get_schema(name=name).revision_id == second.revision_id  # newest
    old = client.get_schema(name=f"{name}@{first.revision_id}")
    assert old.definition == AVRO and old.revision_id == first.revision_id

    third = client.rollback_schema(request={"name": name, "revision_id": first.revision_id})
    assert third.definition == AVRO and third.revision_id not in (
        first.revision_id,
        second.revision_id,
    )
    revisions = list(
        client.list_schema_revisions(
            request={"name": name, "view": T.SchemaView.FULL, "page_size": 2}
        )
    )
    assert [r.revision_id for r in revisions] == [
        third.revision_id,
        second.revision_id,
        first.revision_id,
    ]  # newest first, over two pages
    with pytest.raises(exceptions.NotFound):
        client.rollback_schema(request={"name": name, "revision_id": "nothere0"})

    deleted = client.delete_schema_revision(request={"name": f"{name}@{second.revision_id}"})
    assert deleted.revision_id == second.revision_id
    assert [r.revision_id for r in client.list_schema_revisions(name=name)] == [
        third.revision_id,
        first.revision_id,
    ]
    client.delete_schema_revision(request={"name": f"{name}@{first.revision_id}"})
    with pytest.raises(exceptions.FailedPrecondition):
        client.delete_schema_revision(request={"name": f"{name}@{third.revision_id}"})

    client.delete_schema(name=name)
    with pytest.raises(exceptions.NotFound):
        client.get_schema(name=name)
    with pytest.raises(exceptions.NotFound):
        client.delete_schema(name=name)


def test_validate_schema_and_message(schema_client: SchemaServiceClient) -> None:
    client = schema_client
    client.validate_schema(
        request={
            "parent": PARENT,
            "schema": {"type_": T.Schema.Type.PROTOCOL_BUFFER, "definition": PROTO},
        }
    )
    with pytest.raises(exceptions.InvalidArgument, match="line 2"):
        client.validate_schema(
            request={
                "parent": PARENT,
                "schema": {
                    "type_": T.Schema.Type.PROTOCOL_BUFFER,
                    "definition": 'syntax = "proto3";\nmessage { }',
                },
            }
        )
    with pytest.raises(exceptions.InvalidArgument, match="exactly one top-level message"):
        client.validate_schema(
            request={
                "parent": PARENT,
                "schema": {
                    "type_": T.Schema.Type.PROTOCOL_BUFFER,
                    "definition": PROTO + "message Other { int32 a = 1; }\n",
                },
            }
        )
    sid = _sid("items")
    _create(client, sid, T.Schema.Type.PROTOCOL_BUFFER, PROTO)
    name = f"{PARENT}/schemas/{sid}"
    good = b'{"product_name": "pen", "sku": "12"}'
    client.validate_message(
        request={"parent": PARENT, "name": name, "message": good, "encoding": T.Encoding.JSON}
    )
    with pytest.raises(exceptions.InvalidArgument, match="no field named"):
        client.validate_message(
            request={
                "parent": PARENT,
                "name": name,
                "message": b'{"colour": 1}',
                "encoding": T.Encoding.JSON,
            }
        )
    inline = {"type_": T.Schema.Type.AVRO, "definition": AVRO}
    record = {"name": "Alaska", "post_abbr": "AK"}
    client.validate_message(
        request={
            "parent": PARENT,
            "schema": inline,
            "message": _avro_binary(AVRO, record),
            "encoding": T.Encoding.BINARY,
        }
    )
    with pytest.raises(exceptions.InvalidArgument, match="Avro binary"):
        client.validate_message(
            request={
                "parent": PARENT,
                "schema": inline,
                "message": b"\x08Alaska",
                "encoding": T.Encoding.BINARY,
            }
        )
    with pytest.raises(exceptions.NotFound):
        client.validate_message(
            request={
                "parent": PARENT,
                "name": f"{PARENT}/schemas/none-{sid}",
                "message": good,
                "encoding": T.Encoding.JSON,
            }
        )


def _avro_binary(definition: str, record: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(json.loads(definition)), record)
    return buffer.getvalue()


def test_avro_json_topic_accepts_conforming_batches_only_and_delivers_attributes(
    schema_client: SchemaServiceClient, clients: Any, names: Any, shared_server: Any
) -> None:
    pub, sub = clients
    gapic = gapic_publisher(shared_server.endpoint)  # one Publish request per call
    sid = _sid("avro")
    schema = f"{PARENT}/schemas/{sid}"
    revision = _create(schema_client, sid, T.Schema.Type.AVRO, AVRO).revision_id
    topic, subscription = names.topic(), names.subscription()
    with pytest.raises(exceptions.NotFound):
        pub.create_topic(
            request={
                "name": topic,
                "schema_settings": {"schema": f"{schema}-x", "encoding": T.Encoding.JSON},
            }
        )
    with pytest.raises(exceptions.InvalidArgument, match="first_revision_id"):
        pub.create_topic(
            request={
                "name": topic,
                "schema_settings": {
                    "schema": schema,
                    "encoding": T.Encoding.JSON,
                    "first_revision_id": "nothere0",
                },
            }
        )
    created = pub.create_topic(
        request={"name": topic, "schema_settings": {"schema": schema, "encoding": T.Encoding.JSON}}
    )
    assert created.schema_settings.schema == schema
    sub.create_subscription(name=subscription, topic=topic)

    good = [json.dumps({"name": f"S{i}", "post_abbr": f"S{i}"}).encode() for i in range(3)]
    bad = b'{"name": "Nowhere"}'  # post_abbr missing
    # One request with a bad message among good ones: refused whole, naming the message.
    with pytest.raises(exceptions.InvalidArgument, match=r"messages\[1\].*" + sid):
        gapic.publish(
            topic=topic,
            messages=[
                T.PubsubMessage(data=good[0]),
                T.PubsubMessage(data=bad),
                T.PubsubMessage(data=good[1]),
            ],
        )
    with pytest.raises(exceptions.InvalidArgument):
        gapic.publish(topic=topic, messages=[T.PubsubMessage(data=b"not json")])
    # 98 attributes are within Google's 100, but not with the three googclient_schema* ones.
    crowded = {f"a{n}": "v" for n in range(98)}
    with pytest.raises(exceptions.InvalidArgument, match=r"101 attributes with the googclient"):
        gapic.publish(topic=topic, messages=[T.PubsubMessage(data=good[0], attributes=crowded)])
    ids = gapic.publish(
        topic=topic, messages=[T.PubsubMessage(data=d, attributes={"k": "v"}) for d in good]
    ).message_ids
    assert len(ids) == 3

    received = _pull_all(sub, subscription, 3)
    assert sorted(m.message.data for m in received) == sorted(good)  # nothing of the bad batch
    for m in received:
        assert dict(m.message.attributes) == {
            "k": "v",
            "googclient_schemaname": schema,
            "googclient_schemaencoding": "JSON",
            "googclient_schemarevisionid": revision,
        }
    # Deleting the schema: the topic shows _deleted-schema_ and refuses publishes.
    schema_client.delete_schema(name=schema)
    assert pub.get_topic(topic=topic).schema_settings.schema == "_deleted-schema_"
    with pytest.raises(exceptions.FailedPrecondition):
        gapic.publish(topic=topic, messages=[T.PubsubMessage(data=good[0])])


def test_dead_letters_are_checked_against_the_dead_letter_topics_schema(
    schema_client: SchemaServiceClient, clients: Any, names: Any
) -> None:
    """A dead-lettered copy is published to its dead-letter topic as a client's Publish is:
    one that conforms to that topic's schema arrives there with the googclient_schema*
    attributes of that schema; one that does not is refused (INVALID_ARGUMENT), so it stays
    in its subscription, held for the next try, and never reaches the dead-letter topic."""
    pub, sub = clients
    sid = _sid("dead")
    schema = f"{PARENT}/schemas/{sid}"
    revision = _create(schema_client, sid, T.Schema.Type.AVRO, AVRO).revision_id
    topic, dead = names.topic(), names.topic("dead")
    subscription, dead_subscription = names.subscription(), names.subscription("dead")
    pub.create_topic(name=topic)  # no schema: anything is published to it
    pub.create_topic(
        request={"name": dead, "schema_settings": {"schema": schema, "encoding": T.Encoding.JSON}}
    )
    sub.create_subscription(
        request={
            "name": subscription,
            "topic": topic,
            "dead_letter_policy": {"dead_letter_topic": dead, "max_delivery_attempts": 5},
        }
    )
    sub.create_subscription(name=dead_subscription, topic=dead)
    good = json.dumps({"name": "Ohio", "post_abbr": "OH"}).encode()
    bad = b"not the schema"
    for data in (good, bad):
        pub.publish(topic, data).result(timeout=30)
    for attempt in range(1, 6):  # five deliveries, each nacked: then dead-lettered
        seen: dict[bytes, str] = {}
        for _ in range(40):
            response = sub.pull(
                request={"subscription": subscription, "max_messages": 10}, timeout=10
            )
            for m in response.received_messages:
                assert m.delivery_attempt == attempt
                seen[m.message.data] = m.ack_id
            if len(seen) == 2:
                break
        assert set(seen) == {good, bad}, attempt
        sub.modify_ack_deadline(
            request={
                "subscription": subscription,
                "ack_ids": list(seen.values()),
                "ack_deadline_seconds": 0,
            }
        )
    received = _pull_all(sub, dead_subscription, 1)
    received += sub.pull(  # dead-lettered with the good one: nothing else came
        request={"subscription": dead_subscription, "max_messages": 10, "return_immediately": True},
        timeout=10,
    ).received_messages
    assert [m.message.data for m in received] == [good]
    attributes = dict(received[0].message.attributes)
    assert attributes["googclient_schemaname"] == schema
    assert attributes["googclient_schemarevisionid"] == revision
    assert attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    # The refused copy is held in its subscription (retried later), not redelivered now.
    again = sub.pull(
        request={"subscription": subscription, "max_messages": 10, "return_immediately": True},
        timeout=10,
    )
    assert [m.message.data for m in again.received_messages] == []


def test_proto_binary_topic_with_a_revision_range(
    schema_client: SchemaServiceClient, clients: Any, names: Any, shared_server: Any
) -> None:
    pub, sub = clients
    gapic = gapic_publisher(shared_server.endpoint)
    sid = _sid("proto")
    schema = f"{PARENT}/schemas/{sid}"
    first = _create(schema_client, sid, T.Schema.Type.PROTOCOL_BUFFER, PROTO)
    second = schema_client.commit_schema(
        request={
            "name": schema,
            "schema": {"type_": T.Schema.Type.PROTOCOL_BUFFER, "definition": PROTO_V2},
        }
    )
    topic, subscription = names.topic(), names.subscription()
    # Both revisions allowed; a range whose first revision is newer than its last is refused.
    pub.create_topic(
        request={
            "name": topic,
            "schema_settings": {
                "schema": schema,
                "encoding": T.Encoding.BINARY,
                "first_revision_id": first.revision_id,
                "last_revision_id": second.revision_id,
            },
        }
    )
    with pytest.raises(exceptions.InvalidArgument, match="newer"):
        pub.update_topic(
            request={
                "topic": {
                    "name": topic,
                    "schema_settings": {
                        "schema": schema,
                        "encoding": T.Encoding.BINARY,
                        "first_revision_id": second.revision_id,
                        "last_revision_id": first.revision_id,
                    },
                },
                "update_mask": {"paths": ["schema_settings"]},
            }
        )
    sub.create_subscription(name=subscription, topic=topic)
    # product_name = "pen" (field 1, length-delimited), sku = 7 (field 2, varint).
    message = b"\x0a\x03pen\x10\x07"
    pub.publish(topic, message).result(timeout=30)
    with pytest.raises(exceptions.InvalidArgument, match="Item"):
        gapic.publish(topic=topic, messages=[T.PubsubMessage(data=b"\x0a\x09pen")])  # truncated
    got = _pull_all(sub, subscription, 1)
    assert [m.message.data for m in got] == [message]
    attributes = got[0].message.attributes
    assert attributes["googclient_schemaencoding"] == "BINARY"
    assert attributes["googclient_schemarevisionid"] == second.revision_id  # newest that fits
    assert attributes["googclient_schemaname"] == schema


def test_schemas_over_rest(shared_server: ServerProcess) -> None:
    rest = Rest("127.0.0.1", shared_server.http_port)
    try:
        sid = _sid("rest")
        base = f"/v1/{PARENT}/schemas"
        created = rest.ok("POST", f"{base}?schemaId={sid}", {"type": "AVRO", "definition": AVRO})
        assert created["name"] == f"{PARENT}/schemas/{sid}" and created["revisionId"]
        assert rest.ok("GET", f"{base}/{sid}")["definition"] == AVRO
        listed = rest.ok("GET", f"{base}?pageSize=1000")["schemas"]
        assert any(s["name"] == created["name"] and "definition" not in s for s in listed)
        record = {"name": "Ohio", "post_abbr": "OH"}
        rest.ok(
            "POST",
            f"{base}:validateMessage",
            {
                "name": created["name"],
                "message": b64(json.dumps(record).encode()),
                "encoding": "JSON",
            },
        )
        code, status, message = rest.error(
            "POST", f"{base}:validate", {"schema": {"type": "AVRO", "definition": "{"}}
        )
        assert (code, status) == (400, "INVALID_ARGUMENT") and "Avro" in message
        revisions = rest.ok("GET", f"{base}/{sid}:listRevisions")["schemas"]
        assert [r["revisionId"] for r in revisions] == [created["revisionId"]]
        rest.ok("DELETE", f"{base}/{sid}")
        assert rest.error("GET", f"{base}/{sid}")[:2] == (404, "NOT_FOUND")
    finally:
        rest.close()
