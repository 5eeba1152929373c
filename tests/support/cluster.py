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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsubd.cluster.launcher import LocalCluster
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
    def data_dir(self) -> Path:
        return self.cluster.directory / "serve"

    def alive(self) -> bool:
        return self.cluster.process("serve").running(self.cluster.directory)

    def log(self) -> str:
        return Path(self.cluster.process("serve").log).read_text(errors="replace")

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.cluster.http}/status", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]


@contextmanager
def running_cluster(
    directory: Path, *, zk_nodes: int = 1, storage_nodes: int = 3, **kwargs: Any
) -> Iterator[LocalCluster]:
    """A cluster for the duration of the block; every process it started is stopped after."""
    saved = {k: os.environ.get(k) for k in CLUSTER_ENV}
    os.environ.update(CLUSTER_ENV)
    cluster = LocalCluster(directory)
    try:
        cluster.up(zk_nodes=zk_nodes, storage_nodes=storage_nodes, **kwargs)
        yield cluster
    finally:
        cluster.down()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def topic_uid(cluster: LocalCluster, topic: str) -> str:
    """The storage uid of ``topic``, from the cluster's metadata in ZooKeeper."""

    async def read() -> str:
        coordinator = Coordinator(cluster.zk)
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


def ledger_nodes(cluster: LocalCluster, uid: str) -> list[tuple[str, ...]]:
    """The node list of every ledger of every source of the topic with storage ``uid``."""

    async def read() -> list[tuple[str, ...]]:
        coordinator = Coordinator(cluster.zk)
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
