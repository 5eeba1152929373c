"""``pubsubd cluster up --tls-dir DIR`` (``LocalCluster.up(tls_dir=...)``): ``certs dev``'s files
go to every process, so a one-node cluster (ZooKeeper, a storage node with mutual TLS,
``serve --cluster``, a router, a frontend and a prober) serves only over TLS: the cluster's own
prober, trusting the CA, probes through the frontend successfully, and a plaintext client is
refused by the frontend."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from pubsubd.cli.security import write_dev_certs
from pubsubd.cluster.launcher import ClusterError, LocalCluster
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
