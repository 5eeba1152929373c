"""``pubsubd frontend``: the stateless service proxy as a process (composition root, issue 11).

Clients connect here as they would to any pubsubd (``PUBSUB_EMULATOR_HOST``; several frontends
as ``ipv4:A,B`` and the official client fails over between them). Each call goes to the
forwarder the published assignment names for its topic or subscription (``targets.py``), as
bytes (``proxy.py``). The frontend follows the metadata store's names, the forwarders'
registrations and the routes through ZooKeeper watches (``control/routing_views.py``) and keeps
no state of its own, so any number can run and any can be restarted. It registers itself under
``Layout.frontends`` (JSON: id, address, zone, version).

When ready it prints one line for scripts::

    pubsubd frontend ready grpc=127.0.0.1:P http=127.0.0.1:P frontend_id=ID zone=Z

SIGTERM (or SIGINT) stops it: its registration goes, calls in flight get a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import Gauge

from pubsubd import runtime
from pubsubd.api.grpc import tls as grpc_tls
from pubsubd.api.grpc.authn import AuthInterceptor
from pubsubd.api.grpc.authorization import Authorization, trusted_caller_header
from pubsubd.api.rest import RestFront, local_target
from pubsubd.control.policies import ResourcePolicies, load_policy_file
from pubsubd.control.routing_table import Forwarder
from pubsubd.control.routing_views import NamesView, RoutingView
from pubsubd.coordination.errors import CoordinationError, startup_failure
from pubsubd.coordination.paths import DEFAULT_ROOT
from pubsubd.coordination.registration import Registration, as_json
from pubsubd.coordination.zk import Coordinator
from pubsubd.core.iam import Requirement
from pubsubd.core.principal import Principal
from pubsubd.core.release import version
from pubsubd.core.tls import ServerTls
from pubsubd.core.tokens import TokenSettings, TokenVerifier
from pubsubd.frontend.fanout import Leg, legs
from pubsubd.frontend.spread_proxy import SPREAD_METHODS, SpreadingProxy
from pubsubd.frontend.targets import resource_name, targets
from pubsubd.observability import metrics
from pubsubd.observability.http import HttpEndpoint
from pubsubd.pulsar.server import PulsarServer
from pubsubd.storage.zk_metadata import POLICIES, ZooKeeperMetadataStore

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
MAX_MESSAGE_BYTES = 64 << 20
FORWARDERS = Gauge("pubsubd_frontend_forwarders", "Forwarders this frontend can send calls to")


class StartupError(Exception):
    """The frontend cannot start as configured (the message says why)."""


@dataclass(frozen=True)
class FrontendConfig:
    zk: str
    zk_root: str = DEFAULT_ROOT
    frontend_id: str | None = None
    zone: str = "default"
    host: str = "127.0.0.1"
    port: int = 0
    http_port: int = -1
    pulsar_port: int = -1  # the Pulsar binary protocol, through this frontend's gRPC port
    zk_session_timeout_s: float = 10.0
    pid_file: Path | None = None
    # TLS on its gRPC and HTTP ports (core/tls.py); its proxy's channels to forwarders follow
    # core.tls.INTERNAL (--tls-ca).
    tls: ServerTls | None = None
    # Authentication (``--auth-*``, as ``pubsubd serve``): every call's bearer token is checked
    # here, on the gRPC, HTTP and Pulsar ports, and passed on to the forwarders with the call.
    tokens: TokenSettings | None = None
    # Authorization (``--iam``, as ``pubsubd serve``): the same check, over the policies the
    # cluster keeps in ZooKeeper and this frontend's policy file.
    iam: bool = False
    iam_policy_file: Path | None = None
    trust_caller_header: bool = False  # TESTS AND DEVELOPMENT ONLY


class Frontend:
    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.zk = Coordinator(
            config.zk, config.zk_root, session_timeout=config.zk_session_timeout_s
        )
        self.names = NamesView(self.zk)
        self.routing = RoutingView(self.zk, self._routing_changed)
        self.proxy = SpreadingProxy(self.choose, self.forwarder_registered, self.spread)
        self._forwarders_changed = asyncio.Event()
        # One verifier (one cache of checked tokens) for the gRPC, HTTP and Pulsar ports.
        self.verifier = TokenVerifier(config.tokens) if config.tokens is not None else None
        self.http = HttpEndpoint(
            self.status,
            self.problem,
            authenticate=self.verifier.principal if self.verifier is not None else None,
        )
        self.rest: RestFront | None = None
        self.pulsar: PulsarServer | None = None
        self.pulsar_port = -1
        self.server: grpc.aio.Server | None = None
        self.registration: Registration[dict[str, Any]] | None = None
        self.port = 0
        self.http_port = 0
        self.frontend_id = config.frontend_id or ""
        self._local_dir: str | None = None  # with TLS: the REST front's Unix socket
        self._projects = load_policy_file(config.iam_policy_file)
        self.policies: ResourcePolicies | None = None  # once ZooKeeper is reached (start)
        self._policy_store: ZooKeeperMetadataStore | None = None

    def authorize(self, principal: Principal, needs: Iterable[Requirement]) -> None:
        """The check of ``--iam`` (api/grpc/authorization.py); no call is served before
        ``start`` has read the policies."""
        assert self.policies is not None, "no call is served before the policies are read"
        self.policies.check(principal, needs)

    def choose(self, method: str, request: bytes) -> list[Forwarder]:
        return targets(
            resource_name(method, request),
            topic_uids=self.names.topic_uids(),
            subscription_uids=self.names.subscription_uids(),
            route_of=self.routing.route,
            forwarders=self.routing.forwarders,
            zone=self.config.zone,
            drained=self.routing.constraints.drains,
        )

    def spread(self, method: str, request: bytes) -> list[Leg] | None:
        """The legs of a call on a spread subscription (``fanout.py``); None otherwise."""
        if method not in SPREAD_METHODS:
            return None
        found = resource_name(method, request)
        if found is None or found[0] != "subscription":
            return None
        subscription = self.names.subscriptions.get(found[1])
        if subscription is None:
            return None
        routing = self.routing
        return legs(subscription.uid, routing.route, routing.spread, routing.forwarders)

    def _routing_changed(self) -> None:
        FORWARDERS.set(len(self.routing.forwarders))
        self._forwarders_changed.set()

    async def forwarder_registered(self, within: float) -> bool:
        """Wait until some forwarder is registered; False if none is within ``within`` s."""
        deadline = asyncio.get_running_loop().time() + within
        while not self.routing.forwarders:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            self._forwarders_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):  # never swallows a cancellation (3.11)
                    await self._forwarders_changed.wait()
        return True

    async def start(self) -> None:
        config = self.config
        identify = trusted_caller_header if config.trust_caller_header else None
        checking = Authorization(self.authorize, identify) if config.iam else None
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
            # Authentication first: it names the caller that authorization checks.
            interceptors=[
                *([AuthInterceptor(self.verifier)] if self.verifier is not None else []),
                *([checking] if checking is not None else []),
            ],
        )
        server.add_generic_rpc_handlers([self.proxy])
        tls = config.tls
        if tls is None:
            self.port = server.add_insecure_port(f"{config.host}:{config.port}")
            rest_target = local_target(config.host, self.port)
        else:
            self.port = server.add_secure_port(
                f"{config.host}:{config.port}", grpc_tls.server_credentials(tls)
            )
            # The REST front reaches the proxy over a Unix socket only this user can open.
            self._local_dir = tempfile.mkdtemp(prefix="pubsubd-frontend-")
            rest_target = f"unix:{self._local_dir}/grpc.sock"
            server.add_insecure_port(rest_target)
        if self.port == 0:
            raise StartupError(f"cannot bind gRPC port {config.host}:{config.port}")
        self.frontend_id = config.frontend_id or f"{socket.gethostname()}-{self.port}"
        metrics.describe_process("frontend", self.frontend_id, config.zone, version())
        try:
            await self.zk.start()
            await self.names.start()
            if config.iam:  # only the policies: no watch on every topic and subscription
                self._policy_store = ZooKeeperMetadataStore(self.zk, kinds=(POLICIES,))
                await self._policy_store.follow()
                self.policies = ResourcePolicies(self._policy_store, self._projects)
                if checking is not None:  # a revoked permission ends the streams it held
                    self.policies.on_change(checking.recheck)
            self.routing.start()
            self.registration = Registration(
                self.zk,
                self.zk.layout.frontend(self.frontend_id),
                self.registry_info,
                as_json,
                lambda published, now: published != now,
            )
            await self.registration.start()
        except CoordinationError as e:
            raise StartupError(startup_failure(f"reach ZooKeeper at {config.zk}", e)) from e
        await server.start()
        self.server = server
        if config.http_port >= 0:
            # REST v1 on the HTTP port, through this frontend's own gRPC port (its proxy).
            self.rest = RestFront(rest_target, MAX_MESSAGE_BYTES)
            self.http.rest = self.rest.handle
            self.http_port = await self.http.start(
                config.host, config.http_port, ssl=tls.context() if tls else None
            )
        if config.pulsar_port >= 0:
            # The Pulsar front answers LOOKUP with itself and calls this frontend's gRPC port
            # (over the REST front's local target), whose proxy sends each call to the
            # forwarder that owns its topic or subscription.
            self.pulsar = PulsarServer(
                rest_target,
                f"pubsubd-frontend-{version()}",
                ssl=tls.context() if tls else None,
                verifier=self.verifier,
            )
            self.pulsar_port = await self.pulsar.start(config.host, config.pulsar_port)
        if config.pid_file is not None:
            config.pid_file.write_text(f"{os.getpid()}\n")
        http = f" http={config.host}:{self.http_port}" if config.http_port >= 0 else ""
        sys.stdout.write(
            f"pubsubd frontend ready grpc={config.host}:{self.port}{http}"
            f" frontend_id={self.frontend_id} zone={config.zone}"
            + (f" pulsar={self.pulsar_port}" if self.pulsar is not None else "")
            + "\n"
        )
        sys.stdout.flush()

    def registry_info(self) -> dict[str, Any]:
        return {
            "frontend_id": self.frontend_id,
            "address": f"{self.config.host}:{self.port}",
            "zone": self.config.zone,
            "version": version(),
        }

    def problem(self) -> str | None:
        if not self.routing.forwarders:
            return "no forwarder is registered: calls answer UNAVAILABLE"
        return None

    def status(self) -> dict[str, Any]:
        return {
            **self.registry_info(),
            "forwarders": sorted(self.routing.forwarders),
            "topics": len(self.names.topics),
            "subscriptions": len(self.names.subscriptions),
            "calls": self.proxy.calls,
            "failovers": self.proxy.failovers,
            "given_back": self.proxy.given_back,
            "spread_streams": self.proxy.spread_streams,
            "spread_calls": self.proxy.spread_calls,
            "streams_ended_by_route_changes": self.proxy.routes_changed,
        }

    async def stop(self) -> None:
        if self.registration is not None:
            await self.registration.stop()
        if self.pulsar is not None:
            await self.pulsar.stop()
        if self.server is not None:
            await self.server.stop(STOP_GRACE_S)
        await self.proxy.close()
        self.routing.close()
        self.names.close()
        if self._policy_store is not None:
            self._policy_store.close()
        await self.http.close()
        if self.rest is not None:
            await self.rest.close()
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, ignore_errors=True)
        await self.zk.stop()
        if self.config.pid_file is not None:
            self.config.pid_file.unlink(missing_ok=True)


async def serve(config: FrontendConfig) -> None:
    frontend = Frontend(config)
    await runtime.serve_until_signalled("pubsubd frontend", frontend.start, frontend.stop)


def run(config: FrontendConfig) -> None:
    runtime.run(lambda: serve(config))
