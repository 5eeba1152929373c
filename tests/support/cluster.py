"""A local cluster for tests (``pubsubd.cluster.launcher``): ZooKeeper, storage nodes, serve.

``ClusterServer`` shows the cluster's serving process with ``ServerProcess``'s attributes
(``endpoint``, ``http_port``, ``log()``), so tests written for one process run against a
cluster unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsubd.cluster.launcher import LocalCluster
from pubsubd.control.routing_store import RoutingStore
from pubsubd.control.routing_table import publishing_unit, subscribing_unit
from pubsubd.coordination.zk import Coordinator
from pubsubd.storage.ledgers.meta import LedgerList
from pubsubd.storage.zk_metadata import ZooKeeperMetadataStore

# Short ZooKeeper sessions: a killed serving process's ownership expires in seconds.
CLUSTER_ENV = {"PUBSUBD_ZK_SESSION_TIMEOUT_S": "4"}


@dataclass
class ClusterServer:
    cluster: LocalCluster

    @property
    def endpoint(self) -> str:
        return self.cluster.grpc

    @property
    def host(self) -> str:
        return self.cluster.grpc.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.cluster.grpc.rsplit(":", 1)[1])

    @property
    def http_port(self) -> int:
        return int(self.cluster.http.rsplit(":", 1)[1])

    @property
    def serving(self) -> str:
        """The serving process's name (the first forwarder's with several)."""
        roles = {p.name: p.role for p in self.cluster.processes}
        return "serve" if "serve" in roles else "forwarder-1"

    @property
    def data_dir(self) -> Path:
        return self.cluster.directory / self.serving

    def alive(self) -> bool:
        return self.cluster.process(self.serving).running(self.cluster.directory)

    def log(self) -> str:
        return Path(self.cluster.process(self.serving).log).read_text(errors="replace")

    def status(self) -> dict[str, Any]:
        """The serving process's /status; with several forwarders, theirs merged (each
        holds the subscriptions of the topics it owns)."""
        forwarders = [p for p in self.cluster.processes if p.role == "forwarder" and p.pid]
        if not forwarders:
            return _get_status(self.cluster.http)
        statuses = [
            _get_status(f"127.0.0.1:{p.args[p.args.index('--http-port') + 1]}") for p in forwarders
        ]
        merged = dict(statuses[0])
        for key in ("subscriptions", "failed_topics", "cursors", "storage"):
            merged[key] = {k: v for st in statuses for k, v in st[key].items()}
        merged["damaged"] = [d for st in statuses for d in st["damaged"]]
        merged["trim_passes"] = min(st["trim_passes"] for st in statuses)
        merged["dedup"] = {
            **statuses[0]["dedup"],
            **{k: sum(st["dedup"][k] for st in statuses) for k in ("remembered_ids", "duplicates")},
        }
        return merged


def _get_status(http: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set in this process's environment for the block (the cluster's processes
    inherit it when they start or restart), the previous values back after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def running_cluster(
    directory: Path,
    *,
    zk_nodes: int = 1,
    storage_nodes: int = 3,
    session_timeout_s: float | None = None,
    **kwargs: Any,
) -> Iterator[LocalCluster]:
    """A cluster for the duration of the block; every process it started is stopped after.
    ``session_timeout_s`` replaces the short test session (4 s)."""
    env = dict(CLUSTER_ENV)
    if session_timeout_s is not None:
        env["PUBSUBD_ZK_SESSION_TIMEOUT_S"] = str(session_timeout_s)
    with environment(env):
        cluster = LocalCluster(directory)
        try:
            cluster.up(zk_nodes=zk_nodes, storage_nodes=storage_nodes, **kwargs)
            yield cluster
        finally:
            cluster.down()


@contextmanager
def spread_cluster(
    directory: Path, env: Mapping[str, str], router_args: list[str], subscribing: int = 2
) -> Iterator[LocalCluster]:
    """The cluster of the spread-subscription tests: one publishing-only forwarder
    (``forwarder-1``) and ``subscribing`` subscribing-only ones (``forwarder-2``,
    ``forwarder-3``, ...) over two zones, one router run with ``router_args``
    (``--spread-subscriptions`` and its settings), one frontend; ``env`` is the processes'
    extra settings (load report interval, ...)."""
    with (
        environment(env),
        running_cluster(
            directory,
            zones=2,
            routers=1,
            frontends=1,
            forwarders=1 + subscribing,
            forwarder_args=[["--no-subscribing"], *[["--no-publishing"]] * subscribing],
            router_args=router_args,
            session_timeout_s=20.0,
        ) as cluster,
    ):
        yield cluster


def topic_uid(cluster: LocalCluster, topic: str) -> str:
    """The storage uid of ``topic``, from the cluster's metadata in ZooKeeper."""

    async def read() -> str:
        coordinator = Coordinator(cluster.zk, auth=cluster.zk_credential)
        await coordinator.start()
        try:
            store = ZooKeeperMetadataStore(coordinator)
            try:
                return next(t.uid for t in store.load_topics() if t.name == topic)
            finally:
                store.close()
        finally:
            await coordinator.stop()

    return asyncio.run(read())


def subscription_uid(cluster: LocalCluster, subscription: str) -> str:
    """The storage uid of ``subscription``, from the cluster's metadata in ZooKeeper."""

    async def read() -> str:
        coordinator = Coordinator(cluster.zk, auth=cluster.zk_credential)
        await coordinator.start()
        try:
            store = ZooKeeperMetadataStore(coordinator)
            try:
                return next(s.uid for s in store.load_subscriptions() if s.name == subscription)
            finally:
                store.close()
        finally:
            await coordinator.stop()

    return asyncio.run(read())


def ledger_nodes(cluster: LocalCluster, uid: str) -> list[tuple[str, ...]]:
    """The node list of every ledger of every source of the topic with storage ``uid``."""

    async def read() -> list[tuple[str, ...]]:
        coordinator = Coordinator(cluster.zk, auth=cluster.zk_credential)
        await coordinator.start()
        try:
            layout = coordinator.layout
            parent = layout.source(uid, 0).rsplit("/", 1)[0]
            out: list[tuple[str, ...]] = []
            for source in await coordinator.children(parent):
                if source.isdigit():
                    data, stat = await coordinator.get(layout.source(uid, int(source)))
                    out += [m.nodes for m in LedgerList.decode(data, stat.version).ledgers]
            return out
        finally:
            await coordinator.stop()

    return asyncio.run(read())


def routes(cluster: LocalCluster) -> dict[str, tuple[str, ...]]:
    """Every unit's published route (owner first), from ZooKeeper."""

    async def read() -> dict[str, tuple[str, ...]]:
        zk = Coordinator(cluster.zk, "/pubsubd", auth=cluster.zk_credential)
        await zk.start()
        try:
            return await RoutingStore(zk).routes()
        finally:
            await zk.stop()

    return asyncio.run(read())


def subscription_server(cluster: LocalCluster, subscription: str) -> str:
    """The forwarder the published assignment gives ``subscription`` ("" if none yet)."""
    unit = subscribing_unit(subscription_uid(cluster, subscription), 0)
    route = routes(cluster).get(unit, ())
    return route[0] if route else ""


def topic_owner(cluster: LocalCluster, topic: str) -> str:
    """The forwarder the published assignment gives ``topic`` ("" if none yet)."""
    route = routes(cluster).get(publishing_unit(topic_uid(cluster, topic), 0), ())
    return route[0] if route else ""
