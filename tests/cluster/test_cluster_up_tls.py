"""``pubsubd cluster up --tls-dir DIR`` (``LocalCluster.up(tls_dir=...)``): ``certs dev``'s files
go to every process, so a one-node cluster (ZooKeeper, a storage node with mutual TLS,
``serve --cluster``, a router, a frontend and a prober) serves only over TLS: the cluster's own
prober, trusting the CA, probes through the frontend successfully, and a plaintext client is
refused by the frontend. ZooKeeper speaks TLS only (its ``secureClientPort``, client
certificates required): every process reaches it with ``--zk-tls-*``, ``cluster status`` too,
and a plaintext client or one without a certificate does not get a session."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from pubsubd.cli.security import write_dev_certs
from pubsubd.cluster.launcher import ClusterError, LocalCluster
from pubsubd.cluster.status import cluster_status
from pubsubd.coordination.ensemble import mode
from pubsubd.coordination.errors import CoordinationUnavailable
from pubsubd.coordination.zk import Coordinator
from pubsubd.core.tls import ClientTls
from tests.support.cluster import running_cluster
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("cluster-up-tls")
    write_dev_certs(directory / "certs")
    with running_cluster(
        directory / "c",
        storage_nodes=1,
        replicas=1,
        routers=1,
        frontends=1,
        probers=1,
        tls_dir=directory / "certs",
    ) as c:
        yield c


def test_every_process_speaks_tls_and_the_prober_trusts_the_ca(cluster: LocalCluster) -> None:
    described = cluster.described()
    assert described["tls_ca"] == str(cluster.tls_dir / "ca.pem")  # type: ignore[operator]
    for p in cluster.processes:
        if p.role in ("storage", "serve", "router", "frontend"):
            assert "--tls-cert" in p.args, p.name
        if p.role in ("storage", "serve", "router", "frontend"):
            assert "--zk-tls-ca" in p.args and "--zk-tls-cert" in p.args, p.name
        if p.role == "prober":
            assert "--ca-file" in p.args
    http = cluster.process("prober-1").address

    def probed() -> list[dict[str, Any]] | None:
        with urllib.request.urlopen(f"http://{http}/status", timeout=10) as r:
            probes: list[dict[str, Any]] = json.loads(r.read())["probes"]
        return probes if len(probes) == 2 and all(p["ok"] for p in probes) else None

    wait_for(probed, 60, "a successful round through the TLS frontend")
    with grpc.insecure_channel(cluster.frontends[0]) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary("/google.pubsub.v1.Publisher/GetTopic")(b"", timeout=3)
        assert refused.value.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )


def test_a_tls_dir_without_certificates_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ClusterError, match="pubsubd certs dev"):
        LocalCluster(tmp_path / "c").up(tls_dir=tmp_path)


def test_zookeeper_speaks_tls_only_and_asks_for_a_certificate(cluster: LocalCluster) -> None:
    config = (cluster.directory / "zookeeper" / "node-1" / "zoo.cfg").read_text()
    assert "secureClientPort=" in config and "ssl.clientAuth=need" in config
    assert "\nclientPort=" not in config
    tls = cluster.zk_tls
    assert tls is not None

    async def session(with_tls: ClientTls | None) -> list[str]:
        coordinator = Coordinator(cluster.zk, "/pubsubd", session_timeout=4.0, tls=with_tls)
        await coordinator.start(connect_timeout=4.0)
        try:
            return await coordinator.children("/pubsubd")
        finally:
            await coordinator.stop()

    assert "storage" in asyncio.run(session(tls))  # the cluster registered through TLS
    with pytest.raises(CoordinationUnavailable):  # a plaintext client gets no session
        asyncio.run(session(None))
    # ZooKeeper answers srvr over TLS, to a client showing a certificate the CA signed only.
    # (Asked with the ensemble's probe: kazoo leaves the socket of a refused handshake open.)
    port = int(cluster.zk.rsplit(":", 1)[1])
    assert mode(port, tls=tls) == "standalone"
    assert mode(port, tls=ClientTls(tls.ca)) is None
    assert mode(port) is None
    status = cluster_status(cluster.zk, tls=tls)
    assert "error" not in status and len(status["nodes"]) == 1
    assert "error" in cluster_status(cluster.zk)  # plaintext: no answer
