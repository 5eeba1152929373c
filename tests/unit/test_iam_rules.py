"""IAM rules (core/iam.py, core/iam_calls.py) and policies as metadata (control/policies.py):
Google's roles, member matching, project and resource grants, what each RPC needs, and
SetIamPolicy's etag compare-and-set, update mask and validation."""

from __future__ import annotations

from typing import Any

import pytest

from pubsubd._gen.pubsubd.internal.v1 import forwarder_pb2
from pubsubd._gen.pubsubd.v1 import admin_pb2, replay_pb2
from pubsubd.api.rest import routes as rest_routes
from pubsubd.control.policies import PolicyFileError, ResourcePolicies, parse_policy_file
from pubsubd.core import iam, iam_calls, pb
from pubsubd.core.errors import InvalidArgument, PermissionDenied
from pubsubd.core.iam import CompiledPolicy, Policies, Requirement
from pubsubd.core.principal import ANONYMOUS, Principal
from pubsubd.storage.metadata import (
    MemoryMetadataStore,
    SchemaRecord,
    SubscriptionRecord,
    TopicRecord,
)

pytestmark = pytest.mark.unit

ALICE = Principal("user:alice@example.com")
BOB = Principal("serviceAccount:bob@proj.iam.gserviceaccount.com")
TOPIC = "projects/p/topics/t"
SUB = "projects/p/subscriptions/s"


# --- roles and members ---------------------------------------------------------------------------


def test_roles_hold_googles_permissions() -> None:
    roles = iam.ROLES
    assert roles["roles/pubsub.publisher"] == {"pubsub.topics.publish"}
    assert roles["roles/pubsub.subscriber"] == {
        "pubsub.subscriptions.consume",
        "pubsub.topics.attachSubscription",
        "pubsub.snapshots.seek",
    }
    viewer = roles["roles/pubsub.viewer"]
    assert "pubsub.topics.get" in viewer and "pubsub.subscriptions.list" in viewer
    assert not any(p.endswith((".publish", ".consume", ".create", ".delete")) for p in viewer)
    editor = roles["roles/pubsub.editor"]
    assert {"pubsub.topics.create", "pubsub.topics.publish", "pubsub.subscriptions.consume"} <= (
        editor
    )
    assert "pubsub.topics.setIamPolicy" not in editor
    assert roles["roles/pubsub.admin"] == iam.PERMISSIONS
    assert editor < roles["roles/pubsub.admin"]
    assert all(p in iam.PERMISSIONS for perms in roles.values() for p in perms)


@pytest.mark.parametrize(
    ("member", "principal", "expected"),
    [
        ("allUsers", ANONYMOUS, True),
        ("allUsers", ALICE, True),
        ("allAuthenticatedUsers", ANONYMOUS, False),
        ("allAuthenticatedUsers", ALICE, True),
        ("user:alice@example.com", ALICE, True),
        ("user:alice@example.com", BOB, False),
        ("domain:example.com", ALICE, True),
        ("domain:example.com", BOB, False),
        ("domain:ample.com", ALICE, False),
    ],
)
def test_members_match_principals(member: str, principal: Principal, expected: bool) -> None:
    assert iam.matches(member, principal) is expected


def test_a_resource_policy_or_its_projects_grants_and_nothing_else() -> None:
    policies = Policies(
        projects={
            "p": CompiledPolicy.of([("roles/pubsub.viewer", ["user:alice@example.com"])]),
            "*": CompiledPolicy.of([("roles/pubsub.admin", ["user:root@example.com"])]),
        },
        resources={TOPIC: CompiledPolicy.of([("roles/pubsub.publisher", [BOB.member])])},
    )
    assert policies.allows(BOB, "pubsub.topics.publish", TOPIC)
    assert not policies.allows(BOB, "pubsub.topics.publish", "projects/p/topics/other")
    assert not policies.allows(BOB, "pubsub.topics.get", TOPIC)
    assert policies.allows(ALICE, "pubsub.topics.get", TOPIC)  # project grant
    assert not policies.allows(ALICE, "pubsub.topics.get", "projects/q/topics/t")
    assert not policies.allows(ALICE, "pubsub.topics.publish", TOPIC)
    root = Principal("user:root@example.com")
    assert policies.allows(root, "pubsub.topics.delete", "projects/q/topics/t")  # every project
    assert policies.allows(root, "pubsub.topics.update", iam_calls.EVERY_PROJECT)
    assert not policies.allows(ALICE, "pubsub.topics.get", iam_calls.EVERY_PROJECT)
    with pytest.raises(PermissionDenied, match=r"pubsub\.topics\.publish.*projects/p/topics/t"):
        policies.check(ALICE, [Requirement("pubsub.topics.publish", TOPIC)])
    empty = Policies({}, {})
    assert not empty.allows(ANONYMOUS, "pubsub.topics.get", TOPIC)


# --- what each call needs ------------------------------------------------------------------------


def _needs(method: str, request: Any) -> list[tuple[str, str]]:
    found = iam_calls.requirements(method, request.SerializeToString())
    return [(r.permission, r.resource) for r in found]


P = iam_calls.PUBLISHER
S = iam_calls.SUBSCRIBER


def test_calls_need_googles_permissions_on_the_named_resources() -> None:
    assert _needs(P + "Publish", pb.PublishRequest(topic=TOPIC, messages=[{"data": b"x"}])) == [
        ("pubsub.topics.publish", TOPIC)
    ]
    assert _needs(P + "CreateTopic", pb.Topic(name=TOPIC)) == [
        ("pubsub.topics.create", "projects/p")
    ]
    assert _needs(P + "ListTopics", pb.ListTopicsRequest(project="projects/p")) == [
        ("pubsub.topics.list", "projects/p")
    ]
    assert _needs(S + "Pull", pb.PullRequest(subscription=SUB, max_messages=1)) == [
        ("pubsub.subscriptions.consume", SUB)
    ]
    assert _needs(S + "StreamingPull", pb.StreamingPullRequest(subscription=SUB)) == [
        ("pubsub.subscriptions.consume", SUB)
    ]
    assert _needs(
        S + "Seek", pb.SeekRequest(subscription=SUB, snapshot="projects/p/snapshots/n")
    ) == [
        ("pubsub.subscriptions.consume", SUB),
        ("pubsub.snapshots.seek", "projects/p/snapshots/n"),
    ]
    assert _needs(
        S + "CreateSnapshot",
        pb.CreateSnapshotRequest(name="projects/q/snapshots/n", subscription=SUB),
    ) == [("pubsub.snapshots.create", "projects/q"), ("pubsub.subscriptions.consume", SUB)]
    iam_get = iam_calls.IAM + "GetIamPolicy"
    assert _needs(iam_get, pb.GetIamPolicyRequest(resource=SUB)) == [
        ("pubsub.subscriptions.getIamPolicy", SUB)
    ]
    assert _needs(iam_calls.IAM + "TestIamPermissions", pb.TestIamPermissionsRequest()) == []
    assert _needs(iam_calls.REPLAY + "Read", replay_pb2.ReadRequest(topic=TOPIC)) == [
        ("pubsub.topics.attachSubscription", TOPIC)
    ]
    assert _needs(iam_calls.ADMIN + "ListDamagedRanges", admin_pb2.ListDamagedRangesRequest()) == [
        ("pubsub.topics.get", "projects/*")
    ]


def test_create_subscription_needs_attach_on_the_topic_and_publish_on_the_dead_letter_topic() -> (
    None
):
    request = pb.Subscription(
        name="projects/a/subscriptions/s",
        topic="projects/b/topics/t",
        dead_letter_policy={"dead_letter_topic": "projects/c/topics/dl"},
    )
    assert _needs(S + "CreateSubscription", request) == [
        ("pubsub.subscriptions.create", "projects/a"),
        ("pubsub.topics.attachSubscription", "projects/b/topics/t"),
        ("pubsub.topics.publish", "projects/c/topics/dl"),
    ]
    update = pb.UpdateSubscriptionRequest(subscription=request, update_mask={"paths": ["labels"]})
    assert _needs(S + "UpdateSubscription", update) == [
        ("pubsub.subscriptions.update", "projects/a/subscriptions/s")
    ]
    update.update_mask.paths[:] = ["dead_letter_policy"]
    assert _needs(S + "UpdateSubscription", update)[1] == (
        "pubsub.topics.publish",
        "projects/c/topics/dl",
    )


def test_a_repeated_name_field_is_checked_as_the_server_reads_it() -> None:
    """Protobuf keeps the last value of a repeated singular field: so does the check, or a
    request could be authorized on one topic and publish to another."""
    allowed = pb.PublishRequest(topic="projects/p/topics/allowed").SerializeToString()
    other = pb.PublishRequest(topic="projects/p/topics/other", messages=[{"data": b"x"}])
    raw = allowed + other.SerializeToString()
    assert pb.PublishRequest.FromString(raw).topic == "projects/p/topics/other"
    needs = iam_calls.requirements(P + "Publish", raw)
    assert [r.resource for r in needs] == ["projects/p/topics/other"]


def test_malformed_names_and_bytes_are_invalid_arguments() -> None:
    with pytest.raises(InvalidArgument, match="not a topic name"):
        _needs(P + "Publish", pb.PublishRequest(topic="projects/p/subscriptions/s"))
    with pytest.raises(InvalidArgument, match="not a topic name"):
        _needs(P + "Publish", pb.PublishRequest())
    with pytest.raises(InvalidArgument):
        iam_calls.requirements(P + "Publish", b"\x0a\x10abc")  # length past the end
    with pytest.raises(InvalidArgument, match="not a topic, subscription"):
        _needs(iam_calls.IAM + "GetIamPolicy", pb.GetIamPolicyRequest(resource="projects/p"))


def test_every_method_of_the_checked_services_has_a_rule() -> None:
    # Every method of Google's REST rules (Publisher, Subscriber, SchemaService, IAMPolicy),
    # StreamingPull, and our replay and admin APIs.
    methods = [rule.method for rule in rest_routes.RULES] + [S + "StreamingPull"]
    methods += [
        f"/pubsubd.v1.{s.name}/{m.name}"
        for module in (admin_pb2, replay_pb2)
        for s in module.DESCRIPTOR.services_by_name.values()
        for m in s.methods
    ]
    assert len(methods) > 45
    missing = [m for m in methods if m not in iam_calls.RULES]
    assert missing == []
    assert iam_calls.checked(P + "Publish")
    assert iam_calls.checked("/pubsubd.internal.v1.Forwarder/GiveBack")  # field 2, as Pull
    assert not iam_calls.checked("/pubsubd.internal.v1.Forwarder/Identify")
    assert not iam_calls.checked("/pubsubd.internal.v1.Sources/Tail")
    unknown = iam_calls.requirements(P + "NoSuchMethod", b"")
    with pytest.raises(PermissionDenied):
        Policies({"*": CompiledPolicy.of([("roles/owner", ["allUsers"])])}, {}).check(
            ALICE, unknown
        )


def test_give_back_needs_consume_on_its_subscription_as_pull() -> None:
    """An unsent Pull response given back (the REST front, a frontend: with the client's
    metadata) is checked as the Pull was: ``subscriptions.consume`` on field 2's subscription,
    whoever holds only the viewer role is refused, and a malformed name is INVALID_ARGUMENT."""
    give_back = "/pubsubd.internal.v1.Forwarder/GiveBack"
    request = forwarder_pb2.GiveBackRequest(protocol_version=1, subscription=SUB, ack_ids=["a"])
    needs = iam_calls.requirements(give_back, request.SerializeToString())
    assert needs == [Requirement("pubsub.subscriptions.consume", SUB)]
    assert needs == iam_calls.requirements(
        S + "Pull", pb.PullRequest(subscription=SUB).SerializeToString()
    )
    decisions = Policies(
        {"p": CompiledPolicy.of([("roles/pubsub.subscriber", [ALICE.member]),
                                 ("roles/pubsub.viewer", [BOB.member])])},
        {},
    )  # fmt: skip
    decisions.check(ALICE, needs)
    with pytest.raises(PermissionDenied):
        decisions.check(BOB, needs)
    bad = forwarder_pb2.GiveBackRequest(subscription="projects/p/topics/t")
    with pytest.raises(InvalidArgument):
        iam_calls.requirements(give_back, bad.SerializeToString())


# --- policies as metadata ------------------------------------------------------------------------


def _policy(*bindings: tuple[str, list[str]], etag: bytes = b"") -> Any:
    return pb.Policy(bindings=[{"role": r, "members": m} for r, m in bindings], etag=etag)


def test_set_policy_is_a_compare_and_set_on_the_etag() -> None:
    store = MemoryMetadataStore()
    policies = ResourcePolicies(store)
    empty = policies.get(TOPIC)
    assert empty.etag == iam.EMPTY_ETAG and not empty.bindings and empty.version == 1
    first = policies.set(
        TOPIC, _policy(("roles/pubsub.publisher", [ALICE.member]), etag=empty.etag)
    )
    assert first.etag != empty.etag
    assert policies.decisions.allows(ALICE, "pubsub.topics.publish", TOPIC)
    with pytest.raises(iam.PolicyConflict):
        policies.set(TOPIC, _policy(etag=empty.etag))  # stale
    # The same content again still gets a new etag (an old etag never becomes current again).
    second = policies.set(TOPIC, _policy(("roles/pubsub.publisher", [ALICE.member])))
    assert second.etag not in (first.etag, empty.etag)
    # Another view of the same store (another process) loads it.
    again = ResourcePolicies(store)
    assert again.get(TOPIC) == second
    assert again.decisions.allows(ALICE, "pubsub.topics.publish", TOPIC)


def test_set_policy_masks_and_refuses_what_it_does_not_apply() -> None:
    policies = ResourcePolicies(MemoryMetadataStore())
    policies.set(TOPIC, _policy(("roles/pubsub.viewer", [ALICE.member])))
    kept = policies.set(TOPIC, _policy(("roles/pubsub.admin", [BOB.member])), ["etag"])
    assert [b.role for b in kept.bindings] == ["roles/pubsub.viewer"]
    with pytest.raises(InvalidArgument, match="not a role"):
        policies.set(TOPIC, _policy(("roles/pubsub.emperor", [ALICE.member])))
    with pytest.raises(InvalidArgument, match="not a member"):
        policies.set(TOPIC, _policy(("roles/pubsub.viewer", ["alice"])))
    with pytest.raises(InvalidArgument, match="update_mask"):
        policies.set(TOPIC, _policy(), ["audit_configs"])
    conditional = pb.Policy(
        bindings=[
            {
                "role": "roles/pubsub.viewer",
                "members": ["allUsers"],
                "condition": {"expression": "true"},
            }
        ]
    )
    with pytest.raises(InvalidArgument, match="condition"):
        policies.set(TOPIC, conditional)
    assert [b.role for b in policies.get(TOPIC).bindings] == ["roles/pubsub.viewer"]


def test_test_permissions_answers_the_held_subset_and_refuses_foreign_ones() -> None:
    policies = ResourcePolicies(MemoryMetadataStore())
    policies.set(SUB, _policy(("roles/pubsub.subscriber", [ALICE.member])))
    asked = ["pubsub.subscriptions.consume", "pubsub.subscriptions.delete"]
    assert policies.test(ALICE, SUB, asked) == ["pubsub.subscriptions.consume"]
    assert policies.test(BOB, SUB, asked) == []
    assert policies.test(BOB, SUB, asked, everything=True) == asked
    with pytest.raises(InvalidArgument, match=r"pubsub\.topics\.publish"):
        policies.test(ALICE, SUB, ["pubsub.topics.publish"])


def test_a_deleted_resource_takes_its_policy_with_it() -> None:
    store = MemoryMetadataStore()
    policies = ResourcePolicies(store)
    store.put_topic(TopicRecord(TOPIC, "uid-1", b""))
    store.put_subscription(SubscriptionRecord(SUB, "uid-2", "uid-1", b""))
    policies.set(TOPIC, _policy(("roles/pubsub.viewer", [ALICE.member])))
    policies.set(SUB, _policy(("roles/pubsub.viewer", [ALICE.member])))
    store.delete_topic(TOPIC)
    assert TOPIC not in store.policies and policies.get(TOPIC).etag == iam.EMPTY_ETAG
    assert SUB in store.policies


def test_a_deleted_schema_takes_its_policy_with_it() -> None:
    """A schema re-created under the same name starts without the old one's grants."""
    store = MemoryMetadataStore()
    policies = ResourcePolicies(store)
    schema, other = "projects/p/schemas/s", "projects/p/schemas/other"
    store.put_schema(SchemaRecord(schema, b""), create=True)
    store.put_schema(SchemaRecord(other, b""), create=True)
    policies.set(schema, _policy(("roles/pubsub.viewer", [ALICE.member])))
    policies.set(other, _policy(("roles/pubsub.viewer", [ALICE.member])))
    store.delete_schema(schema)
    assert schema not in store.policies and policies.get(schema).etag == iam.EMPTY_ETAG
    assert other in store.policies
    store.put_schema(SchemaRecord(schema, b""), create=True)
    assert policies.test(ALICE, schema, ["pubsub.schemas.get"]) == []


def test_the_policy_file_names_projects_roles_and_members() -> None:
    compiled = parse_policy_file(
        '{"projects": {"p": {"bindings": [{"role": "roles/pubsub.admin", '
        '"members": ["user:alice@example.com"]}]}, "*": {"bindings": []}}}'
    )
    assert set(compiled) == {"p", "*"}
    assert compiled["p"].allows(ALICE, "pubsub.topics.setIamPolicy")
    for bad, why in [
        ("{", "not JSON"),
        ('{"p": {}}', "expected"),
        ('{"projects": {"p": {"bindings": [{"role": "roles/x", "members": []}]}}}', "role"),
        ('{"projects": {"p": {"bindings": [{"role": "roles/owner", "members": "a"}]}}}', "members"),
    ]:
        with pytest.raises(PolicyFileError, match=why):
            parse_policy_file(bad)
