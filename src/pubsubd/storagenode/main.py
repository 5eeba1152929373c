"""``pubsubd storage``: the storage node process (composition root).

Recovers the ledger store from its data directories, serves the internal gRPC API on
127.0.0.1, optionally /healthz, /metrics and /status over HTTP, and with ``--zk`` registers in
the cluster's ZooKeeper registry. When ready it prints one line for scripts::

    pubsubd storage ready grpc=127.0.0.1:P node_id=ID zone=Z disks=N

SIGTERM (or SIGINT) stops it cleanly: the registry entry goes, new calls are refused with
UNAVAILABLE, calls in flight finish, last-add-confirmed values are saved, files are closed.

With authentication on (``--auth-*``, ``StorageNodeConfig.tokens``) every gRPC call needs a
valid bearer token (``api/grpc/authn.AuthInterceptor``, UNAUTHENTICATED otherwise) and so does
every append-port connection (``append_port.py``); the writers send their internal token
(``core/internal_token.py``). Only that token's principal passes: the node reads it from its
own ``--internal-token-file`` (required with ``--auth-*``; read at start-up and again when the
file changes: ``InternalIdentity``), and any other valid token (a client's, the admin's) gets
PERMISSION_DENIED (``core.internal_token.require_internal``). An append-port connection or an
AppendStream is ended when its token expires, or when its principal is no longer the one the
file names (``append_port.py``, ``service.py``).

The node's ID is ``--node-id``, else the one persisted in the first data directory
(``node_id``), else ``{hostname}-{port}`` (persisted then). A data directory keeps its ID:
starting it under another ``--node-id`` is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from pubsubd import runtime
from pubsubd.api.grpc import tls as grpc_tls
from pubsubd.api.grpc.authn import AuthInterceptor
from pubsubd.coordination.errors import CoordinationError, startup_failure
from pubsubd.coordination.paths import DEFAULT_ROOT
from pubsubd.coordination.registration import Registration, as_json, storage_info_changed
from pubsubd.core.internal_token import DEFAULT_GRACE_S, InternalIdentity
from pubsubd.core.release import version
from pubsubd.core.tls import ServerTls
from pubsubd.core.tokens import TokenSettings, TokenVerifier
from pubsubd.observability.http import HttpEndpoint
from pubsubd.observability.metrics import describe_process
from pubsubd.storage.files import fdatasync, fsync_directory, make_dirs, write_all
from pubsubd.storage.node_client import MAX_MESSAGE_BYTES
from pubsubd.storagenode.append_port import AppendPort
from pubsubd.storagenode.ledger_store import LedgerStore
from pubsubd.storagenode.protocol import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
from pubsubd.storagenode.service import StorageNodeServicer, handlers

log = logging.getLogger(__name__)

NODE_ID_FILE = "node_id"
STOP_GRACE_S = 5.0

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_ping_strikes", 0),
]


class StartupError(Exception):
    """The node cannot start as configured (the message says why)."""


@dataclass(frozen=True)
class StorageNodeConfig:
    data_dirs: list[Path]
    host: str = "127.0.0.1"
    port: int = 0
    http_port: int = -1
    zone: str = "default"
    node_id: str | None = None
    zk: str | None = None
    zk_root: str = DEFAULT_ROOT
    zk_session_timeout_s: float = 10.0
    append_port: int = 0  # the append port (append_port.py); -1 = none, appends over gRPC only
    # TLS on its gRPC, append and HTTP ports (core/tls.py); a client CA: mutual TLS, so only
    # the cluster's processes (showing certificates that CA signed) reach its ledgers.
    tls: ServerTls | None = None
    # Authentication (--auth-*): every gRPC call and append connection shows a valid token,
    # of the principal of the internal token in internal_token_file (required with tokens).
    tokens: TokenSettings | None = None
    internal_token_file: Path | None = None
    # After that file names another subject, the one before stays accepted this long, s.
    internal_token_grace_s: float = DEFAULT_GRACE_S

    def __post_init__(self) -> None:
        if not self.zk_session_timeout_s > 0:
            raise ValueError(
                f"the ZooKeeper session timeout must be positive, got {self.zk_session_timeout_s}"
            )


def resolve_node_id(first_dir: Path, given: str | None, port: int) -> str:
    """The node's ID (see the module docstring); persisted in ``first_dir``."""
    path = first_dir / NODE_ID_FILE
    stored = path.read_text().strip() if path.exists() else None
    if stored and given and stored != given:
        raise StartupError(
            f"data directory {first_dir} belongs to storage node {stored!r}, not {given!r}"
            f" (remove {path} to rename the node)"
        )
    node_id = given or stored or f"{socket.gethostname()}-{port}"
    if not node_id.strip() or "/" in node_id or any(c.isspace() for c in node_id):
        raise StartupError(f"invalid node id {node_id!r}: no spaces or '/'")
    if stored != node_id:
        make_dirs(first_dir)
        tmp = path.with_name(NODE_ID_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, (node_id + "\n").encode())
            fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_directory(first_dir)
    return node_id


class StorageNode:
    """One storage node: store, gRPC server, HTTP endpoint, registration."""

    def __init__(self, config: StorageNodeConfig) -> None:
        self.config = config
        self.store = LedgerStore(config.data_dirs)
        self.node_id = config.node_id or ""
        self.port = 0
        self.http_port = 0
        self.grpc_server: grpc.aio.Server | None = None
        self.append_port: AppendPort | None = None
        self.http = HttpEndpoint(self.status, self.problem)
        self.registration: Registration[dict[str, Any]] | None = None
        self._coordinator: Any = None

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def append_address(self) -> str:
        port = self.append_port
        return f"{self.config.host}:{port.port}" if port is not None else ""

    def registry_info(self) -> dict[str, Any]:
        disks = self.store.disk_health()
        return {
            "node_id": self.node_id,
            "address": self.address,
            "append_address": self.append_address,
            "zone": self.config.zone,
            "disks": len(disks),
            "healthy_disks": sum(d.healthy for d in disks),
            "free_bytes": self.store.free_bytes(),
            "protocol_version": PROTOCOL_VERSION,
            "min_protocol_version": MIN_PROTOCOL_VERSION,
            "version": version(),
        }

    def status(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "address": self.address,
            "zone": self.config.zone,
            "serving": self.store.opened and not self.store.stopping,
            "registered": self.registration is not None,
            "append_port": (
                None
                if self.append_port is None
                else {
                    "address": self.append_address,
                    "connections": self.append_port.connections,
                    "refused_connections": self.append_port.refused_connections,
                    "unauthenticated_connections": self.append_port.unauthenticated_connections,
                    "denied_connections": self.append_port.denied_connections,
                    "expired_connections": self.append_port.expired_connections,
                    "revoked_connections": self.append_port.revoked_connections,
                }
            ),
            **self.store.status(),
        }

    def problem(self) -> str | None:
        """A degraded condition for /healthz (it stays 200: a restart would not cure it)."""
        healthy = sum(d.healthy for d in self.store.disks)
        if healthy < self.store.majority:
            return f"only {healthy} of {len(self.store.disks)} disks are healthy: writes refused"
        bad = [f"{d.path}: {d.error}" for d in self.store.disks if not d.healthy]
        full = [str(d.path) for d in self.store.disks if d.space.full]
        parts = []
        if bad:
            parts.append("unhealthy disks: " + "; ".join(bad))
        if full:
            parts.append("full disks: " + ", ".join(full))
        return " / ".join(parts) or None

    def _authentication(self) -> tuple[TokenVerifier | None, InternalIdentity | None]:
        """The verifier of callers' tokens and the only principals let in (the cluster's
        identity, from the internal token, following its file); (None, None) with
        authentication off."""
        config = self.config
        if config.tokens is None:
            return None, None
        if config.internal_token_file is None:
            raise StartupError(
                "a storage node with authentication needs --internal-token-file: only the "
                "principal of that token (the cluster's writers) may call it"
            )
        verifier = TokenVerifier(config.tokens)
        try:
            return verifier, InternalIdentity(
                verifier, config.internal_token_file, config.internal_token_grace_s
            )
        except ValueError as e:
            raise StartupError(str(e)) from None

    async def start(self) -> None:
        config = self.config
        verifier, internal = self._authentication()  # before anything opens: may refuse
        await self.store.open()
        server = grpc.aio.server(
            options=GRPC_OPTIONS,
            interceptors=[AuthInterceptor(verifier, internal)] if verifier is not None else None,
        )
        address = f"{config.host}:{config.port}"
        tls = config.tls
        if tls is None:
            self.port = server.add_insecure_port(address)
        else:
            self.port = server.add_secure_port(address, grpc_tls.server_credentials(tls))
        if self.port == 0:
            raise OSError(f"cannot bind gRPC port {address}")
        self.node_id = await asyncio.to_thread(
            resolve_node_id, config.data_dirs[0], config.node_id, self.port
        )
        server.add_generic_rpc_handlers(
            [handlers(StorageNodeServicer(self.store, self.node_id, config.zone, internal))]
        )
        describe_process("storage", self.node_id, config.zone, version())
        await server.start()
        self.grpc_server = server
        if config.append_port >= 0:
            self.append_port = AppendPort(
                self.store,
                config.host,
                config.append_port,
                ssl=tls.context() if tls else None,
                verifier=verifier,
                internal=internal,
            )
            await self.append_port.start()
        if config.http_port >= 0:
            self.http_port = await self.http.start(
                config.host, config.http_port, ssl=tls.context() if tls else None
            )
        if config.zk:
            await self._register(config.zk, config.zk_root)
        http = f" http={config.host}:{self.http_port}" if config.http_port >= 0 else ""
        line = (
            f"pubsubd storage ready grpc={self.address} node_id={self.node_id}"
            f" zone={config.zone} disks={len(config.data_dirs)}{http}"
            + (f" append={self.append_address}" if self.append_port is not None else "")
        )
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    async def _register(self, hosts: str, root: str) -> None:
        from pubsubd.coordination.zk import Coordinator

        coordinator = Coordinator(hosts, root, session_timeout=self.config.zk_session_timeout_s)
        self._coordinator = coordinator
        try:
            await coordinator.start()
            registration = Registration(
                coordinator,
                coordinator.layout.storage_node(self.node_id),
                self.registry_info,
                as_json,
                storage_info_changed,
            )
            await registration.start()
        except CoordinationError as e:
            raise StartupError(
                startup_failure(f"register in ZooKeeper at {hosts} ({root})", e)
            ) from e
        self.registration = registration

    async def stop(self) -> None:
        if self.registration is not None:
            await self.registration.stop()
        if self._coordinator is not None:
            await self._coordinator.stop()
        self.store.stopping = True  # new calls: UNAVAILABLE; calls in flight finish
        if self.append_port is not None:
            await self.append_port.stop()
        if self.grpc_server is not None:
            await self.grpc_server.stop(STOP_GRACE_S)
        await self.http.close()
        await self.store.close()


async def serve(config: StorageNodeConfig) -> None:
    node = StorageNode(config)
    await runtime.serve_until_signalled("pubsubd storage", node.start, node.stop)


def run(config: StorageNodeConfig) -> None:
    runtime.run(lambda: serve(config))
