"""IAM with the official client against one real ``pubsubd serve --iam``: policies read, set
(etag compare-and-set) and tested; each of Google's roles allowed what it grants and refused the
rest (PERMISSION_DENIED naming the permission); subscriptions attached to a topic of another
project and dead-letter topics; a REST 403 with Google's error body; policies durable across a
restart and deleted with their resource (a schema's too); the internal
``Forwarder/GiveBack`` on serve's own port checked as the Pull it gives back.

Callers are named by the test-only ``--trust-caller-header`` (``x-pubsubd-caller``), as
authentication will name them from tokens. The policy file makes ``admin@example.com`` admin of
every project and ``dev@example.com`` editor of ``test-project`` (not of ``other-project``).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.api_core import exceptions
from google.pubsub_v1 import types as T

from pubsubd._gen.pubsubd.internal.v1 import forwarder_pb2
from tests.conftest import PROJECT
from tests.support.iam import channel_as, publisher_as, schemas_as, subscriber_as
from tests.support.rest import Rest
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

OTHER = "other-project"
ADMIN = "user:admin@example.com"
DEV = "user:dev@example.com"
POLICY_FILE = {
    "projects": {
        "*": {"bindings": [{"role": "roles/pubsub.admin", "members": [ADMIN]}]},
        PROJECT: {"bindings": [{"role": "roles/pubsub.editor", "members": [DEV]}]},
    }
}
EMPTY_ETAG = b"\x00\x20\x01"  # "ACAB", as Google answers for a resource without a policy


def _start(data_dir: Path) -> ServerProcess:
    policy_file = data_dir.parent / "iam-policy.json"
    policy_file.write_text(json.dumps(POLICY_FILE))
    args = ["--iam", "--iam-policy-file", str(policy_file), "--trust-caller-header"]
    return ServerProcess(data_dir, args=args).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = _start(tmp_path_factory.mktemp("iam") / "data")
    yield srv
    srv.kill()


class Caller:
    """The official publisher and subscriber clients of one principal."""

    def __init__(self, endpoint: str, member: str | None) -> None:
        self.member = member
        self.pub = publisher_as(endpoint, member)
        self.sub = subscriber_as(endpoint, member)

    def close(self) -> None:
        self.sub.close()


@pytest.fixture(scope="module")
def callers(server: ServerProcess) -> Iterator[Callable[[str | None], Caller]]:
    made: dict[str | None, Caller] = {}

    def caller(member: str | None) -> Caller:
        if member not in made:
            made[member] = Caller(server.endpoint, member)
        return made[member]

    yield caller
    for c in made.values():
        c.close()


@pytest.fixture
def admin(callers: Callable[[str | None], Caller]) -> Caller:
    return callers(ADMIN)


def _denied(call: Callable[[], Any], permission: str) -> None:
    with pytest.raises(exceptions.PermissionDenied) as info:
        call()
    assert permission in str(info.value), info.value


def _grant(admin: Caller, resource: str, role: str, *members: str) -> Any:
    iam = admin.sub if "/subscriptions/" in resource or "/snapshots/" in resource else admin.pub
    policy = iam.get_iam_policy(request={"resource": resource})
    policy.bindings.add(role=role, members=list(members))
    return iam.set_iam_policy(request={"resource": resource, "policy": policy})


def test_iam_policies_are_read_set_with_an_etag_and_tested(
    admin: Caller, names: Any, callers: Any
) -> None:
    topic = names.topic()
    admin.pub.create_topic(name=topic)
    empty = admin.pub.get_iam_policy(request={"resource": topic})
    assert empty.etag == EMPTY_ETAG and list(empty.bindings) == []
    alice = "user:alice@example.com"
    empty.bindings.add(role="roles/pubsub.publisher", members=[alice])
    set_ = admin.pub.set_iam_policy(request={"resource": topic, "policy": empty})
    assert set_.etag != EMPTY_ETAG
    got = admin.pub.get_iam_policy(request={"resource": topic})
    assert got == set_ and [(b.role, list(b.members)) for b in got.bindings] == [
        ("roles/pubsub.publisher", [alice])
    ]
    with pytest.raises(exceptions.Aborted, match="concurrent policy changes"):
        admin.pub.set_iam_policy(request={"resource": topic, "policy": empty})  # stale etag
    with pytest.raises(exceptions.InvalidArgument, match="not a role"):
        bad = got.__class__(bindings=[{"role": "roles/pubsub.emperor", "members": [alice]}])
        admin.pub.set_iam_policy(request={"resource": topic, "policy": bad})
    asked = ["pubsub.topics.publish", "pubsub.topics.delete"]
    held = callers(alice).pub.test_iam_permissions(
        request={"resource": topic, "permissions": asked}
    )
    assert list(held.permissions) == ["pubsub.topics.publish"]
    nobody = callers(None).pub.test_iam_permissions(
        request={"resource": topic, "permissions": asked}
    )
    assert list(nobody.permissions) == []
    with pytest.raises(exceptions.NotFound):
        admin.pub.get_iam_policy(request={"resource": names.topic("missing")})


# Each role, on the topic and subscription of one test: what it may do and what it may not.
OPERATIONS = [
    "get_topic",
    "publish",
    "pull",
    "get_subscription",
    "get_policy",
    "delete_subscription",
]
ALLOWED = {
    "roles/pubsub.publisher": {"publish"},
    "roles/pubsub.subscriber": {"pull"},
    "roles/pubsub.viewer": {"get_topic", "get_subscription"},
    "roles/pubsub.editor": {
        "get_topic",
        "publish",
        "pull",
        "get_subscription",
        "delete_subscription",
    },
    "roles/pubsub.admin": set(OPERATIONS),
}
PERMISSION = {
    "get_topic": "pubsub.topics.get",
    "publish": "pubsub.topics.publish",
    "pull": "pubsub.subscriptions.consume",
    "get_subscription": "pubsub.subscriptions.get",
    "delete_subscription": "pubsub.subscriptions.delete",
    "get_policy": "pubsub.subscriptions.getIamPolicy",
}


@pytest.mark.parametrize("role", list(ALLOWED))
def test_each_role_allows_what_it_grants_and_refuses_the_rest(
    role: str, admin: Caller, callers: Any, names: Any
) -> None:
    topic, sub = names.topic(), names.subscription()
    admin.pub.create_topic(name=topic)
    admin.sub.create_subscription(name=sub, topic=topic)
    member = f"serviceAccount:{role.split('.')[-1]}-{names.suffix}@example.com"
    _grant(admin, topic, role, member)
    _grant(admin, sub, role, member)
    me = callers(member)
    admin.pub.publish(topic, b"for the pull").result(timeout=30)
    calls: dict[str, Callable[[], Any]] = {
        "get_topic": lambda: me.pub.get_topic(topic=topic),
        "publish": lambda: me.pub.publish(topic, b"x").result(timeout=30),
        "pull": lambda: me.sub.pull(subscription=sub, max_messages=1, timeout=30),
        "get_subscription": lambda: me.sub.get_subscription(subscription=sub),
        "get_policy": lambda: me.sub.get_iam_policy(request={"resource": sub}),
        "delete_subscription": lambda: me.sub.delete_subscription(subscription=sub),
    }
    for op in OPERATIONS:  # the delete last: it takes the subscription's policy with it
        if op in ALLOWED[role]:
            calls[op]()
        else:
            _denied(calls[op], PERMISSION[op])
    # Nothing on another topic, nor anything on the project.
    _denied(lambda: me.pub.publish(names.topic("elsewhere"), b"x").result(timeout=30), "publish")


def test_anonymous_callers_and_lists_check_the_project(
    admin: Caller, callers: Any, names: Any
) -> None:
    topic = names.topic()
    admin.pub.create_topic(name=topic)
    anonymous = callers(None)
    _denied(lambda: anonymous.pub.get_topic(topic=topic), "pubsub.topics.get")
    _denied(
        lambda: list(anonymous.pub.list_topics(project=f"projects/{PROJECT}")), "pubsub.topics.list"
    )
    _grant(admin, topic, "roles/pubsub.viewer", "allUsers")
    assert anonymous.pub.get_topic(topic=topic).name == topic
    # A project-level grant lists everything (lists filter nothing).
    dev = callers(DEV)
    assert topic in {t.name for t in dev.pub.list_topics(project=f"projects/{PROJECT}")}
    _denied(lambda: list(dev.pub.list_topics(project=f"projects/{OTHER}")), "pubsub.topics.list")
    # Streaming pull is refused on its first request.
    sub = names.subscription()
    admin.sub.create_subscription(name=sub, topic=topic)
    future = anonymous.sub.subscribe(sub, lambda m: m.ack())
    with pytest.raises(exceptions.PermissionDenied, match=r"pubsub\.subscriptions\.consume"):
        future.result(timeout=30)


def test_attaching_to_another_projects_topic_and_dead_letter_topics_need_grants_there(
    admin: Caller, callers: Any, names: Any
) -> None:
    foreign = f"projects/{OTHER}/topics/shared-{names.suffix}"
    dead = f"projects/{OTHER}/topics/dead-{names.suffix}"
    admin.pub.create_topic(name=foreign)
    admin.pub.create_topic(name=dead)
    dev = callers(DEV)
    local = names.topic()
    dev.pub.create_topic(name=local)  # editor of its own project
    sub = names.subscription()
    _denied(
        lambda: dev.sub.create_subscription(name=sub, topic=foreign),
        "pubsub.topics.attachSubscription",
    )
    _grant(admin, foreign, "roles/pubsub.subscriber", DEV)
    dev.sub.create_subscription(name=sub, topic=foreign)
    dead_letter = {"dead_letter_topic": dead, "max_delivery_attempts": 5}
    with_dead_letter = names.subscription("dl")
    request = {"name": with_dead_letter, "topic": local, "dead_letter_policy": dead_letter}
    _denied(lambda: dev.sub.create_subscription(request=request), "pubsub.topics.publish")
    _grant(admin, dead, "roles/pubsub.publisher", DEV)
    dev.sub.create_subscription(request=request)


def test_rest_calls_are_refused_with_googles_403_body(
    admin: Caller, server: ServerProcess, names: Any
) -> None:
    topic = names.topic()
    admin.pub.create_topic(name=topic)
    rest = Rest(server.host, server.http_port)
    try:
        path = f"/v1/{topic}:publish"
        body = {"messages": [{"data": base64.b64encode(b"x").decode()}]}
        status, value = rest.call("POST", path, body, {"x-pubsubd-caller": "carol@example.com"})
        assert status == 403, value
        assert value["error"]["status"] == "PERMISSION_DENIED"
        assert value["error"]["code"] == 403
        assert "pubsub.topics.publish" in value["error"]["message"]
        assert "user:carol@example.com" in value["error"]["message"]
        status, policy = rest.call(
            "GET", f"/v1/{topic}:getIamPolicy", None, {"x-pubsubd-caller": ADMIN}
        )
        assert status == 200 and policy["etag"] == base64.b64encode(EMPTY_ETAG).decode()
    finally:
        rest.close()


def test_give_back_on_serves_port_needs_consume_on_its_subscription(
    server: ServerProcess, admin: Caller, names: Any
) -> None:
    """pubsubd.internal.v1.Forwarder/GiveBack (how the REST front and a frontend hand back a
    Pull response they could not send) is served on serve's own port: it is checked as the
    Pull was, ``subscriptions.consume`` on its subscription."""
    topic, subscription = names.topic(), names.subscription()
    admin.pub.create_topic(name=topic)
    admin.sub.create_subscription(name=subscription, topic=topic)
    viewer = "user:viewer@example.com"
    _grant(admin, subscription, "roles/pubsub.viewer", viewer)
    admin.pub.publish(topic, b"x").result(timeout=30)
    dev = subscriber_as(server.endpoint, DEV)
    pulled = dev.pull(request={"subscription": subscription, "max_messages": 1}, timeout=30)
    [message] = pulled.received_messages

    def give_back(member: str | None) -> Any:
        request = forwarder_pb2.GiveBackRequest(
            protocol_version=1, subscription=subscription, ack_ids=[message.ack_id]
        )
        call = channel_as(server.endpoint, member).unary_unary(
            "/pubsubd.internal.v1.Forwarder/GiveBack",
            request_serializer=forwarder_pb2.GiveBackRequest.SerializeToString,
            response_deserializer=forwarder_pb2.GiveBackResponse.FromString,
        )
        return call(request, timeout=10)

    for member in (None, viewer):
        with pytest.raises(grpc.RpcError) as info:
            give_back(member)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, member
        assert "pubsub.subscriptions.consume" in str(info.value.details())
    assert give_back(DEV).given_back == 1  # the project's editor may: the lease ends
    again = dev.pull(request={"subscription": subscription, "max_messages": 1}, timeout=30)
    assert [m.message.data for m in again.received_messages] == [b"x"]
    dev.close()


def test_a_deleted_schema_takes_its_policy_with_it(server: ServerProcess, names: Any) -> None:
    schemas = schemas_as(server.endpoint, ADMIN)
    sid = f"gone-{names.suffix}"
    name = f"projects/{PROJECT}/schemas/{sid}"
    definition = {"type_": T.Schema.Type.AVRO, "definition": '"string"'}

    def create() -> None:
        schemas.create_schema(parent=f"projects/{PROJECT}", schema=definition, schema_id=sid)

    create()
    policy = schemas.get_iam_policy(request={"resource": name})
    reader = "user:schema-reader@example.com"
    policy.bindings.add(role="roles/pubsub.viewer", members=[reader])
    schemas.set_iam_policy(request={"resource": name, "policy": policy})
    as_reader = schemas_as(server.endpoint, reader)
    assert as_reader.get_schema(name=name).name == name
    schemas.delete_schema(name=name)
    create()  # a schema of the same name starts without the old grants
    assert schemas.get_iam_policy(request={"resource": name}).etag == EMPTY_ETAG
    _denied(lambda: as_reader.get_schema(name=name), "pubsub.schemas.get")


def test_policies_are_durable_and_deleted_with_their_resource(tmp_path: Path, names: Any) -> None:
    server = _start(tmp_path / "data")
    try:
        admin = Caller(server.endpoint, ADMIN)
        topic, gone = names.topic(), names.topic("gone")
        for t in (topic, gone):
            admin.pub.create_topic(name=t)
            _grant(admin, t, "roles/pubsub.publisher", "user:alice@example.com")
        admin.pub.delete_topic(topic=gone)
        admin.pub.create_topic(name=gone)  # a new topic of the same name: no policy
        before = admin.pub.get_iam_policy(request={"resource": topic})
        admin.close()
        server.stop()
        server.start()
        admin = Caller(server.endpoint, ADMIN)
        assert admin.pub.get_iam_policy(request={"resource": topic}) == before
        assert admin.pub.get_iam_policy(request={"resource": gone}).etag == EMPTY_ETAG
        alice = Caller(server.endpoint, "user:alice@example.com")
        alice.pub.publish(topic, b"x").result(timeout=30)
        _denied(lambda: alice.pub.publish(gone, b"x").result(timeout=30), "publish")
        alice.close()
        admin.close()
    finally:
        server.kill()


def test_without_iam_every_call_is_allowed_and_policies_still_work(
    tmp_path: Path, names: Any
) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        anyone = Caller(server.endpoint, None)
        topic = names.topic()
        anyone.pub.create_topic(name=topic)
        policy = anyone.pub.get_iam_policy(request={"resource": topic})
        policy.bindings.add(role="roles/pubsub.viewer", members=["allUsers"])
        anyone.pub.set_iam_policy(request={"resource": topic, "policy": policy})
        asked = ["pubsub.topics.publish", "pubsub.topics.delete"]
        held = anyone.pub.test_iam_permissions(request={"resource": topic, "permissions": asked})
        assert list(held.permissions) == asked
        anyone.pub.publish(topic, b"x").result(timeout=30)
        anyone.close()
    finally:
        server.kill()


def test_a_bad_policy_file_stops_the_server_before_it_starts(tmp_path: Path) -> None:
    bad = tmp_path / "policy.json"
    bad.write_text(json.dumps({"projects": {"p": {"bindings": [{"role": "roles/pubsub.king"}]}}}))
    done = subprocess.run(
        [sys.executable, "-m", "pubsubd", "serve", "--port", "0", "--http-port", "-1",
         "--pulsar-port", "-1", "--data-dir", str(tmp_path / "d"), "--iam",
         "--iam-policy-file", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "roles/pubsub.king" in done.stderr and "is not one of" in done.stderr
