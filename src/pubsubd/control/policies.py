"""IAM policies as metadata: resources' own policies in the metadata store, the operator's
project policies from a file, and the view every call is authorized against.

A resource's policy is a ``PolicyRecord`` (its serialized ``google.iam.v1.Policy``) in the
metadata store, so it is as durable as the resource and, in a cluster (ZooKeeper), every process
follows it through the store's change feed: this view is updated by every policy change any
process makes. When this process deletes a topic, subscription, snapshot or schema, it deletes
the resource's policy too (a re-created resource of the same name starts without one).

SetIamPolicy is a compare-and-set on the etag: the servicer first applies what other processes
wrote (``caught_up``), then the etag in the request must be the current one, and the store
writes the new policy only if the stored one is still the one this view holds (in ZooKeeper, on
the znode's version): of two processes setting one resource's policy at the same instant, one
wins and the other answers ABORTED, as for a stale etag.

The policy file (``--iam-policy-file``), JSON::

    {"projects": {"my-project": {"bindings": [{"role": "roles/pubsub.admin",
                                               "members": ["user:ops@example.com"]}]},
                  "*": {"bindings": [...]}}}

``"*"`` applies to every project (and is the only grant for the cluster-wide admin calls).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pubsubd.core import iam, pb
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.principal import Principal
from pubsubd.storage.metadata import (
    Applied,
    Change,
    MetadataStore,
    PolicyRecord,
    RecordChanged,
    SchemaRecord,
    SnapshotRecord,
    SubscriptionRecord,
    TopicRecord,
)

log = logging.getLogger(__name__)

__all__ = ["PolicyFileError", "ResourcePolicies", "load_policy_file"]

POLICY_VERSION = 1  # no conditions: version 1 policies only
# SetIamPolicy's default mask (google/iam/v1/iam_policy.proto) and what a mask may name.
DEFAULT_MASK = ("bindings", "etag")
MASKABLE = frozenset({"bindings", "etag", "version"})


class PolicyFileError(ValueError):
    """The policy file cannot be read or names what we do not know."""


def parse_policy_file(text: str, source: str = "policy file") -> dict[str, iam.CompiledPolicy]:
    """Project ID (or ``"*"``) -> its compiled policy, from the file's JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PolicyFileError(f"{source}: not JSON: {e}") from e
    projects = data.get("projects") if isinstance(data, dict) else None
    if not isinstance(projects, dict):
        raise PolicyFileError(
            f'{source}: expected {{"projects": {{PROJECT: {{"bindings": ...}}}}}}'
        )
    compiled: dict[str, iam.CompiledPolicy] = {}
    for project, body in projects.items():
        bindings = body.get("bindings") if isinstance(body, dict) else None
        if not isinstance(bindings, list):
            raise PolicyFileError(f"{source}: projects.{project}.bindings: expected a list")
        pairs: list[tuple[str, list[str]]] = []
        for i, binding in enumerate(bindings):
            where = f"{source}: projects.{project}.bindings[{i}]"
            role = binding.get("role") if isinstance(binding, dict) else None
            members = binding.get("members") if isinstance(binding, dict) else None
            if not isinstance(role, str) or role not in iam.ROLES:
                raise PolicyFileError(f"{where}.role: {role!r} is not one of {sorted(iam.ROLES)}")
            if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
                raise PolicyFileError(f"{where}.members: expected a list of member strings")
            pairs.append((role, members))
        compiled[project] = iam.CompiledPolicy.of(pairs)
    return compiled


def load_policy_file(path: Path | None) -> dict[str, iam.CompiledPolicy]:
    """The policy file's project policies (none without a file)."""
    if path is None:
        return {}
    try:
        text = path.read_text()
    except OSError as e:
        raise PolicyFileError(f"{path}: {e.strerror or e}") from e
    return parse_policy_file(text, str(path))


def _compiled(policy: Any) -> iam.CompiledPolicy:
    return iam.CompiledPolicy.of((b.role, b.members) for b in policy.bindings)


def empty_policy() -> Any:
    return pb.Policy(version=POLICY_VERSION, etag=iam.EMPTY_ETAG)


class ResourcePolicies:
    """Every resource's policy, as the metadata store has it, and the decisions on them."""

    def __init__(
        self, store: MetadataStore, projects: Mapping[str, iam.CompiledPolicy] | None = None
    ) -> None:
        self.store = store
        self._policies: dict[str, Any] = {}  # resource -> google.iam.v1.Policy
        self._bodies: dict[str, bytes] = {}  # resource -> its stored record's body
        self._compiled: dict[str, iam.CompiledPolicy] = {}
        self.decisions = iam.Policies(dict(projects or {}), self._compiled)
        self._listeners: list[Callable[[], None]] = []
        for record in store.load_policies():
            self._apply(record, deleted=False)
        store.changes.watch(self._changed)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each policy change this view applies (its own, and every
        other process's through the change feed): authorization decides its open streams
        again (core/stream_guard.py)."""
        self._listeners.append(listener)

    # -- following the store ----------------------------------------------------------------

    def _apply(self, record: PolicyRecord, *, deleted: bool) -> None:
        if deleted:
            self._policies.pop(record.resource, None)
            self._bodies.pop(record.resource, None)
            self._compiled.pop(record.resource, None)
        else:
            policy = pb.Policy.FromString(record.body)
            self._policies[record.resource] = policy
            self._bodies[record.resource] = record.body
            self._compiled[record.resource] = _compiled(policy)
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # one listener's failure must not stop the view following
                log.exception("policy change listener failed")

    def _changed(self, change: Change) -> Applied:
        record = change.record
        if isinstance(record, PolicyRecord):
            self._apply(record, deleted=change.deleted)
            return None
        # A resource this process deleted takes its policy with it (every process hears the
        # delete; the one that made it deletes the policy, once).
        if (
            change.deleted
            and not change.remote
            and isinstance(record, (TopicRecord, SubscriptionRecord, SnapshotRecord, SchemaRecord))
            and record.name in self._policies
        ):
            return self.store.delete_policy(record.name)
        return None

    # -- the IAMPolicy calls ---------------------------------------------------------------

    def get(self, resource: str) -> Any:
        """The resource's policy (an empty one, with Google's empty etag, if it has none)."""
        found = self._policies.get(resource)
        return pb.Policy.FromString(found.SerializeToString()) if found else empty_policy()

    def set(self, resource: str, policy: Any, mask: Iterable[str] = ()) -> Any:
        """Replace the masked fields of the resource's policy (default: bindings and etag);
        raises InvalidArgument for what we do not apply and ``iam.PolicyConflict`` if the
        request's etag is not the current one."""
        paths = tuple(mask) or DEFAULT_MASK
        unknown = sorted(set(paths) - MASKABLE)
        if unknown:
            raise InvalidArgument(
                f"update_mask: {', '.join(unknown)} cannot be set (only bindings, etag, version)"
            )
        if policy.audit_configs:
            raise InvalidArgument("policy.audit_configs: audit configs are not supported")
        if "version" in paths and policy.version not in (0, 1):
            raise InvalidArgument(
                f"policy.version: {policy.version} needs conditions, which are not supported"
            )
        current = self.get(resource)
        if policy.etag and policy.etag != current.etag:
            raise iam.PolicyConflict(resource)
        updated = pb.Policy()
        updated.CopyFrom(current)
        if "bindings" in paths:
            iam.validate_bindings(policy.bindings, resource)
            del updated.bindings[:]
            for binding in policy.bindings:
                if binding.members:  # Google drops bindings without members
                    updated.bindings.add(role=binding.role, members=sorted(set(binding.members)))
        updated.version = POLICY_VERSION
        updated.etag = b""
        updated.etag = iam.next_etag(current.etag, updated.SerializeToString(deterministic=True))
        record = PolicyRecord(resource, updated.SerializeToString())
        try:
            self.store.put_policy(record, expected=self._bodies.get(resource))
        except RecordChanged as e:  # another process set it after this view was read
            raise iam.PolicyConflict(resource) from e
        self._apply(record, deleted=False)
        return updated

    def test(
        self,
        principal: Principal,
        resource: str,
        permissions: Iterable[str],
        *,
        everything: bool = False,
    ) -> list[str]:
        """The asked permissions the caller holds on the resource (TestIamPermissions);
        ``everything``: authorization is off, so the caller holds every valid one."""
        kind = iam.resource_kind(resource)
        if kind is None or kind == "project":
            raise InvalidArgument(f"resource: {resource!r} is not a Pub/Sub resource name")
        asked = list(permissions)
        wrong = [p for p in asked if p not in iam.testable(kind, [p])]
        if wrong:
            raise InvalidArgument(
                f"permissions: {', '.join(wrong)} not valid for a {kind} ({iam.PREFIX[kind]}.*)"
            )
        return [p for p in asked if everything or self.decisions.allows(principal, p, resource)]

    def check(self, principal: Principal, needs: Iterable[iam.Requirement]) -> None:
        self.decisions.check(principal, needs)
