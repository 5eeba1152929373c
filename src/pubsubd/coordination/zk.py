"""The asyncio bridge over kazoo: one ZooKeeper session per ``Coordinator``.

kazoo has no asyncio API. Every call here starts kazoo's ``*_async()`` request, and the
completion (on kazoo's completion thread) settles an asyncio future through
``loop.call_soon_threadsafe``: no thread ever blocks the event loop. Blocking twins of the same
calls (``coordinator.blocking``) serve synchronous callers such as the metadata store's puts.
kazoo's exceptions never leave this module: they become ``coordination.errors`` (``NoNode``,
``NodeExists``, ``BadVersion``, ``NotEmpty``, ``CoordinationUnavailable``, ``SessionExpired``).

Watches and session states are delivered on the event loop that registered them:

- ``get``/``exists``/``children`` take a one-shot ``watch`` (ZooKeeper's own semantics: it fires
  once, with a ``WatchEvent``). A ``NONE`` event means the watch was dropped because the
  connection was lost (kazoo drops every watch then): re-read once connected again.
- ``watch_data``/``watch_children`` follow one znode: the callback gets its current value at
  once and again after every change, re-armed across reconnections, until ``cancel()``.
- ``on_state`` delivers ``CONNECTED``, ``SUSPENDED`` (connection lost, the session may still
  live: stop acting as an owner) and ``LOST`` (session gone, with its ephemeral znodes).

With a credential (``auth``; by default the process's, ``credentials.ZOOKEEPER_CREDENTIAL``)
the session authenticates with ZooKeeper's digest scheme and every znode it creates (``create``,
``ensure_path``, a transaction's creates) carries an ACL that gives that identity every right
and anyone else none. ``start`` reads the root once, so a process without the cluster's
credential, or with a wrong one, fails there with ``AccessDenied`` (ZooKeeper's NoAuth).

Paths are absolute; ``root`` names the cluster (``layout`` gives its znodes), it is not a chroot.
Every request fails with ``CoordinationUnavailable`` after ``request_timeout`` seconds (default:
the session timeout); the outcome of a write that timed out is unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback, KazooState
from kazoo.protocol.states import EventType as KazooEventType
from kazoo.security import make_digest_acl

from pubsubd.coordination.credentials import ZOOKEEPER_CREDENTIAL, DigestCredential
from pubsubd.coordination.errors import (
    AccessDenied,
    BadVersion,
    CoordinationError,
    CoordinationUnavailable,
    NodeExists,
    NoNode,
    NotEmpty,
    SessionExpired,
)
from pubsubd.coordination.lease import SessionLease, lease_clock
from pubsubd.coordination.paths import DEFAULT_ROOT, Layout
from pubsubd.core.deadlines import within
from pubsubd.core.tls import ZOOKEEPER, ClientTls

log = logging.getLogger(__name__)

T = TypeVar("T")

# Reconnect quickly: on loopback a refused connection is instant, and after a ZooKeeper node
# dies the client should find another within a fraction of a second.
_CONNECTION_RETRY = {"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 1.0}

# How an operator gives a process the cluster's ZooKeeper credential (cli/server_security.py).
CREDENTIAL_FLAG = "--zk-auth-file FILE (PUBSUBD_ZK_AUTH_FILE)"


class SessionState(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"  # connection lost; the session may still be alive
    LOST = "lost"  # session expired or closed: its ephemeral znodes are gone


class EventType(enum.Enum):
    CREATED = "created"
    DELETED = "deleted"
    CHANGED = "changed"  # data changed
    CHILD = "child"  # children changed
    NONE = "none"  # the watch was dropped (connection lost): re-read once connected


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    path: str


@dataclass(frozen=True, slots=True)
class ZnodeStat:
    """A znode's stat. ``czxid`` only grows across creations (an epoch); ``mzxid`` is the
    transaction of the last data change; ``version`` is what compare-and-set compares."""

    czxid: int
    mzxid: int
    pzxid: int
    version: int
    cversion: int
    ephemeral_owner: int  # session id of an ephemeral znode's owner, 0 otherwise
    data_length: int
    num_children: int
    ctime_ms: int
    mtime_ms: int

    @property
    def ephemeral(self) -> bool:
        return self.ephemeral_owner != 0


# --- transaction operations (``commit``) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False


@dataclass(frozen=True, slots=True)
class SetData:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class Delete:
    path: str
    version: int = -1


@dataclass(frozen=True, slots=True)
class Check:
    path: str
    version: int


Op = Create | SetData | Delete | Check
OpResult = str | ZnodeStat | None  # Create: the path; SetData: the stat; Delete/Check: None


# --- translation ---------------------------------------------------------------------------------


def _stat(stat: Any) -> ZnodeStat:
    return ZnodeStat(
        czxid=stat.czxid,
        mzxid=stat.mzxid,
        pzxid=stat.pzxid,
        version=stat.version,
        cversion=stat.cversion,
        ephemeral_owner=stat.ephemeralOwner,
        data_length=stat.dataLength,
        num_children=stat.numChildren,
        ctime_ms=stat.ctime,
        mtime_ms=stat.mtime,
    )


def _translate(error: BaseException, path: str | None) -> BaseException:
    """kazoo's exception as ours; anything else (a bug, a TypeError) unchanged."""
    if isinstance(error, CoordinationError):
        return error
    where = f" ({path})" if path else ""
    mapped: CoordinationError
    if isinstance(error, kz.NoNodeError):
        mapped = NoNode(f"no such znode{where}", path)
    elif isinstance(error, kz.NodeExistsError):
        mapped = NodeExists(f"znode already exists{where}", path)
    elif isinstance(error, kz.BadVersionError):
        mapped = BadVersion(f"znode changed since it was read{where}", path)
    elif isinstance(error, kz.NotEmptyError):
        mapped = NotEmpty(f"znode has children{where}", path)
    elif isinstance(error, kz.NoAuthError):
        mapped = AccessDenied(
            f"ZooKeeper refused access{where} (NoAuth): the cluster's znodes are protected by "
            f"its credential; give it with {CREDENTIAL_FLAG}",
            path,
        )
    elif isinstance(error, kz.ConnectionClosedError):
        mapped = CoordinationUnavailable(f"ZooKeeper client is stopped{where}", path)
    elif isinstance(error, kz.SessionExpiredError):
        mapped = SessionExpired(f"ZooKeeper session expired{where}", path)
    elif isinstance(
        error,
        kz.ConnectionLoss
        | kz.ConnectionDropped
        | kz.OperationTimeoutError
        | kz.ZookeeperStoppedError
        | KazooTimeoutError,
    ):
        mapped = CoordinationUnavailable(f"ZooKeeper unreachable{where}: {error!r}", path)
    elif isinstance(error, kz.KazooException):
        mapped = CoordinationError(f"ZooKeeper error{where}: {error!r}", path)
    else:
        return error
    mapped.__cause__ = error
    return mapped


_EVENT_TYPES = {
    KazooEventType.CREATED: EventType.CREATED,
    KazooEventType.DELETED: EventType.DELETED,
    KazooEventType.CHANGED: EventType.CHANGED,
    KazooEventType.CHILD: EventType.CHILD,
}


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """Run ``callback(*args)`` on ``loop`` from any thread; dropped if the loop is closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_guarded, callback, *args)


def _guarded(callback: Callable[..., None], *args: Any) -> None:
    try:
        callback(*args)
    except Exception:
        log.exception("coordination callback %r failed", callback)


class _LoopWatch:
    """A one-shot kazoo watcher that hands its event to ``callback`` on ``loop``. Equal for the
    same callback and path, so kazoo (which keeps a set per path) arms it once."""

    __slots__ = ("callback", "loop", "path")

    def __init__(
        self, callback: Callable[[WatchEvent], None], path: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.callback = callback
        self.path = path
        self.loop = loop

    def __call__(self, event: Any) -> None:  # kazoo's callback thread
        kind = _EVENT_TYPES.get(event.type, EventType.NONE)
        _on_loop(self.loop, self.callback, WatchEvent(kind, self.path))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _LoopWatch)
            and self.callback == other.callback
            and self.path == other.path
        )

    def __hash__(self) -> int:
        return hash((self.callback, self.path))


# --- the coordinator ----------------------------------------------------------------------------


class Coordinator:
    """One ZooKeeper session, bridged to asyncio (see the module docstring)."""

    def __init__(
        self,
        hosts: str,
        root: str = DEFAULT_ROOT,
        *,
        session_timeout: float = 10.0,
        request_timeout: float | None = None,
        tls: ClientTls | Literal["process"] | None = "process",
        auth: DigestCredential | Literal["process"] | None = "process",
    ) -> None:
        """``tls``: how to reach ZooKeeper over TLS (None: plaintext); by default the
        process's setting, ``core.tls.ZOOKEEPER``. ``auth``: the digest credential the
        session authenticates with and its znodes' ACLs name (None: none, znodes open to
        anyone); by default the process's, ``credentials.ZOOKEEPER_CREDENTIAL``."""
        kazoo_log = logging.getLogger("kazoo")
        if kazoo_log.level == logging.NOTSET:
            kazoo_log.setLevel(logging.WARNING)  # kazoo logs every connection step at INFO
        self.hosts = hosts
        self.layout = Layout(root)
        self.session_timeout = session_timeout
        self.request_timeout = request_timeout if request_timeout is not None else session_timeout
        tls = ZOOKEEPER.tls if tls == "process" else tls
        secure: dict[str, Any] = {}
        if tls is not None:  # kazoo checks the server's certificate against the CA
            secure = {
                "use_ssl": True,
                "verify_certs": True,
                "ca": str(tls.ca) if tls.ca is not None else None,
                "certfile": str(tls.cert) if tls.cert is not None else None,
                "keyfile": str(tls.key) if tls.key is not None else None,
            }
        self.credential = ZOOKEEPER_CREDENTIAL.credential if auth == "process" else auth
        if self.credential is not None:  # digest auth; every znode created: this identity only
            c = self.credential
            secure["auth_data"] = [("digest", c.auth)]
            secure["default_acl"] = [make_digest_acl(c.user, c.password, all=True)]
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry=dict(_CONNECTION_RETRY),
            **secure,
        )
        self._client.add_listener(self._kazoo_state)
        self._state = SessionState.LOST
        self._session_lost = False
        self._stopping = False
        self._started = False
        self._listeners: list[tuple[Callable[[SessionState], None], asyncio.AbstractEventLoop]] = []
        self._follows: set[Follow[Any]] = set()
        self._lease = SessionLease(session_timeout)
        self._lease_keeper: asyncio.Task[None] | None = None
        self.blocking = BlockingCoordinator(self)

    @property
    def root(self) -> str:
        return self.layout.root

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def connected(self) -> bool:
        return self._state is SessionState.CONNECTED

    @property
    def session_lost(self) -> bool:
        """True once a session of this coordinator expired while it ran: whatever it held
        through ephemeral znodes may have been taken over since (it goes on in a new session)."""
        return self._session_lost

    def lease_holds(self) -> bool:
        """True while this process can prove its session alive (``lease.py``): an owner
        answers a client on the strength of its ephemeral znodes only then."""
        return self._lease.holds(lease_clock())

    async def renew_lease(self) -> bool:
        """Prove the session alive now, with one request if the lease lapsed; False if the
        session was lost. ``CoordinationUnavailable`` if ZooKeeper does not answer."""
        if not self.lease_holds():
            try:
                await self.exists(self.root)
            except SessionExpired:
                self._lease.expire()
                return False
        return self.lease_holds()

    @property
    def session_id(self) -> int | None:
        client_id = self._client.client_id
        return int(client_id[0]) if client_id else None

    # -- life cycle ------------------------------------------------------------------------------

    async def start(self, connect_timeout: float = 15.0) -> None:
        """Connect (waiting at most ``connect_timeout`` seconds) and create the root znode."""
        await asyncio.to_thread(self._start_client, connect_timeout)
        try:
            await self.ensure_path(self.root)
            await self.get(self.root)  # NoAuth here, not at some later call
            acl_open = self._open_acl(await self._call(self._get_acls, self.root, _acls))
        except AccessDenied as e:
            await asyncio.to_thread(self._stop_client)
            raise self._denied(e) from e
        self._warn_open(acl_open)
        self._lease_keeper = asyncio.create_task(self._keep_lease(), name="zk-lease")

    async def stop(self) -> None:
        """Cancel the follows, close the session (its ephemeral znodes go at once)."""
        follows = list(self._follows)
        for follow in follows:
            follow.cancel()
        if self._lease_keeper is not None:
            self._lease_keeper.cancel()
        await asyncio.gather(*(f.wait_closed() for f in follows), return_exceptions=True)
        await asyncio.to_thread(self._stop_client)

    async def wait_connected(self, within: float = 15.0) -> None:
        """Return once connected; ``CoordinationUnavailable`` after ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not self.connected:
            if loop.time() > deadline:
                raise CoordinationUnavailable(f"not connected to ZooKeeper after {within}s")
            await asyncio.sleep(0.02)

    def on_state(self, callback: Callable[[SessionState], None]) -> Callable[[], None]:
        """Deliver session state changes to ``callback`` on the running loop; returns a
        function that stops them."""
        entry = (callback, asyncio.get_running_loop())
        self._listeners.append(entry)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(entry)

        return remove

    def _get_acls(self) -> Any:
        return self._client.get_acls_async(self.root)

    def _open_acl(self, acls: list[Any]) -> bool:
        """Whether the root's ACL lets a session without this credential in."""
        return self.credential is not None and any(acl.id.scheme == "world" for acl in acls)

    def _warn_open(self, acl_open: bool) -> None:
        if acl_open:
            log.warning(
                "ZooKeeper: %s was created without a credential and stays open to anyone; "
                'only znodes created from now on are protected (README, "TLS and '
                'authentication")',
                self.root,
            )

    def _denied(self, error: AccessDenied) -> AccessDenied:
        """The start-up refusal, saying which credential (if any) was refused."""
        if self.credential is None:
            why = (
                f"ZooKeeper refused access to {self.root} (NoAuth): the cluster's znodes are "
                f"protected by a credential this process does not have; give it with "
                f"{CREDENTIAL_FLAG}"
            )
        else:
            why = (
                f"ZooKeeper refused access to {self.root} (NoAuth): "
                f"{self.credential.describe()} is not the cluster's (wrong user or password; "
                f"{CREDENTIAL_FLAG})"
            )
        denied = AccessDenied(why, error.path)
        denied.__cause__ = error.__cause__
        return denied

    def _start_client(self, timeout: float) -> None:
        if self._started:
            raise RuntimeError("a Coordinator starts once")
        self._started = True
        try:
            self._client.start(timeout=timeout)
        except KazooTimeoutError as e:
            raise CoordinationUnavailable(
                f"cannot connect to ZooKeeper at {self.hosts} within {timeout}s"
            ) from e

    def _stop_client(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(kz.KazooException):
            self._client.stop()
        self._client.close()

    def _kazoo_state(self, state: str) -> None:  # kazoo's connection thread: never block here
        ours = {
            KazooState.CONNECTED: SessionState.CONNECTED,
            KazooState.SUSPENDED: SessionState.SUSPENDED,
        }.get(state, SessionState.LOST)
        self._state = ours
        if ours is SessionState.LOST:
            self._lease.expire()  # before kazoo sends anything in a new session
        if ours is SessionState.LOST and not self._stopping:
            self._session_lost = True
            log.warning("ZooKeeper session lost (%s); reconnecting with a new one", self.hosts)
        for callback, loop in tuple(self._listeners):
            _on_loop(loop, callback, ours)

    # -- requests ------------------------------------------------------------------------------

    def _future(
        self, start: Callable[[], Any], path: str | None, convert: Callable[[Any], T]
    ) -> asyncio.Future[T]:
        """kazoo's async result of ``start()`` as an asyncio future (converted, translated)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: Any) -> None:  # on the loop
            if future.done():
                return  # cancelled or timed out meanwhile
            try:
                future.set_result(convert(result.get_nowait()))
            except Exception as e:
                future.set_exception(_translate(e, path))

        try:
            result = start()
        except Exception as e:
            future.set_exception(_translate(e, path))
            return future
        result.rawlink(lambda done: _on_loop(loop, settle, done))
        return future

    async def _keep_lease(self) -> None:
        """Renew the lease well before it lapses, so owners never wait for it."""
        every = self._lease.term_s / 4
        while True:
            await asyncio.sleep(every)
            age = self._lease.age(lease_clock())
            if self.connected and (age is None or age >= every):
                with contextlib.suppress(CoordinationError):
                    await self.exists(self.root)

    async def _call(
        self, start: Callable[[], Any], path: str | None, convert: Callable[[Any], T]
    ) -> T:
        sent_at = lease_clock()
        try:
            result = await within(self._future(start, path, convert), self.request_timeout)
        except TimeoutError:
            raise CoordinationUnavailable(
                f"ZooKeeper did not answer within {self.request_timeout}s", path
            ) from None
        self._lease.confirmed(sent_at)
        return result

    def _watcher(self, watch: Callable[[WatchEvent], None] | None, path: str) -> _LoopWatch | None:
        return None if watch is None else _LoopWatch(watch, path, asyncio.get_running_loop())

    async def get(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> tuple[bytes, ZnodeStat]:
        watcher = self._watcher(watch, path)
        return await self._call(
            lambda: self._client.get_async(path, watch=watcher), path, _data_and_stat
        )

    async def get_many(
        self, paths: Sequence[str], *, watch: Callable[[WatchEvent], None] | None = None
    ) -> list[tuple[bytes, ZnodeStat] | None]:
        """Read many znodes at once (pipelined on the session); None for a missing one."""

        async def one(path: str) -> tuple[bytes, ZnodeStat] | None:
            try:
                return await self.get(path, watch=watch)
            except NoNode:
                return None

        return list(await asyncio.gather(*(one(p) for p in paths)))

    async def sync(self, path: str) -> None:
        """Let this session's server catch up with the leader on ``path``, then wait until
        every watch event the server sent before its answer has been handed to its callback
        on the loop: after it, a watcher has heard of every write completed before the call,
        by any session (a linearizable read is a sync, then a read)."""
        await self._call(lambda: self._client.sync_async(path), path, _nothing)
        # kazoo runs watch callbacks on one thread in the order the events arrived, and
        # completions (the sync's answer) on another: a marker queued behind the watch
        # callbacks runs after every one of them, and each of those has queued its event
        # on the loop before the marker does.
        loop = asyncio.get_running_loop()
        delivered: asyncio.Future[None] = loop.create_future()

        def settle() -> None:  # on the loop
            if not delivered.done():
                delivered.set_result(None)

        self._client.handler.dispatch_callback(
            Callback("watch", lambda: _on_loop(loop, settle), ())
        )
        try:
            await within(delivered, self.request_timeout)
        except TimeoutError:
            raise CoordinationUnavailable(
                f"ZooKeeper's watch events were not delivered within {self.request_timeout}s",
                path,
            ) from None

    async def exists(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> ZnodeStat | None:
        watcher = self._watcher(watch, path)
        return await self._call(
            lambda: self._client.exists_async(path, watch=watcher), path, _optional_stat
        )

    async def children(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> list[str]:
        watcher = self._watcher(watch, path)
        return await self._call(
            lambda: self._client.get_children_async(path, watch=watcher), path, list
        )

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = True,
    ) -> str:
        """Create a znode; returns its path (with the sequence number for ``sequence``)."""
        created, _ = await self.create_with_stat(
            path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath
        )
        return created

    async def create_with_stat(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = True,
    ) -> tuple[str, ZnodeStat]:
        """``create``, also returning the new znode's stat (its czxid is an epoch)."""
        return await self._call(
            lambda: self._client.create_async(
                path,
                data,
                ephemeral=ephemeral,
                sequence=sequence,
                makepath=makepath,
                include_data=True,
            ),
            path,
            _path_and_stat,
        )

    async def set(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        """Replace a znode's data; with ``version`` only if it is still that (else BadVersion)."""
        return await self._call(lambda: self._client.set_async(path, data, version), path, _stat)

    async def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        """Delete a znode (``recursive``: with everything under it; a missing one is fine)."""
        if recursive:
            _unversioned(version)
            await self._delete_tree(path)
            return
        await self._call(lambda: self._client.delete_async(path, version), path, _nothing)

    async def _delete_tree(self, path: str) -> None:
        try:
            names = await self.children(path)
        except NoNode:
            return
        await asyncio.gather(*(self._delete_tree(f"{path}/{name}") for name in names))
        with contextlib.suppress(NoNode):
            await self.delete(path)

    async def ensure_path(self, path: str) -> None:
        """Create ``path`` and its missing parents (empty); existing ones are left alone."""
        await self._call(lambda: self._client.ensure_path_async(path), path, _nothing)

    async def commit(self, ops: Sequence[Op]) -> list[OpResult]:
        """Apply ``ops`` atomically (ZooKeeper multi): all or none. On failure raises the
        failing operation's error (``NoNode``, ``NodeExists``, ``BadVersion``, ...) with its
        index in ``op_index``."""
        return await self._call(lambda: self._transaction(ops).commit_async(), None, _committed)

    def _transaction(self, ops: Sequence[Op]) -> Any:
        transaction = self._client.transaction()
        for op in ops:
            if isinstance(op, Create):
                transaction.create(op.path, op.data, ephemeral=op.ephemeral, sequence=op.sequence)
            elif isinstance(op, SetData):
                transaction.set_data(op.path, op.data, op.version)
            elif isinstance(op, Delete):
                transaction.delete(op.path, op.version)
            else:
                transaction.check(op.path, op.version)
        return transaction

    # -- following znodes -------------------------------------------------------------------------

    def watch_data(
        self, path: str, callback: Callable[[tuple[bytes, ZnodeStat] | None], None]
    ) -> Follow[tuple[bytes, ZnodeStat] | None]:
        """Follow one znode's data: ``callback((data, stat))``, or ``callback(None)`` while it
        does not exist, at once and after every change, on the running loop."""

        async def read(
            watch: Callable[[WatchEvent], None],
        ) -> tuple[bytes, ZnodeStat] | None:
            if await self.exists(path, watch=watch) is None:
                return None
            try:
                return await self.get(path, watch=watch)
            except NoNode:
                return None  # deleted between the two reads: the exists watch has fired

        return self._follow(path, read, callback)

    def watch_children(
        self, path: str, callback: Callable[[list[str] | None], None]
    ) -> Follow[list[str] | None]:
        """Follow one znode's children: ``callback(sorted names)``, or ``callback(None)`` while
        the znode does not exist, at once and after every change, on the running loop."""

        async def read(watch: Callable[[WatchEvent], None]) -> list[str] | None:
            if await self.exists(path, watch=watch) is None:
                return None
            try:
                return sorted(await self.children(path, watch=watch))
            except NoNode:
                return None

        return self._follow(path, read, callback)

    def _follow(
        self,
        path: str,
        read: Callable[[Callable[[WatchEvent], None]], Any],
        callback: Callable[[T], None],
    ) -> Follow[T]:
        follow: Follow[T] = Follow(self, path, read, callback)
        self._follows.add(follow)
        return follow


class Follow(Generic[T]):
    """One followed znode (``watch_data``/``watch_children``); ``cancel()`` ends it."""

    def __init__(
        self,
        coordinator: Coordinator,
        path: str,
        read: Callable[[Callable[[WatchEvent], None]], Any],
        callback: Callable[[T], None],
    ) -> None:
        self.path = path
        self._coordinator = coordinator
        self._read = read
        self._callback = callback
        self._dirty = asyncio.Event()
        self._dirty.set()
        self._cancelled = False
        self._remove_listener = coordinator.on_state(self._state_changed)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"follow {path}")

    def cancel(self) -> None:
        # The flag as well as the cancel: a follow ends even if a cancellation is lost.
        self._cancelled = True
        self._dirty.set()
        self._task.cancel()
        self._remove_listener()
        self._coordinator._follows.discard(self)

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def _fired(self, _event: WatchEvent) -> None:
        self._dirty.set()

    def _state_changed(self, state: SessionState) -> None:
        if state is SessionState.CONNECTED:
            self._dirty.set()  # watches dropped while disconnected: read again

    async def _run(self) -> None:
        last: Any = _UNSET
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if self._cancelled:
                return
            try:
                value = await self._read(self._fired)
            except CoordinationUnavailable:
                if self._coordinator.connected:  # timed out while connected: try again soon
                    await asyncio.sleep(0.1)
                    self._dirty.set()
                continue  # otherwise the next CONNECTED sets the flag again
            except Exception:
                log.exception("following %s failed", self.path)
                continue
            if value != last and not self._cancelled:
                last = value
                _guarded(self._callback, value)


_UNSET = object()


# --- blocking twins -------------------------------------------------------------------------------


class BlockingCoordinator:
    """The coordinator's calls for synchronous callers (``coordinator.blocking``): they wait on
    the calling thread, at most ``request_timeout`` seconds. Never use them from a kazoo
    callback; from the event loop only where a short stall is the point (durable control-plane
    writes)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._client: Any = coordinator._client

    def start(self, timeout: float = 15.0) -> None:
        """Connect (at most ``timeout`` seconds) and create the root znode."""
        coordinator = self._coordinator
        coordinator._start_client(timeout)
        try:
            self.ensure_path(coordinator.root)
            self.get(coordinator.root)  # NoAuth here, not at some later call
            acls = self._run(coordinator._get_acls, coordinator.root)
        except AccessDenied as e:
            coordinator._stop_client()
            raise coordinator._denied(e) from e
        coordinator._warn_open(coordinator._open_acl(_acls(acls)))

    def stop(self) -> None:
        """Close the session (use the async ``stop`` if follows were started)."""
        self._coordinator._stop_client()

    def _run(self, start: Callable[[], Any], path: str | None) -> Any:
        return self._wait(self._started(lambda _: start(), path), path)

    @staticmethod
    def _started(start: Callable[[Any], Any], path: Any) -> Any:
        """kazoo's async result of ``start(path)`` (its argument checks raise as ours)."""
        try:
            return start(path)
        except Exception as e:
            mapped = _translate(e, path)
            if mapped is e:
                raise
            raise mapped from e

    def _wait(self, result: Any, path: str | None) -> Any:
        try:
            return result.get(timeout=self._coordinator.request_timeout)
        except Exception as e:
            mapped = _translate(e, path)
            if mapped is e:
                raise
            raise mapped from e

    def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        return _data_and_stat(self._run(lambda: self._client.get_async(path), path))

    def sync(self, path: str) -> None:
        """Let this session's server catch up with the leader on ``path`` (a read after it
        sees every write completed before the sync, by any session)."""
        self._run(lambda: self._client.sync_async(path), path)

    def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """Read many znodes in one pipelined round trip; None for a missing one."""
        return [
            None if r is None else _data_and_stat(r)
            for r in self._many(paths, lambda p: self._client.get_async(p))
        ]

    def children_many(self, paths: Sequence[str]) -> list[list[str] | None]:
        """List many znodes' children in one pipelined round trip; None for a missing one."""
        return [
            None if r is None else list(r)
            for r in self._many(paths, lambda p: self._client.get_children_async(p))
        ]

    def _many(self, paths: Sequence[str], start: Callable[[str], Any]) -> list[Any]:
        pending = [(path, self._started(start, path)) for path in paths]
        results = []
        for path, result in pending:
            try:
                results.append(self._wait(result, path))
            except NoNode:
                results.append(None)
        return results

    def exists(self, path: str) -> ZnodeStat | None:
        return _optional_stat(self._run(lambda: self._client.exists_async(path), path))

    def children(self, path: str) -> list[str]:
        return list(self._run(lambda: self._client.get_children_async(path), path))

    def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = True,
    ) -> str:
        created, _ = self.create_with_stat(
            path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath
        )
        return created

    def create_with_stat(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = True,
    ) -> tuple[str, ZnodeStat]:
        result = self._run(
            lambda: self._client.create_async(
                path,
                data,
                ephemeral=ephemeral,
                sequence=sequence,
                makepath=makepath,
                include_data=True,
            ),
            path,
        )
        return _path_and_stat(result)

    def set(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        return _stat(self._run(lambda: self._client.set_async(path, data, version), path))

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        if recursive:
            _unversioned(version)
            try:
                names = self.children(path)
            except NoNode:
                return
            for name in names:
                self.delete(f"{path}/{name}", recursive=True)
            with contextlib.suppress(NoNode):
                self.delete(path)
            return
        self._run(lambda: self._client.delete_async(path, version), path)

    def ensure_path(self, path: str) -> None:
        self._run(lambda: self._client.ensure_path_async(path), path)

    def commit(self, ops: Sequence[Op]) -> list[OpResult]:
        return _committed(
            self._run(lambda: self._coordinator._transaction(ops).commit_async(), None)
        )


# --- result conversions ---------------------------------------------------------------------------


def _data_and_stat(result: Any) -> tuple[bytes, ZnodeStat]:
    data, stat = result
    return cast(bytes, data or b""), _stat(stat)


def _optional_stat(result: Any) -> ZnodeStat | None:
    return None if result is None else _stat(result)


def _path_and_stat(result: Any) -> tuple[str, ZnodeStat]:
    path, stat = result
    return cast(str, path), _stat(stat)


def _acls(result: Any) -> list[Any]:
    acls, _stat = result
    return list(acls)


def _nothing(_result: Any) -> None:
    return None


def _unversioned(version: int) -> None:
    if version != -1:
        raise ValueError("a recursive delete checks no version")


def _committed(results: Any) -> list[OpResult]:
    """A multi's results; raises the failing operation's error if it failed."""
    failed = [
        (i, r)
        for i, r in enumerate(results)
        if isinstance(r, Exception)
        and not isinstance(r, kz.RolledBackError | kz.RuntimeInconsistency)
    ]
    if not failed and any(isinstance(r, Exception) for r in results):
        raise CoordinationError(f"transaction rolled back: {results!r}")
    if failed:
        index, error = failed[0]
        mapped = _translate(error, None)
        if isinstance(mapped, CoordinationError):
            mapped.op_index = index
        raise mapped
    converted: list[OpResult] = []
    for r in results:
        if isinstance(r, str):
            converted.append(r)
        elif r is True or r is None:
            converted.append(None)
        else:
            converted.append(_stat(r))
    return converted
