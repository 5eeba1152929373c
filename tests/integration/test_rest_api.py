"""REST v1 on the HTTP port with plain HTTP calls (http.client, keep-alive), against one real
``pubsubd serve``: every topics, subscriptions and snapshots method, Google's JSON and error
bodies, malformed requests, and mixed use with the official gRPC client (publish over REST,
receive over gRPC, and the reverse)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.cloud import pubsub_v1

from pubsubd.api.rest import RestFront
from pubsubd.observability.http_conn import Request
from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support.rest import Rest, b64, unb64
from tests.support.server import ServerProcess, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]

P = f"/v1/projects/{PROJECT}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("rest") / "data").start()
    yield srv
    srv.kill()


@pytest.fixture
def rest(server: ServerProcess) -> Iterator[Rest]:
    client = Rest(server.host, server.http_port)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_clients(
    server: ServerProcess,
) -> Iterator[tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]]:
    pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
    yield pub, sub
    sub.close()


def _ids(names: Any) -> tuple[str, str, str]:
    s = names.suffix
    return f"top-{s}", f"sub-{s}", f"snap-{s}"


def _topic_with_subscription(rest: Rest, names: Any, **fields: Any) -> tuple[str, str]:
    topic, sub, _ = _ids(names)
    rest.ok("PUT", f"{P}/topics/{topic}", {})
    rest.ok(
        "PUT", f"{P}/subscriptions/{sub}", {"topic": f"projects/{PROJECT}/topics/{topic}", **fields}
    )
    return topic, sub


def _pull(rest: Rest, sub: str, n: int = 100) -> list[dict[str, Any]]:
    got = rest.ok(
        "POST", f"{P}/subscriptions/{sub}:pull", {"maxMessages": n, "returnImmediately": True}
    )
    return list(got.get("receivedMessages", []))


def _pull_until(rest: Rest, sub: str, count: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []

    def more() -> bool:
        got.extend(_pull(rest, sub))
        return len(got) >= count

    wait_for(more, 10, f"{count} messages over REST")
    return got


def test_topic_methods(rest: Rest, names: Any) -> None:
    topic, sub, _ = _ids(names)
    name = f"projects/{PROJECT}/topics/{topic}"
    created = rest.ok(
        "PUT", f"{P}/topics/{topic}", {"labels": {"team": "a"}, "messageRetentionDuration": "3600s"}
    )
    assert created["name"] == name and created["labels"] == {"team": "a"}
    assert created["messageRetentionDuration"] == "3600s"
    assert rest.error("PUT", f"{P}/topics/{topic}", {})[:2] == (409, "ALREADY_EXISTS")
    assert rest.ok("GET", f"{P}/topics/{topic}")["labels"] == {"team": "a"}
    updated = rest.ok(
        "PATCH",
        f"{P}/topics/{topic}",
        {"topic": {"labels": {"team": "b"}}, "updateMask": "labels"},
    )
    assert updated["labels"] == {"team": "b"} and updated["messageRetentionDuration"] == "3600s"
    # Listing pages with pageSize/pageToken in the query.
    others = [f"{topic}-{i}" for i in range(3)]
    for other in others:
        rest.ok("PUT", f"{P}/topics/{other}", {})
    seen: list[str] = []
    token = ""
    while True:
        page = rest.ok("GET", f"{P}/topics?pageSize=2&pageToken={token}")
        assert len(page.get("topics", [])) <= 2
        seen += [t["name"] for t in page.get("topics", [])]
        token = page.get("nextPageToken", "")
        if not token:
            break
    assert {name, *(f"projects/{PROJECT}/topics/{o}" for o in others)} <= set(seen)
    rest.ok("PUT", f"{P}/subscriptions/{sub}", {"topic": name})
    assert rest.ok("GET", f"{P}/topics/{topic}/subscriptions") == {
        "subscriptions": [f"projects/{PROJECT}/subscriptions/{sub}"]
    }
    assert rest.ok("GET", f"{P}/topics/{topic}/snapshots") == {}
    assert rest.ok("DELETE", f"{P}/topics/{topic}") == {}
    assert rest.error("GET", f"{P}/topics/{topic}")[:2] == (404, "NOT_FOUND")
    assert rest.ok("GET", f"{P}/subscriptions/{sub}")["topic"] == "_deleted-topic_"


def test_subscription_methods(rest: Rest, names: Any) -> None:
    _, sub = _topic_with_subscription(
        rest, names, ackDeadlineSeconds=15, labels={"a": "1"}, retryPolicy={"minimumBackoff": "2s"}
    )
    name = f"projects/{PROJECT}/subscriptions/{sub}"
    got = rest.ok("GET", f"{P}/subscriptions/{sub}")
    assert (got["name"], got["ackDeadlineSeconds"], got["labels"]) == (name, 15, {"a": "1"})
    assert got["retryPolicy"]["minimumBackoff"] == "2s"
    updated = rest.ok(
        "PATCH",
        f"{P}/subscriptions/{sub}",
        {"subscription": {"ackDeadlineSeconds": 42}, "updateMask": "ackDeadlineSeconds"},
    )
    assert updated["ackDeadlineSeconds"] == 42 and updated["labels"] == {"a": "1"}
    listed = rest.ok("GET", f"{P}/subscriptions?pageSize=1000")["subscriptions"]
    assert name in [s["name"] for s in listed]
    push = {"pushConfig": {"pushEndpoint": "http://127.0.0.1:9/push"}}
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:modifyPushConfig", push) == {}
    push_config = rest.ok("GET", f"{P}/subscriptions/{sub}")["pushConfig"]
    assert push_config["pushEndpoint"] == "http://127.0.0.1:9/push"
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:modifyPushConfig", {"pushConfig": {}}) == {}
    assert "pushEndpoint" not in rest.ok("GET", f"{P}/subscriptions/{sub}").get("pushConfig", {})
    assert rest.ok("DELETE", f"{P}/subscriptions/{sub}") == {}
    assert rest.error("GET", f"{P}/subscriptions/{sub}")[:2] == (404, "NOT_FOUND")
    assert rest.error("DELETE", f"{P}/subscriptions/{sub}")[:2] == (404, "NOT_FOUND")


def test_publish_pull_modify_ack(rest: Rest, names: Any) -> None:
    topic, sub = _topic_with_subscription(rest, names)
    datas = [b"\x00\xffbinary", b"", b"three"]
    body = {
        "messages": [
            {"data": b64(datas[0]), "attributes": {"k": "v"}},
            {"attributes": {"only": "attributes"}},
            {"data": b64(datas[2])},
        ]
    }
    ids = rest.ok("POST", f"{P}/topics/{topic}:publish", body)["messageIds"]
    assert len(ids) == 3 and all(isinstance(i, str) for i in ids)
    got = _pull_until(rest, sub, 3)
    by_id = {m["message"]["messageId"]: m for m in got}
    assert set(by_id) == set(ids)
    first = by_id[ids[0]]["message"]
    assert unb64(first["data"]) == datas[0] and first["attributes"] == {"k": "v"}
    assert first["publishTime"].endswith("Z")
    assert "data" not in by_id[ids[1]]["message"]  # empty bytes are left out, as Google does
    # A nack (deadline 0) redelivers at once; a longer deadline keeps the message leased.
    nack = {"ackIds": [by_id[ids[2]]["ackId"]], "ackDeadlineSeconds": 0}
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:modifyAckDeadline", nack) == {}
    extend = {"ackIds": [by_id[ids[0]]["ackId"]], "ackDeadlineSeconds": 60}
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:modifyAckDeadline", extend) == {}
    again = _pull_until(rest, sub, 1)
    assert [m["message"]["messageId"] for m in again] == [ids[2]]
    ack_ids = [by_id[ids[0]]["ackId"], by_id[ids[1]]["ackId"], again[0]["ackId"]]
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:acknowledge", {"ackIds": ack_ids}) == {}
    assert _pull(rest, sub) == []
    # A bad ack ID is the service's INVALID_ARGUMENT, as over gRPC.
    bad = rest.error("POST", f"{P}/subscriptions/{sub}:acknowledge", {"ackIds": ["nonsense"]})
    assert bad[:2] == (400, "INVALID_ARGUMENT")


def test_snapshots_and_seek(rest: Rest, names: Any) -> None:
    topic, sub, snap = _ids(names)
    _topic_with_subscription(rest, names, retainAckedMessages=True)  # for the seek to a time
    rest.ok("POST", f"{P}/topics/{topic}:publish", {"messages": [{"data": b64(b"one")}]})
    created = rest.ok(
        "PUT",
        f"{P}/snapshots/{snap}",
        {"subscription": f"projects/{PROJECT}/subscriptions/{sub}", "labels": {"x": "y"}},
    )
    assert created["name"] == f"projects/{PROJECT}/snapshots/{snap}"
    assert created["topic"] == f"projects/{PROJECT}/topics/{topic}" and "expireTime" in created
    assert rest.error(
        "PUT", f"{P}/snapshots/{snap}", {"subscription": f"projects/{PROJECT}/subscriptions/{sub}"}
    )[:2] == (409, "ALREADY_EXISTS")
    assert rest.ok("GET", f"{P}/snapshots/{snap}")["labels"] == {"x": "y"}
    assert created["name"] in [s["name"] for s in rest.ok("GET", f"{P}/snapshots")["snapshots"]]
    assert rest.ok("GET", f"{P}/topics/{topic}/snapshots") == {"snapshots": [created["name"]]}
    patched = rest.ok(
        "PATCH",
        f"{P}/snapshots/{snap}",
        {"snapshot": {"labels": {"x": "z"}}, "updateMask": "labels"},
    )
    assert patched["labels"] == {"x": "z"}
    # Ack the message, then seek back to the snapshot: it is delivered again.
    (m,) = _pull_until(rest, sub, 1)
    rest.ok("POST", f"{P}/subscriptions/{sub}:acknowledge", {"ackIds": [m["ackId"]]})
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:seek", {"snapshot": created["name"]}) == {}
    (again,) = _pull_until(rest, sub, 1)
    assert unb64(again["message"]["data"]) == b"one"
    rest.ok("POST", f"{P}/subscriptions/{sub}:acknowledge", {"ackIds": [again["ackId"]]})
    # Seek to a time before the publish: delivered once more; to the far future: nothing.
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:seek", {"time": "2000-01-01T00:00:00Z"}) == {}
    (third,) = _pull_until(rest, sub, 1)
    assert third["message"]["messageId"] == m["message"]["messageId"]
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:seek", {"time": "2999-01-01T00:00:00Z"}) == {}
    assert _pull(rest, sub) == []
    assert rest.ok("DELETE", f"{P}/snapshots/{snap}") == {}
    assert rest.error("GET", f"{P}/snapshots/{snap}")[:2] == (404, "NOT_FOUND")
    assert rest.error("POST", f"{P}/subscriptions/{sub}:seek", {"snapshot": created["name"]})[
        :2
    ] == (404, "NOT_FOUND")


def test_detach(rest: Rest, names: Any) -> None:
    topic, sub = _topic_with_subscription(rest, names)
    assert rest.ok("POST", f"{P}/subscriptions/{sub}:detach") == {}
    assert rest.ok("GET", f"{P}/subscriptions/{sub}")["detached"] is True
    assert rest.ok("GET", f"{P}/topics/{topic}/subscriptions") == {}
    status, kind, _ = rest.error("POST", f"{P}/subscriptions/{sub}:pull", {"maxMessages": 1})
    assert (status, kind) == (400, "FAILED_PRECONDITION")


def test_exactly_once_failures_carry_error_info(rest: Rest, names: Any) -> None:
    topic, sub = _topic_with_subscription(rest, names, enableExactlyOnceDelivery=True)
    rest.ok("POST", f"{P}/topics/{topic}:publish", {"messages": [{"data": b64(b"once")}]})
    (m,) = _pull_until(rest, sub, 1)
    rest.ok(
        "POST",
        f"{P}/subscriptions/{sub}:modifyAckDeadline",
        {"ackIds": [m["ackId"]], "ackDeadlineSeconds": 0},
    )
    status, value = rest.call(
        "POST", f"{P}/subscriptions/{sub}:acknowledge", {"ackIds": [m["ackId"]]}
    )
    assert status == 400 and value["error"]["status"] == "INVALID_ARGUMENT"
    (detail,) = value["error"]["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert detail["reason"] == "EXACTLY_ONCE_ACKID_FAILURE"
    assert detail["metadata"] == {m["ackId"]: "PERMANENT_FAILURE_INVALID_ACK_ID"}


@pytest.mark.parametrize(
    "verb,path,body,expected",
    [
        ("POST", "/topics/t-{s}:publish", b'{"messages": [', (400, "INVALID_ARGUMENT")),
        (
            "POST",
            "/topics/t-{s}:publish",
            b'{"messages": [{"data": "aGk=",}]}',
            (400, "INVALID_ARGUMENT"),
        ),
        ("POST", "/topics/t-{s}:publish", b"[]", (400, "INVALID_ARGUMENT")),
        ("POST", "/topics/t-{s}:publish", b"\xff\xfe\x00", (400, "INVALID_ARGUMENT")),
        (
            "POST",
            "/topics/t-{s}:publish",
            b'{"messages": [{"data": "%%%"}]}',
            (400, "INVALID_ARGUMENT"),
        ),
        ("POST", "/topics/t-{s}:publish", b'{"unknownField": 1}', (400, "INVALID_ARGUMENT")),
        (
            "PUT",
            "/subscriptions/s-{s}",
            b'{"ackDeadlineSeconds": "soon"}',
            (400, "INVALID_ARGUMENT"),
        ),
        (
            "PUT",
            "/subscriptions/s-{s}",
            b'{"ackDeadlineSeconds": 1e400}',
            (400, "INVALID_ARGUMENT"),
        ),
        ("PUT", "/topics/a", b"{}", (400, "INVALID_ARGUMENT")),  # the service's name rule
        ("PUT", "/topics/goog-{s}", b"{}", (400, "INVALID_ARGUMENT")),
        ("GET", "/topics/t-{s}", None, (404, "NOT_FOUND")),
        ("POST", "/subscriptions/s-{s}:pull", b'{"maxMessages": 1}', (404, "NOT_FOUND")),
        ("GET", "/topics/t-{s}:publish", None, (404, "NOT_FOUND")),  # POST only
        ("GET", "/queues/q-{s}", None, (404, "NOT_FOUND")),
        ("GET", "/topics?pageSize=abc", None, (400, "INVALID_ARGUMENT")),
        ("GET", "/topics?unknown=1", None, (400, "INVALID_ARGUMENT")),
        ("GET", "/topics/t-{s}:getIamPolicy", None, (404, "NOT_FOUND")),
        ("POST", "/topics/t-{s}:setIamPolicy", b"{}", (404, "NOT_FOUND")),
    ],
)
def test_bad_requests_get_googles_errors(
    server: ServerProcess,
    rest: Rest,
    names: Any,
    verb: str,
    path: str,
    body: bytes | None,
    expected: tuple[int, str],
) -> None:
    status, data = rest.raw(verb, P + path.format(s=names.suffix), body)
    error = json.loads(data)["error"]
    assert (status, error["status"]) == expected and error["code"] == status, error
    assert error["message"]
    assert rest.ok("GET", f"{P}/topics?pageSize=1") is not None  # same connection, still served
    assert server.alive()


def test_pull_max_messages_and_timeout_header(rest: Rest, names: Any) -> None:
    _, sub = _topic_with_subscription(rest, names)
    status, kind, message = rest.error("POST", f"{P}/subscriptions/{sub}:pull", {})
    assert (status, kind) == (400, "INVALID_ARGUMENT") and "max_messages" in message
    # gcloud sends X-Server-Timeout: the Pull answers (empty) before it, not after 60 s.
    started = time.monotonic()
    status, value = rest.call(
        "POST", f"{P}/subscriptions/{sub}:pull", {"maxMessages": 1}, {"X-Server-Timeout": "2"}
    )
    assert status == 200 and value == {} and time.monotonic() - started < 5
    status, _ = rest.call(
        "POST", f"{P}/subscriptions/{sub}:pull", {"maxMessages": 1}, {"X-Server-Timeout": "never"}
    )
    assert status == 400


def test_body_size_limits(server: ServerProcess, rest: Rest, names: Any) -> None:
    topic, _ = _topic_with_subscription(rest, names)
    # Over Google's 10 MB per Publish once decoded: the service's INVALID_ARGUMENT.
    big = {"messages": [{"data": b64(b"x" * (10 * 1000 * 1000 + 1))}]}
    status, kind, _ = rest.error("POST", f"{P}/topics/{topic}:publish", big)
    assert (status, kind) == (400, "INVALID_ARGUMENT")
    # A body over the HTTP port's bound is refused before it is read, and the port serves on.
    with socket.create_connection((server.host, server.http_port), timeout=10) as s:
        s.sendall(
            f"POST {P}/topics/{topic}:publish HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {64 << 20}\r\n\r\n".encode()
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 413 ")
    assert rest.ok("GET", f"{P}/topics/{topic}")["name"].endswith(topic)


def test_keep_alive_serves_many_calls_on_one_connection(rest: Rest, names: Any) -> None:
    topic, sub = _topic_with_subscription(rest, names)
    sock = rest.conn.sock
    for i in range(20):
        rest.ok("POST", f"{P}/topics/{topic}:publish", {"messages": [{"data": b64(b"%d" % i)}]})
    assert rest.conn.sock is sock  # no reconnect: the same TCP connection throughout
    assert len(_pull_until(rest, sub, 20)) == 20


def test_publish_over_rest_receive_over_grpc(rest: Rest, names: Any, grpc_clients: Any) -> None:
    _, sub_client = grpc_clients
    topic, sub = _topic_with_subscription(rest, names)
    sent = {b"rest-%d" % i: {"n": str(i)} for i in range(5)}
    body = {"messages": [{"data": b64(d), "attributes": a} for d, a in sent.items()]}
    ids = rest.ok("POST", f"{P}/topics/{topic}:publish", body)["messageIds"]
    received: dict[bytes, Any] = {}
    done = threading.Event()

    def callback(message: Any) -> None:
        received[message.data] = message
        message.ack()
        if len(received) == len(sent):
            done.set()

    future = sub_client.subscribe(f"projects/{PROJECT}/subscriptions/{sub}", callback)
    try:
        assert done.wait(20), received.keys()
    finally:
        future.cancel()
        future.result(timeout=10)
    assert {d: dict(m.attributes) for d, m in received.items()} == sent
    assert sorted(m.message_id for m in received.values()) == sorted(ids)


def test_publish_over_grpc_receive_over_rest(rest: Rest, names: Any, grpc_clients: Any) -> None:
    pub, sub_client = grpc_clients
    topic, sub = _topic_with_subscription(rest, names)
    full_topic = f"projects/{PROJECT}/topics/{topic}"
    ids = [pub.publish(full_topic, b"grpc-%d" % i, k="v").result(timeout=30) for i in range(5)]
    got = _pull_until(rest, sub, 5)
    assert sorted(m["message"]["messageId"] for m in got) == sorted(ids)
    assert {unb64(m["message"]["data"]) for m in got} == {b"grpc-%d" % i for i in range(5)}
    rest.ok("POST", f"{P}/subscriptions/{sub}:acknowledge", {"ackIds": [m["ackId"] for m in got]})
    # Acked over REST: nothing left for the gRPC client either.
    resp = sub_client.pull(
        request={
            "subscription": f"projects/{PROJECT}/subscriptions/{sub}",
            "max_messages": 10,
            "return_immediately": True,
        },
        timeout=10,
    )
    assert not resp.received_messages


def test_a_rest_pull_whose_client_left_takes_nothing(
    server: ServerProcess, rest: Rest, names: Any, grpc_clients: Any
) -> None:
    """A waiting REST Pull ends when its client closes the connection: a message published
    afterwards goes to the next puller at once, not into a lease nobody holds."""
    pub, sub_client = grpc_clients
    topic, sub = _topic_with_subscription(rest, names, ackDeadlineSeconds=60)
    with socket.create_connection((server.host, server.http_port), timeout=10) as s:
        body = b'{"maxMessages": 10}'
        s.sendall(
            f"POST {P}/subscriptions/{sub}:pull HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\nX-Server-Timeout: 30\r\n\r\n".encode()
            + body
        )
        time.sleep(0.5)  # the Pull is waiting on the server
    time.sleep(0.5)  # and is cancelled when the connection closes
    pub.publish(f"projects/{PROJECT}/topics/{topic}", b"for-the-living").result(timeout=30)
    resp = sub_client.pull(
        request={"subscription": f"projects/{PROJECT}/subscriptions/{sub}", "max_messages": 10},
        timeout=10,
    )
    assert [m.message.data for m in resp.received_messages] == [b"for-the-living"]


def test_the_port_still_serves_health_and_metrics_and_counts_rest(
    server: ServerProcess, rest: Rest, names: Any
) -> None:
    topic, _ = _topic_with_subscription(rest, names)
    rest.ok("POST", f"{P}/topics/{topic}:publish", {"messages": [{"data": b64(b"counted")}]})
    status, body = rest.raw("GET", "/healthz")
    assert (status, body) == (200, b"ok\n")
    assert rest.raw("POST", "/metrics", b"")[0] == 405
    rest.error("GET", f"{P}/topics/never-made")
    rest.error("GET", "/v1/nothing/here")
    status, body = rest.raw("GET", "/metrics")
    assert status == 200 and b"pubsubd_process_info" in body
    text = body.decode()
    assert 'pubsubd_rest_requests_total{code="404",method="GetTopic"}' in text
    assert 'pubsubd_rest_requests_total{code="404",method="_unmatched"}' in text
    assert 'pubsubd_rest_requests_total{code="200",method="Publish"}' in text


async def test_a_pull_response_that_was_not_written_goes_back(
    server: ServerProcess, rest: Rest, names: Any, grpc_clients: Any
) -> None:
    """The REST front's ``unsent`` for a Pull (run when the HTTP write fails) gives the
    messages back at once through the internal GiveBack call, not after their ack deadline."""
    pub, sub_client = grpc_clients
    topic, sub = _topic_with_subscription(rest, names, ackDeadlineSeconds=600)
    pub.publish(f"projects/{PROJECT}/topics/{topic}", b"unsent").result(timeout=30)
    front = RestFront(server.endpoint)
    try:
        body = json.dumps({"maxMessages": 5}).encode()
        request = Request("POST", f"{P}/subscriptions/{sub}:pull", {}, body)
        response = await front.handle(request)
        assert response.status == 200 and response.unsent is not None
        assert len(json.loads(response.body)["receivedMessages"]) == 1
        await response.unsent()
    finally:
        await front.close()
    resp = sub_client.pull(
        request={
            "subscription": f"projects/{PROJECT}/subscriptions/{sub}",
            "max_messages": 5,
            "return_immediately": True,
        },
        timeout=10,
    )
    assert [m.message.data for m in resp.received_messages] == [b"unsent"]


def test_fields_selects_a_partial_response(rest: Rest, names: Any) -> None:
    """The ``fields`` system parameter, as Google's REST APIs apply it; a bad selection is
    refused before the call does anything."""
    topic, sub = _topic_with_subscription(rest, names, labels={"team": "a"})
    got = rest.ok("GET", f"{P}/subscriptions/{sub}?fields=name,labels")
    assert got == {"name": f"projects/{PROJECT}/subscriptions/{sub}", "labels": {"team": "a"}}
    listed = rest.ok("GET", f"{P}/topics?fields=topics/name")
    assert listed["topics"] and all(set(t) == {"name"} for t in listed["topics"])
    body = {"messages": [{"data": b64(b"x"), "attributes": {"k": "v"}}]}
    ids = rest.ok("POST", f"{P}/topics/{topic}:publish?fields=messageIds", body)["messageIds"]

    def pulled() -> list[dict[str, Any]]:
        query = "fields=receivedMessages(ackId,message/data)"
        got = rest.ok(
            "POST",
            f"{P}/subscriptions/{sub}:pull?{query}",
            {"maxMessages": 10, "returnImmediately": True},
        )
        return list(got.get("receivedMessages", []))

    received: list[dict[str, Any]] = []
    wait_for(lambda: bool(received.extend(pulled()) or received), 10, "the message over REST")
    assert len(ids) == 1 and [set(m) for m in received] == [{"ackId", "message"}]
    assert received[0]["message"] == {"data": b64(b"x")}
    status = rest.error("DELETE", f"{P}/topics/{topic}?fields=nosuchfield")
    assert status[:2] == (400, "INVALID_ARGUMENT") and "nosuchfield" in status[2]
    assert rest.ok("GET", f"{P}/topics/{topic}")["name"].endswith(topic)  # still there
