"""pubsubd.v1.Admin servicer: the operator's API beside google.pubsub.v1 (proto/pubsubd/v1/
admin.proto), used by the ``pubsubd`` CLI.

Damaged stored messages (storage/damage.py, core/damage_policy.py): list them, and skip them,
which makes every subscription of the topic acknowledge them as lost.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from pubsubd._gen.pubsubd.v1 import admin_pb2 as a
from pubsubd.api.grpc.status import rpc, unary_method
from pubsubd.control.catalog import Catalog
from pubsubd.control.router import Routes
from pubsubd.core.errors import InvalidArgument
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


class AdminServicer:
    def __init__(self, catalog: Catalog, routes: Routes) -> None:
        self.catalog = catalog
        self.routes = routes

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
        },
    )
