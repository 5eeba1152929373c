"""TLS and authentication with the official clients against real ``pubsubd serve`` processes.

Two servers for the module: one with TLS and bearer-token authentication on every port (gRPC,
HTTP/REST, Pulsar), and one with mutual TLS. The certificates come from ``pubsubd certs dev``
and the tokens from ``pubsubd tokens create``, as an operator makes them. Servers without TLS
or authentication are what every other integration test runs against.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _pulsar
import grpc
import httpx
import pulsar
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisher
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber import SubscriberClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from pubsubd.core.client_security import ClientSecurity
from pubsubd.core.tokens import create_token
from pubsubd.pulsar import frames
from pubsubd.pulsar import names as pulsar_names
from pubsubd.pulsar.api import BaseCommand, ServerError, Type
from tests.conftest import PROJECT, _Subscriber, make_publisher
from tests.support.server import ServerProcess, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

# A connection the server refuses: UNAVAILABLE, or the deadline when the handshake hangs.
REFUSED = (exceptions.ServiceUnavailable, exceptions.DeadlineExceeded)

SECRET = b"integration-test-secret-of-32-bytes!"
STATIC_TOKEN = "static-token-for-ci-0123456789"


def _cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "pubsubd", *args], check=True, capture_output=True, timeout=60
    )
    return out.stdout.decode().strip()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    _cli("certs", "dev", str(directory))
    return directory


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "secret"
    path.write_bytes(SECRET + b"\n")
    return path


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, certs: Path, secret_file: Path
) -> Iterator[ServerProcess]:
    """TLS and tokens on every port."""
    base = tmp_path_factory.mktemp("tls-auth")
    static = base / "tokens"
    static.write_text(f"{STATIC_TOKEN} serviceAccount:ci@{PROJECT}.iam.gserviceaccount.com\n")
    prober_token = base / "prober-token"
    prober_token.write_text(STATIC_TOKEN + "\n")
    args = [
        *("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")),
        *("--auth-secret-file", str(secret_file), "--auth-tokens-file", str(static)),
        # The in-server prober, with TLS and authentication on: its own token.
        *("--prober-interval", "0.5", "--prober-token-file", str(prober_token)),
    ]
    srv = ServerProcess(base / "data", args=args, pulsar=True).start()
    assert "tls=on auth=token" in srv.log()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def mutual(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[ServerProcess]:
    """Mutual TLS: clients must show a certificate the dev CA signed; no tokens."""
    args = [
        *("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")),
        *("--tls-client-ca", str(certs / "ca.pem")),
    ]
    srv = ServerProcess(tmp_path_factory.mktemp("mtls") / "data", args=args).start()
    assert "tls=mutual auth=off" in srv.log()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def token(secret_file: Path) -> str:
    return _cli("tokens", "create", "--subject", "alice@example.com", "--secret-file",
                str(secret_file), "--expires-in", "3600")  # fmt: skip


def _credentials(certs: Path, token: str | None, client_cert: bool = False) -> Any:
    """The official client's TLS channel credentials: the dev CA, and the token as call
    credentials (``authorization: Bearer T`` on every call)."""
    tls = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.pem").read_bytes(),
        private_key=(certs / "client-key.pem").read_bytes() if client_cert else None,
        certificate_chain=(certs / "client.pem").read_bytes() if client_cert else None,
    )
    if token is None:
        return tls
    return grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(token))


def _clients(
    srv: ServerProcess, creds: Any
) -> tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]:
    pub_channel = grpc.secure_channel(srv.endpoint, creds)
    sub_channel = grpc.secure_channel(srv.endpoint, creds)
    return (
        pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=pub_channel)),
        pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=sub_channel)),
    )


def test_official_client_over_tls_with_a_token_publishes_and_pulls(
    server: ServerProcess, certs: Path, token: str, names: Any
) -> None:
    pub, sub = _clients(server, _credentials(certs, token))
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    message_id = pub.publish(topic, b"over tls", k="v").result(timeout=30)
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        got = list(
            sub.pull(subscription=subscription, max_messages=10, timeout=5).received_messages
        )
    assert [(m.message.message_id, m.message.data) for m in got] == [(message_id, b"over tls")]
    sub.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in got])
    # StreamingPull runs as the caller too.
    received: list[bytes] = []
    pub.publish(topic, b"streamed").result(timeout=30)
    future = sub.subscribe(subscription, lambda m: (received.append(m.data), m.ack()))
    deadline = time.monotonic() + 20
    while not received and time.monotonic() < deadline:
        time.sleep(0.05)
    future.cancel()
    future.result(timeout=10)
    assert received == [b"streamed"]
    sub.close()


def test_static_token_is_accepted(server: ServerProcess, certs: Path, names: Any) -> None:
    pub, _ = _clients(server, _credentials(certs, STATIC_TOKEN))
    topic = names.topic()
    assert pub.create_topic(name=topic).name == topic


@pytest.mark.parametrize("kind", ["missing", "bad signature", "expired", "garbage"])
def test_a_call_without_a_valid_token_is_unauthenticated_and_does_nothing(
    server: ServerProcess, certs: Path, token: str, names: Any, kind: str
) -> None:
    bad = {
        "missing": None,
        "bad signature": create_token("alice", secret=b"x" * 32, now=time.time()),
        "expired": create_token("alice", secret=SECRET, expires_in_s=10, now=time.time() - 60),
        "garbage": "not-a-token",
    }[kind]
    refused, _ = _clients(server, _credentials(certs, bad))
    topic = names.topic()
    with pytest.raises(exceptions.Unauthenticated):
        refused.create_topic(name=topic, retry=None, timeout=10)
    good, _ = _clients(server, _credentials(certs, token))
    with pytest.raises(exceptions.NotFound):  # nothing was created
        good.get_topic(topic=topic)


def test_a_plaintext_client_cannot_reach_a_tls_port(server: ServerProcess, token: str) -> None:
    plain = make_publisher(server.endpoint)  # PUBSUB_EMULATOR_HOST: no TLS
    with pytest.raises(REFUSED):
        plain.get_topic(topic=f"projects/{PROJECT}/topics/never", retry=None, timeout=3)


def test_rest_and_http_need_a_token_except_health(
    server: ServerProcess, certs: Path, token: str, names: Any
) -> None:
    base = f"https://127.0.0.1:{server.http_port}"
    topic = names.topic()
    path = f"{base}/v1/{topic}"
    with httpx.Client(verify=ssl.create_default_context(cafile=certs / "ca.pem")) as http:
        for open_path in ("/healthz", "/readyz"):
            assert http.get(base + open_path).status_code == 200
        refused = http.put(path, json={})
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["status"] == "UNAUTHENTICATED"
        forged = create_token("alice", secret=b"y" * 32, now=time.time())
        assert (
            http.put(path, json={}, headers={"Authorization": f"Bearer {forged}"}).status_code
            == 401
        )
        for guarded in ("/metrics", "/status", "/api/overview"):
            assert http.get(base + guarded).status_code == 401, guarded
        auth = {"Authorization": f"Bearer {token}"}
        # The REST front calls the gRPC port with the caller's token: a token it dropped would
        # be refused there (401 as well).
        created = http.put(path, json={}, headers=auth)
        assert created.status_code == 200, created.text
        assert http.get(path, headers=auth).json()["name"] == topic
        assert http.get(base + "/metrics", headers=auth).status_code == 200
        # The dashboard signs in with a cookie (Secure over HTTPS), good for reads only.
        assert http.get(base + "/").headers["location"] == "/login"
        signed = http.post(base + "/login", data={"token": token})
        assert signed.status_code == 303 and "; Secure" in signed.headers["set-cookie"]
        assert http.get(base + "/api/overview").status_code == 200  # the client kept it
        assert http.get(path).status_code == 401  # REST: never by cookie
        http.get(base + "/logout")
        assert http.get(base + "/api/overview").status_code == 401
    with pytest.raises(httpx.TransportError):  # the HTTP port speaks TLS only
        httpx.get(f"http://127.0.0.1:{server.http_port}/healthz", timeout=3)


def test_pulsar_token_over_tls(server: ServerProcess, certs: Path, token: str) -> None:
    url = f"pulsar+ssl://127.0.0.1:{server.pulsar_port}"
    quiet = pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error)
    client = pulsar.Client(
        url,
        tls_trust_certs_file_path=str(certs / "ca.pem"),
        authentication=pulsar.AuthenticationToken(token),
        operation_timeout_seconds=5,
        logger=quiet,
    )
    try:
        topic = f"persistent://{PROJECT}/default/tls-{time.monotonic_ns()}"
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"pulsar over tls")
        assert consumer.receive(10_000).data() == b"pulsar over tls"
    finally:
        client.close()


@pytest.mark.parametrize("auth", [("token", b"forged"), ("", b""), ("athenz", b"x")])
def test_pulsar_connect_without_a_valid_token_gets_authentication_error(
    server: ServerProcess, certs: Path, auth: tuple[str, bytes]
) -> None:
    context = ssl.create_default_context(cafile=certs / "ca.pem")
    raw = socket.create_connection(("127.0.0.1", server.pulsar_port), timeout=5)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        cmd = BaseCommand(type=Type.Value("CONNECT"))
        cmd.connect.client_version = "raw-test"
        cmd.connect.protocol_version = 20
        cmd.connect.auth_method_name, cmd.connect.auth_data = auth
        conn.sendall(frames.encode_command(cmd.SerializeToString()))
        decoder = frames.FrameDecoder()
        received: list[frames.Frame] = []
        while not received:
            data = conn.recv(65536)
            assert data, "closed without an answer"
            received += decoder.feed(data)
        reply = BaseCommand()
        reply.ParseFromString(received[0].command)
        assert reply.type == Type.Value("ERROR")
        assert reply.error.error == ServerError.Value("AuthenticationError")
        assert conn.recv(65536) == b""  # then the connection ends


# --- Pulsar auth refresh: tokens of a few seconds (exp is whole seconds: 2-3 s left) ---------


def _short_token(subject: str = "alice@example.com", *, now: float | None = None) -> str:
    at = time.time() if now is None else now
    return create_token(subject, secret=SECRET, expires_in_s=3, now=at)


def _pulsar_client(server: ServerProcess, certs: Path, supplier: Any) -> pulsar.Client:
    """The official client over TLS whose AuthenticationToken asks ``supplier`` for a token at
    every CONNECT and every AUTH_CHALLENGE."""
    return pulsar.Client(
        f"pulsar+ssl://127.0.0.1:{server.pulsar_port}",
        tls_trust_certs_file_path=str(certs / "ca.pem"),
        authentication=pulsar.AuthenticationToken(supplier),
        operation_timeout_seconds=5,
        logger=pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error),
    )


def test_pulsar_tokens_from_a_supplier_are_refreshed_on_one_long_connection(
    server: ServerProcess, certs: Path
) -> None:
    """Every token lives 2-3 s; the server challenges each connection halfway through its
    token's life and the client answers with a fresh one from its supplier, so producing and
    consuming go on past several expiries without the connection being cut (the consumer is
    subscribed again at each of its stream's token expiries, losing nothing)."""
    minted: list[float] = []

    def supplier() -> str:
        minted.append(time.time())
        return _short_token()

    log_from = len(server.log())
    client = _pulsar_client(server, certs, supplier)
    try:
        topic = f"persistent://{PROJECT}/default/refresh-{time.monotonic_ns()}"
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        connected = len(minted)
        end = time.time() + 7.0  # past the first token's expiry, and the next ones'
        sent = 0
        while time.time() < end:
            producer.send(f"m{sent}".encode())
            while (received := consumer.receive(5_000)).data() != f"m{sent}".encode():
                # The consumer's stream holds the token it opened with: at its expiry the
                # consumer is closed and the client subscribes again on the same connection
                # (README), so the message it had not acked yet may come again; none is skipped.
                assert sent > 0 and received.data() == f"m{sent - 1}".encode()
                consumer.acknowledge(received)
            consumer.acknowledge(received)
            sent += 1
            time.sleep(0.25)
        assert sent >= 20
    finally:
        client.close()
    log = server.log()[log_from:]
    refreshed = log.count("credentials of user:alice@example.com refreshed")
    assert len(minted) - connected >= 2 and refreshed >= 2, (minted, refreshed)
    assert "has expired" not in log and "auth refresh refused" not in log, log


def test_a_pulsar_client_whose_supplier_turns_to_expired_tokens_is_cut_off(
    server: ServerProcess, certs: Path
) -> None:
    """The supplier hands out a valid token at first, then only expired ones: the challenge's
    answer is refused and the connection ends with AuthenticationError; the client's
    reconnections present expired tokens, which CONNECT refuses, so a send fails."""
    valid_until = time.time() + 1.0

    def supplier() -> str:
        now = time.time()
        return _short_token(now=now if now < valid_until else now - 60)

    log_from = len(server.log())
    client = _pulsar_client(server, certs, supplier)
    try:
        topic = f"persistent://{PROJECT}/default/cut-{time.monotonic_ns()}"
        producer = client.create_producer(topic, send_timeout_millis=3_000)
        producer.send(b"while the token is valid")
        wait_for(
            lambda: "auth refresh refused: the token has expired" in server.log()[log_from:],
            10,
            "the refresh with an expired token to be refused",
        )
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"after the cut")
    finally:
        client.close()


def _pulsar_connect(server: ServerProcess, certs: Path, token: str, refresh: bool) -> Any:
    """A raw TLS connection that sent CONNECT with ``token`` and read CONNECTED."""
    context = ssl.create_default_context(cafile=certs / "ca.pem")
    raw = socket.create_connection(("127.0.0.1", server.pulsar_port), timeout=10)
    conn = context.wrap_socket(raw, server_hostname="127.0.0.1")
    cmd = BaseCommand(type=Type.Value("CONNECT"))
    cmd.connect.client_version = "raw-test"
    cmd.connect.protocol_version = 20
    cmd.connect.auth_method_name, cmd.connect.auth_data = "token", token.encode()
    cmd.connect.feature_flags.supports_auth_refresh = refresh
    conn.sendall(frames.encode_command(cmd.SerializeToString()))
    assert _next_command(conn, frames.FrameDecoder()).type == Type.Value("CONNECTED")
    return conn


def _next_command(conn: Any, decoder: frames.FrameDecoder) -> Any:
    received: list[frames.Frame] = []
    while not received:
        data = conn.recv(65536)
        assert data, "closed without an answer"
        received += decoder.feed(data)
    assert len(received) == 1, received
    reply = BaseCommand()
    reply.ParseFromString(received[0].command)
    return reply


@pytest.mark.parametrize("answer", ["bob", "forged", "athenz", None])
def test_a_pulsar_refresh_with_another_subject_an_invalid_token_or_none_ends_the_connection(
    server: ServerProcess, certs: Path, answer: str | None
) -> None:
    """After AUTH_CHALLENGE: bob's valid token for alice's connection, a forged token, another
    auth method, or no answer by the expiry: ERROR AuthenticationError, then the end."""
    conn = _pulsar_connect(server, certs, _short_token(), refresh=True)
    with conn:
        decoder = frames.FrameDecoder()
        challenge = _next_command(conn, decoder)
        assert challenge.type == Type.Value("AUTH_CHALLENGE")
        assert challenge.authChallenge.challenge.auth_method_name == "token"
        if answer is not None:
            cmd = BaseCommand(type=Type.Value("AUTH_RESPONSE"))
            method, token = {
                "bob": ("token", _short_token("bob@example.com")),
                "forged": ("token", "forged"),
                "athenz": ("athenz", _short_token()),
            }[answer]
            cmd.authResponse.response.auth_method_name = method
            cmd.authResponse.response.auth_data = token.encode()
            conn.sendall(frames.encode_command(cmd.SerializeToString()))
        reply = _next_command(conn, decoder)
        assert reply.type == Type.Value("ERROR")
        assert reply.error.error == ServerError.Value("AuthenticationError")
        reason = {"bob": "user:bob@example.com", "forged": "not a valid JWT"}.get(
            answer or "", "expired" if answer is None else "athenz"
        )
        assert reason in reply.error.message
        assert conn.recv(65536) == b""


def test_a_pulsar_client_that_cannot_refresh_is_cut_off_when_its_token_expires(
    server: ServerProcess, certs: Path
) -> None:
    conn = _pulsar_connect(server, certs, _short_token(), refresh=False)
    with conn:
        reply = _next_command(conn, frames.FrameDecoder())  # no challenge first
        assert reply.type == Type.Value("ERROR")
        assert reply.error.error == ServerError.Value("AuthenticationError")
        assert "cannot refresh" in reply.error.message
        assert conn.recv(65536) == b""


def test_mutual_tls_refuses_a_client_without_a_certificate(
    mutual: ServerProcess, certs: Path, names: Any
) -> None:
    anonymous, _ = _clients(mutual, _credentials(certs, None))
    with pytest.raises(REFUSED):
        anonymous.get_topic(topic=names.topic(), retry=None, timeout=3)
    pub, _ = _clients(mutual, _credentials(certs, None, client_cert=True))
    topic = names.topic()
    assert pub.create_topic(name=topic).name == topic
    ca = ssl.create_default_context(cafile=certs / "ca.pem")
    with pytest.raises(httpx.HTTPError), httpx.Client(verify=ca) as http:
        http.get(f"https://127.0.0.1:{mutual.http_port}/healthz").raise_for_status()
    ca.load_cert_chain(certs / "client.pem", certs / "client-key.pem")
    with httpx.Client(verify=ca) as http:
        answer = http.get(f"https://127.0.0.1:{mutual.http_port}/v1/{topic}")
        assert answer.status_code == 200


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, secret_file: Path) -> Iterator[ServerProcess]:
    """Authentication and IAM together, plaintext: the token's subject is the caller the
    policies are checked for."""
    base = tmp_path_factory.mktemp("authz")
    policies = base / "policies.json"
    policies.write_text(
        json.dumps(
            {
                "projects": {
                    PROJECT: {
                        "bindings": [
                            {"role": "roles/pubsub.editor", "members": ["user:alice@example.com"]},
                            {"role": "roles/pubsub.viewer", "members": ["user:bob@example.com"]},
                            {"role": "roles/pubsub.admin", "members": ["user:root@example.com"]},
                        ]
                    }
                }
            }
        )
    )
    args = [
        *("--auth-secret-file", str(secret_file)),
        *("--iam", "--iam-policy-file", str(policies)),
    ]
    srv = ServerProcess(base / "data", args=args, pulsar=True).start()
    yield srv
    srv.kill()


def test_iam_decides_for_the_caller_the_token_names(
    guarded: ServerProcess, secret_file: Path, names: Any
) -> None:
    def bearer(subject: str) -> list[tuple[str, str]]:
        token = create_token(subject, secret=SECRET, now=time.time(), expires_in_s=600)
        return [("authorization", f"Bearer {token}")]

    alice, bob = bearer("alice@example.com"), bearer("bob@example.com")
    pub = make_publisher(guarded.endpoint)
    topic = names.topic()
    assert pub.create_topic(name=topic, metadata=alice).name == topic  # editor
    assert pub.get_topic(topic=topic, metadata=bob).name == topic  # viewer may read
    with pytest.raises(exceptions.PermissionDenied, match=r"user:bob@example\.com"):
        pub.delete_topic(topic=topic, metadata=bob)
    with pytest.raises(exceptions.Unauthenticated):
        pub.get_topic(topic=topic)  # no token: refused before authorization
    # The generated client's Publish (the batching one takes no metadata).
    gapic = GapicPublisher(
        transport=PublisherGrpcTransport(channel=grpc.insecure_channel(guarded.endpoint))
    )
    request = {"topic": topic, "messages": [{"data": b"x"}]}
    assert gapic.publish(request=request, metadata=alice).message_ids
    with pytest.raises(exceptions.PermissionDenied, match=r"pubsub\.topics\.publish"):
        gapic.publish(request=request, metadata=bob)
    # REST: the same caller, the same answers.
    base = f"http://127.0.0.1:{guarded.http_port}/v1/{topic}"
    body = {"messages": [{"data": "eA=="}]}
    for who, status in ((alice, 200), (bob, 403)):
        got = httpx.post(f"{base}:publish", json=body, headers=dict(who), timeout=10)
        assert got.status_code == status, got.text
    assert httpx.get(base, timeout=10).status_code == 401


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pubsubd", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_client_commands_with_a_ca_file_and_a_token(
    server: ServerProcess, guarded: ServerProcess, certs: Path, token: str, tmp_path: Path,
    names: Any,
) -> None:  # fmt: skip
    """``pubsubd --ca-file CA --token-file F topics create ...``: TLS and the token; without
    the token the server refuses (UNAUTHENTICATED, printed as 401; exit 1); a token over
    plaintext (a server with authentication and no TLS) goes as metadata."""
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    topic = names.topic()
    secure = ("--ca-file", str(certs / "ca.pem"), "--endpoint", server.endpoint)
    created = _run(*secure[:2], "--token-file", str(token_file), "topics", "create", topic,
                   *secure[2:], "--json")  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)[0]["name"] == topic
    refused = _run(*secure[:2], "topics", "list", *secure[2:])
    # The CLI prints the official client's error: 401 is UNAUTHENTICATED.
    assert refused.returncode == 1 and "401" in refused.stderr, refused.stderr
    # The token in the environment, to a server without TLS.
    plain = subprocess.run(
        [sys.executable, "-m", "pubsubd", "topics", "create", names.topic(), "--endpoint",
         guarded.endpoint, "--json"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PUBSUBD_TOKEN": token},
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr


def test_prober_with_a_ca_file_and_a_token(server: ServerProcess, certs: Path, token: str) -> None:
    """``pubsubd prober --once`` through a TLS endpoint with authentication on: both probes
    pass with the token and fail, naming UNAUTHENTICATED, without it."""
    base = ("prober", "--endpoint", server.endpoint, "--once", "--json", "--http-port", "-1",
            "--ca-file", str(certs / "ca.pem"))  # fmt: skip
    ok = _run(*base, "--token", token)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    results = json.loads(ok.stdout)
    assert {r["probe"] for r in results} == {"publish_receive", "control_plane"}
    assert all(r["ok"] for r in results), results
    refused = _run(*base)
    assert refused.returncode == 1
    assert all(not r["ok"] and "UNAUTHENTICATED" in r["error"] for r in json.loads(refused.stdout))


def test_in_server_prober_carries_its_token(server: ServerProcess, certs: Path, token: str) -> None:
    """``serve --prober-interval --prober-token-file`` with TLS and authentication on: its
    probes (through the server's local socket) pass, as /status shows."""
    url = f"https://127.0.0.1:{server.http_port}/status"
    auth = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 30
    with httpx.Client(verify=ssl.create_default_context(cafile=certs / "ca.pem")) as http:
        while True:
            probes = http.get(url, headers=auth).json()["prober"]["probes"]
            if len(probes) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert {p["probe"] for p in probes} == {"publish_receive", "control_plane"}
    assert all(p["ok"] for p in probes), probes


# --- an open StreamingPull held to its caller's token and permission (core/stream_guard.py) ---


class _MintingCredentials(grpc.AuthMetadataPlugin):  # type: ignore[misc]
    """Call credentials that refresh: a fresh short token for every call (as a client's
    credentials refresh theirs), counting the StreamingPulls opened."""

    def __init__(self) -> None:
        self.streams = 0

    def __call__(self, context: Any, callback: Any) -> None:
        if context.method_name == "StreamingPull":
            self.streams += 1
        callback((("authorization", f"Bearer {_short_token()}"),), None)


def _subscriber(srv: ServerProcess, creds: Any) -> _Subscriber:
    return _Subscriber(
        transport=SubscriberGrpcTransport(channel=grpc.secure_channel(srv.endpoint, creds))
    )


def test_a_subscriber_whose_credentials_refresh_keeps_receiving_across_token_expiry(
    server: ServerProcess, certs: Path, token: str, names: Any
) -> None:
    """Tokens of 2-3 s: the server ends the stream UNAVAILABLE at each expiry, the official
    subscriber reopens it with a fresh token, and every message published over two expiries
    is received."""
    pub, admin = _clients(server, _credentials(certs, token))
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    admin.create_subscription(name=subscription, topic=topic)
    minting = _MintingCredentials()
    tls = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.pem").read_bytes())
    sub = _subscriber(
        server, grpc.composite_channel_credentials(tls, grpc.metadata_call_credentials(minting))
    )
    received: set[bytes] = set()
    future = sub.subscribe(subscription, lambda m: (received.add(m.data), m.ack()))
    try:
        sent: set[bytes] = set()
        end = time.time() + 6.5  # past two expiries of the stream's token at least
        while time.time() < end:
            data = f"m{len(sent)}".encode()
            pub.publish(topic, data).result(timeout=30)
            sent.add(data)
            time.sleep(0.2)
        wait_for(lambda: received >= sent, 20, "every message, across the expiries")
        assert not future.done()
        assert minting.streams >= 3, minting.streams  # reopened at each expiry
    finally:
        sub.close()
    assert received == sent


def test_a_subscriber_whose_token_expires_unrefreshed_stops_receiving(
    server: ServerProcess, certs: Path, token: str, names: Any
) -> None:
    """One short token, never refreshed: the stream ends at its expiry and the reopened one
    is refused UNAUTHENTICATED, so a message published after it is not delivered to it."""
    pub, admin = _clients(server, _credentials(certs, token))
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    admin.create_subscription(name=subscription, topic=topic)
    short = _short_token()
    expires = json.loads(_b64(short.split(".")[1]))["exp"]
    sub = _subscriber(server, _credentials(certs, short))
    received: list[bytes] = []
    future = sub.subscribe(subscription, lambda m: (received.append(m.data), m.ack()))
    try:
        pub.publish(topic, b"before").result(timeout=30)
        wait_for(lambda: received == [b"before"], 10, "the message before the expiry")
        time.sleep(max(0.0, expires - time.time()) + 0.5)
        pub.publish(topic, b"after").result(timeout=30)
        with pytest.raises(exceptions.Unauthenticated):
            future.result(timeout=10)
        time.sleep(0.5)
        assert received == [b"before"]
    finally:
        sub.close()
    # Still there for a client with a valid token.
    pulled = admin.pull(subscription=subscription, max_messages=10, timeout=10)
    assert [m.message.data for m in pulled.received_messages] == [b"after"]


def _b64(part: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_a_revoked_binding_ends_an_open_stream_with_permission_denied(
    guarded: ServerProcess, names: Any
) -> None:
    """carol holds roles/pubsub.subscriber on one subscription only (its own policy); root
    (admin) removes the binding while carol's stream is open: the stream ends
    PERMISSION_DENIED within a second or two, without carol calling anything."""

    def bearer(subject: str) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {_long(subject)}")]

    root = bearer("root@example.com")
    pub = make_publisher(guarded.endpoint)
    admin = SubscriberClient(
        transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(guarded.endpoint))
    )
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(name=topic, metadata=root)
    admin.create_subscription(name=subscription, topic=topic, metadata=root)
    binding = {"role": "roles/pubsub.subscriber", "members": ["user:carol@example.com"]}
    policy = pub.set_iam_policy(
        request={"resource": subscription, "policy": {"bindings": [binding]}}, metadata=root
    )
    carol = _Subscriber(
        transport=SubscriberGrpcTransport(
            channel=ClientSecurity(token=_long("carol@example.com")).channel(guarded.endpoint)
        )
    )
    received: list[bytes] = []
    future = carol.subscribe(subscription, lambda m: (received.append(m.data), m.ack()))
    gapic = GapicPublisher(
        transport=PublisherGrpcTransport(channel=grpc.insecure_channel(guarded.endpoint))
    )
    try:
        gapic.publish(request={"topic": topic, "messages": [{"data": b"granted"}]}, metadata=root)
        wait_for(lambda: received == [b"granted"], 10, "carol's stream to deliver")
        revoked_at = time.monotonic()
        pub.set_iam_policy(
            request={"resource": subscription, "policy": {"bindings": [], "etag": policy.etag}},
            metadata=root,
        )
        with pytest.raises(exceptions.PermissionDenied, match=r"pubsub\.subscriptions\.consume"):
            future.result(timeout=10)
        # At once, not at a lease's end or a poll (the bound is loose: CI is busy).
        assert time.monotonic() - revoked_at < 8.0
    finally:
        carol.close()


def _long(subject: str) -> str:
    return create_token(subject, secret=SECRET, now=time.time(), expires_in_s=600)


def test_a_revoked_binding_closes_an_open_pulsar_consumer(
    guarded: ServerProcess, names: Any
) -> None:
    """A Pulsar consumer reads through a StreamingPull checked as its connection's caller:
    when root removes carol's binding, the stream ends PERMISSION_DENIED and the front closes
    the consumer (CLOSE_CONSUMER, as a broker does on unload); the client subscribes again and
    is refused (AuthorizationError), so nothing published after the revocation reaches it."""
    pulsar_topic = f"persistent://{PROJECT}/default/revoke-{names.suffix}"
    mapped = pulsar_names.parse_topic(pulsar_topic)
    subscription = mapped.subscription("s")

    def client(subject: str) -> pulsar.Client:
        return pulsar.Client(
            f"pulsar://127.0.0.1:{guarded.pulsar_port}",
            authentication=pulsar.AuthenticationToken(_long(subject)),
            operation_timeout_seconds=5,
            logger=pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error),
        )

    root_md = [("authorization", f"Bearer {_long('root@example.com')}")]
    root, carol = client("root@example.com"), client("carol@example.com")
    log_from = 0
    try:
        shared = pulsar.ConsumerType.Shared
        root.subscribe(pulsar_topic, "s", consumer_type=shared).close()  # as Pulsar makes them
        producer = root.create_producer(pulsar_topic)
        pub = make_publisher(guarded.endpoint)
        viewer = {"role": "roles/pubsub.viewer", "members": ["user:carol@example.com"]}
        consume = {"role": "roles/pubsub.subscriber", "members": ["user:carol@example.com"]}
        pub.set_iam_policy(
            request={"resource": mapped.google, "policy": {"bindings": [viewer]}},
            metadata=root_md,
        )
        policy = pub.set_iam_policy(
            request={"resource": subscription, "policy": {"bindings": [viewer, consume]}},
            metadata=root_md,
        )
        consumer = carol.subscribe(pulsar_topic, "s", consumer_type=shared)
        producer.send(b"granted")
        received = consumer.receive(10_000)
        assert received.data() == b"granted"
        consumer.acknowledge(received)
        log_from = len(guarded.log())
        revoked_at = time.monotonic()
        pub.set_iam_policy(
            request={
                "resource": subscription,
                "policy": {"bindings": [viewer], "etag": policy.etag},
            },
            metadata=root_md,
        )
        wait_for(lambda: not consumer.is_connected(), 5, "the consumer to be closed")
        # At once, not at a lease's end or a poll (the bound is loose: CI is busy).
        assert time.monotonic() - revoked_at < 8.0
        producer.send(b"revoked")
        with pytest.raises(pulsar.Timeout):
            consumer.receive(2_000)
    finally:
        carol.close()
        root.close()
    log = guarded.log()[log_from:]
    assert f"stream of {subscription} ended: StatusCode.PERMISSION_DENIED" in log, log
    assert "Task was destroyed" not in log, log
