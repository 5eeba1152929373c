"""A subscription write is answered only once the forwarders serving it have applied it (issue
11, the Pull-after-delete gap).

In a cluster of forwarders a call on a subscription may be answered by one forwarder while the
next call reaches another: a frontend sends a call on a name it has not routed yet to any
forwarder, and the next one, once routed, to the owner of the subscription's units. That owner
hears of a write made elsewhere from its ZooKeeper watch a moment later, so a Pull right after
DeleteSubscription could still be served there. So the forwarder that deleted or changed a
subscription (DeleteSubscription, UpdateSubscription, ModifyPushConfig, DetachSubscription)
asks, after its write and before it answers, every other forwarder serving the subscription to
catch up (``pubsubd.internal.v1.Forwarder/CatchUp``: a ZooKeeper sync, then every watch event it
delivered applied). Serving means owning one of its units ``s/{uid}/{source}``, as ZooKeeper has
the routes after the write (read after a sync, from their shards only) or as this process's
view has them (a forwarder losing the subscription serves until it reads the new route). A
forwarder that gains the subscription later catches up before it serves it
(``SubscriptionOwnership``, data/ownership.py), so no forwarder serves it unaware of a write
completed before its client was answered.

Only these admin writes pay for it (a sync and a few shard reads, one call per serving
forwarder); Pull, acks and streams do not. A forwarder that does not answer within
``CATCH_UP_TIMEOUT_S`` (gone, cut off; counted in ``unanswered``) or of an older release
(UNIMPLEMENTED) is passed over: it hears of the write from its watches, as before. The write
stands either way (it is durable before anyone is asked).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import grpc

from pubsubd._gen.pubsubd.internal.v1 import forwarder_pb2 as f
from pubsubd.control.routing_store import RoutingStore
from pubsubd.control.routing_table import subscribing_unit
from pubsubd.control.routing_views import RoutingView
from pubsubd.coordination.errors import CoordinationError
from pubsubd.core.deadlines import within
from pubsubd.core.internal_token import INTERNAL_TOKEN
from pubsubd.storage.metadata import SubscriptionRecord
from pubsubd.storage.node_client import new_channel

log = logging.getLogger(__name__)

__all__ = ["CATCH_UP_TIMEOUT_S", "ServingCatchUp"]

CATCH_UP = "/pubsubd.internal.v1.Forwarder/CatchUp"
PROTOCOL_VERSION = 4  # api/grpc/forwarder_service.py
# How long a write waits for the forwarders serving its subscription: a ZooKeeper sync and
# applying a few watch events take milliseconds; one that is gone must not hold the answer.
CATCH_UP_TIMEOUT_S = 5.0


class ServingCatchUp:
    """Asks the forwarders serving a subscription to catch up with a write to it."""

    def __init__(
        self,
        store: RoutingStore,
        view: RoutingView,
        forwarder_id: Callable[[], str],
        sources_of: Callable[[str], int],
    ) -> None:
        """``view``: this process's routing view (forwarders' addresses, routes as read);
        ``forwarder_id()``: this forwarder's (not asked); ``sources_of(topic_uid)``: how many
        publish message sources the topic has as known here (0: unknown)."""
        self._store = store
        self._view = view
        self._forwarder_id = forwarder_id
        self._sources_of = sources_of
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.asked = 0  # forwarders asked
        self.unanswered = 0  # of those, the ones that did not answer (or could not be asked)

    async def __call__(self, record: SubscriptionRecord) -> None:
        """Once every other forwarder serving ``record``'s subscription has applied every
        write completed before the call (or did not answer in time)."""
        try:
            await within(self._ask_serving(record), CATCH_UP_TIMEOUT_S)
        except TimeoutError:
            log.warning(
                "subscription %s: serving forwarders not caught up within %.0f s",
                record.name,
                CATCH_UP_TIMEOUT_S,
            )

    async def _ask_serving(self, record: SubscriptionRecord) -> None:
        sources = max(1, len(record.start_offsets), self._sources_of(record.topic_uid))
        units = [subscribing_unit(record.uid, source) for source in range(sources)]
        try:
            published = await self._store.current_routes(units)
        except CoordinationError as e:  # this view's routes only: ZooKeeper will tell them too
            log.debug("subscription %s: routes unread (%s)", record.name, e)
            published = {}
        owners = {route[0] for route in published.values() if route}
        owners |= {route[0] for route in map(self._view.route, units) if route}
        owners.discard(self._forwarder_id())
        if not owners:
            return
        addresses = await self._addresses(owners)
        self.asked += len(owners)
        self.unanswered += len(owners) - len(addresses)
        answers = await asyncio.gather(
            *(self._ask(address) for address in addresses), return_exceptions=True
        )
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, BaseException):
                self.unanswered += 1
                log.info(
                    "subscription %s: %s did not catch up (%s); it follows its watches",
                    record.name,
                    address,
                    answer,
                )

    async def _addresses(self, owners: Iterable[str]) -> list[str]:
        known = self._view.forwarders
        wanted = set(owners)
        if not wanted <= known.keys():  # registered since this view read them
            try:
                known = {f.forwarder_id: f for f in await self._store.forwarders()}
            except CoordinationError as e:
                log.debug("forwarders unread (%s)", e)
        return sorted(known[f].address for f in wanted if f in known)

    async def _ask(self, address: str) -> None:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = new_channel(address)
        call = channel.unary_unary(
            CATCH_UP,
            request_serializer=f.CatchUpRequest.SerializeToString,
            response_deserializer=f.CatchUpResponse.FromString,
        )
        try:
            await call(
                f.CatchUpRequest(protocol_version=PROTOCOL_VERSION),
                timeout=CATCH_UP_TIMEOUT_S,
                metadata=INTERNAL_TOKEN.metadata(),
            )
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:  # an older release: its watches tell it
                raise

    def status(self) -> dict[str, int]:
        return {"asked": self.asked, "unanswered": self.unanswered}

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
