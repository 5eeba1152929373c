"""Composition root: builds every role of ``pubsubd serve`` in one process and runs it.

Roles (ARCHITECTURE.md, "Roles and where they live"): the frontend (gRPC servicers, the service
proxy clients talk to), the router (control plane), one publishing forwarder and one subscribing
forwarder (data plane), embedded storage and the embedded metadata store. They are wired through
the same narrow interfaces a multi-process deployment puts a network transport behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from typing import Any

import grpc

from pubsubd.api.grpc import admin, publisher, replay, subscriber
from pubsubd.config import ServerConfig
from pubsubd.control.catalog import Catalog
from pubsubd.control.cursors import Cursors
from pubsubd.control.expiry import Maintenance
from pubsubd.control.router import Router
from pubsubd.core import pb
from pubsubd.data.publish.dedup import Deduplicator
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.observability import background, metrics
from pubsubd.observability.events import EVENTS_TOPIC, BacklogRotation, EventEmitter
from pubsubd.observability.http import HttpEndpoint
from pubsubd.storage.disk_space import DiskSpace
from pubsubd.storage.metadata import SqliteMetadataStore

log = logging.getLogger(__name__)

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


class PubsubServer:
    """Every role of the service in one process."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        storage = config.storage
        # One watcher of disk-full episodes for every write to the data directory.
        self.disk = DiskSpace(storage.data_dir)
        metrics.DISK_FREE_BYTES.set_function(lambda: float(self.disk.free_bytes() or 0))
        self.store = SqliteMetadataStore(storage.data_dir, self.disk)
        self.publishing = PublishingForwarder(
            storage.data_dir,
            fsync=storage.fsync,
            segment_bytes=storage.segment_bytes,
            disk=self.disk,
            trim_interval_s=storage.trim_interval_s,
            ack_flush_interval_s=storage.ack_flush_interval_s,
        )
        self.subscribing = SubscribingForwarder(self.publishing)
        self.router = Router(
            [("publishing-0", self.publishing)], [("subscribing-0", self.subscribing)]
        )
        self.catalog = Catalog(self.store, self.publishing, self.subscribing)
        # The replay API (docs/REPLAY_API.md): named cursors and the dedup window.
        self.cursors = Cursors(self.catalog)
        self.dedup = Deduplicator(self.publishing, config.dedup_window_s)
        self.maintenance = Maintenance(
            self.catalog,
            check_interval_s=config.expiry_check_s,
            ttl_divisor=config.test_ttl_divisor,
        )
        self.grpc_server: grpc.aio.Server | None = None
        self.http = HttpEndpoint(self.status, self.disk.problem)
        self.port = 0
        self.http_port = 0
        self._stopped = asyncio.Event()
        self._quota_task: asyncio.Task[None] | None = None
        self.sli_events: EventEmitter | None = None

    async def start(self) -> None:
        # Loading 100k topics and subscriptions creates millions of objects that live on;
        # collecting cycles while they pile up took more than half of the load time.
        gc.disable()
        try:
            self.catalog.load()
        finally:
            gc.enable()
        gc.collect()
        # Cursor and dedup pins are installed before the first trim can delete what they keep.
        self.cursors.load()
        self.dedup.recover(e.record.uid for e in self.catalog.topics.values())
        self.publishing.start()
        self.dedup.start()
        self.maintenance.start()
        self._quota_task = asyncio.create_task(self._quota_loop(), name="quota_loop")
        self._start_sli_events()
        self._damage_gauges()
        server = grpc.aio.server(options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers(
            [
                publisher.handlers(publisher.PublisherServicer(self.catalog, self.router)),
                subscriber.handlers(subscriber.SubscriberServicer(self.catalog, self.router)),
                replay.handlers(
                    replay.ReplayServicer(self.catalog, self.router, self.cursors, self.dedup)
                ),
                admin.handlers(admin.AdminServicer(self.catalog, self.router)),
            ]
        )
        self.port = server.add_insecure_port(f"{self.config.host}:{self.config.port}")
        if self.port == 0:
            raise OSError(f"cannot bind gRPC port {self.config.host}:{self.config.port}")
        await server.start()
        self.grpc_server = server
        if self.config.http_port >= 0:
            self.http_port = await self.http.start(self.config.host, self.config.http_port)
        log.info(
            "pubsubd ready grpc=%s:%d http=%s:%d data_dir=%s fsync=%s",
            self.config.host,
            self.port,
            self.config.host,
            self.http_port,
            self.config.storage.data_dir,
            self.config.storage.fsync.value,
        )

    async def stop(self) -> None:
        """End streams with UNAVAILABLE, finish in-flight RPCs, then close storage cleanly."""
        if self.sli_events is not None:
            await self.sli_events.close()
        await self.maintenance.close()
        await self.dedup.close()
        if self._quota_task is not None:
            self._quota_task.cancel()
        await self.subscribing.close()
        if self.grpc_server is not None:
            await self.grpc_server.stop(self.config.shutdown_grace_s)
        await self.http.close()
        await self.publishing.close()
        self.store.close()
        self._stopped.set()

    def _start_sli_events(self) -> None:
        """SLI monitoring events (observability/events.py) to the internal topic; never fatal."""
        if self.config.sli_events_s <= 0:
            return
        try:
            if EVENTS_TOPIC not in self.catalog.topics:
                self.catalog.create_topic(pb.Topic(name=EVENTS_TOPIC))
        except Exception:
            log.exception("cannot create %s: SLI events are off", EVENTS_TOPIC)
            return

        async def sink(raw: bytes, count: int) -> None:
            uid = self.catalog.topic(EVENTS_TOPIC).record.uid
            await self.router.publishing_forwarder(uid).publish(uid, raw, count)

        self.sli_events = EventEmitter(
            sink,
            self.config.sli_events_s,
            backlog=BacklogRotation(lambda: self.subscribing.dispatchers),
        )
        self.sli_events.start()

    async def _quota_loop(self) -> None:
        """Backlog quotas with evict_oldest are applied every ``quota_check_s``."""
        while True:
            await asyncio.sleep(self.config.quota_check_s)
            try:
                self.catalog.enforce_eviction()
            except Exception as e:
                background.report("backlog quota eviction", e)

    def status(self) -> dict[str, Any]:
        return {
            "topics": len(self.catalog.topics),
            "subscriptions": {
                name: {
                    "backlog": d.backlog(),
                    "outstanding": len(d.leases),
                    "consumers": len(d.consumers),
                    "delivered": d.delivered,
                    "acked": d.acked,
                    "lost": d.lost,
                    **d.damage_status(),
                    **self.subscribing.push.stats(name),
                }
                for name, d in self.subscribing.dispatchers.items()
            },
            "storage": self.publishing.stats(),
            # Completed trim passes (every trim_interval_s): "the next pass" for tests and tools
            "trim_passes": self.publishing.trim_passes,
            # Damaged stored messages (storage/damage.py) and topics whose storage cannot open
            "damaged": self.damage_status(),
            "failed_topics": self.publishing.failed_topics,
            # Replay API named cursors: topic -> cursor -> offsets, lag (latest - committed)
            "cursors": self.cursors.status(),
            "dedup": {
                "window_s": self.config.dedup_window_s,
                "remembered_ids": sum(len(w) for w in self.dedup.windows.values()),
                "duplicates": self.dedup.duplicates,
            },
            "disk": self.disk.status(),
        }

    def damage_status(self) -> list[dict[str, Any]]:
        out = []
        for uid, ranges in sorted(self.publishing.damage_report().items()):
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
            return sum(len(r) for r in self.publishing.damage_report().values())

        def messages() -> float:
            report = self.publishing.damage_report().values()
            return sum(d.messages for r in report for _, d in r)

        metrics.DAMAGED_RANGES.set_function(ranges)
        metrics.DAMAGED_MESSAGES.set_function(messages)


async def serve(config: ServerConfig) -> None:
    server = PubsubServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("pubsubd stopping")
    await server.stop()
    log.info("pubsubd stopped")


def run(config: ServerConfig) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
