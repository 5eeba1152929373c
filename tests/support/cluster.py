"""A local cluster for tests (``pubsubd.cluster.launcher``): ZooKeeper, storage nodes, serve.

``ClusterServer`` shows the cluster's serving process with ``ServerProcess``'s attributes
(``endpoint``, ``http_port``, ``log()``), so tests written for one process run against a
cluster unchanged.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsubd.cluster.launcher import LocalCluster

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
