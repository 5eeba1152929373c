"""Google's IAM model for Pub/Sub as pure rules: permissions, roles, policies, who may do what.

Rules (every decision of authorization is made here; api/grpc/authorization.py only reads the
caller and the request and asks):

1. A **permission** is Google's name (``pubsub.topics.publish``); a **role** is a set of them
   (``ROLES``: Google's predefined ``roles/pubsub.*`` and the basic ``roles/owner``, ``editor``,
   ``viewer`` restricted to Pub/Sub's permissions).
2. A **policy** binds roles to members (``user:a@x``, ``serviceAccount:...``, ``domain:x``,
   ``allUsers``, ``allAuthenticatedUsers``). A caller holds a permission on a resource when a
   binding of the resource's own policy, or of its project's policy (the operator's policy file),
   or of the ``"*"`` project of that file (every project) grants a role containing it to a member
   the caller matches. Nothing else grants anything: with enforcement on, an empty policy refuses
   everyone.
3. A **call** needs every permission ``required(method, request)`` lists, each on a named
   resource (a topic, subscription, snapshot, schema, or a project ``projects/P``); the first one
   missing refuses the call, and the refusal names it. Listing checks the list permission on the
   project and filters nothing (as Google does).
4. Policies are values: ``set_policy`` returns the new policy with a new etag (derived from the
   old etag and the new content, so every change changes it) or raises; an etag in the request
   that is not the current one is a concurrent change (``PolicyConflict``, ABORTED).

Conditions (``Binding.condition``) and audit configs are not supported: a policy carrying one is
refused with INVALID_ARGUMENT rather than half-applied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pubsubd.core.errors import Aborted, InvalidArgument, PermissionDenied
from pubsubd.core.principal import Principal

__all__ = [
    "EMPTY_ETAG",
    "PERMISSIONS",
    "ROLES",
    "CompiledPolicy",
    "PermissionDenied",
    "PolicyConflict",
    "Requirement",
    "resource_kind",
]

# --- permissions and roles (Google's names) ------------------------------------------------------

_TOPIC = (
    "pubsub.topics.",
    (
        "attachSubscription",
        "create",
        "delete",
        "detachSubscription",
        "get",
        "getIamPolicy",
        "list",
        "publish",
        "setIamPolicy",
        "update",
    ),
)
_SUBSCRIPTION = (
    "pubsub.subscriptions.",
    ("consume", "create", "delete", "get", "getIamPolicy", "list", "setIamPolicy", "update"),
)
_SNAPSHOT = (
    "pubsub.snapshots.",
    ("create", "delete", "get", "getIamPolicy", "list", "seek", "setIamPolicy", "update"),
)
_SCHEMA = (
    "pubsub.schemas.",
    (
        "attach",
        "commit",
        "create",
        "delete",
        "get",
        "getIamPolicy",
        "list",
        "listRevisions",
        "rollback",
        "setIamPolicy",
        "validate",
    ),
)

PERMISSIONS: frozenset[str] = frozenset(
    prefix + verb for prefix, verbs in (_TOPIC, _SUBSCRIPTION, _SNAPSHOT, _SCHEMA) for verb in verbs
)
_IAM_VERBS = ("getIamPolicy", "setIamPolicy")

_VIEWER = frozenset(
    {
        "pubsub.topics.get",
        "pubsub.topics.list",
        "pubsub.subscriptions.get",
        "pubsub.subscriptions.list",
        "pubsub.snapshots.get",
        "pubsub.snapshots.list",
        "pubsub.schemas.get",
        "pubsub.schemas.list",
        "pubsub.schemas.listRevisions",
        "pubsub.schemas.validate",
    }
)
_EDITOR = frozenset(p for p in PERMISSIONS if not p.endswith(_IAM_VERBS))

ROLES: Mapping[str, frozenset[str]] = {
    "roles/pubsub.publisher": frozenset({"pubsub.topics.publish"}),
    "roles/pubsub.subscriber": frozenset(
        {
            "pubsub.snapshots.seek",
            "pubsub.subscriptions.consume",
            "pubsub.topics.attachSubscription",
        }
    ),
    "roles/pubsub.viewer": _VIEWER,
    "roles/pubsub.editor": _EDITOR,
    "roles/pubsub.admin": PERMISSIONS,
    # Basic roles, as far as Pub/Sub's permissions go.
    "roles/viewer": _VIEWER,
    "roles/editor": _EDITOR,
    "roles/owner": PERMISSIONS,
}

# The etag of a resource that never had a policy (Google answers "ACAB" in base64).
EMPTY_ETAG = b"\x00\x20\x01"
ALL_PROJECTS = "*"  # the policy file's entry that applies to every project

# --- errors --------------------------------------------------------------------------------------


class PolicyConflict(Aborted):
    """SetIamPolicy's etag is not the current one: another change came first (ABORTED)."""

    def __init__(self, resource: str) -> None:
        super().__init__(
            f"There were concurrent policy changes to {resource}: read the policy again "
            "(GetIamPolicy) and retry with its etag"
        )


# --- members and compiled policies ---------------------------------------------------------------


def matches(member: str, principal: Principal) -> bool:
    """Whether the binding member ``member`` names ``principal``."""
    if member == "allUsers":
        return True
    if member == "allAuthenticatedUsers":
        return not principal.anonymous
    if member.startswith("domain:"):
        _, _, address = principal.member.partition(":")
        return not principal.anonymous and address.endswith("@" + member[len("domain:") :])
    return member == principal.member


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A policy as lookups: member -> the permissions its bindings grant."""

    grants: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, bindings: Iterable[tuple[str, Iterable[str]]]) -> CompiledPolicy:
        """From (role, members) pairs; a role not in ``ROLES`` grants nothing."""
        grants: dict[str, set[str]] = {}
        for role, members in bindings:
            permissions = ROLES.get(role, frozenset())
            for member in members:
                grants.setdefault(member, set()).update(permissions)
        return cls({m: frozenset(p) for m, p in grants.items()})

    def allows(self, principal: Principal, permission: str) -> bool:
        exact = self.grants.get(principal.member)
        if exact is not None and permission in exact:
            return True
        return any(
            permission in granted and matches(member, principal)
            for member, granted in self.grants.items()
            if member != principal.member
        )


EMPTY_POLICY = CompiledPolicy({})


def validate_bindings(bindings: Iterable[Any], resource: str) -> None:
    """Refuse what we do not apply: unknown roles, conditions, malformed members."""
    for i, binding in enumerate(bindings):
        where = f"policy.bindings[{i}]"
        if binding.role not in ROLES:
            raise InvalidArgument(
                f"{where}.role: {binding.role!r} is not a role supported for {resource} "
                f"(one of {', '.join(sorted(ROLES))})"
            )
        if binding.HasField("condition"):
            raise InvalidArgument(f"{where}.condition: conditional role bindings are not supported")
        for member in binding.members:
            if member not in ("allUsers", "allAuthenticatedUsers") and (
                ":" not in member or not member.split(":", 1)[1]
            ):
                raise InvalidArgument(
                    f"{where}.members: {member!r} is not a member (user:EMAIL, "
                    "serviceAccount:EMAIL, group:EMAIL, domain:DOMAIN, allUsers, "
                    "allAuthenticatedUsers)"
                )


def next_etag(previous: bytes, body: bytes) -> bytes:
    """The etag of a policy whose serialized content (without etag) is ``body``, replacing one
    whose etag was ``previous``: every change makes a new one, even back to equal content."""
    return hashlib.sha256(previous + b"\n" + body).digest()[:8]


# --- resources -----------------------------------------------------------------------------------

_KINDS = {
    "topics": "topic",
    "subscriptions": "subscription",
    "snapshots": "snapshot",
    "schemas": "schema",
}


def resource_kind(name: str) -> str | None:
    """``topic``, ``subscription``, ``snapshot``, ``schema`` or ``project`` for a well-formed
    ``projects/P[/KIND/ID]``; None for anything else."""
    parts = name.split("/")
    if len(parts) == 2 and parts[0] == "projects" and parts[1]:
        return "project"
    if len(parts) == 4 and parts[0] == "projects" and parts[1] and parts[3]:
        return _KINDS.get(parts[2])
    return None


def project_of(name: str) -> str:
    """The project ID of a resource name (``""`` if it has none)."""
    parts = name.split("/", 2)
    return parts[1] if len(parts) >= 2 and parts[0] == "projects" else ""


def project(name: str) -> str:
    """The project resource of a resource name: ``projects/P``."""
    return f"projects/{project_of(name)}"


# The permission prefix of each kind: its IAM calls need ``PREFIX.getIamPolicy`` etc.
PREFIX = {
    "topic": "pubsub.topics",
    "subscription": "pubsub.subscriptions",
    "snapshot": "pubsub.snapshots",
    "schema": "pubsub.schemas",
}


@dataclass(frozen=True, slots=True)
class Requirement:
    """One permission a call needs on one resource."""

    permission: str
    resource: str


def testable(kind: str, permissions: Iterable[str]) -> list[str]:
    """TestIamPermissions' answer set: the asked permissions that exist for the kind."""
    prefix = PREFIX[kind] + "."
    return [p for p in permissions if p.startswith(prefix) and p in PERMISSIONS]


# --- the decision --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Policies:
    """Everything that grants: the file's project policies and the resources' own policies."""

    projects: Mapping[str, CompiledPolicy]  # project ID (or "*") -> policy
    resources: Mapping[str, CompiledPolicy]  # resource name -> its own policy

    def allows(self, principal: Principal, permission: str, resource: str) -> bool:
        own = self.resources.get(resource)
        if own is not None and own.allows(principal, permission):
            return True
        for key in (project_of(resource), ALL_PROJECTS):
            policy = self.projects.get(key)
            if policy is not None and policy.allows(principal, permission):
                return True
        return False

    def check(self, principal: Principal, needs: Iterable[Requirement]) -> None:
        """Raise ``PermissionDenied`` naming the first requirement the caller lacks."""
        for need in needs:
            if not self.allows(principal, need.permission, need.resource):
                raise PermissionDenied(need.permission, need.resource, principal.member)
