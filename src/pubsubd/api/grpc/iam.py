"""google.iam.v1.IAMPolicy servicer: GetIamPolicy, SetIamPolicy and TestIamPermissions on
topics, subscriptions, snapshots and schemas (control/policies.py keeps the policies).

Get and Set answer NOT_FOUND for a topic, subscription or snapshot that does not exist; a
schema's name is accepted without an existence check (schemas are served by their own service).
TestIamPermissions never answers NOT_FOUND (Google's behaviour): it returns the asked
permissions the caller holds (with authorization off, ``--iam`` not given, every one). The
checks of Get and Set themselves (``getIamPolicy``, ``setIamPolicy``) are made before the call
reaches here, by api/grpc/authorization.py, when authorization is on.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from pubsubd.api.grpc.status import rpc, unary_method
from pubsubd.control.catalog import Catalog
from pubsubd.control.policies import ResourcePolicies
from pubsubd.control.snapshots import Snapshots
from pubsubd.core import iam, pb
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.principal import caller

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

SERVICE = "google.iam.v1.IAMPolicy"


class IamPolicyServicer:
    def __init__(
        self,
        catalog: Catalog,
        snapshots: Snapshots,
        policies: ResourcePolicies,
        *,
        enforced: bool = False,
    ) -> None:
        """``enforced``: authorization is on (``--iam``); off, every caller holds every
        permission, and TestIamPermissions says so."""
        self.enforced = enforced
        self.catalog = catalog
        self.snapshots = snapshots
        self.policies = policies

    async def _existing(self, resource: str) -> None:
        """NOT_FOUND unless the resource exists (schemas: the name is enough)."""
        kind = iam.resource_kind(resource)
        if kind is None or kind == "project":
            raise InvalidArgument(
                f"resource: {resource!r} is not a topic, subscription, snapshot or schema name"
            )
        await self.catalog.caught_up()
        if kind == "topic":
            self.catalog.topic(resource)
        elif kind == "subscription":
            self.catalog.subscription(resource)
        elif kind == "snapshot":
            self.snapshots.entry(resource)

    @rpc
    async def GetIamPolicy(self, request: Any, context: Context) -> Any:
        await self._existing(request.resource)
        return self.policies.get(request.resource)

    @rpc
    async def SetIamPolicy(self, request: Any, context: Context) -> Any:
        await self._existing(request.resource)
        if not request.HasField("policy"):
            raise InvalidArgument("policy: required")
        mask = request.update_mask.paths if request.HasField("update_mask") else ()
        return self.policies.set(request.resource, request.policy, mask)

    @rpc
    async def TestIamPermissions(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        held = self.policies.test(
            caller(), request.resource, request.permissions, everything=not self.enforced
        )
        return pb.TestIamPermissionsResponse(permissions=held)


def handlers(servicer: IamPolicyServicer) -> grpc.GenericRpcHandler:
    unary = unary_method
    s = servicer
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetIamPolicy": unary(s.GetIamPolicy, pb.GetIamPolicyRequest, pb.Policy),
            "SetIamPolicy": unary(s.SetIamPolicy, pb.SetIamPolicyRequest, pb.Policy),
            "TestIamPermissions": unary(
                s.TestIamPermissions, pb.TestIamPermissionsRequest, pb.TestIamPermissionsResponse
            ),
        },
    )
