"""The roles of one process, wired in-process: what ``pubsubd serve`` runs behind its gRPC
frontends (``app.py``), and what in-process tests build (no gRPC, any metadata store, any clock).

One publishing and one subscribing forwarder at in-process addresses; the router hands out the
addresses and ``Routes`` resolves them. The forwarders follow the metadata store through their
reconcilers (``data/reconcile.py``); the control plane (catalog, snapshots, named cursors)
writes the store and reaches the forwarders only through ``core.roles`` interfaces.
"""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pubsubd.control.catalog import Catalog
from pubsubd.control.cursors import Cursors
from pubsubd.control.router import Router, Routes
from pubsubd.control.snapshots import Snapshots
from pubsubd.core import pb, validation
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.roles import PublishingForwarderApi
from pubsubd.data.publish.forwarder import (
    DEFAULT_ACK_FLUSH_INTERVAL_S,
    DEFAULT_DEDUP_WINDOW_S,
    DEFAULT_TRIM_INTERVAL_S,
    PublishingForwarder,
)
from pubsubd.data.reconcile import PublishingReconciler, SubscribingReconciler
from pubsubd.data.subscribe.budget import DeliveryBudget
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.storage.disk_space import DiskSpace
from pubsubd.storage.log import FsyncPolicy, RemoteLogs
from pubsubd.storage.metadata import MetadataStore

# The in-process addresses of the one forwarder of each kind (control/router.py).
PUBLISHING = "inproc:publishing-0"
SUBSCRIBING = "inproc:subscribing-0"


@dataclass
class Node:
    """Every role of one process but the frontends."""

    store: MetadataStore
    clock: Clock
    publishing: PublishingForwarder
    subscribing: SubscribingForwarder
    router: Router
    routes: Routes
    publishing_reconciler: PublishingReconciler
    subscribing_reconciler: SubscribingReconciler
    catalog: Catalog
    snapshots: Snapshots
    cursors: Cursors

    def load(self) -> None:
        """The forwarders replay the store, then the control plane loads its view. Every pin
        (snapshots, named cursors, retention, dedup windows) is installed before the first trim
        can delete what it keeps. Synchronous (start-up)."""
        # Loading 100k topics and subscriptions creates millions of objects that live on;
        # collecting cycles while they pile up took more than half of the load time.
        gc.disable()
        try:
            self.publishing_reconciler.start(self.store)
            self.subscribing_reconciler.start(self.store)
            self.catalog.load()
            self.catalog.follow()
            self.snapshots.load()
            self.cursors.load()
        finally:
            gc.enable()
        gc.collect()

    def start(self) -> None:
        """Load, then start the forwarders' housekeeping (on the running loop)."""
        self.load()
        self.publishing.start()

    async def close(self) -> None:
        await self.subscribing.close()
        await self.publishing.close()


def build(
    store: MetadataStore,
    data_dir: Path,
    *,
    clock: Clock = SYSTEM_CLOCK,
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
    segment_bytes: int = 64 << 20,
    disk: DiskSpace | None = None,
    trim_interval_s: float = DEFAULT_TRIM_INTERVAL_S,
    ack_flush_interval_s: float = DEFAULT_ACK_FLUSH_INTERVAL_S,
    dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S,
    remote_logs: RemoteLogs | None = None,
    owns_topic: Callable[[str], bool] | None = None,
    owns_subscription: Callable[[str], bool] | None = None,
    remote_sources: PublishingForwarderApi | None = None,
    remote_publish: Callable[[str, bytes], Awaitable[None]] | None = None,
    delivery_budget: DeliveryBudget | None = None,
) -> Node:
    """Wire the roles of one process (call :meth:`Node.start` on the event loop).

    A forwarder of a cluster passes ``owns_topic`` (the topics it owns now, by uid: it serves
    only those and their subscriptions, ``data/ownership.py``) and ``remote_publish(topic uid,
    PublishRequest bytes)`` for publishes to a topic another forwarder owns (dead letters).
    With ``owns_subscription`` (by uid) it serves the subscriptions that says instead of its
    topics' ones, reading a topic owned elsewhere through ``remote_sources``
    (``data/subscribe/remote_sources.py``)."""
    publishing = PublishingForwarder(
        data_dir,
        fsync=fsync,
        segment_bytes=segment_bytes,
        disk=disk,
        trim_interval_s=trim_interval_s,
        ack_flush_interval_s=ack_flush_interval_s,
        dedup_window_s=dedup_window_s,
        clock=clock,
        remote_logs=remote_logs,
        admits=owns_topic,
        owner_quotas=owns_topic is not None,  # a cluster: block quotas at the topic's owner
    )
    router = Router([PUBLISHING], [SUBSCRIBING])
    routes_cell: list[Routes] = []
    catalog_cell: list[Catalog] = []

    async def publish_dead_letter(topic: str, payload: bytes) -> None:
        """A message goes to its dead-letter topic by name, as a client publishes: through
        the catalog and the router, checked against Publish's limits and the topic's schema
        as a Publish is (the checks a remote publish gets from the owner's Publish): a copy
        that fails them (its four CloudPubSubDeadLetter* attributes count) raises
        INVALID_ARGUMENT, so the dispatcher keeps it and tries again later."""
        entry = catalog_cell[0].topic(topic)  # NOT_FOUND while the topic is missing
        uid = entry.record.uid
        request = pb.PublishRequest.FromString(payload)
        validation.publish_request(request, len(payload), payload, now_s=clock.time_us() / 1e6)
        if entry.schema_settings is not None:
            catalog_cell[0].schemas.conform(entry.schema_settings, request.messages)
            payload = request.SerializeToString()
        if remote_publish is not None and not routes_cell[0].serves_topic(uid):
            await remote_publish(uid, payload)
            return
        await routes_cell[0].publishing(uid).publish(uid, payload, 1)

    def topic_route(topic_uid: str) -> PublishingForwarderApi:
        """Where a subscription served here reads its topic: here, or a copy of it."""
        return routes_cell[0].reader(topic_uid)

    subscribing = SubscribingForwarder(
        topic_route,
        clock=clock,
        dead_letter_publish=publish_dead_letter,
        budget=delivery_budget,
        block_quotas_at_owner=owns_topic is not None,
    )
    routes = Routes(router, {PUBLISHING: publishing}, {SUBSCRIBING: subscribing})
    routes_cell.append(routes)
    catalog = Catalog(store, routes, clock)
    catalog_cell.append(catalog)
    if owns_topic is not None:
        routes.restrict(owns_topic, catalog.subscription_topics.get, owns_subscription)
    if remote_sources is not None:
        routes.set_remote(remote_sources)
    return Node(
        store=store,
        clock=clock,
        publishing=publishing,
        subscribing=subscribing,
        router=router,
        routes=routes,
        publishing_reconciler=PublishingReconciler(
            publishing,
            owns_topic or (lambda uid: router.publishing_for(uid)[0] == PUBLISHING),
        ),
        subscribing_reconciler=SubscribingReconciler(
            subscribing,
            (lambda rec: owns_subscription(rec.uid))
            if owns_subscription is not None
            else (lambda rec: owns_topic(rec.topic_uid))
            if owns_topic is not None
            else (lambda rec: router.subscribing_for(rec.uid)[0] == SUBSCRIBING),
        ),
        catalog=catalog,
        snapshots=Snapshots(catalog, routes, clock),
        cursors=Cursors(catalog, routes, clock),
    )
