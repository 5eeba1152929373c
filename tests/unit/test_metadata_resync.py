"""The metadata follower after a lost connection: kazoo drops every watch, and the server the
session reconnects to may be one just back from a crash whose answers predate changes others
completed meanwhile. The follower reads again only after a sync (the server catches up with the
leader), so it publishes every change made while it was away. A fake server stands in for
ZooKeeper: its view of the tree lags the leader's until a sync, and it fires no watch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pubsubd.coordination.errors import CoordinationUnavailable, NoNode
from pubsubd.coordination.zk import EventType, SessionState, WatchEvent, ZnodeStat
from pubsubd.storage.metadata import Change, ChangeFeed, TopicRecord
from pubsubd.storage.zk_metadata import (
    TOPICS,
    MetadataLayout,
    ZooKeeperMetadataStore,
    _Follower,
    encode,
)

pytestmark = pytest.mark.unit

Watch = Callable[[WatchEvent], None]


def _stat(czxid: int, mzxid: int) -> ZnodeStat:
    return ZnodeStat(czxid, mzxid, mzxid, 0, 0, 0, 0, 0, 0, 0)


@dataclass
class _LaggingServer:
    """The leader's tree, and the view a reconnected server answers from until a sync."""

    root: str = "/m"
    leader: dict[str, tuple[bytes, int, int]] = field(default_factory=dict)
    view: dict[str, tuple[bytes, int, int]] = field(default_factory=dict)
    zxid: int = 0
    connected: bool = True
    request_timeout: float = 1.0
    watches: dict[str, set[Watch]] = field(default_factory=dict)
    listeners: list[Callable[[SessionState], None]] = field(default_factory=list)
    syncs: int = 0

    # -- what the follower calls ---------------------------------------------------------------

    def on_state(self, callback: Callable[[SessionState], None]) -> Callable[[], None]:
        self.listeners.append(callback)
        return lambda: self.listeners.remove(callback)

    async def sync(self, path: str) -> None:
        self._require_connection()
        self.syncs += 1
        self.view = dict(self.leader)

    async def children(self, path: str, *, watch: Watch | None = None) -> list[str]:
        self._require_connection()
        self._arm(path, watch)
        prefix = path + "/"
        return sorted(
            {p[len(prefix) :].split("/")[0] for p in self._paths() if p.startswith(prefix)}
        )

    async def get(self, path: str, *, watch: Watch | None = None) -> tuple[bytes, ZnodeStat]:
        self._require_connection()
        if path not in self.view:
            raise NoNode("no such znode", path)
        self._arm(path, watch)
        data, czxid, mzxid = self.view[path]
        return data, _stat(czxid, mzxid)

    async def get_many(
        self, paths: list[str], *, watch: Watch | None = None
    ) -> list[tuple[bytes, ZnodeStat] | None]:
        found: list[tuple[bytes, ZnodeStat] | None] = []
        for path in paths:
            try:
                found.append(await self.get(path, watch=watch))
            except NoNode:
                found.append(None)
        return found

    # -- what the test does --------------------------------------------------------------------

    def write(self, path: str, data: bytes) -> None:
        """Another process's write, at the leader (and at the view of a connected server)."""
        self.zxid += 1
        czxid = self.leader[path][1] if path in self.leader else self.zxid
        self.leader[path] = (data, czxid, self.zxid)
        if self.connected:
            self.view = dict(self.leader)

    def write_unseen(self, path: str, data: bytes) -> None:
        """Another process's write, completed at the leader, that this session's server has
        not applied yet (it was not in that write's quorum)."""
        self.zxid += 1
        self.leader[path] = (data, self.zxid, self.zxid)

    def delete(self, path: str) -> None:
        self.zxid += 1
        del self.leader[path]
        if self.connected:
            self.view = dict(self.leader)

    def lose_connection(self) -> None:
        """kazoo's SUSPENDED: every watch is dropped, each told with an event of no type."""
        self.connected = False
        for listener in self.listeners:
            listener(SessionState.SUSPENDED)
        dropped, self.watches = self.watches, {}
        for path, watches in dropped.items():
            for watch in watches:
                watch(WatchEvent(EventType.NONE, path))

    def reconnect_to_a_lagging_server(self) -> None:
        """The session comes back on a server whose view is still from before the loss."""
        self.connected = True
        for listener in self.listeners:
            listener(SessionState.CONNECTED)

    def _require_connection(self) -> None:
        if not self.connected:
            raise CoordinationUnavailable("disconnected", None)

    def _arm(self, path: str, watch: Watch | None) -> None:
        if watch is not None:
            self.watches.setdefault(path, set()).add(watch)

    def _paths(self) -> set[str]:
        """Every znode of the view with its ancestors under the root."""
        paths: set[str] = set()
        for path in self.view:
            while path.startswith(self.root + "/"):
                paths.add(path)
                path = path.rpartition("/")[0]
        return paths


@dataclass
class _Store:
    """What the follower needs of its store."""

    coordinator: Any
    layout: MetadataLayout
    kinds: tuple[Any, ...] = (TOPICS,)
    changes: ChangeFeed = field(default_factory=ChangeFeed)
    _follower: Any = None


async def _until(condition: Callable[[], bool], within: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_changes_made_while_away_are_heard_from_a_server_that_had_not_caught_up() -> None:
    server = _LaggingServer()
    layout = MetadataLayout("/m", (TOPICS,))
    kept = TopicRecord("projects/p/topics/kept", "u1", b"v1")
    gone = TopicRecord("projects/p/topics/gone", "u2", b"")
    for record in (kept, gone):
        server.write(layout.record(TOPICS, record), encode(record))
    store = _Store(server, layout)
    follower = _Follower(store)  # type: ignore[arg-type]
    heard: list[tuple[object, bool]] = []

    def listener(change: Change) -> None:
        heard.append((change.record, change.deleted))

    try:
        await follower.scan()
        store.changes.watch(listener)

        server.lose_connection()
        changed = TopicRecord(kept.name, kept.uid, b"v2")
        added = TopicRecord("projects/p/topics/added", "u3", b"")
        server.write(layout.record(TOPICS, changed), encode(changed))
        server.write(layout.record(TOPICS, added), encode(added))
        server.delete(layout.record(TOPICS, gone))
        await asyncio.sleep(0.1)  # the follower's reads fail while disconnected
        assert heard == []
        server.reconnect_to_a_lagging_server()

        await _until(lambda: len(heard) >= 3)
        await asyncio.sleep(0.2)  # negative check: nothing heard twice
        assert sorted(heard, key=repr) == sorted(
            [(changed, False), (added, False), (gone, True)], key=repr
        )
        assert server.syncs >= 1
        await follower.settled()
    finally:
        follower.close()


async def test_watches_dropped_while_the_loop_was_busy_are_read_after_a_sync() -> None:
    """The dropped watches' events reach the loop only after the session is back (the loop
    was busy meanwhile): the follower still syncs before it reads them."""
    server = _LaggingServer()
    layout = MetadataLayout("/m", (TOPICS,))
    gone = TopicRecord("projects/p/topics/gone", "u2", b"")
    server.write(layout.record(TOPICS, gone), encode(gone))
    store = _Store(server, layout)
    follower = _Follower(store)  # type: ignore[arg-type]
    heard: list[tuple[object, bool]] = []
    store.changes.watch(lambda change: heard.append((change.record, change.deleted)))
    try:
        await follower.scan()
        dropped, server.watches = server.watches, {}
        server.connected = False
        server.delete(layout.record(TOPICS, gone))
        server.connected = True  # back on a server that has not caught up; no state event yet
        for path, watches in dropped.items():
            for watch in watches:
                watch(WatchEvent(EventType.NONE, path))

        await _until(lambda: heard == [(gone, True)])
    finally:
        follower.close()


async def test_following_starts_from_every_change_completed_before_it() -> None:
    """follow() syncs before its first read: a record another process created just before,
    not yet applied by this session's server, is known, so its deletion while the connection
    is lost is heard (CI saw it missed: the record was created and deleted out of sight)."""
    server = _LaggingServer()
    layout = MetadataLayout("/m", (TOPICS,))
    gone = TopicRecord("projects/p/topics/gone", "u2", b"")
    server.write_unseen(layout.record(TOPICS, gone), encode(gone))
    store = _Store(server, layout)
    heard: list[tuple[object, bool]] = []
    store.changes.watch(lambda change: heard.append((change.record, change.deleted)))
    await ZooKeeperMetadataStore.follow(store)  # type: ignore[arg-type]
    follower = store._follower
    try:
        assert layout.record(TOPICS, gone) in follower.seen
        server.lose_connection()
        server.delete(layout.record(TOPICS, gone))
        server.reconnect_to_a_lagging_server()
        await _until(lambda: len(heard) >= 1)
        assert heard == [(gone, True)]
    finally:
        follower.close()
