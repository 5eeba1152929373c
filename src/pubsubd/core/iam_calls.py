"""Which permissions each RPC needs, on which resources (pure; Google's table, plus ours).

``requirements(method, raw)`` reads the request's wire bytes and answers the
:class:`~pubsubd.core.iam.Requirement` list of the call; :mod:`pubsubd.core.iam` decides. Most
calls name their resource in field 1 and need one permission on it: field 1 is read by parsing
the bytes as a one-field message (the payload of a Publish stays undecoded bytes). The others
are parsed as their request type.

Google's access-control table (https://cloud.google.com/pubsub/docs/access-control), and where
we differ or extend it:

* CreateTopic: ``topics.create`` on the project; with ``schema_settings``, ``schemas.attach`` on
  the schema. CreateSubscription: ``subscriptions.create`` on the subscription's project and
  ``topics.attachSubscription`` on the topic (which may be in another project). Our rule: a
  ``dead_letter_policy`` (in CreateSubscription, or UpdateSubscription's mask) needs
  ``topics.publish`` on the dead-letter topic *for the caller* (Google grants it to its service
  agent instead; we have none, and without the rule a caller could make us publish where it
  may not).
* CreateSnapshot: ``snapshots.create`` on the project and ``subscriptions.consume`` on the
  subscription. Seek: ``subscriptions.consume`` and, to a snapshot, ``snapshots.seek`` on it.
* DetachSubscription: ``topics.detachSubscription`` on the *subscription's project* (Google
  checks it on the topic; the request names only the subscription).
* Lists need the list permission on the project and filter nothing; ListTopicSubscriptions and
  ListTopicSnapshots need ``topics.get`` on the topic.
* DeleteSchemaRevision: ``schemas.delete`` (our choice).
* IAM: Get/SetIamPolicy need ``<kind>.getIamPolicy`` / ``setIamPolicy`` on the resource;
  TestIamPermissions needs nothing (it answers what the caller holds).
* pubsubd.v1.Replay: reading messages or moving a named cursor (Read, CommitCursor,
  DeleteCursor) is ``topics.attachSubscription`` on the topic (the subscriber role's right to
  read a topic), PublishDeduplicated ``topics.publish``, SeekOffsets (the Pulsar front's seek
  by message ID) ``subscriptions.consume`` on the subscription, as Seek; the rest
  ``topics.get``.
* pubsubd.v1.Admin: SkipDamagedRanges ``topics.update`` on the topic, ListDamagedRanges
  ``topics.get`` on it; the routing constraints (the whole cluster) ``topics.get`` /
  ``topics.update`` on ``projects/*``, which only the policy file's ``"*"`` entry grants.
* Internal services (``pubsubd.internal.v1``: forwarders' and storage nodes' own calls) are not
  checked: they belong to the cluster's network, which TLS protects (issue 14 part 1); with
  authentication on they need a valid token (the internal token, ``core/internal_token.py``).
  One exception: ``Forwarder/GiveBack`` (a Pull response that never reached its client goes
  back for redelivery) is made with the client's own metadata by the REST front and the
  frontends, and is reachable on ``serve``'s port: it needs ``subscriptions.consume`` on its
  subscription (field 2), as Pull.
* A method of a checked service that this table does not list is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from pubsubd.core import pb
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.iam import PREFIX, Requirement, project, resource_kind

__all__ = ["CHECKED_SERVICES", "RULES", "requirements"]

PUBLISHER = "/google.pubsub.v1.Publisher/"
SUBSCRIBER = "/google.pubsub.v1.Subscriber/"
SCHEMAS = "/google.pubsub.v1.SchemaService/"
IAM = "/google.iam.v1.IAMPolicy/"
REPLAY = "/pubsubd.v1.Replay/"
ADMIN = "/pubsubd.v1.Admin/"
CHECKED_SERVICES = (PUBLISHER, SUBSCRIBER, SCHEMAS, IAM, REPLAY, ADMIN)
GIVE_BACK = "/pubsubd.internal.v1.Forwarder/GiveBack"  # the one checked internal method
EVERY_PROJECT = "projects/*"  # the cluster itself: granted by the policy file's "*" entry


def _one_field_message(number: int) -> Any:
    """A message class with only ``string name = number``: parsing a request with it reads field 1
    with protobuf's own (C) parser, the last value winning as for the real request, and keeps
    the rest as unknown bytes without decoding them (25 times faster than a Python scan of a
    100-message Publish)."""
    pool = descriptor_pool.DescriptorPool()
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"pubsubd_iam_field{number}.proto", package="pubsubd.iam", syntax="proto3"
    )
    message = proto.message_type.add(name=f"Field{number}")
    message.field.add(
        name="name",
        number=number,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"pubsubd.iam.Field{number}"))


_FIELDS: dict[int, Any] = {1: _one_field_message(1), 2: _one_field_message(2)}


def field1(data: bytes, number: int = 1) -> str:
    """A serialized request's string field 1 (or ``number``: 2) (``""`` if absent);
    InvalidArgument for bytes that do not parse or a name that is not UTF-8."""
    try:
        name: str = _FIELDS[number].FromString(data).name
    except DecodeError:
        raise InvalidArgument("request: not a valid protocol buffer") from None
    return name


def _named(name: str, kind: str, field: str) -> str:
    """``name`` if it is a well-formed resource of ``kind``, else INVALID_ARGUMENT."""
    if resource_kind(name) != kind:
        raise InvalidArgument(f"{field}: {name!r} is not a {kind} name (projects/P/...)")
    return name


# --- rules ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """How one method's requirements are found: field 1's resource of ``kind`` needing
    ``permission`` (read from the wire), or ``parse`` with ``request`` (parsed)."""

    permission: str = ""
    kind: str = ""
    request: Any = None
    parse: Callable[[Any], list[Requirement]] | None = None
    field: int = 1  # the field naming the resource (1, or 2: GiveBack)


def _on(kind: str, permission: str) -> Rule:
    return Rule(permission=permission, kind=kind)


def _topic(verb: str) -> Rule:
    return _on("topic", f"pubsub.topics.{verb}")


def _subscription(verb: str) -> Rule:
    return _on("subscription", f"pubsub.subscriptions.{verb}")


def _snapshot(verb: str) -> Rule:
    return _on("snapshot", f"pubsub.snapshots.{verb}")


def _schema(verb: str) -> Rule:
    return _on("schema", f"pubsub.schemas.{verb}")


def _in_project(permission: str) -> Rule:
    return _on("project", permission)


def _create_topic(topic: Any) -> list[Requirement]:
    name = _named(topic.name, "topic", "name")
    needs = [Requirement("pubsub.topics.create", project(name))]
    if topic.schema_settings.schema:
        schema = _named(topic.schema_settings.schema, "schema", "schema_settings.schema")
        needs.append(Requirement("pubsub.schemas.attach", schema))
    return needs


def _update_topic(request: Any) -> list[Requirement]:
    name = _named(request.topic.name, "topic", "topic.name")
    needs = [Requirement("pubsub.topics.update", name)]
    if request.topic.schema_settings.schema:
        schema = _named(request.topic.schema_settings.schema, "schema", "schema_settings.schema")
        needs.append(Requirement("pubsub.schemas.attach", schema))
    return needs


def _dead_letter(subscription: Any) -> list[Requirement]:
    topic = subscription.dead_letter_policy.dead_letter_topic
    if not topic:
        return []
    field = "dead_letter_policy.dead_letter_topic"
    return [Requirement("pubsub.topics.publish", _named(topic, "topic", field))]


def _create_subscription(subscription: Any) -> list[Requirement]:
    name = _named(subscription.name, "subscription", "name")
    topic = _named(subscription.topic, "topic", "topic")
    return [
        Requirement("pubsub.subscriptions.create", project(name)),
        Requirement("pubsub.topics.attachSubscription", topic),
        *_dead_letter(subscription),
    ]


def _update_subscription(request: Any) -> list[Requirement]:
    name = _named(request.subscription.name, "subscription", "subscription.name")
    needs = [Requirement("pubsub.subscriptions.update", name)]
    if any(p.split(".")[0] == "dead_letter_policy" for p in request.update_mask.paths):
        needs.extend(_dead_letter(request.subscription))
    return needs


def _create_snapshot(request: Any) -> list[Requirement]:
    name = _named(request.name, "snapshot", "name")
    subscription = _named(request.subscription, "subscription", "subscription")
    return [
        Requirement("pubsub.snapshots.create", project(name)),
        Requirement("pubsub.subscriptions.consume", subscription),
    ]


def _update_snapshot(request: Any) -> list[Requirement]:
    name = _named(request.snapshot.name, "snapshot", "snapshot.name")
    return [Requirement("pubsub.snapshots.update", name)]


def _seek(request: Any) -> list[Requirement]:
    subscription = _named(request.subscription, "subscription", "subscription")
    needs = [Requirement("pubsub.subscriptions.consume", subscription)]
    if request.snapshot:
        snapshot = _named(request.snapshot, "snapshot", "snapshot")
        needs.append(Requirement("pubsub.snapshots.seek", snapshot))
    return needs


def _create_schema(request: Any) -> list[Requirement]:
    parent = _named(request.parent, "project", "parent")
    return [Requirement("pubsub.schemas.create", parent)]


def _iam(verb: str) -> Callable[[Any], list[Requirement]]:
    def needs(request: Any) -> list[Requirement]:
        kind = resource_kind(request.resource)
        if kind is None or kind == "project":
            raise InvalidArgument(
                f"resource: {request.resource!r} is not a topic, subscription, snapshot or "
                "schema name"
            )
        return [Requirement(f"{PREFIX[kind]}.{verb}", request.resource)]

    return needs


def _damaged_ranges(request: Any) -> list[Requirement]:
    if not request.topic:  # every topic
        return [Requirement("pubsub.topics.get", EVERY_PROJECT)]
    return [Requirement("pubsub.topics.get", _named(request.topic, "topic", "topic"))]


def _nothing(_request: Any) -> list[Requirement]:
    return []


def _every_project(permission: str) -> Rule:
    return Rule(parse=lambda _r: [Requirement(permission, EVERY_PROJECT)])


RULES: dict[str, Rule] = {
    # google.pubsub.v1.Publisher
    PUBLISHER + "CreateTopic": Rule(request=pb.Topic, parse=_create_topic),
    PUBLISHER + "UpdateTopic": Rule(request=pb.UpdateTopicRequest, parse=_update_topic),
    PUBLISHER + "Publish": _topic("publish"),
    PUBLISHER + "GetTopic": _topic("get"),
    PUBLISHER + "ListTopics": _in_project("pubsub.topics.list"),
    PUBLISHER + "ListTopicSubscriptions": _topic("get"),
    PUBLISHER + "ListTopicSnapshots": _topic("get"),
    PUBLISHER + "DeleteTopic": _topic("delete"),
    PUBLISHER + "DetachSubscription": Rule(
        request=pb.DetachSubscriptionRequest,
        parse=lambda r: [
            Requirement(
                "pubsub.topics.detachSubscription",
                project(_named(r.subscription, "subscription", "subscription")),
            )
        ],
    ),
    # google.pubsub.v1.Subscriber
    SUBSCRIBER + "CreateSubscription": Rule(request=pb.Subscription, parse=_create_subscription),
    SUBSCRIBER + "GetSubscription": _subscription("get"),
    SUBSCRIBER + "UpdateSubscription": Rule(
        request=pb.UpdateSubscriptionRequest, parse=_update_subscription
    ),
    SUBSCRIBER + "ListSubscriptions": _in_project("pubsub.subscriptions.list"),
    SUBSCRIBER + "DeleteSubscription": _subscription("delete"),
    SUBSCRIBER + "ModifyAckDeadline": _subscription("consume"),
    SUBSCRIBER + "Acknowledge": _subscription("consume"),
    SUBSCRIBER + "Pull": _subscription("consume"),
    SUBSCRIBER + "StreamingPull": _subscription("consume"),  # its first request
    SUBSCRIBER + "ModifyPushConfig": _subscription("update"),
    SUBSCRIBER + "GetSnapshot": _snapshot("get"),
    SUBSCRIBER + "ListSnapshots": _in_project("pubsub.snapshots.list"),
    SUBSCRIBER + "CreateSnapshot": Rule(request=pb.CreateSnapshotRequest, parse=_create_snapshot),
    SUBSCRIBER + "UpdateSnapshot": Rule(request=pb.UpdateSnapshotRequest, parse=_update_snapshot),
    SUBSCRIBER + "DeleteSnapshot": _snapshot("delete"),
    SUBSCRIBER + "Seek": Rule(request=pb.SeekRequest, parse=_seek),
    # google.pubsub.v1.SchemaService
    SCHEMAS + "CreateSchema": Rule(request=pb.CreateSchemaRequest, parse=_create_schema),
    SCHEMAS + "GetSchema": _schema("get"),
    SCHEMAS + "ListSchemas": _in_project("pubsub.schemas.list"),
    SCHEMAS + "ListSchemaRevisions": _schema("listRevisions"),
    SCHEMAS + "CommitSchema": _schema("commit"),
    SCHEMAS + "RollbackSchema": _schema("rollback"),
    SCHEMAS + "DeleteSchemaRevision": _schema("delete"),
    SCHEMAS + "DeleteSchema": _schema("delete"),
    SCHEMAS + "ValidateSchema": _in_project("pubsub.schemas.validate"),
    SCHEMAS + "ValidateMessage": _in_project("pubsub.schemas.validate"),
    # google.iam.v1.IAMPolicy
    IAM + "GetIamPolicy": Rule(request=pb.GetIamPolicyRequest, parse=_iam("getIamPolicy")),
    IAM + "SetIamPolicy": Rule(request=pb.SetIamPolicyRequest, parse=_iam("setIamPolicy")),
    IAM + "TestIamPermissions": Rule(parse=_nothing),
    # pubsubd.v1.Replay (field 1 is the topic)
    REPLAY + "GetTopicRanges": _topic("get"),
    REPLAY + "LookupOffsets": _topic("get"),
    REPLAY + "Read": _topic("attachSubscription"),
    REPLAY + "GetCursor": _topic("get"),
    REPLAY + "ListCursors": _topic("get"),
    REPLAY + "CommitCursor": _topic("attachSubscription"),
    REPLAY + "DeleteCursor": _topic("attachSubscription"),
    REPLAY + "PublishDeduplicated": _topic("publish"),
    # Field 1 is the subscription: moving its delivery back, as Seek (consume) does.
    REPLAY + "SeekOffsets": _subscription("consume"),
    # pubsubd.v1.Admin
    ADMIN + "ListDamagedRanges": Rule(parse=_damaged_ranges),
    ADMIN + "SkipDamagedRanges": _topic("update"),
    ADMIN + "GetRoutingConstraints": _every_project("pubsub.topics.get"),
    ADMIN + "ChangeRoutingConstraints": _every_project("pubsub.topics.update"),
    # pubsubd.internal.v1.Forwarder: an unsent Pull response given back (field 2), as Pull.
    GIVE_BACK: Rule(permission="pubsub.subscriptions.consume", kind="subscription", field=2),
}


class _Field1:
    """A request's field 1 (ListDamagedRangesRequest.topic), read from the wire."""

    def __init__(self, raw: bytes) -> None:
        self.topic = field1(raw)


def checked(method: str) -> bool:
    """Whether calls of ``method`` are authorized (its service is a checked one)."""
    return method.startswith(CHECKED_SERVICES) or method == GIVE_BACK


def requirements(method: str, raw: bytes) -> list[Requirement]:
    """What a call of ``method`` with request bytes ``raw`` needs. Raises InvalidArgument for a
    request whose resource name is missing or malformed, PermissionDenied-free: deciding is
    :meth:`pubsubd.core.iam.Policies.check`'s job. A method of a checked service without a
    rule gets a requirement nobody holds (refused)."""
    rule = RULES.get(method)
    if rule is None:
        return [Requirement(f"(no rule for {method.rsplit('/', 1)[-1]})", EVERY_PROJECT)]
    if rule.parse is None:
        name = field1(raw, rule.field)
        if rule.kind == "project":
            return [Requirement(rule.permission, _named(name, "project", "parent"))]
        return [Requirement(rule.permission, _named(name, rule.kind, "name"))]
    if rule.request is None:  # nothing to parse, or only field 1
        return rule.parse(_Field1(raw))
    try:
        request = rule.request.FromString(raw)
    except DecodeError:
        raise InvalidArgument(f"request: not a valid {rule.request.DESCRIPTOR.full_name}") from None
    return rule.parse(request)
