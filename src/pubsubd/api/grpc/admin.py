"""pubsubd.v1.Admin servicer: the operator's API beside google.pubsub.v1 (proto/pubsubd/v1/
admin.proto), used by the ``pubsubd`` CLI.

Damaged stored messages (storage/damage.py, core/damage_policy.py): list them, and skip them,
which makes every subscription of the topic acknowledge them as lost.

A cluster's routing constraints (control/routing_store.py): read them, and change one at a time
(what ``pubsubd routing drain|undrain|pin|unpin`` do through ZooKeeper), through any frontend.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from pubsubd._gen.pubsubd.v1 import admin_pb2 as a
from pubsubd.api.grpc.status import rpc, unary_method
from pubsubd.control.catalog import Catalog
from pubsubd.control.router import Routes
from pubsubd.control.routing_store import RoutingStore
from pubsubd.control.routing_table import Constraints
from pubsubd.coordination.errors import CoordinationError
from pubsubd.core.errors import FailedPrecondition, InvalidArgument, Unavailable
from pubsubd.storage.damage import DamagedRange

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

SERVICE = "pubsubd.v1.Admin"


def damaged_range_pb(topic: str, uid: str, source: int, damaged: DamagedRange) -> Any:
    return a.DamagedRange(
        topic=topic,
        topic_storage=uid,
        source=source,
        first_offset=damaged.first_offset,
        end_offset=damaged.end_offset,
        file=damaged.path,
        byte_start=damaged.byte_start,
        byte_stop=damaged.byte_stop,
        reason=damaged.reason,
        found=damaged.found,
    )


def constraints_pb(constraints: Constraints) -> Any:
    return a.RoutingConstraints(
        drained_forwarders=sorted(constraints.drained),
        drained_zones=sorted(constraints.drained_zones),
        pinned_topics=dict(constraints.pinned_topics),
    )


class AdminServicer:
    def __init__(
        self, catalog: Catalog, routes: Routes, routing: RoutingStore | None = None
    ) -> None:
        """``routing``: the cluster's routing records (None: not part of a cluster)."""
        self.catalog = catalog
        self.routes = routes
        self.routing = routing

    def _routing(self) -> RoutingStore:
        if self.routing is None:
            raise FailedPrecondition("routing constraints: this server is not part of a cluster")
        return self.routing

    @rpc
    async def GetRoutingConstraints(self, request: Any, context: Context) -> Any:
        try:
            constraints, _ = await self._routing().constraints()
        except CoordinationError as e:
            raise Unavailable(f"routing constraints: ZooKeeper: {e}") from e
        return constraints_pb(constraints)

    @rpc
    async def ChangeRoutingConstraints(self, request: Any, context: Context) -> Any:
        routing = self._routing()
        kind = request.WhichOneof("change")
        if kind is None:
            raise InvalidArgument(
                "change: exactly one of drain_forwarder, undrain_forwarder, "
                "drain_zone, undrain_zone, pin_topic, unpin_topic is required"
            )
        if kind == "pin_topic":
            pin = request.pin_topic
            if not pin.forwarder_id:
                raise InvalidArgument("pin_topic.forwarder_id: required")
            await self.catalog.caught_up()
            topic = self.catalog.topic(pin.topic).record.name  # NOT_FOUND if missing

            def change(c: Constraints) -> Constraints:
                return c.pin(topic, pin.forwarder_id)
        else:
            value = getattr(request, kind)
            if not value:
                raise InvalidArgument(f"{kind}: must not be empty")
            change = {
                "drain_forwarder": lambda c: c.drain(value),
                "undrain_forwarder": lambda c: c.undrain(value),
                "drain_zone": lambda c: c.drain_zone(value),
                "undrain_zone": lambda c: c.undrain_zone(value),
                "unpin_topic": lambda c: c.unpin(value),
            }[kind]
        try:
            return constraints_pb(await routing.change_constraints(change))
        except CoordinationError as e:
            raise Unavailable(f"routing constraints: ZooKeeper: {e}") from e

    @rpc
    async def ListDamagedRanges(self, request: Any, context: Context) -> Any:
        response = a.ListDamagedRangesResponse()
        if request.topic:
            uid = self.catalog.topic(request.topic).record.uid
            found = {uid: self.routes.publishing(uid).damaged(uid)}
        else:
            found = {}
            for forwarder in self.routes.all_publishing():
                for topic_uid in forwarder.topic_uids(written_only=True):
                    ranges = forwarder.damaged(topic_uid)
                    if ranges:
                        found[topic_uid] = ranges
        for uid, ranges in sorted(found.items()):
            entry = self.catalog.topics_by_uid.get(uid)
            name = entry.record.name if entry is not None else ""
            response.ranges.extend(damaged_range_pb(name, uid, s, d) for s, d in ranges)
        return response

    @rpc
    async def SkipDamagedRanges(self, request: Any, context: Context) -> Any:
        if not request.topic:
            raise InvalidArgument("topic: required")
        uid = self.catalog.topic(request.topic).record.uid
        damaged = self.routes.publishing(uid).damaged(uid)
        lost = sum(f.skip_damaged(uid, damaged) for f in self.routes.all_subscribing())
        return a.SkipDamagedRangesResponse(
            skipped=[damaged_range_pb(request.topic, uid, s, d) for s, d in damaged],
            messages_lost=lost,
        )


def handlers(servicer: AdminServicer) -> grpc.GenericRpcHandler:
    unary = unary_method
    s = servicer
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ListDamagedRanges": unary(
                s.ListDamagedRanges, a.ListDamagedRangesRequest, a.ListDamagedRangesResponse
            ),
            "SkipDamagedRanges": unary(
                s.SkipDamagedRanges, a.SkipDamagedRangesRequest, a.SkipDamagedRangesResponse
            ),
            "GetRoutingConstraints": unary(
                s.GetRoutingConstraints, a.GetRoutingConstraintsRequest, a.RoutingConstraints
            ),
            "ChangeRoutingConstraints": unary(
                s.ChangeRoutingConstraints,
                a.ChangeRoutingConstraintsRequest,
                a.RoutingConstraints,
            ),
        },
    )
