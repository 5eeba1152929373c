"""Google's HTTP rules for the Pub/Sub v1 REST API, and matching a request line to one (pure).

The table is the ``google.api.http`` annotations of google/pubsub/v1/pubsub.proto and
schema.proto, plus the google.iam.v1 mixin rules of ``pubsub_v1.yaml``: the same rules the
official client's REST transports carry (``tests/unit/test_rest_routes.py`` compares the two).
Every rule names the gRPC method it stands for; the REST front calls that method, so REST
implements no rule of the service itself.

A template is ``/v1/`` then segments, one variable ``{field.path=pattern}`` whose pattern is
segments of literals and ``*`` (one whole segment), and optionally ``:customVerb`` at the end.
A variable's value is its segments joined by ``/``, each percent-decoded; a ``*`` never matches
an empty segment. A resource ID cannot contain ``:`` (``core/names.py``), so the custom verb
is what follows the first ``:`` of the last segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pubsubd.core import pb

__all__ = ["RULES", "Match", "Rule", "match", "verbs_for"]

PUBLISHER = "/google.pubsub.v1.Publisher/"
SUBSCRIBER = "/google.pubsub.v1.Subscriber/"
SCHEMAS = "/google.pubsub.v1.SchemaService/"
IAM = "/google.iam.v1.IAMPolicy/"

TOPIC = "projects/*/topics/*"
SUBSCRIPTION = "projects/*/subscriptions/*"
SNAPSHOT = "projects/*/snapshots/*"
SCHEMA = "projects/*/schemas/*"
PROJECT = "projects/*"


@dataclass(frozen=True)
class Rule:
    """One HTTP rule: ``verb template`` with ``body`` ("" none, "*" the whole request, or the
    request field the body is) stands for the gRPC ``method`` (request and response types)."""

    verb: str
    template: str
    body: str
    method: str
    request: Any
    response: Any


@dataclass(frozen=True)
class _Compiled:
    rule: Rule
    segments: tuple[str, ...]  # literals and "*"
    field: str  # the variable's field path ("topic", "topic.name")
    start: int  # the variable's segments: [start, end)
    end: int
    custom: str  # the custom verb, "" if none


@dataclass(frozen=True)
class Match:
    rule: Rule
    field: str
    value: str  # the variable's value, percent-decoded


def _rule(verb: str, template: str, body: str, method: str, request: Any, response: Any) -> Rule:
    return Rule(verb, template, body, method, request, response)


def _iam(resource: str) -> list[Rule]:
    v = f"/v1/{{resource={resource}}}"
    get, put = IAM + "GetIamPolicy", IAM + "SetIamPolicy"
    return [
        _rule("GET", f"{v}:getIamPolicy", "", get, pb.GetIamPolicyRequest, pb.Policy),
        _rule("POST", f"{v}:setIamPolicy", "*", put, pb.SetIamPolicyRequest, pb.Policy),
        _rule(
            "POST",
            f"{v}:testIamPermissions",
            "*",
            IAM + "TestIamPermissions",
            pb.TestIamPermissionsRequest,
            pb.TestIamPermissionsResponse,
        ),
    ]  # fmt: skip


RULES: tuple[Rule, ...] = (
    # google.pubsub.v1.Publisher
    _rule("PUT", f"/v1/{{name={TOPIC}}}", "*", PUBLISHER + "CreateTopic", pb.Topic, pb.Topic),
    _rule("PATCH", f"/v1/{{topic.name={TOPIC}}}", "*", PUBLISHER + "UpdateTopic",
          pb.UpdateTopicRequest, pb.Topic),
    _rule("POST", f"/v1/{{topic={TOPIC}}}:publish", "*", PUBLISHER + "Publish",
          pb.PublishRequest, pb.PublishResponse),
    _rule("GET", f"/v1/{{topic={TOPIC}}}", "", PUBLISHER + "GetTopic", pb.GetTopicRequest,
          pb.Topic),
    _rule("GET", f"/v1/{{project={PROJECT}}}/topics", "", PUBLISHER + "ListTopics",
          pb.ListTopicsRequest, pb.ListTopicsResponse),
    _rule("GET", f"/v1/{{topic={TOPIC}}}/subscriptions", "", PUBLISHER + "ListTopicSubscriptions",
          pb.ListTopicSubscriptionsRequest, pb.ListTopicSubscriptionsResponse),
    _rule("GET", f"/v1/{{topic={TOPIC}}}/snapshots", "", PUBLISHER + "ListTopicSnapshots",
          pb.ListTopicSnapshotsRequest, pb.ListTopicSnapshotsResponse),
    _rule("DELETE", f"/v1/{{topic={TOPIC}}}", "", PUBLISHER + "DeleteTopic",
          pb.DeleteTopicRequest, pb.Empty),
    _rule("POST", f"/v1/{{subscription={SUBSCRIPTION}}}:detach", "",
          PUBLISHER + "DetachSubscription", pb.DetachSubscriptionRequest,
          pb.DetachSubscriptionResponse),
    # google.pubsub.v1.Subscriber
    _rule("PUT", f"/v1/{{name={SUBSCRIPTION}}}", "*", SUBSCRIBER + "CreateSubscription",
          pb.Subscription, pb.Subscription),
    _rule("GET", f"/v1/{{subscription={SUBSCRIPTION}}}", "", SUBSCRIBER + "GetSubscription",
          pb.GetSubscriptionRequest, pb.Subscription),
    _rule("PATCH", f"/v1/{{subscription.name={SUBSCRIPTION}}}", "*",
          SUBSCRIBER + "UpdateSubscription", pb.UpdateSubscriptionRequest, pb.Subscription),
    _rule("GET", f"/v1/{{project={PROJECT}}}/subscriptions", "", SUBSCRIBER + "ListSubscriptions",
          pb.ListSubscriptionsRequest, pb.ListSubscriptionsResponse),
    _rule("DELETE", f"/v1/{{subscription={SUBSCRIPTION}}}", "", SUBSCRIBER + "DeleteSubscription",
          pb.DeleteSubscriptionRequest, pb.Empty),
    _rule("POST", f"/v1/{{subscription={SUBSCRIPTION}}}:modifyAckDeadline", "*",
          SUBSCRIBER + "ModifyAckDeadline", pb.ModifyAckDeadlineRequest, pb.Empty),
    _rule("POST", f"/v1/{{subscription={SUBSCRIPTION}}}:acknowledge", "*",
          SUBSCRIBER + "Acknowledge", pb.AcknowledgeRequest, pb.Empty),
    _rule("POST", f"/v1/{{subscription={SUBSCRIPTION}}}:pull", "*", SUBSCRIBER + "Pull",
          pb.PullRequest, pb.PullResponse),
    _rule("POST", f"/v1/{{subscription={SUBSCRIPTION}}}:modifyPushConfig", "*",
          SUBSCRIBER + "ModifyPushConfig", pb.ModifyPushConfigRequest, pb.Empty),
    _rule("GET", f"/v1/{{snapshot={SNAPSHOT}}}", "", SUBSCRIBER + "GetSnapshot",
          pb.GetSnapshotRequest, pb.Snapshot),
    _rule("GET", f"/v1/{{project={PROJECT}}}/snapshots", "", SUBSCRIBER + "ListSnapshots",
          pb.ListSnapshotsRequest, pb.ListSnapshotsResponse),
    _rule("PUT", f"/v1/{{name={SNAPSHOT}}}", "*", SUBSCRIBER + "CreateSnapshot",
          pb.CreateSnapshotRequest, pb.Snapshot),
    _rule("PATCH", f"/v1/{{snapshot.name={SNAPSHOT}}}", "*", SUBSCRIBER + "UpdateSnapshot",
          pb.UpdateSnapshotRequest, pb.Snapshot),
    _rule("DELETE", f"/v1/{{snapshot={SNAPSHOT}}}", "", SUBSCRIBER + "DeleteSnapshot",
          pb.DeleteSnapshotRequest, pb.Empty),
    _rule("POST", f"/v1/{{subscription={SUBSCRIPTION}}}:seek", "*", SUBSCRIBER + "Seek",
          pb.SeekRequest, pb.SeekResponse),
    # google.pubsub.v1.SchemaService
    _rule("POST", f"/v1/{{parent={PROJECT}}}/schemas", "schema", SCHEMAS + "CreateSchema",
          pb.CreateSchemaRequest, pb.Schema),
    _rule("GET", f"/v1/{{name={SCHEMA}}}", "", SCHEMAS + "GetSchema", pb.GetSchemaRequest,
          pb.Schema),
    _rule("GET", f"/v1/{{parent={PROJECT}}}/schemas", "", SCHEMAS + "ListSchemas",
          pb.ListSchemasRequest, pb.ListSchemasResponse),
    _rule("GET", f"/v1/{{name={SCHEMA}}}:listRevisions", "", SCHEMAS + "ListSchemaRevisions",
          pb.ListSchemaRevisionsRequest, pb.ListSchemaRevisionsResponse),
    _rule("POST", f"/v1/{{name={SCHEMA}}}:commit", "*", SCHEMAS + "CommitSchema",
          pb.CommitSchemaRequest, pb.Schema),
    _rule("POST", f"/v1/{{name={SCHEMA}}}:rollback", "*", SCHEMAS + "RollbackSchema",
          pb.RollbackSchemaRequest, pb.Schema),
    _rule("DELETE", f"/v1/{{name={SCHEMA}}}:deleteRevision", "",
          SCHEMAS + "DeleteSchemaRevision", pb.DeleteSchemaRevisionRequest, pb.Schema),
    _rule("DELETE", f"/v1/{{name={SCHEMA}}}", "", SCHEMAS + "DeleteSchema",
          pb.DeleteSchemaRequest, pb.Empty),
    _rule("POST", f"/v1/{{parent={PROJECT}}}/schemas:validate", "*", SCHEMAS + "ValidateSchema",
          pb.ValidateSchemaRequest, pb.ValidateSchemaResponse),
    _rule("POST", f"/v1/{{parent={PROJECT}}}/schemas:validateMessage", "*",
          SCHEMAS + "ValidateMessage", pb.ValidateMessageRequest, pb.ValidateMessageResponse),
    # google.iam.v1.IAMPolicy, on every resource kind (pubsub_v1.yaml)
    *_iam(TOPIC),
    *_iam(SUBSCRIPTION),
    *_iam(SNAPSHOT),
    *_iam(SCHEMA),
)  # fmt: skip


def _compile(rule: Rule) -> _Compiled:
    path, _, custom = rule.template.partition(":")
    head, _, rest = path.partition("{")
    var, _, tail = rest.partition("}")
    field, _, pattern = var.partition("=")
    before = [s for s in head.strip("/").split("/") if s]
    inside = pattern.split("/")
    after = [s for s in tail.strip("/").split("/") if s]
    start = len(before)
    return _Compiled(rule, (*before, *inside, *after), field, start, start + len(inside), custom)


_COMPILED = tuple(_compile(r) for r in RULES)


def _fits(compiled: _Compiled, segments: Sequence[str], custom: str) -> bool:
    if compiled.custom != custom or len(compiled.segments) != len(segments):
        return False
    return all(
        (want == "*" and got != "") or want == got
        for want, got in zip(compiled.segments, segments, strict=True)
    )


def _split(path: str) -> tuple[list[str], str]:
    segments = path.lstrip("/").split("/")
    last, colon, custom = segments[-1].partition(":")
    segments[-1] = last
    return segments, custom if colon else ""


def match(verb: str, path: str) -> Match | None:
    """The rule a request's verb and raw (still percent-encoded) path stand for, or None."""
    segments, custom = _split(path)
    for compiled in _COMPILED:
        if compiled.rule.verb == verb and _fits(compiled, segments, custom):
            value = "/".join(unquote(s) for s in segments[compiled.start : compiled.end])
            return Match(compiled.rule, compiled.field, value)
    return None


def verbs_for(path: str) -> list[str]:
    """The verbs some rule accepts for ``path`` (to explain a request that matched none)."""
    segments, custom = _split(path)
    return sorted({c.rule.verb for c in _COMPILED if _fits(c, segments, custom)})
