"""Schemas of google.pubsub.v1: a definition compiled once, and messages checked against it.

Rules (Google's, docs/GOOGLE_API.md §6 "Schemas"):

- A schema is ``AVRO`` (an Avro schema in JSON, parsed by fastavro) or ``PROTOCOL_BUFFER`` (the
  text of one ``.proto`` file, compiled by protoc, core/proto_compiler.py) with exactly one
  top-level message type, which messages are checked against; imports are not supported. A
  ``PROTOCOL_BUFFER`` schema may instead come precompiled (``compiled_proto_schema``: a
  FileDescriptorSet and the root message's full name), loaded into a private pool as it is.
- A message's ``data`` is checked in its topic's encoding: ``BINARY`` (Avro binary encoding of
  one datum, every byte used; the protobuf wire format) or ``JSON`` (the Avro JSON encoding, so
  a union value is written ``{"type": value}``, or the proto3 JSON mapping; unknown fields are
  refused). ``ENCODING_UNSPECIFIED`` is checked as JSON.
- Every failure is ``InvalidArgument`` naming what failed; nothing else escapes ``check``.
- A topic accepts a message if any revision in its ``[first_revision_id, last_revision_id]``
  range accepts it, newest first; the revision that did is the one delivery names
  (``googclient_schemarevisionid``).

Pure: no I/O here except what protoc needs (a temporary file, in proto_compiler.py); no clock.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import fastavro
from fastavro.validation import ValidationError as AvroValidationError
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError

from pubsubd.core import proto_compiler
from pubsubd.core.errors import InvalidArgument

# google.pubsub.v1.Schema.Type and google.pubsub.v1.Encoding values.
TYPE_UNSPECIFIED = 0
PROTOCOL_BUFFER = 1
AVRO = 2
ENCODING_UNSPECIFIED = 0
JSON = 1
BINARY = 2
ENCODING_NAMES = {ENCODING_UNSPECIFIED: "JSON", JSON: "JSON", BINARY: "BINARY"}

# The attributes Google adds to every message published to a topic with a schema.
SCHEMA_NAME_ATTRIBUTE = "googclient_schemaname"
SCHEMA_ENCODING_ATTRIBUTE = "googclient_schemaencoding"
SCHEMA_REVISION_ATTRIBUTE = "googclient_schemarevisionid"

# Google's limit on a schema definition (and so what one revision adds to its record).
MAX_DEFINITION_BYTES = 300_000


class CompiledSchema(Protocol):
    def check(self, data: bytes, encoding: int) -> None:
        """Raise InvalidArgument (naming what failed) unless ``data`` conforms."""


@dataclass(frozen=True, slots=True)
class AvroSchema:
    parsed: Any  # fastavro's parsed schema
    # No unions, bytes, fixed or field defaults anywhere: then a message's Avro JSON encoding is
    # its plain JSON value, checked by fastavro's (compiled) validator alone, without its
    # pure-Python JSON decoder (~10x faster; the decoder is what unwraps unions, reads bytes
    # as code points and fills defaults).
    plain_json: bool = False

    def check(self, data: bytes, encoding: int) -> None:
        if encoding == BINARY:
            self._binary(data)
        else:
            self._json(data)

    def _binary(self, data: bytes) -> None:
        buffer = io.BytesIO(data)
        try:
            fastavro.schemaless_reader(buffer, self.parsed, None)
        except Exception as e:  # fastavro raises whatever its decoder meets: all mean "invalid"
            raise InvalidArgument(f"message is not valid Avro binary for the schema: {e!r}") from e
        if buffer.tell() != len(data):
            raise InvalidArgument(
                f"message is not valid Avro binary for the schema: {len(data) - buffer.tell()} "
                "bytes left after the record"
            )

    def _json(self, data: bytes) -> None:
        value = _json_value(data)
        if self.plain_json:
            try:
                fastavro.validate(value, self.parsed, raise_errors=True)
            except AvroValidationError as e:
                raise InvalidArgument(f"message does not conform to the Avro schema: {e}") from e
            return
        try:
            # The Avro JSON encoding (unions as {"type": value}), then the datum's types.
            line = io.StringIO(json.dumps(value, separators=(",", ":")))
            records = list(fastavro.json_reader(line, self.parsed))
            if len(records) != 1:
                raise InvalidArgument("message is not one Avro JSON record")
            fastavro.validate(records[0], self.parsed, raise_errors=True)
        except InvalidArgument:
            raise
        except AvroValidationError as e:
            raise InvalidArgument(f"message does not conform to the Avro schema: {e}") from e
        except Exception as e:
            raise InvalidArgument(f"message is not valid Avro JSON for the schema: {e!r}") from e


@dataclass(frozen=True, slots=True)
class ProtoSchema:
    message_class: Any  # the one top-level message type, from a private descriptor pool

    def check(self, data: bytes, encoding: int) -> None:
        message = self.message_class()
        name = message.DESCRIPTOR.name
        if encoding == BINARY:
            try:
                message.ParseFromString(data)
            except DecodeError as e:
                raise InvalidArgument(f"message is not a valid binary {name}: {e}") from e
            return
        text = _json_text(data)
        try:
            json_format.Parse(text, message)
        except json_format.ParseError as e:
            raise InvalidArgument(f"message is not a valid JSON {name}: {e}") from e


def _json_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("message is not UTF-8 JSON text") from None


def _json_value(data: bytes) -> Any:
    try:
        return json.loads(_json_text(data))
    except ValueError as e:
        raise InvalidArgument(f"message is not JSON: {e}") from None


def compile_schema(schema_type: int, definition: str) -> CompiledSchema:
    """Compile a definition; raises InvalidArgument saying what is wrong with it."""
    if not definition:
        raise InvalidArgument("definition: required")
    if len(definition.encode("utf-8")) > MAX_DEFINITION_BYTES:
        raise InvalidArgument(f"definition: longer than {MAX_DEFINITION_BYTES} bytes")
    if schema_type == AVRO:
        return _avro(definition)
    if schema_type == PROTOCOL_BUFFER:
        return _proto(definition)
    raise InvalidArgument("type: must be AVRO or PROTOCOL_BUFFER")


def compile_descriptor_set(root_message: str, compiled_bytes: bytes) -> CompiledSchema:
    """A Protocol Buffer schema given precompiled (Schema.compiled_proto_schema): a serialized
    FileDescriptorSet, dependencies before the files that import them, and the full name of the
    message type to check against. Raises InvalidArgument saying what is wrong."""
    if not root_message:
        raise InvalidArgument("compiled_proto_schema.root_message: required")
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(compiled_bytes).file
    except DecodeError:
        raise InvalidArgument(
            "compiled_proto_schema.compiled_bytes: not a serialized FileDescriptorSet"
        ) from None
    pool = descriptor_pool.DescriptorPool()
    try:
        for file in files:
            pool.Add(file)
        descriptor = pool.FindMessageTypeByName(root_message)
    except KeyError:
        raise InvalidArgument(
            f"compiled_proto_schema.root_message: no message type {root_message!r} in the set"
        ) from None
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"compiled_proto_schema.compiled_bytes: {e}") from None
    return ProtoSchema(message_factory.GetMessageClass(descriptor))


def _avro(definition: str) -> AvroSchema:
    try:
        raw = json.loads(definition)
    except ValueError as e:
        raise InvalidArgument(f"definition: an Avro schema is JSON: {e}") from None
    try:
        # A private repository of named types per schema: names may repeat across schemas.
        parsed = fastavro.parse_schema(raw, named_schemas={}, _write_hint=False)
    except Exception as e:  # SchemaParseException, UnknownType, ValueError, TypeError...
        raise InvalidArgument(f"definition: not a valid Avro schema: {e}") from None
    return AvroSchema(parsed, _plain_json(raw))


def _plain_json(node: Any) -> bool:
    """Whether an Avro schema (its JSON) needs nothing of the Avro JSON decoder (see
    ``AvroSchema.plain_json``)."""
    if isinstance(node, list):
        return False  # a union
    if isinstance(node, str):
        return node not in ("bytes", "fixed")
    if not isinstance(node, dict):
        return False
    kind = node.get("type")
    if kind in ("bytes", "fixed"):
        return False
    if kind == "record" or kind == "error":
        return all(
            isinstance(f, dict) and "default" not in f and _plain_json(f.get("type"))
            for f in node.get("fields", ())
        )
    if kind == "array":
        return _plain_json(node.get("items"))
    if kind == "map":
        return _plain_json(node.get("values"))
    if kind == "enum":
        return True
    return _plain_json(kind)  # {"type": "string", "logicalType": ...} or a nested schema


def _proto(definition: str) -> ProtoSchema:
    file = proto_compiler.compile_definition(definition)
    if len(file.message_type) != 1:
        raise InvalidArgument(
            "definition: a Protocol Buffer schema must define exactly one top-level message "
            f"type (found {len(file.message_type)})"
        )
    pool = descriptor_pool.DescriptorPool()
    try:
        found = pool.Add(file)
        descriptor = pool.FindMessageTypeByName(
            f"{file.package}.{file.message_type[0].name}".lstrip(".")
        )
    except (TypeError, KeyError, ValueError) as e:
        raise InvalidArgument(f"definition: {e}") from None
    del found
    return ProtoSchema(message_factory.GetMessageClass(descriptor))


@dataclass(frozen=True, slots=True)
class Candidate:
    """One revision a topic's messages may conform to."""

    revision_id: str
    schema: CompiledSchema


def conforming_revision(data: bytes, encoding: int, candidates: Sequence[Candidate]) -> str:
    """The first (newest) revision ``data`` conforms to; InvalidArgument naming the newest
    revision's complaint if none does."""
    first: InvalidArgument | None = None
    for candidate in candidates:
        try:
            candidate.schema.check(data, encoding)
        except InvalidArgument as e:
            if first is None:
                first = e
            continue
        return candidate.revision_id
    if first is None:
        raise InvalidArgument("the topic's schema has no revision in its revision range")
    raise first
