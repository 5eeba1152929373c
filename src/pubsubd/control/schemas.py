"""Schema registry: google.pubsub.v1 schemas and their revisions, validated and persisted.

A schema is one metadata record (``SchemaRecord``) holding every revision it keeps, newest
first; each call that changes it writes the whole record before it answers, as the catalog
does for topics. Rules (Google's; docs/GOOGLE_API.md §6):

- CreateSchema: the ID follows the resource ID rules; the definition must compile
  (core/schemas.py); the first revision gets a random 8-character ``revision_id`` and the
  server's time as ``revision_create_time``. A name in use: ALREADY_EXISTS.
- ``name@revision`` names one revision (GetSchema, DeleteSchemaRevision); a bare name the
  newest. Views: GetSchema defaults to FULL; the listings to BASIC (no ``definition``).
- CommitSchema adds a revision (the type may change); RollbackSchema adds a new revision with
  an older one's definition; at most ``MAX_REVISIONS`` are kept (FAILED_PRECONDITION beyond).
  DeleteSchemaRevision refuses the last one (FAILED_PRECONDITION).
- DeleteSchema removes every revision; topics that named it then show ``_deleted-schema_``
  (the catalog rewrites them) and refuse publishes.
- Compiled definitions are cached per (schema, revision) and dropped when the schema changes.

In a cluster every process keeps this view and applies the other processes' writes from the
store's change feed; a name it lacks is looked up in the store before NOT_FOUND (as the
catalog does). Two processes committing to one schema at the same moment: the store writes only
over the revisions this view holds (a compare-and-set), so one wins and the other answers
ABORTED.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from pubsubd.control.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, SortedNames
from pubsubd.core import names, pb
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from pubsubd.core.schemas import (
    ENCODING_NAMES,
    PROTOCOL_BUFFER,
    SCHEMA_ENCODING_ATTRIBUTE,
    SCHEMA_NAME_ATTRIBUTE,
    SCHEMA_REVISION_ATTRIBUTE,
    Candidate,
    CompiledSchema,
    compile_descriptor_set,
    compile_schema,
    conforming_revision,
)
from pubsubd.core.validation import MAX_ATTRIBUTES
from pubsubd.storage.metadata import Change, MetadataStore, RecordChanged, SchemaRecord

# What a topic's schema_settings show once its schema is deleted (Google's value).
DELETED_SCHEMA = "_deleted-schema_"
# Revisions one schema keeps (Google's quota); also keeps a record within one ZooKeeper znode.
MAX_REVISIONS = 20
# google.pubsub.v1.SchemaView
VIEW_UNSPECIFIED, VIEW_BASIC, VIEW_FULL = 0, 1, 2


def split_revision(name: str) -> tuple[str, str]:
    """``projects/p/schemas/s@rev`` -> (``projects/p/schemas/s``, ``rev``); validates the name."""
    base, _, revision = name.partition("@")
    names.parse(base, "schemas")
    return base, revision


def _shown(schema: Any, view: int) -> Any:
    if view == VIEW_FULL:
        return schema
    basic = pb.Schema()
    basic.CopyFrom(schema)
    basic.ClearField("definition")
    return basic


class SchemaRegistry:
    def __init__(self, store: MetadataStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock
        self._revisions: dict[str, list[Any]] = {}  # name -> Schema revisions, newest first
        self._bodies: dict[str, bytes] = {}  # name -> its stored record's body
        self._names = SortedNames()
        self._compiled: dict[tuple[str, str], CompiledSchema] = {}
        # Called with a deleted schema's name (the catalog marks its topics).
        self.deleted_listeners: list[Callable[[str], None]] = []

    # --- start-up and other processes ----------------------------------------------------------

    def load(self) -> None:
        for record in self.store.load_schemas():
            self._apply(record)

    def follow(self) -> None:
        self.store.changes.watch(self._remote_change)

    def _remote_change(self, change: Change) -> None:
        record = change.record
        if not change.remote or not isinstance(record, SchemaRecord):
            return
        if change.deleted:
            self._forget(record.name)  # the deleting process rewrote the topics
        else:
            self._apply(record)

    def _apply(self, record: SchemaRecord) -> None:
        revisions = list(pb.ListSchemaRevisionsResponse.FromString(record.body).schemas)
        if record.name not in self._revisions:
            self._names.add(record.name)
        self._drop_compiled(record.name)
        self._revisions[record.name] = revisions
        self._bodies[record.name] = record.body

    def _forget(self, name: str) -> None:
        self._bodies.pop(name, None)
        if self._revisions.pop(name, None) is not None:
            self._names.remove(name)
        self._drop_compiled(name)

    def _drop_compiled(self, name: str) -> None:
        for key in [k for k in self._compiled if k[0] == name]:
            del self._compiled[key]

    def _find(self, name: str) -> list[Any]:
        revisions = self._revisions.get(name)
        if revisions is None and getattr(self.store, "shared", False):
            record = self.store.find_schema(name)  # type: ignore[attr-defined]
            if record is not None:
                self._apply(record)
                revisions = self._revisions.get(name)
        if revisions is None:
            raise NotFound("schema", name)
        return revisions

    def _write(self, name: str, revisions: list[Any], *, create: bool = False) -> None:
        body = pb.ListSchemaRevisionsResponse(schemas=revisions).SerializeToString()
        record = SchemaRecord(name, body)
        if create:
            self.store.put_schema(record, create=True)
        else:
            # Only over the revisions this view holds: of two processes committing to one
            # schema at the same moment, one wins and the other answers ABORTED.
            try:
                self.store.put_schema(record, expected=self._bodies.get(name))
            except RecordChanged as e:
                raise Aborted(
                    f"schema {name} was changed by another request at the same time; "
                    "read it again and retry"
                ) from e
        self._apply(record)

    def _revision(self, schema: Any, name: str) -> Any:
        """A new revision of ``schema``'s type and definition (compiled first: invalid ones
        never get stored), stamped now."""
        self.compile(schema)
        revision = pb.Schema(name=name, type_=schema.type_)
        if schema.HasField("compiled_proto_schema"):
            revision.compiled_proto_schema.CopyFrom(schema.compiled_proto_schema)
        else:
            revision.definition = schema.definition
        revision.revision_id = secrets.token_hex(4)
        now_us = self.clock.time_us()
        revision.revision_create_time.FromMicroseconds(now_us)
        return revision

    @staticmethod
    def compile(schema: Any) -> CompiledSchema:
        """A Schema message's definition, compiled; InvalidArgument saying what is wrong."""
        if schema.HasField("compiled_proto_schema"):
            if schema.type_ != PROTOCOL_BUFFER:
                raise InvalidArgument("compiled_proto_schema: the type must be PROTOCOL_BUFFER")
            compiled = schema.compiled_proto_schema
            return compile_descriptor_set(compiled.root_message, compiled.compiled_bytes)
        return compile_schema(schema.type_, schema.definition)

    # --- SchemaService ---------------------------------------------------------------------------

    def create(self, parent: str, schema_id: str, schema: Any) -> Any:
        names.project(parent)
        if not schema_id:
            raise InvalidArgument("schema_id: required")
        name = f"{parent}/schemas/{schema_id}"
        names.parse(name, "schemas")
        if name in self._revisions:
            raise AlreadyExists("schema", name)
        revision = self._revision(schema, name)
        self._write(name, [revision], create=True)  # AlreadyExists if another process won
        return revision

    def get(self, name: str, view: int = VIEW_FULL) -> Any:
        base, revision_id = split_revision(name)
        revisions = self._find(base)
        if not revision_id:
            return _shown(revisions[0], view or VIEW_FULL)
        for revision in revisions:
            if revision.revision_id == revision_id:
                return _shown(revision, view or VIEW_FULL)
        raise NotFound("schema revision", name)

    def list_schemas(
        self, parent: str, view: int, page_size: int, token: str
    ) -> tuple[list[Any], str]:
        names.project(parent)
        page, next_token = self._names.page(f"{parent}/schemas/", page_size, token)
        return [_shown(self._revisions[n][0], view or VIEW_BASIC) for n in page], next_token

    def list_revisions(
        self, name: str, view: int, page_size: int, token: str
    ) -> tuple[list[Any], str]:
        names.parse(name, "schemas")
        revisions = self._find(name)
        if page_size < 0:
            raise InvalidArgument("page_size: must not be negative")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        start = 0
        if token:  # the last revision ID returned
            ids = [r.revision_id for r in revisions]
            if token not in ids:
                raise InvalidArgument("page_token: not a token for this listing")
            start = ids.index(token) + 1
        page = revisions[start : start + size]
        more = start + size < len(revisions)
        return [_shown(r, view or VIEW_BASIC) for r in page], (
            page[-1].revision_id if more and page else ""
        )

    def commit(self, name: str, schema: Any) -> Any:
        names.parse(name, "schemas")
        revisions = self._find(name)
        if schema.name and schema.name != name:
            raise InvalidArgument(f"schema.name: {schema.name!r} is not {name!r}")
        return self._add_revision(name, revisions, schema)

    def rollback(self, name: str, revision_id: str) -> Any:
        names.parse(name, "schemas")
        if not revision_id:
            raise InvalidArgument("revision_id: required")
        revisions = self._find(name)
        for revision in revisions:
            if revision.revision_id == revision_id:
                return self._add_revision(name, revisions, revision)
        raise NotFound("schema revision", f"{name}@{revision_id}")

    def _add_revision(self, name: str, revisions: list[Any], schema: Any) -> Any:
        if len(revisions) >= MAX_REVISIONS:
            raise FailedPrecondition(
                f"schema {name} has {len(revisions)} revisions, the most it may keep: "
                "delete one (DeleteSchemaRevision) first"
            )
        revision = self._revision(schema, name)
        self._write(name, [revision, *revisions])
        return revision

    def delete_revision(self, name: str, revision_id: str = "") -> Any:
        base, at = split_revision(name)
        revision_id = at or revision_id
        if not revision_id:
            raise InvalidArgument("name: must name a revision (projects/p/schemas/s@revision)")
        revisions = self._find(base)
        kept = [r for r in revisions if r.revision_id != revision_id]
        if len(kept) == len(revisions):
            raise NotFound("schema revision", f"{base}@{revision_id}")
        if not kept:
            raise FailedPrecondition(
                f"revision {revision_id} is the only revision of schema {base}: delete the "
                "schema instead"
            )
        deleted = next(r for r in revisions if r.revision_id == revision_id)
        self._write(base, kept)
        return deleted

    def delete(self, name: str) -> None:
        names.parse(name, "schemas")
        self._find(name)
        self.store.delete_schema(name)
        self._forget(name)
        for listener in self.deleted_listeners:
            listener(name)

    def validate_schema(self, parent: str, schema: Any) -> None:
        """ValidateSchema: InvalidArgument saying what is wrong with the definition."""
        names.project(parent)
        self.compile(schema)

    def validate_message(self, parent: str, request: Any) -> None:
        """ValidateMessage: a named schema (newest revision, or ``name@revision``) or an inline
        one; InvalidArgument naming what failed."""
        names.project(parent)
        if request.HasField("schema"):
            compiled = self.compile(request.schema)
        elif request.name:
            revision = self.get(request.name, VIEW_FULL)
            compiled = self._compiled_revision(revision)
        else:
            raise InvalidArgument("schema_spec: name or schema required")
        compiled.check(request.message, request.encoding)

    # --- topics ----------------------------------------------------------------------------------

    def check_settings(self, settings: Any) -> None:
        """A topic's schema_settings on CreateTopic/UpdateTopic: the schema exists (NOT_FOUND)
        and the revision range names its revisions in order (INVALID_ARGUMENT)."""
        if not settings.schema:
            raise InvalidArgument("schema_settings.schema: required")
        if settings.schema == DELETED_SCHEMA:
            raise InvalidArgument("schema_settings.schema: the schema was deleted")
        names.parse(settings.schema, "schemas")
        revisions = self._find(settings.schema)
        ids = [r.revision_id for r in revisions]  # newest first
        for field in ("first_revision_id", "last_revision_id"):
            value = getattr(settings, field)
            if value and value not in ids:
                raise InvalidArgument(
                    f"schema_settings.{field}: {settings.schema} has no revision {value!r}"
                )
        first, last = settings.first_revision_id, settings.last_revision_id
        if first and last and ids.index(first) < ids.index(last):
            raise InvalidArgument(
                "schema_settings: first_revision_id is newer than last_revision_id"
            )

    def candidates(self, settings: Any) -> Sequence[Candidate]:
        """The revisions a topic's messages may conform to, newest first (compiled, cached).
        FAILED_PRECONDITION once the schema is deleted."""
        if settings.schema == DELETED_SCHEMA:
            raise FailedPrecondition("the topic's schema was deleted; messages cannot be validated")
        try:
            revisions = self._find(settings.schema)
        except NotFound:
            raise FailedPrecondition(
                f"the topic's schema {settings.schema} does not exist; messages cannot be validated"
            ) from None
        ids = [r.revision_id for r in revisions]
        start = ids.index(settings.last_revision_id) if settings.last_revision_id in ids else 0
        end = (
            ids.index(settings.first_revision_id) + 1
            if settings.first_revision_id in ids
            else len(ids)
        )
        return [Candidate(r.revision_id, self._compiled_revision(r)) for r in revisions[start:end]]

    def conform(self, settings: Any, messages: Sequence[Any]) -> None:
        """Check each message (``data`` and an ``attributes`` map) against a topic's schema and
        add Google's googclient_schema* attributes naming the revision it conforms to. The first
        that conforms to no revision, or has more than ``MAX_ATTRIBUTES`` once they are added,
        raises InvalidArgument naming it, before any is stamped beyond it: the caller stores
        nothing then. (Google documents neither case for the added attributes; a message the
        limit would refuse on delivery is refused at publish, where its publisher sees why.)"""
        candidates = self.candidates(settings)
        encoding = settings.encoding
        encoding_name = ENCODING_NAMES.get(encoding, "JSON")
        for i, message in enumerate(messages):
            try:
                revision = conforming_revision(message.data, encoding, candidates)
            except InvalidArgument as e:
                raise InvalidArgument(
                    f"messages[{i}]: does not conform to schema {settings.schema} "
                    f"({encoding_name} encoding): {e}"
                ) from None
            attributes = message.attributes
            attributes[SCHEMA_NAME_ATTRIBUTE] = settings.schema
            attributes[SCHEMA_ENCODING_ATTRIBUTE] = encoding_name
            attributes[SCHEMA_REVISION_ATTRIBUTE] = revision
            if len(attributes) > MAX_ATTRIBUTES:
                raise InvalidArgument(
                    f"messages[{i}].attributes: {len(attributes)} attributes with the "
                    f"googclient_schema* ones schema {settings.schema} adds; the maximum is "
                    f"{MAX_ATTRIBUTES}"
                )

    def _compiled_revision(self, revision: Any) -> CompiledSchema:
        key = (revision.name, revision.revision_id)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self.compile(revision)
        return compiled
