"""pubsubd.internal.v1.Forwarder servicer: what frontends ask of a forwarder beyond the
google.pubsub.v1 calls they pass through, and who serves here for a router or a forwarder that
suspects this process dead (proto/pubsubd/internal/v1/forwarder.proto)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import grpc

from pubsubd._gen.pubsubd.internal.v1 import forwarder_pb2 as f
from pubsubd.api.grpc.status import rpc, unary_method
from pubsubd.control.catalog import Catalog
from pubsubd.control.router import Routes
from pubsubd.core import names
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.release import version

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

SERVICE = "pubsubd.internal.v1.Forwarder"
GIVE_BACK = f"/{SERVICE}/GiveBack"
IDENTIFY = f"/{SERVICE}/Identify"
SUBSCRIPTION_CURSORS = f"/{SERVICE}/SubscriptionCursors"
CATCH_UP = f"/{SERVICE}/CatchUp"
# 1: GiveBack. 2: Identify. 3: SubscriptionCursors. 4: CatchUp. A request of a newer version is
# served as far as this one understands it.
PROTOCOL_VERSION = 4


class ForwarderServicer:
    def __init__(
        self,
        catalog: Catalog,
        routes: Routes,
        session_id: Callable[[], int | None] = lambda: None,
        forwarder_id: Callable[[], str] = lambda: "",
        served_sources: Callable[[str], frozenset[int] | None] = lambda _uid: None,
    ) -> None:
        """``served_sources(uid)``: the sources of a spread subscription served here (None:
        served whole, or not spread)."""
        self.catalog = catalog
        self.routes = routes
        self._session_id = session_id
        self._forwarder_id = forwarder_id
        self._served_sources = served_sources

    @rpc
    async def GiveBack(self, request: Any, context: Context) -> Any:
        names.subscription(request.subscription)
        if not request.protocol_version:
            raise InvalidArgument("protocol_version: required")
        uid = self.catalog.subscription(request.subscription).record.uid
        back = self.routes.subscribing(uid).give_back(request.subscription, list(request.ack_ids))
        return f.GiveBackResponse(given_back=back)

    @rpc
    async def Identify(self, request: Any, context: Context) -> Any:
        return f.IdentifyResponse(
            protocol_version=PROTOCOL_VERSION,
            session_id=self._session_id() or 0,
            forwarder_id=self._forwarder_id(),
            version=version(),
        )

    @rpc
    async def SubscriptionCursors(self, request: Any, context: Context) -> Any:
        names.subscription(request.subscription)
        if not request.protocol_version:
            raise InvalidArgument("protocol_version: required")
        uid = self.catalog.subscription(request.subscription).record.uid
        states = self.routes.subscribing(uid).cursor_states(request.subscription)
        served = self._served_sources(uid)
        return f.SubscriptionCursorsResponse(
            cursors=[
                f.SourceCursor(
                    source=source,
                    mark_delete=state.mark_delete,
                    ranges=[bound for pair in state.ranges for bound in pair],
                )
                for source, state in sorted(states.items())
                if served is None or source in served
            ]
        )

    @rpc
    async def CatchUp(self, request: Any, context: Context) -> Any:
        """Answered once every metadata change completed before the call is applied here
        (``Catalog.caught_up``; api/grpc/serving_catch_up.py asks it)."""
        await self.catalog.caught_up()
        return f.CatchUpResponse()


def handlers(servicer: ForwarderServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GiveBack": unary_method(servicer.GiveBack, f.GiveBackRequest, f.GiveBackResponse),
            "Identify": unary_method(servicer.Identify, f.IdentifyRequest, f.IdentifyResponse),
            "SubscriptionCursors": unary_method(
                servicer.SubscriptionCursors,
                f.SubscriptionCursorsRequest,
                f.SubscriptionCursorsResponse,
            ),
            "CatchUp": unary_method(servicer.CatchUp, f.CatchUpRequest, f.CatchUpResponse),
        },
    )
