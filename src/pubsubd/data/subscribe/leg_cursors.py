"""A snapshot of a spread subscription, with every source's position as of now.

A spread subscription is served by several subscribing forwarders, each for some of its
sources (*Spread subscriptions* in ARCHITECTURE.md); each one's dispatcher knows the acks of
its own sources and, of the others, only what it read when it attached. CreateSnapshot is
answered by one of them, so before the snapshot is written it asks each forwarder serving the
other sources for their positions (``pubsubd.internal.v1.Forwarder/SubscriptionCursors``,
answered from that forwarder's dispatcher: every ack it received, sent to the topic's owner or
not yet) and takes each source's state from the forwarder that serves it. A forwarder that does
not answer (gone, moving, an older release) leaves its sources as this one knows them: the
snapshot then redelivers more after a Seek to it, never less.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import grpc

from pubsubd._gen.pubsubd.internal.v1 import forwarder_pb2 as f
from pubsubd.core.internal_token import INTERNAL_TOKEN
from pubsubd.core.records import CursorState
from pubsubd.storage.node_client import new_channel

log = logging.getLogger(__name__)

__all__ = ["LegCursors"]

SUBSCRIPTION_CURSORS = "/pubsubd.internal.v1.Forwarder/SubscriptionCursors"
PROTOCOL_VERSION = 3  # api/grpc/forwarder_service.py
CALL_TIMEOUT_S = 10.0


class LegCursors:
    """Asks the other forwarders of a spread subscription for their sources' positions."""

    def __init__(
        self,
        served_sources: Callable[[str], frozenset[int] | None],
        owner_address: Callable[[str, int], str | None],
    ) -> None:
        """``served_sources(uid)``: the sources of a spread subscription served here (None:
        served whole); ``owner_address(uid, source)``: the address of the forwarder the
        published routes give that source of the subscription."""
        self._served_sources = served_sources
        self._owner_address = owner_address
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.asked = 0  # forwarders asked
        self.unanswered = 0  # of those, the ones that did not answer

    async def gather(
        self, subscription_uid: str, name: str, states: Mapping[int, CursorState]
    ) -> dict[int, CursorState]:
        """``states`` (this forwarder's view of every source) with the sources served
        elsewhere replaced by what their forwarders hold now."""
        out = dict(states)
        served = self._served_sources(subscription_uid)
        if served is None:
            return out
        by_address: dict[str, set[int]] = {}
        for source in states:
            if source in served:
                continue
            address = self._owner_address(subscription_uid, source)
            if address is not None:
                by_address.setdefault(address, set()).add(source)
        answers = await asyncio.gather(
            *(self._ask(address, name) for address in by_address), return_exceptions=True
        )
        for (address, wanted), answer in zip(by_address.items(), answers, strict=True):
            self.asked += 1
            if isinstance(answer, BaseException):
                self.unanswered += 1
                log.warning(
                    "snapshot of %s: sources %s as known here (%s did not answer: %s)",
                    name,
                    sorted(wanted),
                    address,
                    answer,
                )
                continue
            for source, state in answer.items():
                if source in wanted:
                    out[source] = state
        return out

    async def _ask(self, address: str, name: str) -> dict[int, CursorState]:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = new_channel(address)
        call = channel.unary_unary(
            SUBSCRIPTION_CURSORS,
            request_serializer=f.SubscriptionCursorsRequest.SerializeToString,
            response_deserializer=f.SubscriptionCursorsResponse.FromString,
        )
        response: f.SubscriptionCursorsResponse = await call(
            f.SubscriptionCursorsRequest(protocol_version=PROTOCOL_VERSION, subscription=name),
            timeout=CALL_TIMEOUT_S,
            metadata=INTERNAL_TOKEN.metadata(),
        )
        out = {}
        for cursor in response.cursors:
            bounds = list(cursor.ranges)
            if len(bounds) % 2:
                raise ValueError(f"source {cursor.source}: an odd number of range bounds")
            pairs = tuple((bounds[i], bounds[i + 1]) for i in range(0, len(bounds), 2))
            if any(start >= end for start, end in pairs):
                raise ValueError(f"source {cursor.source}: an empty or inverted range")
            out[cursor.source] = CursorState(cursor.mark_delete, pairs)
        return out

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
