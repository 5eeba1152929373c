"""TLS between a cluster's processes: ZooKeeper, a storage node with mutual TLS on its gRPC and
append ports, ``serve --cluster`` with TLS on its own ports whose ledger writes and reads reach
the node over TLS (``--tls-ca``, showing its own certificate), a router, and a frontend with TLS
proxying to it over TLS. The official client publishes and pulls through the frontend (and REST
answers on its HTTPS port); a plaintext client reaches neither the node nor the frontend.

Authentication is on at ``serve --cluster`` and at the frontend (the same ``--auth-secret-file``):
the frontend checks each call's token itself (no token: UNAUTHENTICATED there, HTTP 401) and
passes it on with the call, which the forwarder checks again."""

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
from pubsubd.core.tokens import create_token
from tests.conftest import PROJECT
from tests.support.process import LoggedProcess
from tests.support.server import ServerProcess
from tests.support.storage_node import StorageNodeProcess

pytest_plugins = ["tests.support.zookeeper"]
pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.timeout(180)]

FRONTEND_READY = re.compile(r"pubsubd frontend ready grpc=(\S+) http=(\S+)")
ROUTER_READY = re.compile(r"pubsubd router ready")


SECRET = b"cluster-test-secret-of-32-bytes!!"


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
    secret = base / "secret"
    secret.write_bytes(SECRET)
    auth = ["--auth-secret-file", str(secret)]
    zk, root = zookeeper.connect_string, f"/t-{uuid.uuid4().hex}"
    started: list[Any] = []
    try:
        node = StorageNodeProcess(
            base / "node", disks=1, zk=zk, zk_root=root, args=_tls(certs, client_ca=True, ca=False)
        ).start()
        started.append(node)
        serve = ServerProcess(
            base / "serve",
            args=["--zk-root", root, "--replicas", "1", *_tls(certs, client_ca=True), *auth],
            env={"PUBSUBD_CLUSTER": zk},
        ).start()
        started.append(serve)
        control = []
        for role, ready, extra in (
            ("router", ROUTER_READY, []),
            ("frontend", FRONTEND_READY, ["--port", "0", "--http-port", "0", *_tls(certs), *auth]),
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


def _token() -> str:
    return create_token("alice@example.com", secret=SECRET, now=time.time(), expires_in_s=600)


def _channel(certs: Path, endpoint: str, token: str | None = None) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    if token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return grpc.secure_channel(endpoint, credentials)


def test_publish_and_pull_through_a_tls_frontend_over_tls_storage(cluster: dict[str, Any]) -> None:
    certs, frontend, token = cluster["certs"], cluster["frontend"], _token()
    pub = pubsub_v1.PublisherClient(
        transport=PublisherGrpcTransport(channel=_channel(certs, frontend, token))
    )
    sub = pubsub_v1.SubscriberClient(
        transport=SubscriberGrpcTransport(channel=_channel(certs, frontend, token))
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
    # No token: the frontend refuses the call itself, before its proxy sends it anywhere (its
    # count of proxied calls stays put); its /status needs a token too.
    ca = ssl.create_default_context(cafile=certs / "ca.pem")
    status_url = f"https://{cluster['frontend_http']}/status"
    bearer = {"Authorization": f"Bearer {token}"}
    with httpx.Client(verify=ca) as http:
        assert http.get(status_url).status_code == 401
        calls = http.get(status_url, headers=bearer).json()["calls"]
        anonymous = pubsub_v1.PublisherClient(
            transport=PublisherGrpcTransport(channel=_channel(certs, frontend))
        )
        with pytest.raises(exceptions.Unauthenticated, match="no credentials"):
            anonymous.get_topic(topic=topic, retry=None, timeout=10)
        assert http.get(status_url, headers=bearer).json()["calls"] == calls
    ids = [pub.publish(topic, f"m{i}".encode()).result(timeout=60) for i in range(3)]
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        got += sub.pull(subscription=subscription, max_messages=10, timeout=10).received_messages
    assert sorted(m.message.message_id for m in got) == sorted(ids)
    sub.close()
    # REST on the frontend's HTTPS port, through its own gRPC port (a Unix socket with TLS on).
    with httpx.Client(verify=ca) as http:
        url = f"https://{cluster['frontend_http']}/v1/{subscription}"
        assert http.get(url).status_code == 401
        answer = http.get(url, headers={"Authorization": f"Bearer {token}"})
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
