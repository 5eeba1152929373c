"""Contract of the ``MetadataStore`` protocol (storage/metadata.py), run against every
implementation: the in-memory twin, the embedded SQLite store and the ZooKeeper store
(storage/zk_metadata.py, on one standalone ZooKeeper node for the session; a place is a root;
also with a digest credential, so every znode it writes carries an ACL).

What the protocol promises, as the catalog, snapshots and named cursors use it (and, for the
change feed the forwarders follow, the end of this file):
- ``put_*`` stores a record under its key (topics, subscriptions and snapshots by name, cursors
  by topic uid and name); a second put under the same key replaces the first.
- ``put_topic``/``put_subscription``/``put_snapshot``/``put_schema`` with ``create=True`` store
  only under a new key: a name already there raises AlreadyExists and keeps the record (two
  processes creating one name at once: one wins).
- ``put_policy`` with ``expected`` stores only over that stored body (None: none stored), else
  raises RecordChanged (two processes' SetIamPolicy at once: one wins).
- ``delete_*`` removes the record under a key; deleting a missing key is a no-op.
- ``load_*`` yields every stored record of its kind, equal to what was put, once each. No order is
  promised (every caller indexes what it loads by key), so the suite compares by key.
- Deleting while a ``load_*`` iteration is under way is allowed (Cursors.load drops the cursors
  of deleted topics that way): the iteration still yields every record once.
- Kinds are independent: deleting a topic leaves its subscriptions, snapshots and cursors (a
  deleted topic's data stays while subscriptions still read it, ARCHITECTURE.md).
- A durable store holds everything after close and reopen, loading the same records in the same
  order; a put is committed when it returns (another store opened on the same place sees it
  while the first is still open, as after a kill -9).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pubsubd.coordination.credentials import DigestCredential
from pubsubd.coordination.ensemble import Ensemble
from pubsubd.core.errors import AlreadyExists
from pubsubd.storage.metadata import (
    CursorRecord,
    MemoryMetadataStore,
    MetadataStore,
    PolicyRecord,
    RecordChanged,
    SchemaRecord,
    SnapshotRecord,
    SqliteMetadataStore,
    SubscriptionRecord,
    TopicRecord,
)
from pubsubd.storage.zk_metadata import ZooKeeperMetadataStore

pytest_plugins = ["tests.support.zookeeper"]
pytestmark = pytest.mark.unit


# --- the implementations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Store:
    """One implementation under contract: how to open it on a place (a directory), and whether
    what it holds survives closing and opening it again there."""

    name: str
    open: Callable[[Path], MetadataStore]
    durable: bool
    # A store on a service that a session fixture runs: the fixture's name, and how to open the
    # store on a place given the fixture's value (``open`` is then that, see ``_ready``).
    service: str | None = None
    on_service: Callable[[Any], Callable[[Path], MetadataStore]] | None = None


def _needs_service(_place: Path) -> MetadataStore:
    raise RuntimeError("this store runs on a service: open it through the impl fixture")


def _on_zookeeper(ensemble: Ensemble) -> Callable[[Path], MetadataStore]:
    """The place is a root named after the test's directory: opening the same place again
    finds the same records, and no two tests share a root."""

    def open_store(place: Path) -> MetadataStore:
        root = "/t-" + hashlib.sha1(str(place).encode()).hexdigest()[:16]
        return ZooKeeperMetadataStore.connect(ensemble.connect_string, root, session_timeout=4.0)

    return open_store


def _on_zookeeper_with_auth(ensemble: Ensemble) -> Callable[[Path], MetadataStore]:
    """As ``_on_zookeeper``, with a digest credential: every znode the store creates carries
    an ACL naming that identity only (``cluster up --zk-auth``)."""

    def open_store(place: Path) -> MetadataStore:
        root = "/t-auth-" + hashlib.sha1(str(place).encode()).hexdigest()[:16]
        return ZooKeeperMetadataStore.connect(
            ensemble.connect_string, root, session_timeout=4.0, auth=ZK_CREDENTIAL
        )

    return open_store


ZK_CREDENTIAL = DigestCredential("pubsubd", "contract")
STORES = [
    Store("memory", lambda _place: MemoryMetadataStore(), durable=False),
    Store("sqlite", SqliteMetadataStore, durable=True),
    Store("zookeeper", _needs_service, True, service="zookeeper", on_service=_on_zookeeper),
    Store(
        "zookeeper-auth",
        _needs_service,
        True,
        service="zookeeper",
        on_service=_on_zookeeper_with_auth,
    ),
]
DURABLE = [s for s in STORES if s.durable]


def _ready(store: Store, request: pytest.FixtureRequest) -> Store:
    if store.service is None or store.on_service is None:
        return store
    service = request.getfixturevalue(store.service)
    return dataclasses.replace(store, open=store.on_service(service))


@pytest.fixture(params=STORES, ids=lambda s: s.name)
def impl(request: pytest.FixtureRequest) -> Store:
    return _ready(request.param, request)


@pytest.fixture(params=DURABLE, ids=lambda s: s.name)
def durable(request: pytest.FixtureRequest) -> Store:
    return _ready(request.param, request)


@pytest.fixture
def store(impl: Store, tmp_path: Path) -> Iterator[MetadataStore]:
    opened = impl.open(tmp_path)
    yield opened
    opened.close()


# --- the kinds of records ------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One kind of record and the protocol's methods for it."""

    name: str
    make: Callable[[int, str], Any]  # record number i, with a variant tag in its content
    put: Callable[[MetadataStore, Any], None]
    delete: Callable[[MetadataStore, Any], None]
    load: Callable[[MetadataStore], Iterator[Any]]
    key: Callable[[Any], Hashable]


def _topic(i: int, tag: str) -> TopicRecord:
    return TopicRecord(f"projects/p/topics/t{i}", f"uid-{tag}-{i}", f"topic {tag} {i}".encode())


def _subscription(i: int, tag: str) -> SubscriptionRecord:
    # Sync points: none, one source, several sources with offsets beyond 32 bits.
    starts = [{}, {0: i}, {0: 5, 1: 0, 7: (1 << 47) + i}][i % 3]
    return SubscriptionRecord(
        f"projects/p/subscriptions/s{i}",
        f"sub-uid-{tag}-{i}",
        f"uid-{i % 2}",
        b"\x00\xff" + tag.encode() + bytes([i % 256]),
        dict(starts),
    )


def _snapshot(i: int, tag: str) -> SnapshotRecord:
    cursors: list[dict[int, tuple[int, list[tuple[int, int]]]]] = [
        {},
        {0: (i, [])},
        {0: (3, [(5, 9), (12, 13)]), 2: ((1 << 40) + i, [((1 << 40) + i + 2, (1 << 41))])},
    ]
    return SnapshotRecord(
        f"projects/p/snapshots/n{i}", f"uid-{i % 2}", tag.encode() * 3, cursors[i % 3]
    )


def _cursor(i: int, tag: str) -> CursorRecord:
    # Two topic incarnations share cursor names: the key is (topic uid, name).
    return CursorRecord(
        f"uid-{i % 2}",
        f"cursor-{i // 2}",
        f"projects/p/topics/t{i % 2}-{tag}",
        {0: i, 3: 1 << 47} if i % 2 else {},
        (1 << 62) + i,
    )


def _schema(i: int, tag: str) -> SchemaRecord:
    # A schema's revisions travel as one opaque body (control/schemas.py).
    return SchemaRecord(f"projects/p/schemas/sc{i}", b"\x0a\x02" + tag.encode() * (i + 1))


def _policy(i: int, tag: str) -> PolicyRecord:
    kind = ("topics", "subscriptions", "snapshots", "schemas")[i % 4]
    return PolicyRecord(f"projects/p/{kind}/r{i}", b"\x08\x01" + tag.encode() * (i + 1))


KINDS = [
    Kind(
        "topics",
        _topic,
        lambda s, r: s.put_topic(r),
        lambda s, r: s.delete_topic(r.name),
        lambda s: s.load_topics(),
        lambda r: r.name,
    ),
    Kind(
        "subscriptions",
        _subscription,
        lambda s, r: s.put_subscription(r),
        lambda s, r: s.delete_subscription(r.name),
        lambda s: s.load_subscriptions(),
        lambda r: r.name,
    ),
    Kind(
        "snapshots",
        _snapshot,
        lambda s, r: s.put_snapshot(r),
        lambda s, r: s.delete_snapshot(r.name),
        lambda s: s.load_snapshots(),
        lambda r: r.name,
    ),
    Kind(
        "cursors",
        _cursor,
        lambda s, r: s.put_cursor(r),
        lambda s, r: s.delete_cursor(r.topic_uid, r.name),
        lambda s: s.load_cursors(),
        lambda r: (r.topic_uid, r.name),
    ),
    Kind(
        "schemas",
        _schema,
        lambda s, r: s.put_schema(r),
        lambda s, r: s.delete_schema(r.name),
        lambda s: s.load_schemas(),
        lambda r: r.name,
    ),
    Kind(
        "policies",
        _policy,
        lambda s, r: s.put_policy(r),
        lambda s, r: s.delete_policy(r.resource),
        lambda s: s.load_policies(),
        lambda r: r.resource,
    ),
]


@pytest.fixture(params=KINDS, ids=lambda k: k.name)
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param


def _by_key(kind: Kind, store: MetadataStore) -> dict[Hashable, Any]:
    loaded = list(kind.load(store))
    by_key = {kind.key(r): r for r in loaded}
    assert len(by_key) == len(loaded), "a key loaded twice"
    return by_key


def _fill(kind: Kind, store: MetadataStore, count: int = 6, tag: str = "a") -> dict[Hashable, Any]:
    records = [kind.make(i, tag) for i in range(count)]
    for record in records:
        kind.put(store, record)
    return {kind.key(r): r for r in records}


def _all(store: MetadataStore) -> dict[str, list[Any]]:
    """Everything a store loads, kind by kind, in the order it loads it."""
    return {k.name: list(k.load(store)) for k in KINDS}


# --- the contract -------------------------------------------------------------------------------


def test_a_new_store_loads_nothing(store: MetadataStore) -> None:
    assert _all(store) == {k.name: [] for k in KINDS}


def test_put_records_load_back_equal(kind: Kind, store: MetadataStore) -> None:
    expected = _fill(kind, store)
    assert len(expected) == 6
    assert _by_key(kind, store) == expected


def test_a_put_under_an_existing_key_replaces_the_record(kind: Kind, store: MetadataStore) -> None:
    expected = _fill(kind, store, tag="old")
    for i in (1, 4):
        new = kind.make(i, "new")  # the same key, other content
        assert new != expected[kind.key(new)]
        kind.put(store, new)
        expected[kind.key(new)] = new
    assert _by_key(kind, store) == expected


def test_a_create_under_an_existing_name_is_refused_and_keeps_the_record(
    store: MetadataStore,
) -> None:
    topic = _topic(1, "a")
    store.put_topic(topic, create=True)
    with pytest.raises(AlreadyExists):
        store.put_topic(_topic(1, "b"), create=True)
    assert list(store.load_topics()) == [topic]
    sub = _subscription(1, "a")
    store.put_subscription(sub, create=True)
    with pytest.raises(AlreadyExists):
        store.put_subscription(_subscription(1, "b"), create=True)
    assert list(store.load_subscriptions()) == [sub]
    schema = _schema(1, "a")
    store.put_schema(schema, create=True)
    with pytest.raises(AlreadyExists):
        store.put_schema(_schema(1, "b"), create=True)
    assert list(store.load_schemas()) == [schema]
    snapshot = _snapshot(1, "a")
    store.put_snapshot(snapshot, create=True)
    with pytest.raises(AlreadyExists):
        store.put_snapshot(_snapshot(1, "b"), create=True)
    assert list(store.load_snapshots()) == [snapshot]
    store.put_topic(_topic(1, "c"))  # without create: replaced
    assert [t.body for t in store.load_topics()] == [_topic(1, "c").body]


def test_a_conditional_policy_put_stores_only_over_the_expected_policy(
    store: MetadataStore,
) -> None:
    """SetIamPolicy's compare-and-set: ``expected`` is the body the caller last saw (None: no
    policy); any other stored body raises RecordChanged and keeps what is stored."""
    first = PolicyRecord("projects/p/topics/t", b"first")
    store.put_policy(first, expected=None)
    with pytest.raises(RecordChanged):
        store.put_policy(PolicyRecord(first.resource, b"lost"), expected=None)
    second = PolicyRecord(first.resource, b"second")
    store.put_policy(second, expected=b"first")
    with pytest.raises(RecordChanged):  # a writer that still saw the first one
        store.put_policy(PolicyRecord(first.resource, b"stale"), expected=b"first")
    assert list(store.load_policies()) == [second]
    store.put_policy(PolicyRecord(first.resource, b"any"))  # unconditional: replaced
    assert [p.body for p in store.load_policies()] == [b"any"]


def test_of_two_stores_on_one_place_setting_a_policy_from_the_same_view_one_wins(
    durable: Store, tmp_path: Path
) -> None:
    """Two processes' SetIamPolicy with the same etag: each store (SQLite: its own connection to
    the file; ZooKeeper: its own session) compares and writes as one step, so the second
    conditional put over what both saw fails, and a refused put leaves its store usable."""
    first, second = durable.open(tmp_path), durable.open(tmp_path)
    try:
        resource = "projects/p/topics/t"
        seen = b"seen"
        first.put_policy(PolicyRecord(resource, seen), expected=None)
        first.put_policy(PolicyRecord(resource, b"first wins"), expected=seen)
        with pytest.raises(RecordChanged):
            second.put_policy(PolicyRecord(resource, b"second loses"), expected=seen)
        assert [p.body for p in second.load_policies()] == [b"first wins"]
        second.put_policy(PolicyRecord(resource, b"second, seeing it"), expected=b"first wins")
        with pytest.raises(RecordChanged):  # no policy stored, as it believed: refused
            first.put_policy(PolicyRecord(resource, b"create"), expected=None)
        second.put_policy(PolicyRecord(resource, b"unconditional"))  # nothing left half-done
        assert [p.body for p in first.load_policies()] == [b"unconditional"]
    finally:
        first.close()
        second.close()


def test_of_two_stores_on_one_place_creating_one_snapshot_name_one_wins(
    durable: Store, tmp_path: Path
) -> None:
    """Two processes' CreateSnapshot of one name, each having checked that the name is free:
    each store's create-only put (SQLite: a plain INSERT on its own connection to the file;
    ZooKeeper: a create in its own session) lets the first in and refuses the second with
    AlreadyExists, keeping the first's record; the refused store stays usable."""
    first, second = durable.open(tmp_path), durable.open(tmp_path)
    try:
        assert list(first.load_snapshots()) == list(second.load_snapshots()) == []
        won = _snapshot(1, "first")
        first.put_snapshot(won, create=True)
        with pytest.raises(AlreadyExists):
            second.put_snapshot(_snapshot(1, "second"), create=True)
        assert list(second.load_snapshots()) == [won]
        with pytest.raises(AlreadyExists):  # and the other way round
            first.put_snapshot(_snapshot(1, "again"), create=True)
        other = _snapshot(2, "second")
        second.put_snapshot(other, create=True)  # nothing left half-done
        assert {s.name: s for s in first.load_snapshots()} == {won.name: won, other.name: other}
    finally:
        first.close()
        second.close()


def test_a_conditional_schema_put_stores_only_over_the_expected_revisions(
    store: MetadataStore,
) -> None:
    schema = _schema(1, "a")
    store.put_schema(schema, create=True)
    newer = dataclasses.replace(schema, body=b"a+b")
    store.put_schema(newer, expected=schema.body)
    with pytest.raises(RecordChanged):  # a commit that still saw the first revision
        store.put_schema(dataclasses.replace(schema, body=b"a+c"), expected=schema.body)
    assert list(store.load_schemas()) == [newer]
    with pytest.raises(RecordChanged):  # deleted meanwhile
        store.delete_schema(schema.name)
        store.put_schema(newer, expected=newer.body)
    assert list(store.load_schemas()) == []


# Update{Topic,Subscription,Snapshot}: a put over the body the updater read.
UPDATED = [
    ("topics", _topic, lambda s, r, e: s.put_topic(r, expected=e), lambda s: s.load_topics()),
    (
        "subscriptions",
        _subscription,
        lambda s, r, e: s.put_subscription(r, expected=e),
        lambda s: s.load_subscriptions(),
    ),
    (
        "snapshots",
        _snapshot,
        lambda s, r, e: s.put_snapshot(r, expected=e),
        lambda s: s.load_snapshots(),
    ),
]


@pytest.mark.parametrize(("name", "make", "put_over", "load"), UPDATED, ids=[u[0] for u in UPDATED])
def test_of_two_stores_on_one_place_updating_one_resource_from_the_same_view_one_wins(
    durable: Store,
    tmp_path: Path,
    name: str,
    make: Callable[[int, str], Any],
    put_over: Callable[[MetadataStore, Any, bytes | None], Any],
    load: Callable[[MetadataStore], Iterator[Any]],
) -> None:
    """Two processes update one topic (subscription, snapshot) read at the same version: the
    second put over the body both read fails with RecordChanged and stores nothing, so it
    cannot undo the first's change; it succeeds over what the first wrote. A put expecting a
    record that was deleted fails too."""
    first, second = durable.open(tmp_path), durable.open(tmp_path)
    try:
        seen = make(1, "seen")
        first_put = getattr(first, f"put_{name.rstrip('s')}")
        first_put(seen, create=True)
        won = dataclasses.replace(seen, body=b"first wins")
        put_over(first, won, seen.body)
        with pytest.raises(RecordChanged):
            put_over(second, dataclasses.replace(seen, body=b"second loses"), seen.body)
        assert [r.body for r in load(second)] == [b"first wins"]
        put_over(second, dataclasses.replace(seen, body=b"second, seeing it"), b"first wins")
        assert [r.body for r in load(first)] == [b"second, seeing it"]
        getattr(first, f"delete_{name.rstrip('s')}")(seen.name)
        with pytest.raises(RecordChanged):  # deleted meanwhile: not brought back
            put_over(second, dataclasses.replace(seen, body=b"after"), b"second, seeing it")
        assert list(load(first)) == list(load(second)) == []
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize(("name", "make", "put_over", "load"), UPDATED, ids=[u[0] for u in UPDATED])
def test_a_conditional_update_stores_only_over_the_body_it_read(
    store: MetadataStore,
    name: str,
    make: Callable[[int, str], Any],
    put_over: Callable[[MetadataStore, Any, bytes | None], Any],
    load: Callable[[MetadataStore], Iterator[Any]],
) -> None:
    record = make(2, "read")
    getattr(store, f"put_{name.rstrip('s')}")(record, create=True)
    with pytest.raises(RecordChanged):  # an update over a body nobody stored
        put_over(store, dataclasses.replace(record, body=b"stale"), b"another body")
    with pytest.raises(RecordChanged):  # over no record, when one is stored
        put_over(store, dataclasses.replace(record, body=b"stale"), None)
    assert list(load(store)) == [record]
    updated = dataclasses.replace(record, body=b"updated")
    put_over(store, updated, record.body)
    assert list(load(store)) == [updated]


def test_delete_removes_only_its_record_and_a_missing_key_is_a_no_op(
    kind: Kind, store: MetadataStore
) -> None:
    expected = _fill(kind, store)
    gone = kind.make(2, "a")
    kind.delete(store, gone)
    del expected[kind.key(gone)]
    kind.delete(store, gone)  # again: nothing there, no error
    kind.delete(store, kind.make(99, "a"))  # never stored
    assert _by_key(kind, store) == expected


def test_deleting_during_a_load_visits_every_record_once(kind: Kind, store: MetadataStore) -> None:
    expected = _fill(kind, store, count=10)
    seen = []
    for record in kind.load(store):
        seen.append(kind.key(record))
        if len(seen) % 2:
            kind.delete(store, record)
    assert sorted(seen, key=repr) == sorted(expected, key=repr)
    assert _by_key(kind, store) == {key: expected[key] for key in seen[1::2]}


def test_kinds_are_independent(store: MetadataStore) -> None:
    """Deleting a topic leaves what refers to its uid; a name may be used by every kind."""
    filled = {k.name: _fill(k, store, count=4) for k in KINDS}
    for topic in filled["topics"].values():
        store.delete_topic(topic.name)
    store.delete_subscription("projects/p/topics/t0")  # a topic's name: no subscription has it
    loaded = {k.name: _by_key(k, store) for k in KINDS}
    assert loaded == {**filled, "topics": {}}


def test_cursor_keys_are_topic_uid_and_name(store: MetadataStore) -> None:
    first = CursorRecord("uid-1", "reader", "projects/p/topics/t", {0: 1}, 10)
    second = CursorRecord("uid-2", "reader", "projects/p/topics/t", {0: 2}, 20)
    store.put_cursor(first)
    store.put_cursor(second)
    store.delete_cursor("uid-1", "other")
    store.delete_cursor("uid-3", "reader")
    assert sorted(store.load_cursors(), key=lambda r: r.topic_uid) == [first, second]
    store.delete_cursor("uid-1", "reader")
    assert list(store.load_cursors()) == [second]


# --- durable stores -----------------------------------------------------------------------------


def test_a_durable_store_loads_the_same_after_reopen(durable: Store, tmp_path: Path) -> None:
    store = durable.open(tmp_path)
    for kind in KINDS:
        _fill(kind, store, count=8, tag="first")
        kind.put(store, kind.make(3, "second"))  # replaced
        kind.delete(store, kind.make(5, "first"))  # deleted
    before = _all(store)
    store.close()

    again = durable.open(tmp_path)
    try:
        assert _all(again) == before  # same records, in the same order
        assert all(len(records) == 7 for records in before.values())
    finally:
        again.close()


def test_a_put_is_committed_when_it_returns(durable: Store, tmp_path: Path) -> None:
    """Another store opened on the same place sees every put and delete while the first is
    still open (nothing waits for a close: what a kill -9 leaves is what was answered)."""
    writer = durable.open(tmp_path)
    reader = None
    try:
        for kind in KINDS:
            _fill(kind, writer, count=3)
            kind.delete(writer, kind.make(0, "a"))
        reader = durable.open(tmp_path)
        assert _all(reader) == _all(writer)
        assert all(len(records) == 2 for records in _all(reader).values())
    finally:
        if reader is not None:
            reader.close()
        writer.close()


# --- the change feed ----------------------------------------------------------------------------
# Every change is published on ``store.changes`` once durable, deletes with the record deleted;
# deleting a missing key publishes nothing; what a listener returns to await is gathered into
# the mutation's result; a failing listener does not keep the others from hearing.


def test_every_change_is_published_once_durable(kind: Kind, impl: Store, tmp_path: Path) -> None:
    store = impl.open(tmp_path)
    heard: list[tuple[Any, bool, list[Any]]] = []
    store.changes.watch(lambda c: heard.append((c.record, c.deleted, list(kind.load(store)))))
    record = kind.make(1, "a")
    kind.put(store, record)
    replaced = kind.make(1, "b")
    kind.put(store, replaced)
    kind.delete(store, replaced)
    kind.delete(store, replaced)  # missing: nothing to tell
    assert [(r, d) for r, d, _ in heard] == [(record, False), (replaced, False), (replaced, True)]
    # Each listener ran after the change was in the store.
    assert [len(seen) for _, _, seen in heard] == [1, 1, 0]
    store.close()


async def test_listeners_awaitables_are_gathered_and_failures_contained(
    impl: Store, tmp_path: Path
) -> None:
    store = impl.open(tmp_path)
    done: list[str] = []

    def failing(_change: Any) -> None:
        raise RuntimeError("a broken listener")

    async def slow(change: Any) -> None:
        done.append(change.record.name)

    store.changes.watch(failing)
    store.changes.watch(slow)
    pending = store.put_topic(_topic(1, "a"))
    assert pending is not None and done == []
    await pending
    assert done == ["projects/p/topics/t1"]
    store.close()
