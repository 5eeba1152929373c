"""``pubsubd cluster up --tokens --iam`` (``LocalCluster.up(tokens=True, iam=True)``): a secured
cluster in one command, and forwarders that check tokens themselves (issue 14).

The cluster runs a publishing-only and a subscribing-only forwarder behind a router and a
frontend, so a subscription is served on the other forwarder than its topic: its reads (the
owner's ``Sources/Tail``), acks and dead letters (published to the topic's owner) are calls
between forwarders, which carry the cluster's internal token (``--internal-token-file``) and
pass IAM as the cluster's own identity. The official client, with the admin token
``up`` printed, publishes, pulls, acks and gets a dead-lettered message through the frontend; a
call without a token is UNAUTHENTICATED at the frontend and at a forwarder reached directly,
and a forwarder reached directly refuses a valid token whose subject holds no role
(PERMISSION_DENIED: it checks IAM itself). The forwarders' internal API (Sources,
SubscriptionCursors) refuses the admin token on a forwarder's port and at the frontend
(PERMISSION_DENIED, nothing changed) and serves the internal token; the cluster goes on through
a kill -9 and restart of the topic's owner. The cluster's prober probes with the admin token.
The frontend's Pulsar port checks tokens too: the official pulsar-client with
``AuthenticationToken`` produces, consumes and reads through it; without a token, or with a
forged one, it gets no producer.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _pulsar
import grpc
import pulsar
import pytest
from google.api_core import exceptions
from google.pubsub_v1 import PublisherClient, SubscriberClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from pubsubd._gen.pubsubd.internal.v1 import forwarder_pb2, sources_pb2
from pubsubd.cluster.launcher import AUTH_DIR, INTERNAL_TOKEN_FILE, SECRET_FILE, LocalCluster
from pubsubd.core.tokens import create_token
from pubsubd.data import sources_wire
from tests.conftest import PROJECT, _Subscriber
from tests.support.cluster import (
    environment,
    running_cluster,
    subscription_server,
    subscription_uid,
    topic_owner,
    topic_uid,
)
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # No grace for a replaced internal identity (the rotation test checks the refusal; the
    # grace itself: tests/integration/test_storage_node_auth.py).
    with (
        environment({"PUBSUBD_INTERNAL_TOKEN_GRACE": "0"}),
        running_cluster(
            tmp_path_factory.mktemp("cluster-up-tokens") / "c",
            storage_nodes=1,
            replicas=1,
            routers=1,
            frontends=1,
            forwarders=2,
            forwarder_args=[["--no-subscribing"], ["--no-publishing"]],
            probers=1,
            tokens=True,
            iam=True,
        ) as c,
    ):
        yield c


def _clients(endpoint: str) -> tuple[PublisherClient, SubscriberClient]:
    channel = grpc.insecure_channel(endpoint)
    publisher = PublisherClient(transport=PublisherGrpcTransport(channel=channel))
    subscriber = SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
    return publisher, subscriber


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_up_prints_the_admin_token_and_passes_auth_flags(cluster: LocalCluster) -> None:
    described = cluster.described()
    token = described["token"]
    assert token and described["iam"] is True
    assert Path(described["token_file"]).read_text().strip() == token
    for p in cluster.processes:
        if p.role in ("forwarder", "frontend"):
            assert "--auth-secret-file" in p.args and "--iam" in p.args, p.name
        if p.role == "forwarder":
            assert "--internal-token-file" in p.args
        if p.role == "storage":  # the forwarders' appends carry their internal token
            assert "--auth-secret-file" in p.args
        if p.role == "prober":
            assert "--token-file" in p.args
    prober = cluster.process("prober-1").address

    def probed() -> list[dict[str, Any]] | None:
        with urllib.request.urlopen(f"http://{prober}/status", timeout=10) as r:
            probes: list[dict[str, Any]] = json.loads(r.read())["probes"]
        return probes if len(probes) == 2 and all(p["ok"] for p in probes) else None

    wait_for(probed, 60, "a successful probe round with the admin token")


def test_admin_token_publishes_pulls_and_dead_letters_across_forwarders(
    cluster: LocalCluster,
) -> None:
    admin = _bearer(cluster.admin_token or "")
    publisher, subscriber = _clients(cluster.frontends[0])
    suffix = uuid.uuid4().hex[:8]
    topic = f"projects/{PROJECT}/topics/t-{suffix}"
    dead = f"projects/{PROJECT}/topics/dead-{suffix}"
    sub = f"projects/{PROJECT}/subscriptions/s-{suffix}"
    dead_sub = f"projects/{PROJECT}/subscriptions/dead-s-{suffix}"
    publisher.create_topic(name=topic, metadata=admin)
    publisher.create_topic(name=dead, metadata=admin)
    subscriber.create_subscription(
        request={
            "name": sub,
            "topic": topic,
            "dead_letter_policy": {"dead_letter_topic": dead, "max_delivery_attempts": 5},
        },
        metadata=admin,
    )
    subscriber.create_subscription(name=dead_sub, topic=dead, metadata=admin)
    # Placed apart: the subscription on the subscribing forwarder, its topic on the other.
    wait_for(lambda: topic_owner(cluster, topic) == "forwarder-1", 30, "topic placed")
    wait_for(lambda: subscription_server(cluster, sub) == "forwarder-2", 30, "sub placed")

    def published(data: bytes) -> None:
        def attempt() -> bool:
            try:
                request = {"topic": topic, "messages": [{"data": data}]}
                return bool(publisher.publish(request=request, metadata=admin).message_ids)
            except exceptions.ServiceUnavailable:
                return False  # the topic is being taken over

        wait_for(attempt, 30, "a publish through the frontend")

    def pulled(subscription: str) -> Any:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                response = subscriber.pull(
                    request={"subscription": subscription, "max_messages": 10},
                    metadata=admin,
                    timeout=10,
                )
            except (exceptions.ServiceUnavailable, exceptions.DeadlineExceeded):
                continue
            if response.received_messages:
                return response.received_messages[0]
        raise AssertionError(f"nothing pulled from {subscription}")

    published(b"kept")
    received = pulled(sub)  # read on forwarder-2's copy, over forwarder-1's Tail
    assert received.message.data == b"kept"
    subscriber.acknowledge(subscription=sub, ack_ids=[received.ack_id], metadata=admin)
    published(b"refused")
    for _ in range(5):  # nacked five times: dead-lettered by forwarder-2 to forwarder-1
        received = pulled(sub)
        assert received.message.data == b"refused"
        subscriber.modify_ack_deadline(
            subscription=sub, ack_ids=[received.ack_id], ack_deadline_seconds=0, metadata=admin
        )
    assert pulled(dead_sub).message.data == b"refused"


def test_calls_without_a_token_or_permission_are_refused_at_the_forwarder_too(
    cluster: LocalCluster,
) -> None:
    assert cluster.auth_dir is not None
    secret = (cluster.auth_dir / SECRET_FILE).read_bytes().strip()
    assert cluster.auth_dir.name == AUTH_DIR
    nobody = _bearer(create_token("nobody@example.com", secret=secret, now=time.time()))
    name = f"projects/{PROJECT}/topics/never-{uuid.uuid4().hex[:8]}"
    forwarder = cluster.process("forwarder-1").address
    for endpoint in (cluster.frontends[0], forwarder):
        publisher, _ = _clients(endpoint)
        with pytest.raises(exceptions.Unauthenticated):
            publisher.create_topic(name=name)
        with pytest.raises(exceptions.PermissionDenied):
            publisher.create_topic(name=name, metadata=nobody)


def test_pulsar_front_of_a_frontend_with_authentication(cluster: LocalCluster) -> None:
    frontend = cluster.process("frontend-1")
    port = frontend.args[frontend.args.index("--pulsar-port") + 1]
    admin = cluster.admin_token or ""
    publisher, _ = _clients(cluster.frontends[0])
    topic_id = f"pulsar-{uuid.uuid4().hex[:8]}"
    publisher.create_topic(name=f"projects/{PROJECT}/topics/{topic_id}", metadata=_bearer(admin))
    wait_for(
        lambda: topic_owner(cluster, f"projects/{PROJECT}/topics/{topic_id}") == "forwarder-1",
        30,
        "topic placed",
    )
    pulsar_topic = f"persistent://{PROJECT}/default/{topic_id}"
    quiet = pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error)

    def client(token: str | None, timeout_s: int = 30) -> pulsar.Client:
        auth = pulsar.AuthenticationToken(token) if token is not None else None
        return pulsar.Client(
            f"pulsar://127.0.0.1:{port}",
            authentication=auth,
            operation_timeout_seconds=timeout_s,
            logger=quiet,
        )

    trusted = client(admin)
    try:
        consumer = trusted.subscribe(pulsar_topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = trusted.create_producer(pulsar_topic)
        for i in range(3):
            producer.send(f"p{i}".encode())
        got = []
        for _ in range(3):
            message = consumer.receive(30_000)
            got.append(message.data())
            consumer.acknowledge(message)
        assert sorted(got) == [b"p0", b"p1", b"p2"]
        reader = trusted.create_reader(pulsar_topic, pulsar.MessageId.earliest)
        read = [reader.read_next(30_000).data() for _ in range(3)]
        assert sorted(read) == [b"p0", b"p1", b"p2"]
    finally:
        trusted.close()
    assert cluster.auth_dir is not None
    forged = create_token("admin@pubsubd.local", secret=b"f" * 40, now=time.time())
    for token in (None, forged):
        refused = client(token, timeout_s=3)
        try:
            with pytest.raises(pulsar.PulsarException):
                refused.create_producer(pulsar_topic)
        finally:
            refused.close()


def _internal_calls(topic_uid_: str, sub_uid: str, sub: str) -> list[tuple[str, Any, bool]]:
    """Internal calls that would change or reveal a subscription's state: (method, request,
    server streaming)."""
    version = sources_wire.PROTOCOL_VERSION
    ids = {"protocol_version": version, "topic_uid": topic_uid_, "subscription_uid": sub_uid}
    everything_acked = [sources_pb2.CursorState(source=0, mark_delete=1 << 40)]
    return [
        (
            "/pubsubd.internal.v1.Sources/SetPublishBlock",
            sources_pb2.SetPublishBlockRequest(**ids, reason="blocked by a client", from_us=1),
            False,
        ),
        (
            "/pubsubd.internal.v1.Sources/ResetCursors",
            sources_pb2.ResetCursorsRequest(**ids, cursors=everything_acked),
            False,
        ),
        (
            "/pubsubd.internal.v1.Sources/RecordAcks",
            sources_pb2.RecordAcksRequest(**ids, acks=everything_acked),
            False,
        ),
        ("/pubsubd.internal.v1.Sources/Detach", sources_pb2.SubscriptionRequest(**ids), False),
        (
            "/pubsubd.internal.v1.Sources/CursorStates",
            sources_pb2.SubscriptionRequest(**ids),
            False,
        ),
        (
            "/pubsubd.internal.v1.Sources/Tail",
            sources_pb2.TailRequest(protocol_version=version, topic_uid=topic_uid_, source=0),
            True,
        ),
        (
            "/pubsubd.internal.v1.Forwarder/SubscriptionCursors",
            forwarder_pb2.SubscriptionCursorsRequest(protocol_version=3, subscription=sub),
            False,
        ),
    ]


def _status_of(endpoint: str, method: str, request: Any, streaming: bool, token: str) -> Any:
    """The status code of ``method`` called at ``endpoint`` with ``token`` (OK: it was served)."""
    with grpc.insecure_channel(endpoint) as channel:
        try:
            if streaming:
                call = channel.unary_stream(
                    method, request_serializer=type(request).SerializeToString
                )
                for _ in call(request, metadata=_bearer(token), timeout=5):
                    break  # one answer: it was served
            else:
                channel.unary_unary(method, request_serializer=type(request).SerializeToString)(
                    request, metadata=_bearer(token), timeout=10
                )
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def test_internal_methods_refuse_a_client_or_admin_token_and_change_nothing(
    cluster: LocalCluster,
) -> None:
    """The admin token (every IAM role, but not the cluster's identity) calls the internal API
    on the forwarders' own ports and through the frontend: PERMISSION_DENIED everywhere, and
    the topic still takes publishes (no publish block), its subscription still gets its
    message (no cursor reset, no detach). The internal token is let in (the same calls' reads
    answer). Then the topic's owner is killed (-9) and restarted and takes its sources back
    (ledger recovery on the storage nodes, the subscribing forwarder's Tail and Attach again,
    all with the internal token): publish and pull go on."""
    admin = cluster.admin_token or ""
    assert cluster.auth_dir is not None
    internal = (cluster.auth_dir / INTERNAL_TOKEN_FILE).read_text().strip()
    publisher, subscriber = _clients(cluster.frontends[0])
    suffix = uuid.uuid4().hex[:8]
    topic = f"projects/{PROJECT}/topics/internal-{suffix}"
    sub = f"projects/{PROJECT}/subscriptions/internal-{suffix}"
    publisher.create_topic(name=topic, metadata=_bearer(admin))
    subscriber.create_subscription(name=sub, topic=topic, metadata=_bearer(admin))
    wait_for(lambda: topic_owner(cluster, topic) == "forwarder-1", 30, "topic placed")
    wait_for(lambda: subscription_server(cluster, sub) == "forwarder-2", 30, "sub placed")
    _published(publisher, topic, b"before", admin)
    calls = _internal_calls(topic_uid(cluster, topic), subscription_uid(cluster, sub), sub)
    owner = cluster.process("forwarder-1").address
    reader = cluster.process("forwarder-2").address
    for method, request, streaming in calls:
        at = reader if "SubscriptionCursors" in method else owner
        for endpoint in (at, cluster.frontends[0]):
            code = _status_of(endpoint, method, request, streaming, admin)
            assert code == grpc.StatusCode.PERMISSION_DENIED, (method, endpoint, code)
    for method, request, streaming in calls:
        if method.endswith(("CursorStates", "Tail", "SubscriptionCursors")):  # reads only
            at = reader if "SubscriptionCursors" in method else owner
            assert _status_of(at, method, request, streaming, internal) == grpc.StatusCode.OK
    _published(publisher, topic, b"after", admin)  # not blocked
    # Nothing was acked or detached: both are delivered.
    assert _pulled_until(subscriber, sub, admin, {b"before", b"after"}) == {b"before", b"after"}
    cluster.kill("forwarder-1")
    cluster.restart("forwarder-1")  # its sources are taken back from the storage nodes
    _published(publisher, topic, b"restarted", admin)
    # (acks within the owner's journal flush window may come again after a kill -9)
    assert b"restarted" in _pulled_until(subscriber, sub, admin, {b"restarted"})


def _published(publisher: PublisherClient, topic: str, data: bytes, token: str) -> None:
    def attempt() -> bool:
        try:
            request = {"topic": topic, "messages": [{"data": data}]}
            return bool(publisher.publish(request=request, metadata=_bearer(token)).message_ids)
        except exceptions.ServiceUnavailable:
            return False  # the topic is being taken over

    wait_for(attempt, 60, "a publish through the frontend")


def _pulled_until(
    subscriber: SubscriberClient, sub: str, token: str, expected: set[bytes]
) -> set[bytes]:
    """The data of the messages pulled (and acked) through the frontend until every one of
    ``expected`` came, or 60 s passed."""
    got: set[bytes] = set()
    deadline = time.monotonic() + 60
    while not expected <= got and time.monotonic() < deadline:
        try:
            response = subscriber.pull(
                request={"subscription": sub, "max_messages": 10},
                metadata=_bearer(token),
                timeout=10,
            )
        except (exceptions.ServiceUnavailable, exceptions.DeadlineExceeded):
            continue
        for received in response.received_messages:
            got.add(received.message.data)
        if response.received_messages:
            subscriber.acknowledge(
                subscription=sub,
                ack_ids=[r.ack_id for r in response.received_messages],
                metadata=_bearer(token),
            )
    return got


def test_the_cluster_follows_its_internal_token_to_another_subject(cluster: LocalCluster) -> None:
    """The internal token file every process of the cluster reads is replaced by a token of
    another subject (rotation): the forwarders and the storage node follow it, so the old token
    is refused on a forwarder's internal API and the new one served; the subscribing
    forwarder's open Tail (old subject) is ended and opened again with the new token, the
    writers' append connections likewise, and publish and pull go on through the frontend."""
    assert cluster.auth_dir is not None
    path = cluster.auth_dir / INTERNAL_TOKEN_FILE
    secret = (cluster.auth_dir / SECRET_FILE).read_bytes().strip()
    old = path.read_text().strip()
    new = create_token(
        "serviceAccount:pubsubd-internal-2@pubsubd.local", secret=secret, now=time.time()
    )
    admin = cluster.admin_token or ""
    publisher, subscriber = _clients(cluster.frontends[0])
    suffix = uuid.uuid4().hex[:8]
    topic = f"projects/{PROJECT}/topics/rotate-{suffix}"
    sub = f"projects/{PROJECT}/subscriptions/rotate-{suffix}"
    publisher.create_topic(name=topic, metadata=_bearer(admin))
    subscriber.create_subscription(name=sub, topic=topic, metadata=_bearer(admin))
    wait_for(lambda: topic_owner(cluster, topic) == "forwarder-1", 30, "topic placed")
    wait_for(lambda: subscription_server(cluster, sub) == "forwarder-2", 30, "sub placed")
    _published(publisher, topic, b"before", admin)
    assert _pulled_until(subscriber, sub, admin, {b"before"}) == {b"before"}  # a Tail is open
    ids = {
        "protocol_version": sources_wire.PROTOCOL_VERSION,
        "topic_uid": topic_uid(cluster, topic),
        "subscription_uid": subscription_uid(cluster, sub),
    }
    states = ("/pubsubd.internal.v1.Sources/CursorStates", sources_pb2.SubscriptionRequest(**ids))
    owner = cluster.process("forwarder-1").address
    reader_log = Path(cluster.process("forwarder-2").log)
    # The owner's refusal of the reader's open Tail, made with the old token, as the reader
    # logs it (api/grpc/authn.LongCall; remote_sources.py starts the Tail again).
    ended = f"tail of {ids['topic_uid']} source 0 broke (<AioRpcError"
    old_member = "serviceAccount:pubsubd-internal@pubsubd.local is not"

    def tail_ended() -> bool:  # a "tail ... broke (the error); starting again" naming it
        entries = reader_log.read_text().split("; starting again")
        return any(ended in e and old_member in e.rsplit(ended, 1)[1] for e in entries)

    assert not tail_ended()
    _replace(path, new)
    try:
        wait_for(
            lambda: _status_of(owner, *states, False, old) == grpc.StatusCode.PERMISSION_DENIED,
            10,
            "the owner to refuse the old subject",
        )
        assert _status_of(owner, *states, False, new) == grpc.StatusCode.OK
        _published(publisher, topic, b"after", admin)
        assert b"after" in _pulled_until(subscriber, sub, admin, {b"after"})
        wait_for(tail_ended, 10, "the reader's Tail of the old subject to be ended")
    finally:
        _replace(path, old)


def _replace(path: Path, token: str) -> None:
    """Replace a token file as an operator rotating it would (a new file renamed over it)."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(token)
    fresh.chmod(0o600)
    fresh.replace(path)


def test_a_stream_through_the_frontend_follows_its_token_and_the_policies(
    cluster: LocalCluster,
) -> None:
    """The official subscriber through the frontend (core/stream_guard.py): with a client
    interceptor that sends a fresh 2-3 s token on every call, it receives across the token's
    expiry (the stream ends UNAVAILABLE and is reopened); when the admin then removes carol's
    binding on the subscription (SetIamPolicy through the frontend, followed by every process
    through ZooKeeper), her open stream ends PERMISSION_DENIED at once."""
    assert cluster.auth_dir is not None
    secret = (cluster.auth_dir / SECRET_FILE).read_bytes().strip()
    admin = _bearer(cluster.admin_token or "")
    endpoint = cluster.frontends[0]
    publisher, admin_subscriber = _clients(endpoint)
    suffix = uuid.uuid4().hex[:8]
    topic = f"projects/{PROJECT}/topics/guard-{suffix}"
    sub = f"projects/{PROJECT}/subscriptions/guard-{suffix}"
    publisher.create_topic(name=topic, metadata=admin)
    admin_subscriber.create_subscription(name=sub, topic=topic, metadata=admin)
    wait_for(lambda: topic_owner(cluster, topic) == "forwarder-1", 30, "topic placed")
    wait_for(lambda: subscription_server(cluster, sub) == "forwarder-2", 30, "sub placed")
    binding = {"role": "roles/pubsub.subscriber", "members": ["user:carol@example.com"]}
    policy = publisher.set_iam_policy(
        request={"resource": sub, "policy": {"bindings": [binding]}}, metadata=admin
    )
    streams: list[float] = []

    class FreshToken(grpc.StreamStreamClientInterceptor, grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        def _details(self, details: Any) -> Any:
            if details.method.endswith("/StreamingPull"):
                streams.append(time.time())
            token = create_token(
                "carol@example.com", secret=secret, expires_in_s=3, now=time.time()
            )
            return _Details(details, ("authorization", f"Bearer {token}"))

        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._details(details), request)

        def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
            return continuation(self._details(details), requests)

    channel = grpc.intercept_channel(grpc.insecure_channel(endpoint), FreshToken())
    carol = _Subscriber(transport=SubscriberGrpcTransport(channel=channel))

    def may_consume() -> bool:
        try:
            with warnings.catch_warnings():  # the client frowns on return_immediately
                warnings.simplefilter("ignore", DeprecationWarning)
                carol.pull(
                    request={"subscription": sub, "max_messages": 1, "return_immediately": True},
                    timeout=10,
                )
        except exceptions.PermissionDenied:
            return False
        return True

    # The binding reaches the subscription's forwarder through ZooKeeper, a moment after
    # SetIamPolicy returns: a stream opened before would be refused for good.
    wait_for(may_consume, 30, "carol's binding in force where the subscription is served")
    received: set[bytes] = set()
    future = carol.subscribe(sub, lambda m: (received.add(m.data), m.ack()))
    try:
        sent: set[bytes] = set()
        end = time.time() + 4.5  # past the first stream's token
        while time.time() < end:
            data = f"m{len(sent)}".encode()
            publisher.publish(topic=topic, messages=[{"data": data}], metadata=admin)
            sent.add(data)
            time.sleep(0.3)
        wait_for(lambda: received >= sent, 20, "every message across the expiry")
        assert len(streams) >= 2 and not future.done(), streams
        revoked_at = time.monotonic()
        publisher.set_iam_policy(
            request={"resource": sub, "policy": {"bindings": [], "etag": policy.etag}},
            metadata=admin,
        )
        with pytest.raises(exceptions.PermissionDenied, match=r"subscriptions\.consume"):
            future.result(timeout=10)
        # At once, not at a lease's end or a poll (the bound is loose: CI is busy).
        assert time.monotonic() - revoked_at < 8.0
    finally:
        carol.close()


class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
    """A call's details with one more metadata entry."""

    def __init__(self, details: Any, extra: tuple[str, str]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = [*(details.metadata or ()), extra]
        self.credentials = details.credentials
        self.wait_for_ready = details.wait_for_ready
        self.compression = details.compression
