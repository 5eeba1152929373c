"""Composition root: builds every role of ``pubsubd serve`` in one process and runs it (and of
``pubsubd forwarder``: the same process in a cluster, serving only the topics the routers give
it, ``data/ownership.py``).

Roles (ARCHITECTURE.md, "Roles and where they live"): the frontend (gRPC servicers, the service
proxy clients talk to), the router (control plane), one publishing forwarder and one subscribing
forwarder (data plane), embedded storage and the embedded metadata store. They are wired through
the same narrow interfaces a multi-process deployment puts a network transport behind.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import grpc

from pubsubd import node, runtime
from pubsubd.acks.replicated import cursor_source, restore_journal
from pubsubd.api.grpc import (
    admin,
    authn,
    forwarder_service,
    iam,
    liveness,
    publisher,
    replay,
    schema,
    sources_service,
    subscriber,
)
from pubsubd.api.grpc import tls as grpc_tls
from pubsubd.api.grpc.authorization import Authorization, trusted_caller_header
from pubsubd.api.grpc.serving_catch_up import ServingCatchUp
from pubsubd.api.rest import RestFront, local_target
from pubsubd.config import ClusterConfig, ServerConfig
from pubsubd.control.expiry import Maintenance
from pubsubd.control.policies import ResourcePolicies, load_policy_file
from pubsubd.control.routing_store import RoutingStore, encode_forwarder
from pubsubd.control.routing_table import Forwarder, publishing_unit, subscribing_unit
from pubsubd.control.routing_views import RoutingView
from pubsubd.control.source_growth_loop import SourceGrowthLoop
from pubsubd.coordination.liveness import OwnerCheck, this_process
from pubsubd.coordination.registration import Registration
from pubsubd.coordination.zk import Coordinator
from pubsubd.core import pb, publish_sources
from pubsubd.core.backlog_view import BacklogShare
from pubsubd.core.client_security import ClientSecurity
from pubsubd.core.clock import SYSTEM_CLOCK
from pubsubd.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    PubsubError,
    Unavailable,
)
from pubsubd.core.flow_control import MemoryBudget
from pubsubd.core.internal_token import INTERNAL_TOKEN, InternalIdentity, internal_only
from pubsubd.core.records import DamagedRange
from pubsubd.core.release import version
from pubsubd.core.tokens import TokenVerifier
from pubsubd.dashboard import Dashboard
from pubsubd.data.load_report import LoadReporter
from pubsubd.data.ownership import SubscriptionOwnership, TopicOwnership
from pubsubd.data.publish.forwarder import SUBSCRIPTIONS_DIR, TOPICS_DIR
from pubsubd.data.subscribe.budget import DeliveryBudget
from pubsubd.data.subscribe.leg_cursors import LegCursors
from pubsubd.data.subscribe.remote_sources import COPIES_DIR, RemoteSources
from pubsubd.observability import background, metrics, sli
from pubsubd.observability.events import EVENTS_TOPIC, BacklogRotation, EventEmitter
from pubsubd.observability.http import HttpEndpoint
from pubsubd.observability.slo import SloMonitor, load_slo, scaled_windows
from pubsubd.prober.loop import ProbeLoop, ProberConfig
from pubsubd.pulsar.server import PulsarServer
from pubsubd.storage import cache_budget
from pubsubd.storage.disk_space import DiskSpace
from pubsubd.storage.ledgers.auditor import Auditor
from pubsubd.storage.ledgers.cluster import ClusterStorage
from pubsubd.storage.ledgers.meta import StoragePolicy
from pubsubd.storage.ledgers.reader import LedgerReader
from pubsubd.storage.metadata import (
    Change,
    MetadataStore,
    SqliteMetadataStore,
    SubscriptionRecord,
)
from pubsubd.storage.node_client import new_channel
from pubsubd.storage.zk_metadata import ZooKeeperMetadataStore

log = logging.getLogger(__name__)

# A remote Publish's answers that refuse its content (a dead-letter copy held to the owner's
# checks): they stay what they are, the rest is the owner being unavailable.
_REFUSED: dict[grpc.StatusCode, type[PubsubError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}
# A Publish may carry 10 MB; accept more at the transport so an oversize request gets a clear
# INVALID_ARGUMENT from validation instead of a transport error the client would retry.
MAX_RECEIVE_BYTES = 32 << 20
MAX_SEND_BYTES = 32 << 20

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_BYTES),
    # The official clients ping idle channels (30 s, Node 5 min); never GOAWAY them for it.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_ping_strikes", 0),
    # Our own pings find clients that vanished without closing their streams.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
]

# The dashboard's pages: path -> HTML file of observability/static/.
DASHBOARD_PAGES = {
    "/": "index.html",
    "/ui/topic": "topic.html",
    "/ui/subscription": "subscription.html",
    "/ui/cluster": "cluster.html",
    "/ui/alerts": "alerts.html",
}


class PubsubServer:
    """Every role of the service in one process.

    On one machine the metadata store is embedded and the logs live on the local disk. In a
    cluster (``ClusterParts``, made by :func:`connect_cluster` before this is built) the store
    is ZooKeeper and every source's durable copy is its ledgers on the storage nodes."""

    def __init__(self, config: ServerConfig, cluster: ClusterParts | None = None) -> None:
        self.config = config
        storage = config.storage
        # One watcher of disk-full episodes for every write to the data directory.
        self.disk = DiskSpace(storage.data_dir)
        metrics.DISK_FREE_BYTES.set_function(lambda: float(self.disk.free_bytes() or 0))
        self.cluster = cluster
        if cluster is not None:
            metrics.LEDGER_REPLICATION_LAG.set_function(cluster.storage.replication_lag)
        self.store: MetadataStore = (
            cluster.store
            if cluster is not None
            else SqliteMetadataStore(storage.data_dir, self.disk)
        )
        self.clock = SYSTEM_CLOCK
        # A forwarder of a cluster (``pubsubd forwarder``): the topics the routers' assignment
        # gives it, kept by ``self.ownership`` once the gRPC port (its identity) is bound.
        in_cluster = cluster is not None and config.cluster is not None
        self.assigned = in_cluster and config.cluster is not None and config.cluster.assigned
        self.owned: set[str] = set()
        self.ownership: TopicOwnership | None = None
        # The subscriptions it serves (their units ``s/{uid}/0``), on its own topics or on
        # copies of topics other forwarders own (data/subscribe/remote_sources.py).
        self.served: set[str] = set()
        self.subscription_ownership: SubscriptionOwnership | None = None
        self.remote_sources = (
            RemoteSources(
                storage.data_dir / COPIES_DIR,
                self._topic_owners,
                # Copies catch up from the storage nodes' closed ledgers first.
                ledgers=LedgerReader(
                    cluster.storage.directory,
                    cluster.storage.nodes,
                    rate_bytes=config.cluster.copy_fill_rate_bytes,
                ),
                fill_min_messages=config.cluster.copy_fill_min_messages,
            )
            if self.assigned and cluster is not None and config.cluster is not None
            else None
        )
        self.load_report: LoadReporter | None = None
        # A forwarder's writes to a subscription wait for the others serving it to apply them.
        self.serving_catch_up: ServingCatchUp | None = None
        self.leg_cursors: LegCursors | None = None
        self.source_growth: SourceGrowthLoop | None = None
        self.routing: RoutingView | None = None
        self._publish_channels: dict[str, grpc.aio.Channel] = {}
        cache_budget.PROCESS.set_max_bytes(config.log_cache_bytes)
        self.node = node.build(
            self.store,
            storage.data_dir,
            clock=self.clock,
            fsync=storage.fsync,
            segment_bytes=storage.segment_bytes,
            disk=self.disk,
            trim_interval_s=storage.trim_interval_s,
            ack_flush_interval_s=storage.ack_flush_interval_s,
            dedup_window_s=config.dedup_window_s,
            remote_logs=cluster.storage.remote_log if cluster is not None else None,
            owns_topic=self.owned.__contains__ if self.assigned else None,
            owns_subscription=self.served.__contains__ if self.assigned else None,
            remote_sources=self.remote_sources,
            remote_publish=self._remote_publish if self.assigned else None,
            delivery_budget=DeliveryBudget(
                config.max_outstanding_messages, config.max_outstanding_bytes
            ),
        )
        self.publishing = self.node.publishing
        self.subscribing = self.node.subscribing
        self.routes = self.node.routes
        self.catalog = self.node.catalog
        self.snapshots = self.node.snapshots
        self.cursors = self.node.cursors
        self.maintenance = Maintenance(
            self.catalog,
            self.snapshots,
            self.routes,
            check_interval_s=config.expiry_check_s,
            ttl_divisor=config.test_ttl_divisor,
            clock=self.clock,
        )
        # IAM policies (control/policies.py), enforced on every call with --iam.
        self.policies = ResourcePolicies(self.store, load_policy_file(config.iam_policy_file))
        self.grpc_server: grpc.aio.Server | None = None
        # Request SLIs and the SLO burn-rate monitor (observability/sli.py, slo.py).
        slo_config = load_slo(config.slo_file)
        recorder = sli.configure(
            config.metrics_max_topics,
            slo_config.topics,
            enabled=config.request_slis,
            max_subscriptions=config.metrics_max_subscriptions,
        )
        self.slo = SloMonitor(
            slo_config,
            recorder.counts,
            windows=scaled_windows(config.test_slo_window_divisor),
            sample_s=config.slo_sample_s,
        )
        self._slo_task: asyncio.Task[None] | None = None
        self.prober: ProbeLoop | None = None  # probes this server's own endpoint (opt-in)
        self.inflight = MemoryBudget(config.max_inflight_publish_bytes)
        self._unregister_backlog = sli.register_backlog(self._backlogs)
        # The web dashboard: its JSON API (dashboard.py) and pages on the HTTP port.
        self.dashboard = Dashboard(self)
        # Authentication (--auth-*): one verifier, so one cache of checked tokens, for the
        # gRPC port, the HTTP port and the Pulsar port.
        self.verifier = TokenVerifier(config.tokens) if config.tokens is not None else None
        # The cluster's own identity: the principal of the token this process's calls to
        # other forwarders carry (--internal-token-file, followed when it changes), which
        # authorization lets pass and which alone may call the internal methods (nobody
        # without the file: no process of a cluster calls a stand-alone server).
        self.internal_identity = (
            InternalIdentity(
                self.verifier, config.internal_token_file, config.internal_token_grace_s
            )
            if self.verifier is not None
            else None
        )
        # With TLS on, the REST and Pulsar fronts reach this process's gRPC API over a Unix
        # socket in a directory only this user can open (mkdtemp: mode 0700), not over TLS.
        self._local_dir: str | None = None
        self.local_target = ""
        self.http = HttpEndpoint(
            self.status,
            self.disk.problem,
            {"/alerts": lambda: self.slo.alerts(time.monotonic())},
            api_routes=self.dashboard.routes(),
            pages=DASHBOARD_PAGES,
            authenticate=self.verifier.principal if self.verifier is not None else None,
        )
        self.port = 0
        self.http_port = 0
        self.rest: RestFront | None = None
        self.pulsar_port = -1  # -1: the Pulsar front is off
        self.pulsar: PulsarServer | None = None
        self._stopped = asyncio.Event()
        self._quota_task: asyncio.Task[None] | None = None
        self.sli_events: EventEmitter | None = None
        # The cluster's repair auditor, when this process is elected (storage/ledgers/auditor.py).
        self.auditor: Auditor | None = None
        if cluster is not None and config.cluster is not None:
            self.auditor = Auditor(cluster.storage, config.cluster.repair)
        # In a cluster: this process's entry among the forwarders the routers assign work to.
        self.forwarder: Forwarder | None = None
        self.registration: Registration[Forwarder] | None = None

    async def start(self) -> None:
        self.node.start()
        self.maintenance.start()
        self._quota_task = asyncio.create_task(self._quota_loop(), name="quota_loop")
        self._start_sli_events()
        self._slo_task = asyncio.create_task(self._slo_loop(), name="slo_monitor")
        self.dashboard.start()
        self._damage_gauges()
        # Authentication first: it names the caller that authorization checks.
        interceptors = [
            *(
                [authn.AuthInterceptor(self.verifier, self.internal_identity, internal_only)]
                if self.verifier
                else []
            ),
            *authorization(self.config, self.policies, self.internal_identity),
        ]
        server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=interceptors)
        subscriber_servicer = subscriber.SubscriberServicer(
            self.catalog, self.snapshots, self.routes, after_write=self._serving_caught_up
        )
        replay_servicer = replay.ReplayServicer(
            self.catalog, self.routes, self.cursors, self.snapshots, self.clock
        )
        server.add_generic_rpc_handlers(
            [
                publisher.handlers(
                    publisher.PublisherServicer(
                        self.catalog,
                        self.snapshots,
                        self.routes,
                        self.clock,
                        self.inflight,
                        after_write=self._serving_caught_up,
                    )
                ),
                subscriber.handlers(subscriber_servicer),
                replay.handlers(replay_servicer),
                admin.handlers(
                    admin.AdminServicer(
                        self.catalog,
                        self.routes,
                        RoutingStore(self.cluster.coordinator) if self.cluster else None,
                    )
                ),
                forwarder_service.handlers(
                    forwarder_service.ForwarderServicer(
                        self.catalog,
                        self.routes,
                        session_id=lambda: (
                            self.cluster.coordinator.session_id if self.cluster else None
                        ),
                        forwarder_id=lambda: self.forwarder.forwarder_id if self.forwarder else "",
                        served_sources=self.subscribing.served_sources.get,
                    )
                ),
                sources_service.handlers(
                    sources_service.SourcesServicer(self.routes, self.internal_identity)
                ),
                schema.handlers(schema.SchemaServicer(self.catalog)),
                iam.handlers(
                    iam.IamPolicyServicer(
                        self.catalog, self.snapshots, self.policies, enforced=self.config.iam
                    )
                ),
            ]
        )
        address = f"{self.config.host}:{self.config.port}"
        tls = self.config.tls
        if tls is None:
            self.port = server.add_insecure_port(address)
        else:
            self.port = server.add_secure_port(address, grpc_tls.server_credentials(tls))
            self._local_dir = tempfile.mkdtemp(prefix="pubsubd-")
            self.local_target = f"unix:{self._local_dir}/grpc.sock"
            server.add_insecure_port(self.local_target)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC port {address}")
        if tls is None:
            self.local_target = local_target(self.config.host, self.port)
        await server.start()
        self.grpc_server = server
        if self.cluster is not None:
            self.cluster.storage.directory.set_address(f"{self.config.host}:{self.port}")
        cluster_config = self.config.cluster
        metrics.describe_process(
            "forwarder" if self.assigned else "serve",
            self._forwarder_id(cluster_config)
            if cluster_config is not None
            else f"{socket.gethostname()}-{self.port}",
            cluster_config.zone if cluster_config is not None else "default",
            version(),
        )
        if self.config.http_port >= 0:
            # REST v1 on the HTTP port: each call goes to this process's gRPC port.
            self.rest = RestFront(self.local_target, MAX_RECEIVE_BYTES)
            self.http.rest = self.rest.handle
            self.http_port = await self.http.start(
                self.config.host, self.config.http_port, ssl=tls.context() if tls else None
            )
        if self.config.pulsar_port >= 0:
            # A gateway to this process's own gRPC API (pulsar/__init__.py).
            self.pulsar = PulsarServer(
                self.local_target,
                f"pubsubd-{version()}",
                ssl=tls.context() if tls else None,
                verifier=self.verifier,
                # Its consumers' StreamingPulls and its producers' publishes in this process,
                # without the loopback hop, when the gRPC port checks no caller
                # (pulsar/streams.py, pulsar/gateway.py); else through it.
                open_in_process=None if interceptors else subscriber_servicer.open_in_process,
                publish_in_process=None if interceptors else replay_servicer.publish_in_process,
            )
            self.pulsar_port = await self.pulsar.start(self.config.host, self.config.pulsar_port)
        if self.config.prober_interval_s > 0:
            # With TLS on, through the local socket the REST front uses (the same server and
            # interceptors, so its calls count and are checked like a client's); with
            # authentication on, carrying --prober-token-file's token.
            endpoint = self.local_target if tls is not None else f"{self.config.host}:{self.port}"
            self.prober = ProbeLoop(
                ProberConfig(
                    (endpoint,),
                    interval_s=self.config.prober_interval_s,
                    security=ClientSecurity(token_file=self.config.prober_token_file),
                )
            )
            self.prober.start()
        log.info(
            "pubsubd ready grpc=%s:%d http=%s:%d pulsar=%d data_dir=%s fsync=%s tls=%s auth=%s%s",
            self.config.host,
            self.port,
            self.config.host,
            self.http_port,
            self.pulsar_port,
            self.config.storage.data_dir,
            self.config.storage.fsync.value,
            "off" if tls is None else "mutual" if tls.client_ca else "on",
            "off" if self.verifier is None else "token",
            "" if self.cluster is None else f" cluster={self.cluster.coordinator.hosts}",
        )
        if self.auditor is not None:
            self.auditor.start()
        if self.config.source_growth is not None:
            # Busy topics get more publish message sources (core/source_growth.py); in a
            # cluster, each forwarder decides for the topics it owns.
            self.source_growth = SourceGrowthLoop(
                self.config.source_growth,
                self.catalog,
                lambda: self.publishing.published,
                owns=self.owned.__contains__ if self.assigned else None,
            )
            self.source_growth.start()
        if self.cluster is not None and self.config.cluster is not None:
            forwarder_id = self._forwarder_id(self.config.cluster)
            if self.assigned:
                self._follow_assignment(self.cluster, forwarder_id)
            else:
                # serve --cluster owns every topic; it reports those published to since it
                # started (the others weigh 1 anyway), not every name it has.
                self._start_load_report(
                    self.cluster, forwarder_id, self.publishing.published.keys()
                )
            await self._register_forwarder(self.cluster.coordinator, self.config.cluster)

    def _forwarder_id(self, cluster: ClusterConfig) -> str:
        return cluster.forwarder_id or f"{socket.gethostname()}-{self.port}"

    def _follow_assignment(self, cluster: ClusterParts, forwarder_id: str) -> None:
        """Serve the topics the published assignment gives this forwarder, and follow it."""
        catalog, snapshots, cursors = self.catalog, self.snapshots, self.cursors

        def records_of(uid: str) -> list[Change]:
            topic = catalog.topics_by_uid.get(uid)
            return [
                *([Change(topic.record)] if topic is not None else []),
                *(Change(s.record) for s in catalog.subscriptions_of(uid)),
                *(
                    Change(e.record)
                    for e in snapshots.entries.values()
                    if e.record.topic_uid == uid
                ),
                *(Change(r) for (t, _), r in cursors.records.items() if t == uid),
            ]

        def assigned() -> set[str]:
            return self.routing.owned_topics(forwarder_id) if self.routing is not None else set()

        def subscriptions_assigned() -> set[str]:
            if self.routing is None:
                return set()
            return set(self.routing.owned_subscription_sources(forwarder_id))

        def sources_assigned() -> dict[str, frozenset[int] | None]:
            if self.routing is None:
                return {}
            return self.routing.owned_subscription_sources(forwarder_id)

        def subscription_record(uid: str) -> SubscriptionRecord | None:
            topic_uid = catalog.subscription_topics.get(uid)
            if topic_uid is None:
                return None
            found = [s.record for s in catalog.subscriptions_of(topic_uid) if s.record.uid == uid]
            return found[0] if found else None

        assert self.remote_sources is not None
        subscriptions = self.subscription_ownership = SubscriptionOwnership(
            assigned=subscriptions_assigned,
            topic_assigned=lambda uid: uid in assigned(),
            record_of=subscription_record,
            subscribing=self.subscribing,
            subscribing_reconciler=self.node.subscribing_reconciler,
            owned_topics=self.owned,
            remote=self.remote_sources,
            ready=self.served,
            sources_assigned=sources_assigned,
            caught_up=catalog.caught_up,
        )
        self.ownership = TopicOwnership(
            assigned=assigned,
            records_of=records_of,
            subscriptions_of=lambda uid: [s.record.uid for s in catalog.subscriptions_of(uid)],
            storage=cluster.storage,
            data_dir=self.config.storage.data_dir,
            publishing=self.publishing,
            subscribing=self.subscribing,
            publishing_reconciler=self.node.publishing_reconciler,
            subscribing_reconciler=self.node.subscribing_reconciler,
            owned=self.owned,
            on_moved=subscriptions.topic_moved,
        )
        topics = self.ownership

        def routing_changed() -> None:
            topics.changed()
            subscriptions.changed()

        self.routing = RoutingView(cluster.coordinator, routing_changed)
        # A snapshot of a spread subscription reads the other sources' positions from the
        # forwarders serving them (data/subscribe/leg_cursors.py).
        routing = self.routing
        self.leg_cursors = LegCursors(
            served_sources=self.subscribing.served_sources.get,
            owner_address=lambda uid, source: routing.owner_address(subscribing_unit(uid, source)),
        )
        self.snapshots.gather = self.leg_cursors.gather
        # A subscription routed here before this process's catalog had its record opens as
        # soon as the record arrives (the catalog applies it first: it watched first).
        self.store.changes.watch(
            lambda change: (
                subscriptions.changed() if isinstance(change.record, SubscriptionRecord) else None
            )
        )
        self.routing.start()
        self._start_load_report(cluster, forwarder_id, self.owned)

        def sources_of(topic_uid: str) -> int:
            topic = catalog.topics_by_uid.get(topic_uid)
            return publish_sources.parse(topic.topic.labels).sources if topic is not None else 0

        self.serving_catch_up = ServingCatchUp(
            RoutingStore(cluster.coordinator), self.routing, lambda: forwarder_id, sources_of
        )

    async def _serving_caught_up(self, record: SubscriptionRecord) -> None:
        """After a write to a subscription: the other forwarders serving it have applied it
        (api/grpc/serving_catch_up.py; a forwarder of a cluster of forwarders only)."""
        if self.serving_catch_up is not None:
            await self.serving_catch_up(record)

    def _start_load_report(
        self, cluster: ClusterParts, forwarder_id: str, owned: Collection[str]
    ) -> None:
        """Report what its topics (``owned``: their uids) and subscriptions cost, and its
        shares of their backlogs, for the router to weigh them by and the whole backlog views
        to add up (data/load_report.py): a forwarder's, the topics it is assigned."""
        routing_store = RoutingStore(cluster.coordinator)
        self.load_report = LoadReporter(
            owned=owned,
            published=self.publishing.published,
            dispatchers=lambda: self.subscribing.dispatchers,
            write=lambda loads, at, subs, shares: routing_store.write_load(
                forwarder_id, loads, at, subs, shares
            ),
            interval_s=self.config.cluster.load_report_s if self.config.cluster else 5.0,
            shares=self._backlog_shares,
            half_life=routing_store.load_half_life,
        )
        self.load_report.start()

    def _backlog_shares(self) -> dict[str, BacklogShare]:
        """This forwarder's share of the backlog of each subscription served here that has
        one or is spread, by uid (its load report; core/backlog_view.py)."""
        now_us = self.clock.time_us()
        shares = {}
        for dispatcher in self.subscribing.dispatchers.values():
            share = dispatcher.backlog_share(now_us)
            if share is not None:
                shares[dispatcher.uid] = share
        return shares

    def _topic_owners(self, topic_uid: str) -> list[str]:
        """The addresses of a topic's publishing forwarders as last published: its owner,
        then the fallbacks (a subscription read on a copy reaches it through them)."""
        if self.routing is None:
            return []
        forwarders = self.routing.forwarders
        route = self.routing.route(publishing_unit(topic_uid, 0))
        return [forwarders[f].address for f in route if f in forwarders]

    async def _remote_publish(self, topic_uid: str, request: bytes) -> None:
        """Publish to a topic another forwarder owns (dead letters, SLI events): its
        PublishRequest, as bytes, to the owner the published assignment names."""
        address = (
            self.routing.owner_address(publishing_unit(topic_uid, 0))
            if self.routing is not None
            else None
        )
        if address is None:
            raise Unavailable(f"no forwarder owns topic storage {topic_uid} yet")
        channel = self._publish_channels.get(address)
        if channel is None:
            channel = self._publish_channels[address] = new_channel(address)
        try:
            await channel.unary_unary("/google.pubsub.v1.Publisher/Publish")(
                request, timeout=30, metadata=INTERNAL_TOKEN.metadata()
            )
        except grpc.aio.AioRpcError as e:
            refused = _REFUSED.get(e.code())  # the owner refuses the content itself
            if refused is not None:
                raise refused(f"{address} refused the publish: {e.details()}") from e
            raise Unavailable(f"publishing to {address} failed: {e.details()}") from e

    async def _register_forwarder(self, coordinator: Coordinator, cluster: ClusterConfig) -> None:
        """Register as a forwarder (routing/forwarders/<id>) of the kinds it serves."""
        forwarder = Forwarder(
            self._forwarder_id(cluster),
            f"{self.config.host}:{self.port}",
            cluster.zone,
            version(),
            publishing=cluster.publishing or not cluster.assigned,
            subscribing=cluster.subscribing or not cluster.assigned,
        )
        self.forwarder = forwarder
        self.registration = Registration(
            coordinator,
            coordinator.layout.forwarder(forwarder.forwarder_id),
            lambda: forwarder,
            encode_forwarder,
            lambda published, now: published != now,
        )
        await self.registration.start()

    async def stop(self) -> None:
        """End streams with UNAVAILABLE, finish in-flight RPCs, then close storage cleanly."""
        if self.registration is not None:
            await self.registration.stop()  # routers move its units before it goes
        if self.load_report is not None:
            await self.load_report.close()
        if self.serving_catch_up is not None:
            await self.serving_catch_up.close()
        if self.source_growth is not None:
            await self.source_growth.close()
        if self.subscription_ownership is not None:
            await self.subscription_ownership.close()  # acks read on copies to their owners
        if self.ownership is not None:
            await self.ownership.close()
        if self.routing is not None:
            self.routing.close()
        for channel in self._publish_channels.values():
            await channel.close()
        if self.leg_cursors is not None:
            await self.leg_cursors.close()
        if self.auditor is not None:
            await self.auditor.close()
        if self.sli_events is not None:
            await self.sli_events.close()
        if self.prober is not None:
            await self.prober.stop()
        await self.maintenance.close()
        if self._quota_task is not None:
            self._quota_task.cancel()
        if self._slo_task is not None:
            self._slo_task.cancel()
        await self.dashboard.close()
        if self.pulsar is not None:
            await self.pulsar.stop()  # its consumers give back what they hold
        self._unregister_backlog()
        await self.subscribing.close()
        if self.grpc_server is not None:
            await self.grpc_server.stop(self.config.shutdown_grace_s)
        await self.http.close()
        if self.rest is not None:
            await self.rest.close()
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, ignore_errors=True)
        await self.publishing.close()
        self.store.close()
        if self.cluster is not None:
            await self.cluster.close()
        self._stopped.set()

    def _start_sli_events(self) -> None:
        """SLI monitoring events (observability/events.py) to the internal topic; never fatal."""
        if self.config.sli_events_s <= 0:
            return
        try:
            if EVENTS_TOPIC not in self.catalog.topics:
                self.catalog.create_topic(pb.Topic(name=EVENTS_TOPIC))
        except AlreadyExists:
            pass  # another forwarder of the cluster created it a moment ago
        except Exception:
            log.exception("cannot create %s: SLI events are off", EVENTS_TOPIC)
            return

        async def sink(raw: bytes, count: int) -> None:
            uid = self.catalog.topic(EVENTS_TOPIC).record.uid
            if self.assigned and not self.routes.serves_topic(uid):
                await self._remote_publish(uid, raw)
                return
            await self.routes.publishing(uid).publish(uid, raw, count)

        def backlog(name: str, now_us: int) -> tuple[str, Any]:
            entry = self.catalog.subscriptions[name]
            stats = self.routes.subscribing(entry.record.uid).backlog_stats(name, now_us)
            return str(entry.subscription.topic), stats

        self.sli_events = EventEmitter(
            sink,
            self.config.sli_events_s,
            backlog=BacklogRotation(self.subscribing.subscription_names, backlog),
        )
        self.sli_events.start()

    def _backlogs(self) -> list[sli.BacklogRow]:
        """Every subscription served here, with its topic and backlog."""
        now_us = self.clock.time_us()
        rows = []
        for subscribing in self.routes.all_subscribing():
            for name in subscribing.subscription_names():
                try:
                    topic = str(self.catalog.subscriptions[name].subscription.topic)
                    b = subscribing.backlog_stats(name, now_us)
                except Exception:  # deleted meanwhile: the next scrape will not list it
                    continue
                rows.append(sli.BacklogRow(name, topic, b.messages, b.bytes, b.oldest_age_s))
        return rows

    async def _slo_loop(self) -> None:
        """Sample the SLO tallies and the backlog ages for the burn-rate windows
        (observability/slo.py)."""
        while True:
            try:
                ages = [(b.topic, b.oldest_age_s) for b in self._backlogs()]
            except Exception as e:  # a sample without the backlog beats no sample
                background.report("SLO backlog sample", e)
                ages = []
            self.slo.sample(time.monotonic(), ages)
            await asyncio.sleep(self.config.slo_sample_s)

    async def _quota_loop(self) -> None:
        """Backlog quotas with evict_oldest are applied every ``quota_check_s``."""
        while True:
            await asyncio.sleep(self.config.quota_check_s)
            try:
                for subscribing in self.routes.all_subscribing():
                    subscribing.enforce_eviction()
                    subscribing.refresh_blocks()  # age limits move with time
            except Exception as e:
                background.report("backlog quotas", e)

    def status(self) -> dict[str, Any]:
        return {
            "topics": len(self.catalog.topics),
            "pulsar_port": self.pulsar_port,
            "subscriptions": {
                name: subscribing.status(name)
                for subscribing in self.routes.all_subscribing()
                for name in subscribing.subscription_names()
            },
            "storage": self.publishing.stats(),
            # Completed trim passes (every trim_interval_s): "the next pass" for tests and tools
            "trim_passes": self.publishing.trim_passes,
            # Damaged stored messages (storage/damage.py) and topics whose storage cannot open
            "damaged": self.damage_status(),
            "failed_topics": self.publishing.failed_topics,
            # Replay API named cursors: topic -> cursor -> offsets, lag (latest - committed)
            "cursors": self.cursors.status(),
            "dedup": self.publishing.dedup.status(),
            "disk": self.disk.status(),
            "cluster": self.cluster_status(),
            "sli": sli.recorder().status(),
            "prober": self.prober.status() if self.prober is not None else None,
            "flow_control": {
                "inflight_publish_bytes": self.inflight.status(),
                "outstanding_deliveries": self.subscribing.budget.status(),
                "log_cache": cache_budget.PROCESS.status(),
            },
        }

    def cluster_status(self) -> dict[str, Any] | None:
        if self.cluster is None:
            return None
        status = self.cluster.storage.status()
        if self.auditor is not None:
            status["auditor"] = self.auditor.status()
        if self.forwarder is not None:
            status["forwarder"] = {"id": self.forwarder.forwarder_id, "zone": self.forwarder.zone}
        if self.ownership is not None:
            status["ownership"] = self.ownership.status()
        if self.subscription_ownership is not None:
            status["subscription_ownership"] = self.subscription_ownership.status()
        if self.load_report is not None:  # the half-life: the leading router's
            status["load_report"] = {
                "interval_s": self.load_report.interval_s,
                "half_life_s": self.load_report.rates.half_life_s,
            }
        if self.serving_catch_up is not None:  # forwarders asked to apply a subscription write
            status["serving_catch_up"] = self.serving_catch_up.status()
        return status

    def _damage_report(self) -> dict[str, list[tuple[int, DamagedRange]]]:
        report = {}
        for publishing in self.routes.all_publishing():
            for uid in publishing.topic_uids(written_only=True):
                ranges = publishing.damaged(uid)
                if ranges:
                    report[uid] = ranges
        return report

    def damage_status(self) -> list[dict[str, Any]]:
        out = []
        for uid, ranges in sorted(self._damage_report().items()):
            entry = self.catalog.topics_by_uid.get(uid)
            for source, damaged in ranges:
                out.append(
                    {
                        "topic": entry.record.name if entry is not None else "",
                        "topic_storage": uid,
                        "source": source,
                        "messages": damaged.messages,
                        **damaged.as_dict(),
                    }
                )
        return out

    def _damage_gauges(self) -> None:
        def ranges() -> float:
            return sum(len(r) for r in self._damage_report().values())

        def messages() -> float:
            report = self._damage_report().values()
            return sum(d.messages for r in report for _, d in r)

        metrics.DAMAGED_RANGES.set_function(ranges)
        metrics.DAMAGED_MESSAGES.set_function(messages)


@dataclass
class ClusterParts:
    """What a clustered server gets from ZooKeeper before its roles are built."""

    coordinator: Coordinator
    store: MetadataStore
    storage: ClusterStorage

    async def close(self) -> None:
        await self.storage.close()
        await self.coordinator.stop()


# How long a clustered server waits at start-up for the storage nodes its ledgers need.
STORAGE_NODES_WAIT_S = 30.0


def authorization(
    config: ServerConfig, policies: ResourcePolicies, internal: InternalIdentity | None = None
) -> list[Authorization]:
    """The server interceptors of ``--iam``: none when authorization is off. A forwarder of a
    cluster without authentication (behind frontends, which check every call) only names the
    caller; with authentication it checks every call too, but lets ``internal`` (the principal
    of the cluster's internal token: other forwarders' dead letters, SLI events) pass."""
    if not config.iam:
        return []
    identify = trusted_caller_header if config.trust_caller_header else None
    assigned = config.cluster is not None and config.cluster.assigned
    enforce = not assigned or config.tokens is not None
    if identify is not None:
        log.warning(
            "--trust-caller-header: the %s header is believed as the caller's identity; "
            "for tests and development only",
            "x-pubsubd-caller",
        )
    checking = Authorization(policies.check, identify, enforce=enforce, trusted=internal)
    policies.on_change(checking.recheck)  # a revoked permission ends the open streams it held
    return [checking]


async def connect_cluster(config: ServerConfig) -> ClusterParts:
    """Connect to ZooKeeper, wait for storage nodes, take over every source of every topic
    and bring the local copies up to their ledgers (storage/ledgers/cluster.py)."""
    cluster = config.cluster
    assert cluster is not None
    coordinator = Coordinator(
        cluster.zookeeper, cluster.root, session_timeout=cluster.session_timeout_s
    )
    await coordinator.start()
    try:
        # A fixed port is known before binding: the owner znodes taken over below name it.
        address = f"{config.host}:{config.port}" if config.port else ""
        storage = ClusterStorage(
            coordinator,
            replicas=cluster.replicas,
            ledger_bytes=cluster.ledger_bytes,
            owner_check=OwnerCheck(this_process(address), liveness.probe),
        )
        await storage.start(wait_for_nodes=1, wait_s=STORAGE_NODES_WAIT_S)
        # Every node there is at start-up up to the replica count (issue: "at most the
        # number of nodes"); a short grace lets the others of a starting cluster register.
        deadline = asyncio.get_running_loop().time() + 3.0
        while len(storage.directory.nodes()) < cluster.replicas:
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        replicas = min(cluster.replicas, len(storage.directory.nodes()))
        storage.policy = StoragePolicy(replicas=replicas)
        store = ZooKeeperMetadataStore(coordinator)
        await store.follow()  # other processes' changes reach the reconcilers too
        storage.follow_topics(store)  # message_storage_policy and pubsubd-storage-replicas
        if cluster.assigned:  # a forwarder takes over the topics it is given, as it is
            log.info(
                "cluster: %d storage nodes; topics as assigned", len(storage.directory.nodes())
            )
            return ClusterParts(coordinator, store, storage)
        uids = {t.uid for t in store.load_topics()} | {
            s.topic_uid for s in store.load_subscriptions()
        }
        copied = await storage.prepare(config.storage.data_dir / TOPICS_DIR, sorted(uids))
        restored = 0
        for record in store.load_subscriptions():
            source = cursor_source(record.uid)
            if await storage.directory.sources(source):  # it flushed acks at least once
                ledgers = storage.remote_log(source, 0)
                await ledgers.take_over()
                directory = config.storage.data_dir / SUBSCRIPTIONS_DIR / record.uid
                restored += await restore_journal(directory, ledgers)
        log.info(
            "cluster: %d storage nodes, %d copies per ledger, %d sources taken over, "
            "%d entries copied to local copies, %d ack journals restored",
            len(storage.directory.nodes()),
            replicas,
            len(storage.sources),
            copied,
            restored,
        )
    except BaseException:
        await coordinator.stop()
        raise
    return ClusterParts(coordinator, store, storage)


async def serve(config: ServerConfig) -> None:
    cluster = await connect_cluster(config) if config.cluster is not None else None
    server = PubsubServer(config, cluster)
    await server.start()
    await runtime.until_signalled("pubsubd", server.stop)


def run(config: ServerConfig) -> None:
    runtime.run(lambda: serve(config))
