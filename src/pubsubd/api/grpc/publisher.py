"""google.pubsub.v1.Publisher servicer: topic admin and Publish, over the catalog and the router.

Publish receives the request's raw bytes (the method handler does not deserialize), validates a
parsed view of them and stores the raw bytes as one log entry, so a batch is never re-encoded.

Every admin call but CreateTopic (create-only wherever it runs) first applies what other
processes wrote before it (``Catalog.caught_up``): a cluster's forwarders share one catalog,
and a client reads its own writes back through whichever forwarder answers.
"""

from __future__ import annotations

import time
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError

from pubsubd.api.grpc.status import rpc, unary_method
from pubsubd.api.grpc.subscriber import AfterWrite, no_catch_up
from pubsubd.control.catalog import Catalog
from pubsubd.control.router import Routes
from pubsubd.control.snapshots import Snapshots
from pubsubd.control.update_retry import retry_update
from pubsubd.core import ids, names, pb, validation
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.errors import InvalidArgument, ResourceExhausted
from pubsubd.core.flow_control import MemoryBudget, PublishRate, RateLimiter
from pubsubd.observability import events, metrics, sli

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class PublisherServicer:
    def __init__(
        self,
        catalog: Catalog,
        snapshots: Snapshots,
        routes: Routes,
        clock: Clock = SYSTEM_CLOCK,
        inflight: MemoryBudget | None = None,
        after_write: AfterWrite = no_catch_up,
    ) -> None:
        """``after_write``: after DetachSubscription (api/grpc/subscriber.py)."""
        self.catalog = catalog
        self.after_write = after_write
        self.clock = clock
        self.snapshots = snapshots
        self.routes = routes
        # Flow control (core/flow_control.py): bytes of publishes waiting for storage, and
        # each rate-limited topic's buckets (by topic uid).
        self.inflight = inflight if inflight is not None else MemoryBudget(0)
        self._rates: dict[str, RateLimiter] = {}

    def _rate_limit(self, uid: str, rate: PublishRate | None, messages: int, size: int) -> None:
        if rate is None:
            self._rates.pop(uid, None)
            return
        limiter = self._rates.get(uid)
        if limiter is None or limiter.rate != rate:
            limiter = self._rates[uid] = RateLimiter(rate)
        over = limiter.admit(messages, size, time.monotonic())
        if over is not None:
            raise ResourceExhausted(f"topic publish rate quota exceeded: {over}")

    @rpc
    async def CreateTopic(self, request: Any, context: Context) -> Any:
        return self.catalog.create_topic(request)

    @rpc
    async def GetTopic(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.catalog.topic(request.topic).topic

    @rpc
    async def UpdateTopic(self, request: Any, context: Context) -> Any:
        if not request.HasField("topic"):
            raise InvalidArgument("topic: required")
        return await retry_update(
            self.catalog.caught_up,
            lambda: self.catalog.update_topic(request.topic, request.update_mask),
        )

    @rpc
    async def DeleteTopic(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        await self.catalog.delete_topic(request.topic)
        return pb.Empty()

    @rpc
    async def ListTopics(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        topics, token = self.catalog.list_topics(
            request.project, request.page_size, request.page_token
        )
        return pb.ListTopicsResponse(topics=topics, next_page_token=token)

    @rpc
    async def ListTopicSubscriptions(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        subs, token = self.catalog.list_topic_subscriptions(
            request.topic, request.page_size, request.page_token
        )
        return pb.ListTopicSubscriptionsResponse(subscriptions=subs, next_page_token=token)

    @rpc
    async def ListTopicSnapshots(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        snaps, token = self.snapshots.list_topic(
            request.topic, request.page_size, request.page_token
        )
        return pb.ListTopicSnapshotsResponse(snapshots=snaps, next_page_token=token)

    @rpc
    async def DetachSubscription(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        await self.snapshots.detach(request.subscription)
        entry = self.catalog.subscriptions.get(request.subscription)
        if entry is not None:  # the forwarders serving it catch up (api/grpc/subscriber.py)
            await self.after_write(entry.record)
        return pb.DetachSubscriptionResponse()

    @rpc
    async def Publish(self, raw: bytes, context: Context) -> Any:
        try:
            request = pb.PublishRequest.FromString(raw)
        except DecodeError:
            raise InvalidArgument("request: not a valid PublishRequest") from None
        names.topic(request.topic)
        sli.PUBLISH_TOPIC.set(request.topic)
        entry = self.catalog.topic(request.topic)
        validation.publish_request(request, len(raw), raw, now_s=self.clock.time_us() / 1e6)
        if entry.schema_settings is not None:  # topics without a schema skip this
            raw = self._conform(entry.schema_settings, request)
        uid = entry.record.uid
        publishing = self.routes.publishing(uid)
        blocked = publishing.publish_blocked(uid)  # a block_publishers backlog quota
        if blocked is not None:
            raise ResourceExhausted(blocked)
        count = len(request.messages)
        self._rate_limit(uid, entry.publish_rate, count, len(raw))
        if not self.inflight.acquire(len(raw)):
            raise ResourceExhausted(
                f"the server holds {self.inflight.used} bytes of publishes waiting for storage "
                f"(bound {self.inflight.limit}, PUBSUBD_MAX_INFLIGHT_PUBLISH_BYTES); retry later"
            )
        started = time.perf_counter()
        try:
            # Validated: every message has the first one's ordering key (one entry, one source).
            key = request.messages[0].ordering_key
            source, base = await publishing.publish(uid, raw, count, ordering_key=key)
        except Exception:
            events.record_publish(request.topic, (time.perf_counter() - started) * 1e3, ok=False)
            raise
        finally:
            self.inflight.release(len(raw))
        elapsed = time.perf_counter() - started
        metrics.PUBLISH_LATENCY.observe(elapsed)
        events.record_publish(request.topic, elapsed * 1e3)
        metrics.PUBLISHED_MESSAGES.inc(count)
        metrics.PUBLISHED_BYTES.inc(len(raw))
        first = ids.position(source, base)
        return pb.PublishResponse(message_ids=[str(first + i) for i in range(count)])

    def _conform(self, settings: Any, request: Any) -> bytes:
        """The batch as stored: every message checked against the topic's schema and stamped
        with Google's attributes (a message that conforms to no revision fails it whole)."""
        self.catalog.schemas.conform(settings, request.messages)
        serialized: bytes = request.SerializeToString()
        return serialized


def handlers(servicer: PublisherServicer) -> grpc.GenericRpcHandler:
    unary = unary_method
    s = servicer
    return grpc.method_handlers_generic_handler(
        "google.pubsub.v1.Publisher",
        {
            "CreateTopic": unary(s.CreateTopic, pb.Topic, pb.Topic),
            "GetTopic": unary(s.GetTopic, pb.GetTopicRequest, pb.Topic),
            "UpdateTopic": unary(s.UpdateTopic, pb.UpdateTopicRequest, pb.Topic),
            "DeleteTopic": unary(s.DeleteTopic, pb.DeleteTopicRequest, pb.Empty),
            "ListTopics": unary(s.ListTopics, pb.ListTopicsRequest, pb.ListTopicsResponse),
            "ListTopicSubscriptions": unary(
                s.ListTopicSubscriptions,
                pb.ListTopicSubscriptionsRequest,
                pb.ListTopicSubscriptionsResponse,
            ),
            "ListTopicSnapshots": unary(
                s.ListTopicSnapshots, pb.ListTopicSnapshotsRequest, pb.ListTopicSnapshotsResponse
            ),
            "DetachSubscription": unary(
                s.DetachSubscription, pb.DetachSubscriptionRequest, pb.DetachSubscriptionResponse
            ),
            # Raw bytes in: the batch is stored exactly as received.
            "Publish": unary(s.Publish, None, pb.PublishResponse),
        },
    )
