"""Metadata store: where topics, subscriptions, snapshots, cursors and schemas live (one machine).

``MetadataStore`` is the narrow interface the catalog writes through; ``SqliteMetadataStore`` is the
embedded implementation (SQLite in WAL mode, ``synchronous=FULL``, so a create acknowledged to a
client survives kill -9) and ``MemoryMetadataStore`` the in-memory twin for tests. A multi-machine
deployment will put ZooKeeper behind the same interface. Records carry the resource as serialized
protobuf bytes, so the store never needs to know the API's fields.

State flows one way: a writer (the catalog, snapshots, named cursors) changes a record, and
every change, once durable, is published on the store's :class:`ChangeFeed`; the forwarders
reconcile what they own from it (``data/reconcile.py``), as they will from ZooKeeper watches.
A mutation returns what its listeners still do asynchronously (a future), or None: a writer
that must answer only once the change is applied (DeleteSubscription) awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import Any, Protocol, TypeAlias

from pubsubd.core.errors import AlreadyExists
from pubsubd.storage import disk_space
from pubsubd.storage.disk_space import DiskSpace

logger = logging.getLogger(__name__)

# File name of the embedded store inside the data directory.
METADATA_FILE = "metadata.sqlite3"


@dataclass(slots=True)
class TopicRecord:
    name: str
    uid: str  # storage identity: a re-created topic of the same name is a new topic
    body: bytes  # serialized google.pubsub.v1.Topic


@dataclass(slots=True)
class SubscriptionRecord:
    name: str
    uid: str
    topic_uid: str  # the storage identity of the topic, kept after the topic is deleted
    body: bytes  # serialized google.pubsub.v1.Subscription
    # Sync point: per source, the first offset this subscription receives.
    start_offsets: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class SnapshotRecord:
    name: str
    topic_uid: str  # storage identity of the topic whose messages it captures
    body: bytes  # serialized google.pubsub.v1.Snapshot
    # Captured ack state per source: (mark_delete, acked ranges above it).
    cursors: dict[int, tuple[int, list[tuple[int, int]]]] = field(default_factory=dict)


@dataclass(slots=True)
class CursorRecord:
    """A named cursor of the replay API (control/cursors.py)."""

    topic_uid: str  # storage identity: a re-created topic starts without cursors
    name: str
    topic: str  # the topic's name, for status pages
    offsets: dict[int, int] = field(default_factory=dict)  # source -> next position to read
    commit_time_us: int = 0


@dataclass(slots=True)
class SchemaRecord:
    """A schema of the SchemaService (control/schemas.py) with every revision it keeps."""

    name: str
    # Serialized google.pubsub.v1.ListSchemaRevisionsResponse used as a container: the
    # revisions (full Schema messages), newest first; the response's page token is unused.
    body: bytes


@dataclass(slots=True)
class PolicyRecord:
    """A resource's IAM policy (control/policies.py); deleted with its resource."""

    resource: str  # projects/P/topics/T, .../subscriptions/S, .../snapshots/N, .../schemas/X
    body: bytes  # serialized google.iam.v1.Policy, etag included


Record: TypeAlias = (
    TopicRecord | SubscriptionRecord | SnapshotRecord | CursorRecord | SchemaRecord | PolicyRecord
)


@dataclass(frozen=True, slots=True)
class Change:
    """A record written to, or deleted from, the metadata store (durably)."""

    record: Record
    deleted: bool = False
    # Written by another process (a cluster's metadata store follows ZooKeeper): views a
    # process keeps of what it writes itself (the catalog's) must apply it.
    remote: bool = False


ChangeListener = Callable[[Change], Awaitable[None] | None]
Applied: TypeAlias = "asyncio.Future[Any] | None"


class ChangeFeed:
    """The store's changes, in-process (the embedded stand-in for ZooKeeper watches).

    Listeners run synchronously, in the order they started watching, after the change is
    durable; what a listener returns to await (a coroutine) runs as a task. A failing listener
    is logged and the others still run: the change itself is already durable."""

    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: list[ChangeListener] = []

    def watch(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def publish(self, change: Change) -> Applied:
        """Tell every listener; returns a future of their asynchronous parts, or None."""
        pending: list[Awaitable[None]] = []
        for listener in tuple(self._listeners):
            try:
                result = listener(change)
            except Exception:
                logger.exception("metadata listener %r failed on %r", listener, change)
                continue
            if result is not None and inspect.isawaitable(result):
                pending.append(result)
        if not pending:
            return None
        return asyncio.gather(*(_logged(p, change) for p in pending))


async def _logged(awaitable: Awaitable[None], change: Change) -> None:
    try:
        await awaitable
    except Exception:
        logger.exception("metadata listener failed on %r", change)


async def applied(result: Applied) -> None:
    """Await what a store mutation's listeners still do (None: nothing)."""
    if result is not None:
        await result


class MetadataStore(Protocol):
    @property
    def changes(self) -> ChangeFeed: ...
    def load_topics(self) -> Iterator[TopicRecord]: ...
    def load_subscriptions(self) -> Iterator[SubscriptionRecord]: ...
    # ``create`` (topics, subscriptions, snapshots): only if no record has the name
    # (AlreadyExists otherwise), so two processes creating one name at once cannot both succeed.
    # ``expected``: only over a stored record whose body is this one (RecordChanged otherwise):
    # an update's read-modify-write, so of two processes updating one resource at once neither
    # undoes the other's fields.
    def put_topic(
        self, record: TopicRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied: ...
    def delete_topic(self, name: str) -> Applied: ...
    def put_subscription(
        self, record: SubscriptionRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied: ...
    def delete_subscription(self, name: str) -> Applied: ...
    def load_snapshots(self) -> Iterator[SnapshotRecord]: ...
    def put_snapshot(
        self, record: SnapshotRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied: ...
    def delete_snapshot(self, name: str) -> Applied: ...
    def load_cursors(self) -> Iterator[CursorRecord]: ...
    def put_cursor(self, record: CursorRecord) -> Applied: ...
    def delete_cursor(self, topic_uid: str, name: str) -> Applied: ...
    def load_schemas(self) -> Iterator[SchemaRecord]: ...
    # ``create``: only if no schema has the name (AlreadyExists otherwise).
    def put_schema(
        self,
        record: SchemaRecord,
        *,
        create: bool = False,
        expected: bytes | EllipsisType | None = ...,
    ) -> Applied: ...
    def delete_schema(self, name: str) -> Applied: ...
    def load_policies(self) -> Iterator[PolicyRecord]: ...
    # ``expected``: store only if the stored record's body is this one (None: none stored), else
    # raise RecordChanged: SetIamPolicy's and schema commits' compare-and-set across processes.
    def put_policy(
        self, record: PolicyRecord, *, expected: bytes | EllipsisType | None = ...
    ) -> Applied: ...
    def delete_policy(self, resource: str) -> Applied: ...
    # Until ``changes`` has published every change other processes completed before the call
    # (a store no other process writes: at once).
    async def caught_up(self) -> None: ...
    def close(self) -> None: ...


# The stored body a conditional put expects (None: no record), or ``...``: no condition.
Expected: TypeAlias = bytes | EllipsisType | None


class RecordChanged(Exception):
    """A conditional put (``expected=``) found another record than the one it expected
    (another process wrote it first)."""


def _check_body(key: str, stored: bytes | None, expected: bytes | EllipsisType | None) -> None:
    if expected is not ... and stored != expected:
        raise RecordChanged(key)


class MemoryMetadataStore:
    """In-memory twin of the embedded store (tests, ephemeral servers)."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicRecord] = {}
        self.subscriptions: dict[str, SubscriptionRecord] = {}
        self.snapshots: dict[str, SnapshotRecord] = {}
        self.cursors: dict[tuple[str, str], CursorRecord] = {}
        self.schemas: dict[str, SchemaRecord] = {}
        self.policies: dict[str, PolicyRecord] = {}
        self._changes = ChangeFeed()

    @property
    def changes(self) -> ChangeFeed:
        return self._changes

    def load_topics(self) -> Iterator[TopicRecord]:
        yield from list(self.topics.values())

    def load_subscriptions(self) -> Iterator[SubscriptionRecord]:
        yield from list(self.subscriptions.values())

    def put_topic(
        self, record: TopicRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied:
        if create and record.name in self.topics:
            raise AlreadyExists("topic", record.name)
        stored = self.topics.get(record.name)
        _check_body(record.name, stored.body if stored else None, expected)
        self.topics[record.name] = record
        return self._changes.publish(Change(record))

    def delete_topic(self, name: str) -> Applied:
        return _deleted(self._changes, self.topics.pop(name, None))

    def put_subscription(
        self, record: SubscriptionRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied:
        if create and record.name in self.subscriptions:
            raise AlreadyExists("subscription", record.name)
        stored_subscription = self.subscriptions.get(record.name)
        _check_body(
            record.name, stored_subscription.body if stored_subscription else None, expected
        )
        self.subscriptions[record.name] = record
        return self._changes.publish(Change(record))

    def delete_subscription(self, name: str) -> Applied:
        return _deleted(self._changes, self.subscriptions.pop(name, None))

    def load_snapshots(self) -> Iterator[SnapshotRecord]:
        yield from list(self.snapshots.values())

    def put_snapshot(
        self, record: SnapshotRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied:
        if create and record.name in self.snapshots:
            raise AlreadyExists("snapshot", record.name)
        stored_snapshot = self.snapshots.get(record.name)
        _check_body(record.name, stored_snapshot.body if stored_snapshot else None, expected)
        self.snapshots[record.name] = record
        return self._changes.publish(Change(record))

    def delete_snapshot(self, name: str) -> Applied:
        return _deleted(self._changes, self.snapshots.pop(name, None))

    def load_cursors(self) -> Iterator[CursorRecord]:
        yield from list(self.cursors.values())

    def put_cursor(self, record: CursorRecord) -> Applied:
        self.cursors[(record.topic_uid, record.name)] = record
        return self._changes.publish(Change(record))

    def delete_cursor(self, topic_uid: str, name: str) -> Applied:
        return _deleted(self._changes, self.cursors.pop((topic_uid, name), None))

    def load_schemas(self) -> Iterator[SchemaRecord]:
        yield from list(self.schemas.values())

    def put_schema(
        self,
        record: SchemaRecord,
        *,
        create: bool = False,
        expected: bytes | EllipsisType | None = ...,
    ) -> Applied:
        if create and record.name in self.schemas:
            raise AlreadyExists("schema", record.name)
        stored = self.schemas.get(record.name)
        _check_body(record.name, stored.body if stored else None, expected)
        self.schemas[record.name] = record
        return self._changes.publish(Change(record))

    def delete_schema(self, name: str) -> Applied:
        return _deleted(self._changes, self.schemas.pop(name, None))

    def load_policies(self) -> Iterator[PolicyRecord]:
        yield from list(self.policies.values())

    def put_policy(
        self, record: PolicyRecord, *, expected: bytes | EllipsisType | None = ...
    ) -> Applied:
        stored = self.policies.get(record.resource)
        _check_body(record.resource, stored.body if stored else None, expected)
        self.policies[record.resource] = record
        return self._changes.publish(Change(record))

    def delete_policy(self, resource: str) -> Applied:
        return _deleted(self._changes, self.policies.pop(resource, None))

    async def caught_up(self) -> None:
        """Nothing to wait for: no other process writes this store."""

    def close(self) -> None:
        pass


def _deleted(changes: ChangeFeed, record: Record | None) -> Applied:
    return changes.publish(Change(record, deleted=True)) if record is not None else None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (name TEXT PRIMARY KEY, uid TEXT NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS subscriptions (
    name TEXT PRIMARY KEY, uid TEXT NOT NULL, topic_uid TEXT NOT NULL, body BLOB NOT NULL,
    start_offsets TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    name TEXT PRIMARY KEY, topic_uid TEXT NOT NULL, body BLOB NOT NULL, cursors TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cursors (
    topic_uid TEXT NOT NULL, name TEXT NOT NULL, topic TEXT NOT NULL, offsets TEXT NOT NULL,
    commit_time_us INTEGER NOT NULL, PRIMARY KEY (topic_uid, name));
CREATE TABLE IF NOT EXISTS schemas (name TEXT PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS policies (resource TEXT PRIMARY KEY, body BLOB NOT NULL);
"""


class SqliteMetadataStore:
    """Embedded metadata store in one SQLite file; every put is a durable transaction.

    A write that fails for lack of disk space raises ``DiskFull`` (RESOURCE_EXHAUSTED, reported
    once per episode by ``disk``); SQLite has rolled it back, so the same call works later."""

    def __init__(self, directory: Path, disk: DiskSpace | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.disk = disk or DiskSpace(directory)
        self.path = directory / METADATA_FILE
        self._changes = ChangeFeed()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            # Opening creates the write-ahead log files: a server started on a full disk
            # cannot open its metadata. Say so, instead of "disk I/O error".
            self._db.close()
            full = self.disk.error(e, disk_space.METADATA)
            if full is not None:
                raise full from e
            raise

    @property
    def changes(self) -> ChangeFeed:
        return self._changes

    def load_topics(self) -> Iterator[TopicRecord]:
        for name, uid, body in self._db.execute("SELECT name, uid, body FROM topics"):
            yield TopicRecord(name, uid, bytes(body))

    def load_subscriptions(self) -> Iterator[SubscriptionRecord]:
        return self._subscriptions("", ())

    def _subscriptions(self, where: str, params: tuple[Any, ...]) -> Iterator[SubscriptionRecord]:
        rows = self._db.execute(
            f"SELECT name, uid, topic_uid, body, start_offsets FROM subscriptions {where}", params
        )
        for name, uid, topic_uid, body, starts in rows:
            offsets = {int(k): int(v) for k, v in json.loads(starts).items()}
            yield SubscriptionRecord(name, uid, topic_uid, bytes(body), offsets)

    def put_topic(
        self, record: TopicRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied:
        with self._compared("topics", "name", record.name, expected):
            self._write(
                f"INSERT {'' if create else 'OR REPLACE '}INTO topics (name, uid, body) "
                "VALUES (?, ?, ?)",
                (record.name, record.uid, record.body),
                exists=("topic", record.name),
            )
        return self._changes.publish(Change(record))

    def delete_topic(self, name: str) -> Applied:
        rows = self._db.execute("SELECT name, uid, body FROM topics WHERE name = ?", (name,))
        found = [TopicRecord(n, u, bytes(b)) for n, u, b in rows]
        self._write("DELETE FROM topics WHERE name = ?", (name,))
        return _deleted(self._changes, found[0] if found else None)

    def put_subscription(
        self, record: SubscriptionRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied:
        with self._compared("subscriptions", "name", record.name, expected):
            self._write(
                f"INSERT {'' if create else 'OR REPLACE '}INTO subscriptions "
                "(name, uid, topic_uid, body, start_offsets) VALUES (?, ?, ?, ?, ?)",
                (
                    record.name,
                    record.uid,
                    record.topic_uid,
                    record.body,
                    json.dumps({str(k): v for k, v in record.start_offsets.items()}),
                ),
                exists=("subscription", record.name),
            )
        return self._changes.publish(Change(record))

    def delete_subscription(self, name: str) -> Applied:
        found = list(self._subscriptions("WHERE name = ?", (name,)))
        self._write("DELETE FROM subscriptions WHERE name = ?", (name,))
        return _deleted(self._changes, found[0] if found else None)

    def load_snapshots(self) -> Iterator[SnapshotRecord]:
        return self._snapshots("", ())

    def _snapshots(self, where: str, params: tuple[Any, ...]) -> Iterator[SnapshotRecord]:
        rows = self._db.execute(
            f"SELECT name, topic_uid, body, cursors FROM snapshots {where}", params
        )
        for name, topic_uid, body, cursors in rows:
            yield SnapshotRecord(
                name,
                topic_uid,
                bytes(body),
                {
                    int(k): (int(md), [(int(s), int(e)) for s, e in ranges])
                    for k, (md, ranges) in json.loads(cursors).items()
                },
            )

    def put_snapshot(
        self, record: SnapshotRecord, *, create: bool = False, expected: Expected = ...
    ) -> Applied:
        with self._compared("snapshots", "name", record.name, expected):
            self._write(
                f"INSERT {'' if create else 'OR REPLACE '}INTO snapshots "
                "(name, topic_uid, body, cursors) VALUES (?, ?, ?, ?)",
                (
                    record.name,
                    record.topic_uid,
                    record.body,
                    json.dumps(
                        {str(k): [md, ranges] for k, (md, ranges) in record.cursors.items()}
                    ),
                ),
                exists=("snapshot", record.name),
            )
        return self._changes.publish(Change(record))

    def delete_snapshot(self, name: str) -> Applied:
        found = list(self._snapshots("WHERE name = ?", (name,)))
        self._write("DELETE FROM snapshots WHERE name = ?", (name,))
        return _deleted(self._changes, found[0] if found else None)

    def load_cursors(self) -> Iterator[CursorRecord]:
        return self._cursors("", ())

    def _cursors(self, where: str, params: tuple[Any, ...]) -> Iterator[CursorRecord]:
        rows = self._db.execute(
            f"SELECT topic_uid, name, topic, offsets, commit_time_us FROM cursors {where}", params
        )
        for topic_uid, name, topic, offsets, commit_time_us in rows:
            parsed = {int(k): int(v) for k, v in json.loads(offsets).items()}
            yield CursorRecord(topic_uid, name, topic, parsed, int(commit_time_us))

    def put_cursor(self, record: CursorRecord) -> Applied:
        self._write(
            "INSERT OR REPLACE INTO cursors (topic_uid, name, topic, offsets, commit_time_us) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                record.topic_uid,
                record.name,
                record.topic,
                json.dumps({str(k): v for k, v in record.offsets.items()}),
                record.commit_time_us,
            ),
        )
        return self._changes.publish(Change(record))

    def delete_cursor(self, topic_uid: str, name: str) -> Applied:
        where = "WHERE topic_uid = ? AND name = ?"
        found = list(self._cursors(where, (topic_uid, name)))
        self._write(f"DELETE FROM cursors {where}", (topic_uid, name))
        return _deleted(self._changes, found[0] if found else None)

    def load_schemas(self) -> Iterator[SchemaRecord]:
        return self._schemas("", ())

    def _schemas(self, where: str, params: tuple[Any, ...]) -> Iterator[SchemaRecord]:
        for name, body in self._db.execute(f"SELECT name, body FROM schemas {where}", params):
            yield SchemaRecord(name, bytes(body))

    def put_schema(
        self,
        record: SchemaRecord,
        *,
        create: bool = False,
        expected: bytes | EllipsisType | None = ...,
    ) -> Applied:
        with self._compared("schemas", "name", record.name, expected):
            self._write(
                f"INSERT {'' if create else 'OR REPLACE '}INTO schemas (name, body) VALUES (?, ?)",
                (record.name, record.body),
                exists=("schema", record.name),
            )
        return self._changes.publish(Change(record))

    def delete_schema(self, name: str) -> Applied:
        found = list(self._schemas("WHERE name = ?", (name,)))
        self._write("DELETE FROM schemas WHERE name = ?", (name,))
        return _deleted(self._changes, found[0] if found else None)

    def load_policies(self) -> Iterator[PolicyRecord]:
        for resource, body in self._db.execute("SELECT resource, body FROM policies"):
            yield PolicyRecord(resource, bytes(body))

    def put_policy(
        self, record: PolicyRecord, *, expected: bytes | EllipsisType | None = ...
    ) -> Applied:
        with self._compared("policies", "resource", record.resource, expected):
            self._write(
                "INSERT OR REPLACE INTO policies (resource, body) VALUES (?, ?)",
                (record.resource, record.body),
            )
        return self._changes.publish(Change(record))

    def delete_policy(self, resource: str) -> Applied:
        rows = self._db.execute("SELECT body FROM policies WHERE resource = ?", (resource,))
        found = [PolicyRecord(resource, bytes(body)) for (body,) in rows]
        self._write("DELETE FROM policies WHERE resource = ?", (resource,))
        return _deleted(self._changes, found[0] if found else None)

    @contextlib.contextmanager
    def _compared(
        self, table: str, column: str, key: str, expected: bytes | EllipsisType | None
    ) -> Iterator[None]:
        """Run the body's write only if ``table``'s row under ``key`` still has the ``expected``
        body (None: no row), else raise RecordChanged: the read, the compare and the write are
        one IMMEDIATE transaction (the write lock taken before the read), so no writer on this
        file, in this process or another, can come in between. ``...``: no condition."""
        if expected is ...:
            yield
            return
        with self.disk.guard(disk_space.METADATA):
            self._db.execute("BEGIN IMMEDIATE")
        try:
            rows = self._db.execute(f"SELECT body FROM {table} WHERE {column} = ?", (key,))
            stored = [bytes(body) for (body,) in rows]
            _check_body(key, stored[0] if stored else None, expected)
            yield
            with self.disk.guard(disk_space.METADATA):
                self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise

    def _write(
        self, sql: str, params: tuple[Any, ...], exists: tuple[str, str] | None = None
    ) -> None:
        with self.disk.guard(disk_space.METADATA):
            try:
                self._db.execute(sql, params)
            except sqlite3.IntegrityError as e:
                if exists is None:
                    raise
                raise AlreadyExists(*exists) from e  # a create of a name already there
            except sqlite3.Error:
                if self._db.in_transaction:  # SQLite may leave it open after SQLITE_FULL
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    async def caught_up(self) -> None:
        """Nothing to wait for: no other process writes this store."""

    def close(self) -> None:
        self._db.close()
