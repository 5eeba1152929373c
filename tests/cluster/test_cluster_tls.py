"""TLS between a cluster's processes: ZooKeeper, a storage node with mutual TLS on its gRPC and
append ports, ``serve --cluster`` with TLS on its own ports whose ledger writes and reads reach
the node over TLS (``--tls-ca``, showing its own certificate), a router, and a frontend with TLS
proxying to it over TLS. The official client publishes and pulls through the frontend (and REST
answers on its HTTPS port); a plaintext client reaches neither the node nor the frontend."""

from __future__ import annotations

import re
import ssl
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from pubsubd.cli.security import write_dev_certs
from pubsubd.coordination.ensemble import Ensemble
from tests.conftest import PROJECT
from tests.support.process import LoggedProcess
from tests.support.server import ServerProcess
from tests.support.storage_node import StorageNodeProcess

pytest_plugins = ["tests.support.zookeeper"]
pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.timeout(180)]

FRONTEND_READY = re.compile(r"pubsubd frontend ready grpc=(\S+) http=(\S+)")
ROUTER_READY = re.compile(r"pubsubd router ready")


def _tls(certs: Path, *, client_ca: bool = False, ca: bool = True) -> list[str]:
    args = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")]
    if client_ca:
        args += ["--tls-client-ca", str(certs / "ca.pem")]
    if ca:
        args += ["--tls-ca", str(certs / "ca.pem")]
    return args


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: Ensemble
) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("cluster-tls")
    certs = base / "certs"
    write_dev_certs(certs)
    zk, root = zookeeper.connect_string, f"/t-{uuid.uuid4().hex}"
    started: list[Any] = []
    try:
        node = StorageNodeProcess(
            base / "node", disks=1, zk=zk, zk_root=root, args=_tls(certs, client_ca=True, ca=False)
        ).start()
        started.append(node)
        serve = ServerProcess(
            base / "serve",
            args=["--zk-root", root, "--replicas", "1", *_tls(certs, client_ca=True)],
            env={"PUBSUBD_CLUSTER": zk},
        ).start()
        started.append(serve)
        control = []
        for role, ready, extra in (
            ("router", ROUTER_READY, []),
            ("frontend", FRONTEND_READY, ["--port", "0", "--http-port", "0", *_tls(certs)]),
        ):
            process = LoggedProcess(base / f"{role}.log")
            command = [sys.executable, "-m", "pubsubd", role, "--cluster", zk, "--zk-root", root]
            match = process.launch([*command, *extra, *_tls(certs)[4:]], ready, {}, 60, role)
            started.append(process)
            control.append(match)
        yield {
            "certs": certs,
            "node": node,
            "serve": serve,
            "frontend": control[1].group(1),
            "frontend_http": control[1].group(2),
        }
    finally:
        for process in reversed(started):
            process.kill()


def _channel(certs: Path, endpoint: str) -> grpc.Channel:
    return grpc.secure_channel(
        endpoint, grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    )


def test_publish_and_pull_through_a_tls_frontend_over_tls_storage(cluster: dict[str, Any]) -> None:
    certs, frontend = cluster["certs"], cluster["frontend"]
    pub = pubsub_v1.PublisherClient(
        transport=PublisherGrpcTransport(channel=_channel(certs, frontend))
    )
    sub = pubsub_v1.SubscriberClient(
        transport=SubscriberGrpcTransport(channel=_channel(certs, frontend))
    )
    suffix = time.monotonic_ns()
    topic = f"projects/{PROJECT}/topics/tls-{suffix}"
    subscription = f"projects/{PROJECT}/subscriptions/tls-{suffix}"
    # The frontend needs a moment to learn the forwarder's assignment from the router.
    deadline = time.monotonic() + 60
    while True:
        try:
            pub.create_topic(name=topic, timeout=10)
            break
        except exceptions.ServiceUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    sub.create_subscription(name=subscription, topic=topic)
    ids = [pub.publish(topic, f"m{i}".encode()).result(timeout=60) for i in range(3)]
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        got += sub.pull(subscription=subscription, max_messages=10, timeout=10).received_messages
    assert sorted(m.message.message_id for m in got) == sorted(ids)
    sub.close()
    # REST on the frontend's HTTPS port, through its own gRPC port (a Unix socket with TLS on).
    ca = ssl.create_default_context(cafile=certs / "ca.pem")
    with httpx.Client(verify=ca) as http:
        answer = http.get(f"https://{cluster['frontend_http']}/v1/{subscription}")
        assert answer.status_code == 200, answer.text
        assert answer.json()["topic"] == topic
    # Every message went to the storage node's ledger: over TLS, as nothing else is served.
    assert "tls=mutual" in cluster["serve"].log()


def test_plaintext_clients_reach_neither_the_node_nor_the_frontend(
    cluster: dict[str, Any],
) -> None:
    for address in (cluster["node"].address, cluster["frontend"]):
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary("/pubsubd.internal.v1.StorageNode/Health")
            with pytest.raises(grpc.RpcError) as e:
                call(b"", timeout=3)
            assert e.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ), address
    # A TLS client without a certificate is refused by the node (mutual TLS) too.
    with _channel(cluster["certs"], cluster["node"].address) as channel:
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary("/pubsubd.internal.v1.StorageNode/Health")(b"", timeout=3)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
