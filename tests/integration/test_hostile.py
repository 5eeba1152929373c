"""Hostile and broken clients: garbage on the wire, bad streams, clients that vanish.

After each test the server must still be alive, serving gRPC, and answering /healthz.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.api_core import exceptions
from google.protobuf.message import DecodeError

from tests.conftest import PROJECT
from tests.support.raw import (
    STREAMING_PULL,
    PublishRequest,
    RawStream,
    StreamingPullRequest,
    StreamingPullResponse,
    http_get,
)
from tests.support.server import ServerProcess, wait_for
from tests.support.status import sub_status

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ACK_DEADLINE_S = 10


@pytest.fixture(autouse=True)
def still_serving(shared_server: ServerProcess, clients: Any, names: Any) -> Iterator[None]:
    """After each test: the process is alive, /healthz is 200 and publish/pull still works."""
    yield
    assert shared_server.alive(), shared_server.log()[-4000:]
    assert http_get(shared_server, "/healthz")[0] == 200
    pub, sub = clients
    topic, subscription = names.topic("check"), names.subscription("check")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    pub.publish(topic, b"still here").result(timeout=30)
    resp = sub.pull(request={"subscription": subscription, "max_messages": 1}, timeout=20)
    assert [m.message.data for m in resp.received_messages] == [b"still here"]


@pytest.fixture
def topic_and_sub(clients: Any, names: Any) -> tuple[str, str]:
    pub, sub = clients
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(
        request={"name": subscription, "topic": topic, "ack_deadline_seconds": ACK_DEADLINE_S}
    )
    return topic, subscription


def _undecodable(rng: random.Random, size: int) -> bytes:
    """Random bytes that are certainly not a valid protobuf message."""
    while True:
        body = rng.randbytes(size)
        try:
            PublishRequest.FromString(body)
        except DecodeError:
            return body


def _drain(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    chunks = []
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        pass
    return b"".join(chunks)


# --- garbage on the wire ----------------------------------------------------------------------


def test_garbage_bytes_on_grpc_port(shared_server: ServerProcess) -> None:
    rng = random.Random(7)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    payloads = [rng.randbytes(rng.choice([1, 17, 512, 65536])) for _ in range(20)]
    payloads += [preface + rng.randbytes(1000) for _ in range(5)]
    # A valid preface, then a frame header announcing a huge frame, then silence.
    payloads.append(preface + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01")
    for payload in payloads:
        with socket.create_connection((shared_server.host, shared_server.port), timeout=5) as s:
            with contextlib.suppress(OSError):  # the server may hang up mid-send
                s.sendall(payload)
            _drain(s, 0.2)


def test_http1_request_on_grpc_port(shared_server: ServerProcess) -> None:
    requests = [
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"POST /google.pubsub.v1.Publisher/Publish HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/grpc\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /v1/projects/p/topics HTTP/1.0\r\n\r\n",
    ]
    for request in requests:
        with socket.create_connection((shared_server.host, shared_server.port), timeout=5) as s:
            s.sendall(request)
            _drain(s, 1.0)


def test_idle_connections_do_not_block_service(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    idle = [
        socket.create_connection((shared_server.host, shared_server.port), timeout=5)
        for _ in range(50)
    ]
    try:
        pub, _ = clients
        name = names.topic("while-idle")
        assert pub.create_topic(name=name, timeout=10).name == name
    finally:
        for s in idle:
            s.close()


def test_garbage_on_http_port(shared_server: ServerProcess) -> None:
    rng = random.Random(5)
    payloads = [
        rng.randbytes(300),
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n",  # a head longer than any limit
        b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 20_000 + b"\r\n",
        b"\r\n\r\n",
        b"GET\r\n\r\n",
    ]
    for payload in payloads:
        with socket.create_connection(
            (shared_server.host, shared_server.http_port), timeout=5
        ) as s:
            with contextlib.suppress(OSError):
                s.sendall(payload)
            _drain(s, 0.5)
    # Connections that never finish their request head must not block others.
    idle = [
        socket.create_connection((shared_server.host, shared_server.http_port), timeout=5)
        for _ in range(20)
    ]
    try:
        for s in idle:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert http_get(shared_server, "/healthz")[0] == 200
        with pytest.raises(urllib.error.HTTPError) as e:
            http_get(shared_server, "/no/such/page")
        assert e.value.code == 404
        e.value.close()  # the error holds the response and its socket
    finally:
        for s in idle:
            s.close()


# --- garbage protobuf bodies ------------------------------------------------------------------


def _raw_unary(endpoint: str, method: str, body: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as e:
            call(body, timeout=10)
    return e.value


def test_garbage_publish_body_invalid_argument(shared_server: ServerProcess, names: Any) -> None:
    rng = random.Random(11)
    valid = PublishRequest(topic=names.topic(), messages=[{"data": b"x" * 100}]).SerializeToString()
    bodies = [
        _undecodable(rng, 64),
        _undecodable(rng, 4096),
        valid[: len(valid) - 7],  # truncated mid-field
        b"\x0a\xff\xff\xff\xff\x0f",  # length prefix far past the end
        b"\xff" * 32,
    ]
    for body in bodies:
        with pytest.raises(DecodeError):
            PublishRequest.FromString(body)
        err = _raw_unary(shared_server.endpoint, "/google.pubsub.v1.Publisher/Publish", body)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()


@pytest.mark.parametrize(
    "method",
    [
        "/google.pubsub.v1.Publisher/CreateTopic",
        "/google.pubsub.v1.Publisher/GetTopic",
        "/google.pubsub.v1.Subscriber/Pull",
        "/google.pubsub.v1.Subscriber/Acknowledge",
        "/google.pubsub.v1.Subscriber/CreateSubscription",
    ],
)
def test_garbage_body_other_rpcs_invalid_argument(
    shared_server: ServerProcess, method: str
) -> None:
    """An unparsable request is the client's fault: INVALID_ARGUMENT, never a code it retries."""
    err = _raw_unary(shared_server.endpoint, method, b"\x0a\xff\xff\xff\xff\x0f")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())


def test_unknown_method_unimplemented(shared_server: ServerProcess) -> None:
    err = _raw_unary(shared_server.endpoint, "/google.pubsub.v1.Subscriber/NoSuchRpc", b"")
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED


def test_garbage_streaming_pull_request_invalid_argument(shared_server: ServerProcess) -> None:
    with grpc.insecure_channel(shared_server.endpoint) as channel:
        call = channel.stream_stream(
            STREAMING_PULL, request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.RpcError) as e:
            list(call(iter([b"\x0a\xff\xff\xff\xff\x0f"]), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())


# --- bad StreamingPull requests ---------------------------------------------------------------


def _stream_error(endpoint: str, *requests: Any) -> grpc.StatusCode | None:
    stream = RawStream(endpoint, requests[0], timeout=20)
    for r in requests[1:]:
        stream.send(r)
    try:
        return stream.status_code(15)
    finally:
        stream.close()


def test_streaming_pull_first_request_without_subscription(shared_server: ServerProcess) -> None:
    code = _stream_error(
        shared_server.endpoint, StreamingPullRequest(stream_ack_deadline_seconds=10)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_streaming_pull_bad_first_requests(
    shared_server: ServerProcess, names: Any, topic_and_sub: tuple[str, str]
) -> None:
    _, subscription = topic_and_sub
    ep = shared_server.endpoint
    cases = {
        "missing subscription": (
            StreamingPullRequest(
                subscription=names.subscription("missing"), stream_ack_deadline_seconds=10
            ),
            grpc.StatusCode.NOT_FOUND,
        ),
        "malformed subscription": (
            StreamingPullRequest(
                subscription=f"projects/{PROJECT}/subscriptions/1x", stream_ack_deadline_seconds=10
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        "deadline 5": (
            StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=5),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        "deadline 601": (
            StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=601),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        "negative flow control": (
            StreamingPullRequest(
                subscription=subscription,
                stream_ack_deadline_seconds=10,
                max_outstanding_messages=-1,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        "mismatched modify lists": (
            StreamingPullRequest(
                subscription=subscription,
                stream_ack_deadline_seconds=10,
                modify_deadline_ack_ids=["a", "b"],
                modify_deadline_seconds=[10],
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    }
    for what, (first, expected) in cases.items():
        assert _stream_error(ep, first) == expected, what


def test_streaming_pull_bad_later_requests(
    shared_server: ServerProcess, names: Any, topic_and_sub: tuple[str, str]
) -> None:
    _, subscription = topic_and_sub
    ep = shared_server.endpoint
    first = StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=10)
    later = {
        "mismatched modify lists": StreamingPullRequest(
            modify_deadline_ack_ids=["a"], modify_deadline_seconds=[10, 20]
        ),
        "modify deadline 601": StreamingPullRequest(
            modify_deadline_ack_ids=["x"], modify_deadline_seconds=[601]
        ),
        "changed subscription": StreamingPullRequest(subscription=names.subscription("other")),
        "malformed ack id": StreamingPullRequest(ack_ids=["not-an-ack-id"]),
    }
    for what, request in later.items():
        assert _stream_error(ep, first, request) == grpc.StatusCode.INVALID_ARGUMENT, what


def test_streaming_pull_heartbeats_keep_stream_open(
    shared_server: ServerProcess, clients: Any, topic_and_sub: tuple[str, str]
) -> None:
    pub, _ = clients
    topic, subscription = topic_and_sub
    stream = RawStream(
        shared_server.endpoint,
        StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=10),
    )
    try:
        for _ in range(5):
            stream.send(StreamingPullRequest())  # what the official client sends every 30 s
        pub.publish(topic, b"after heartbeats").result(timeout=30)
        got = stream.receive(1, 10)
        assert [m.message.data for m in got] == [b"after heartbeats"], stream.error
        assert stream.status_code(0) is None, "the stream is still open"
    finally:
        stream.close()


# --- clients that vanish ----------------------------------------------------------------------


def _start_killable_subscriber(endpoint: str, subscription: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.vanishing_subscriber",
            endpoint,
            subscription,
            str(ACK_DEADLINE_S),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )


def _read_lines(proc: subprocess.Popen[str], count: int, timeout: float) -> list[dict[str, str]]:
    lines: list[dict[str, str]] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(json.loads(line))
            if len(lines) >= count:
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    return lines


def test_streaming_pull_client_vanishes_messages_redelivered(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    """Messages leased to a stream whose client disappears come back after the ack deadline.

    Two ways to vanish, run side by side: the channel closed under the open stream, and the
    client process killed with SIGKILL (the kernel closes the socket, no HTTP/2 goodbye).
    """
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    closed_sub, killed_sub = names.subscription("closed"), names.subscription("killed")
    for s in (closed_sub, killed_sub):
        sub.create_subscription(
            request={"name": s, "topic": topic, "ack_deadline_seconds": ACK_DEADLINE_S}
        )
    count = 5
    futures = [pub.publish(topic, f"m{i}".encode()) for i in range(count)]
    ids = {f.result(timeout=30) for f in futures}

    proc = _start_killable_subscriber(shared_server.endpoint, killed_sub)
    try:
        stream = RawStream(
            shared_server.endpoint,
            StreamingPullRequest(
                subscription=closed_sub, stream_ack_deadline_seconds=ACK_DEADLINE_S
            ),
        )
        got_closed = stream.receive(count, 15)
        delivered_at = time.monotonic()
        assert {m.message.message_id for m in got_closed} == ids
        got_killed = _read_lines(proc, count, 30)
        assert {line["message_id"] for line in got_killed} == ids
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()
    stream.vanish()
    for s in (closed_sub, killed_sub):
        wait_for(lambda s=s: sub_status(shared_server, s).get("consumers") == 0, 10, f"{s} gone")

    # Not before the deadline: another consumer finds nothing leased-out to take.
    for s in (closed_sub, killed_sub):
        resp = sub.pull(request={"subscription": s, "max_messages": 10}, timeout=3)
        assert list(resp.received_messages) == [], "redelivered before the ack deadline"

    old_ack_ids = {m.ack_id for m in got_closed} | {line["ack_id"] for line in got_killed}
    for s in (closed_sub, killed_sub):
        redelivered: dict[str, Any] = {}

        def collect(s: str = s, redelivered: dict[str, Any] = redelivered) -> bool:
            resp = sub.pull(request={"subscription": s, "max_messages": 10}, timeout=5)
            for m in resp.received_messages:
                redelivered[m.message.message_id] = m
            return set(redelivered) == ids

        wait_for(collect, ACK_DEADLINE_S + 15, f"redelivery on {s}")
        assert time.monotonic() - delivered_at >= ACK_DEADLINE_S - 1
        assert not {m.ack_id for m in redelivered.values()} & old_ack_ids, "new ack IDs"
        sub.acknowledge(subscription=s, ack_ids=[m.ack_id for m in redelivered.values()])


def test_many_streams_opened_and_dropped(
    shared_server: ServerProcess, topic_and_sub: tuple[str, str]
) -> None:
    _, subscription = topic_and_sub
    channel = grpc.insecure_channel(shared_server.endpoint)
    streams = [
        RawStream(
            shared_server.endpoint,
            StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=10),
            channel=channel,
        )
        for _ in range(30)
    ]
    wait_for(
        lambda: sub_status(shared_server, subscription).get("consumers") == 30,
        15,
        "30 open streams",
    )
    channel.close()
    for s in streams:
        assert s.ended.wait(10)
    wait_for(
        lambda: sub_status(shared_server, subscription).get("consumers") == 0,
        10,
        "every dropped stream removed",
    )


def test_stream_half_closed_without_requests(
    shared_server: ServerProcess, topic_and_sub: tuple[str, str]
) -> None:
    with grpc.insecure_channel(shared_server.endpoint) as channel:
        call = channel.stream_stream(
            STREAMING_PULL,
            request_serializer=StreamingPullRequest.SerializeToString,
            response_deserializer=StreamingPullResponse.FromString,
        )
        try:
            assert list(call(iter([]), timeout=10)) == []
        except grpc.RpcError as e:
            assert e.code() != grpc.StatusCode.INTERNAL, e.details()


def test_publish_connection_dropped_mid_request(
    shared_server: ServerProcess, clients: Any, topic_and_sub: tuple[str, str]
) -> None:
    """A big Publish whose channel is closed while it is being sent leaves the server fine."""
    topic, _ = topic_and_sub
    body = PublishRequest(topic=topic, messages=[{"data": b"x" * 8_000_000}]).SerializeToString()
    for _ in range(3):
        channel = grpc.insecure_channel(shared_server.endpoint)
        call = channel.unary_unary(
            "/google.pubsub.v1.Publisher/Publish",
            request_serializer=None,
            response_deserializer=None,
        )
        future = call.future(body, timeout=10)
        channel.close()
        with pytest.raises((grpc.RpcError, grpc.FutureCancelledError)):
            future.result(timeout=10)


def test_not_found_is_not_retried_forever(clients: Any, names: Any) -> None:
    """Sanity: permanent errors come back fast (a retried code would take the 60 s timeout)."""
    _, sub = clients
    start = time.monotonic()
    with pytest.raises(exceptions.NotFound):
        sub.pull(request={"subscription": names.subscription("nope"), "max_messages": 1})
    assert time.monotonic() - start < 5
