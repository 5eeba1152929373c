"""Schema definitions and message checks (core/schemas.py, core/proto_compiler.py) and the
registry's revision rules (control/schemas.py over the in-memory metadata store).

Every failure is InvalidArgument (or the registry's NOT_FOUND / FAILED_PRECONDITION) naming
what failed; conforming messages pass in both encodings; a topic's revision range is searched
newest first.
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any, cast

import fastavro
import pytest
from google.protobuf import descriptor_pb2

from pubsubd.control.schemas import MAX_REVISIONS, SchemaRegistry
from pubsubd.core import pb
from pubsubd.core.clock import ManualClock
from pubsubd.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from pubsubd.core.proto_compiler import compile_definition
from pubsubd.core.schemas import (
    AVRO,
    BINARY,
    JSON,
    PROTOCOL_BUFFER,
    AvroSchema,
    Candidate,
    compile_schema,
    conforming_revision,
)
from pubsubd.storage.metadata import MemoryMetadataStore

pytestmark = pytest.mark.unit

AVRO_DEF = json.dumps(
    {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "sensor", "type": "string"},
            {"name": "value", "type": "double"},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
)
PROTO_DEF = (
    'syntax = "proto3";\npackage acme;\n'
    "message Reading {\n  string sensor = 1;\n  double value = 2;\n}\n"
)


def _binary(record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(AVRO_DEF)), record)
    return out.getvalue()


@pytest.mark.parametrize(
    ("data", "encoding"),
    [
        (b'{"sensor": "a", "value": 1.5}', JSON),
        (b'{"sensor": "a", "value": 1.5, "note": {"string": "hi"}}', JSON),  # Avro JSON union
        (b'{"sensor": "a", "value": 2, "note": null}', JSON),
        (_binary({"sensor": "a", "value": 1.5, "note": None}), BINARY),
        (_binary({"sensor": "", "value": -1.0, "note": "x"}), BINARY),
    ],
)
def test_avro_accepts_conforming_messages(data: bytes, encoding: int) -> None:
    compile_schema(AVRO, AVRO_DEF).check(data, encoding)


@pytest.mark.parametrize(
    ("data", "encoding", "says"),
    [
        (b'{"sensor": "a"}', JSON, "Avro JSON"),  # a field without default missing
        (b'{"sensor": 3, "value": 1.5}', JSON, "conform"),
        (b'{"sensor": "a", "value": 1.5, "note": "bare"}', JSON, "Avro JSON"),  # union unwrapped
        (b"[1, 2", JSON, "not JSON"),
        (b"\xff\xfe", JSON, "UTF-8"),
        (_binary({"sensor": "a", "value": 1.5, "note": None}) + b"\x00", BINARY, "left after"),
        (_binary({"sensor": "a", "value": 1.5, "note": None})[:-3], BINARY, "Avro binary"),
        (b"", BINARY, "Avro binary"),
    ],
)
def test_avro_refuses_what_does_not_conform(data: bytes, encoding: int, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        compile_schema(AVRO, AVRO_DEF).check(data, encoding)


def test_proto_messages_in_both_encodings() -> None:
    schema = compile_schema(PROTOCOL_BUFFER, PROTO_DEF)
    schema.check(b'{"sensor": "a", "value": 2.5}', JSON)
    schema.check(b"\x0a\x01a\x11" + struct.pack("<d", 2.5), BINARY)  # sensor 1, value 2 (fixed64)
    schema.check(b"", BINARY)  # every proto3 field is optional
    with pytest.raises(InvalidArgument, match="no field named"):
        schema.check(b'{"sensr": "a"}', JSON)
    with pytest.raises(InvalidArgument, match="Reading"):
        schema.check(b"\x0a\x05ab", BINARY)  # a string longer than the bytes left


@pytest.mark.parametrize(
    ("kind", "definition", "says"),
    [
        (PROTOCOL_BUFFER, "message A { strin a = 1; }", "line 1 column"),
        (PROTOCOL_BUFFER, PROTO_DEF + "message Other { int32 a = 1; }\n", "exactly one"),
        (PROTOCOL_BUFFER, 'syntax = "proto3";\nenum E { A = 0; }\n', "exactly one"),
        (
            PROTOCOL_BUFFER,
            'syntax = "proto3"; import "x.proto"; message A { int32 a = 1; }',
            "imports",
        ),
        (AVRO, "{", "Avro schema is JSON"),
        (
            AVRO,
            '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}',
            "Avro",
        ),
        (AVRO, "", "required"),
        (0, "{}", "AVRO or PROTOCOL_BUFFER"),
        (AVRO, '"' + "x" * 300_001 + '"', "longer than"),
    ],
)
def test_bad_definitions_say_what_is_wrong(kind: int, definition: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        compile_schema(kind, definition)


def test_two_schemas_may_define_the_same_names() -> None:
    """Each definition compiles into its own pool: names never collide across schemas."""
    first = compile_schema(PROTOCOL_BUFFER, PROTO_DEF)
    other = compile_schema(PROTOCOL_BUFFER, PROTO_DEF.replace("double value", "string value"))
    first.check(b'{"value": 1.0}', JSON)
    other.check(b'{"value": "1.0"}', JSON)
    compile_schema(AVRO, AVRO_DEF)
    compile_schema(AVRO, AVRO_DEF)


def test_the_newest_conforming_revision_is_named() -> None:
    old = Candidate("old00000", compile_schema(AVRO, AVRO_DEF))
    new = Candidate("new00000", compile_schema(AVRO, '"string"'))
    assert conforming_revision(b'"text"', JSON, [new, old]) == "new00000"
    assert conforming_revision(b'{"sensor": "a", "value": 1}', JSON, [new, old]) == "old00000"
    with pytest.raises(InvalidArgument, match="conform"):
        conforming_revision(b"7", JSON, [new, old])  # the newest revision's complaint
    with pytest.raises(InvalidArgument, match="no revision"):
        conforming_revision(b"7", JSON, [])


# --- the registry -------------------------------------------------------------------------------

NAME = "projects/p/schemas/readings"


def _registry() -> tuple[SchemaRegistry, MemoryMetadataStore, ManualClock]:
    store = MemoryMetadataStore()
    clock = ManualClock()
    return SchemaRegistry(store, clock), store, clock


def _schema(definition: str = AVRO_DEF, kind: int = AVRO) -> Any:
    return pb.Schema(type_=kind, definition=definition)


def test_revisions_commit_rollback_delete_and_reload() -> None:
    registry, store, clock = _registry()
    first = registry.create("projects/p", "readings", _schema())
    with pytest.raises(AlreadyExists):
        registry.create("projects/p", "readings", _schema())
    clock.advance(1)
    second = registry.commit(NAME, _schema('"string"'))
    clock.advance(1)
    third = registry.rollback(NAME, first.revision_id)
    assert third.definition == AVRO_DEF
    assert (
        third.revision_create_time.ToMicroseconds() > second.revision_create_time.ToMicroseconds()
    )
    ids = [r.revision_id for r in registry.list_revisions(NAME, 0, 0, "")[0]]
    assert ids == [third.revision_id, second.revision_id, first.revision_id]
    page, token = registry.list_revisions(NAME, 0, 2, "")
    assert [r.revision_id for r in page] == ids[:2] and page[0].definition == ""  # BASIC
    rest, end = registry.list_revisions(NAME, 2, 2, token)
    assert [r.revision_id for r in rest] == ids[2:] and rest[0].definition and end == ""
    assert registry.get(f"{NAME}@{second.revision_id}").definition == '"string"'
    with pytest.raises(NotFound):
        registry.get(f"{NAME}@nothere0")
    with pytest.raises(InvalidArgument):
        registry.commit(NAME, _schema("{"))  # never stored
    assert (
        registry.delete_revision(f"{NAME}@{second.revision_id}").revision_id == second.revision_id
    )

    again = SchemaRegistry(store)  # what a restart loads
    again.load()
    assert [r.revision_id for r in again.list_revisions(NAME, 0, 0, "")[0]] == [
        third.revision_id,
        first.revision_id,
    ]
    again.delete_revision(f"{NAME}@{first.revision_id}")
    with pytest.raises(FailedPrecondition):
        again.delete_revision(f"{NAME}@{third.revision_id}")  # the last one
    deleted: list[str] = []
    again.deleted_listeners.append(deleted.append)
    again.delete(NAME)
    assert deleted == [NAME] and list(store.load_schemas()) == []
    with pytest.raises(NotFound):
        again.get(NAME)


def test_at_most_max_revisions_are_kept() -> None:
    registry, _, _ = _registry()
    registry.create("projects/p", "readings", _schema())
    for _ in range(MAX_REVISIONS - 1):
        registry.commit(NAME, _schema())
    with pytest.raises(FailedPrecondition, match="revisions"):
        registry.commit(NAME, _schema())


def test_topic_settings_and_their_revision_range() -> None:
    registry, _, _ = _registry()
    first = registry.create("projects/p", "readings", _schema('"string"'))
    second = registry.commit(NAME, _schema('"int"'))
    third = registry.commit(NAME, _schema('"boolean"'))
    settings = pb.Topic().schema_settings
    settings.schema = NAME
    registry.check_settings(settings)
    assert [c.revision_id for c in registry.candidates(settings)] == [
        third.revision_id,
        second.revision_id,
        first.revision_id,
    ]
    settings.first_revision_id = second.revision_id
    settings.last_revision_id = second.revision_id
    registry.check_settings(settings)
    assert [c.revision_id for c in registry.candidates(settings)] == [second.revision_id]
    settings.first_revision_id = third.revision_id
    with pytest.raises(InvalidArgument, match="newer"):
        registry.check_settings(settings)
    settings.first_revision_id = "nothere0"
    with pytest.raises(InvalidArgument, match="first_revision_id"):
        registry.check_settings(settings)
    settings.schema = "projects/p/schemas/missing"
    with pytest.raises(NotFound):
        registry.check_settings(settings)
    with pytest.raises(FailedPrecondition):
        registry.candidates(settings)


def test_conform_stamps_each_message_or_names_the_first_that_fails() -> None:
    registry, _, _ = _registry()
    revision = registry.create("projects/p", "readings", _schema('"string"')).revision_id
    settings = pb.Topic().schema_settings
    settings.schema, settings.encoding = NAME, JSON
    batch = pb.PublishRequest(messages=[{"data": b'"a"', "attributes": {"k": "v"}}])
    registry.conform(settings, batch.messages)
    assert dict(batch.messages[0].attributes) == {
        "k": "v",
        "googclient_schemaname": NAME,
        "googclient_schemaencoding": "JSON",
        "googclient_schemarevisionid": revision,
    }
    bad = pb.PublishRequest(messages=[{"data": b'"a"'}, {"data": b"7"}])
    with pytest.raises(InvalidArgument, match=r"messages\[1\]: does not conform to schema"):
        registry.conform(settings, bad.messages)


def test_conform_refuses_a_message_the_schema_attributes_take_past_the_limit() -> None:
    """100 attributes at most, counted with the three googclient_schema* ones added (ones the
    publisher set itself are replaced, not counted twice)."""
    registry, _, _ = _registry()
    registry.create("projects/p", "readings", _schema('"string"'))
    settings = pb.Topic().schema_settings
    settings.schema, settings.encoding = NAME, JSON
    fits = {f"k{n}": "v" for n in range(97)}
    batch = pb.PublishRequest(messages=[{"data": b'"a"', "attributes": fits}])
    registry.conform(settings, batch.messages)
    assert len(batch.messages[0].attributes) == 100
    restamped = pb.PublishRequest(messages=[batch.messages[0]])  # already carries the three
    registry.conform(settings, restamped.messages)
    assert len(restamped.messages[0].attributes) == 100
    over = pb.PublishRequest(
        messages=[{"data": b'"a"'}, {"data": b'"b"', "attributes": {**fits, "k97": "v"}}]
    )
    with pytest.raises(InvalidArgument, match=r"messages\[1\]\.attributes: 101 attributes"):
        registry.conform(settings, over.messages)


def test_a_precompiled_proto_schema_is_loaded_as_given() -> None:
    """Schema.compiled_proto_schema: a FileDescriptorSet and the root message's full name."""
    files = descriptor_pb2.FileDescriptorSet(file=[compile_definition(PROTO_DEF)])
    registry, _, _ = _registry()
    schema = pb.Schema(type_=PROTOCOL_BUFFER)
    schema.compiled_proto_schema.root_message = "acme.Reading"
    schema.compiled_proto_schema.compiled_bytes = files.SerializeToString()
    created = registry.create("projects/p", "readings", schema)
    assert created.compiled_proto_schema.root_message == "acme.Reading"
    settings = pb.Topic().schema_settings
    settings.schema, settings.encoding = NAME, JSON
    [candidate] = registry.candidates(settings)
    candidate.schema.check(b'{"sensor": "a"}', JSON)
    schema.compiled_proto_schema.root_message = "acme.Missing"
    with pytest.raises(InvalidArgument, match="no message type"):
        registry.compile(schema)
    schema.compiled_proto_schema.compiled_bytes = b"\xff"
    with pytest.raises(InvalidArgument, match="FileDescriptorSet"):
        registry.compile(schema)
    schema.type_ = AVRO
    with pytest.raises(InvalidArgument, match="PROTOCOL_BUFFER"):
        registry.compile(schema)


PLAIN_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        ],
    }
)


@pytest.mark.parametrize(
    "data",
    [
        b'{"id": 1, "tags": ["a"], "kind": "A"}',
        b'{"id": 1, "tags": [], "kind": "B", "extra": 1}',
        b'{"id": "1", "tags": [], "kind": "A"}',
        b'{"id": 1.5, "tags": [], "kind": "A"}',
        b'{"id": 1, "tags": [2], "kind": "A"}',
        b'{"id": 1, "tags": [], "kind": "C"}',
        b'{"id": 1, "kind": "A"}',
        b"[]",
    ],
)
def test_plain_avro_json_takes_the_validator_alone_with_the_decoders_verdict(data: bytes) -> None:
    """A schema without unions, bytes, fixed or defaults skips fastavro's JSON decoder: the
    verdict is the same as through it."""
    fast = compile_schema(AVRO, PLAIN_AVRO)
    assert isinstance(fast, AvroSchema) and fast.plain_json
    assert not cast(AvroSchema, compile_schema(AVRO, AVRO_DEF)).plain_json  # a union, a default
    slow = AvroSchema(fast.parsed, plain_json=False)
    verdicts = []
    for schema in (fast, slow):
        try:
            schema.check(data, JSON)
            verdicts.append(True)
        except InvalidArgument:
            verdicts.append(False)
    assert verdicts[0] == verdicts[1]
