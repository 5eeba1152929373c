"""The gRPC calls the Pulsar front makes to this process's own API (asyncio).

One channel per server; every Pulsar command that touches topics, subscriptions or messages
becomes one of these calls, so the Pub/Sub API's rules (validation, quotas, dedup, delivery,
leases, subscription types) apply unchanged. gRPC errors become PulsarError (errors.py).

With authentication on, each connection's calls carry the token its CONNECT presented
(:meth:`Gateway.as_caller`: the same channel, the token as ``authorization`` metadata), so the
gRPC handlers check it, and run as that caller, as for any other client; a refreshed token
replaces it for the calls that follow (:meth:`Gateway.use_token`). A StreamingPull is
authenticated when it opens.

Publishes can skip the loopback hop: in a server whose gRPC port checks no caller (no tokens,
no IAM), ``app.py`` hands the gateway the PublishDeduplicated method's own work
(``ReplayServicer.publish_in_process``), which :meth:`Gateway.publish` calls with the same
request bytes instead of the RPC: the same checks, dedup window and storage, and the same
status (mapped by errors.py), without the HTTP/2 round trip (a one-message SEND's receipt
waited ~1 ms more for it). A view with a caller's token (``as_caller``) always calls the RPC.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import grpc
from google.protobuf import timestamp_pb2

from pubsubd._gen.pubsubd.v1 import replay_pb2
from pubsubd.api.grpc.status import to_status
from pubsubd.core import active_notices, pb
from pubsubd.core.dedup_batches import encode_request
from pubsubd.core.errors import PubsubError
from pubsubd.pulsar import errors
from pubsubd.pulsar.messages import OutMessage

# PublishDeduplicated in this process: request bytes -> (message IDs, duplicates); raises
# PubsubError as the method answers.
PublishInProcess: TypeAlias = Callable[[bytes], Awaitable[tuple[list[str], int]]]

_PUBLISHER = "/google.pubsub.v1.Publisher/"
_SUBSCRIBER = "/google.pubsub.v1.Subscriber/"
_REPLAY = "/pubsubd.v1.Replay/"
_SCHEMAS = "/google.pubsub.v1.SchemaService/"
_OPTIONS = [
    ("grpc.max_send_message_length", 32 * 1024 * 1024),
    ("grpc.max_receive_message_length", 32 * 1024 * 1024),
]


class Gateway:
    def __init__(self, address: str, publish_in_process: PublishInProcess | None = None) -> None:
        self.channel = grpc.aio.insecure_channel(address, options=_OPTIONS)
        self.metadata: tuple[tuple[str, str], ...] | None = None  # sent with every call
        self.publish_in_process = publish_in_process  # None: publish through the RPC
        ch = self.channel
        self._create_topic = ch.unary_unary(
            _PUBLISHER + "CreateTopic", pb.Topic.SerializeToString, pb.Topic.FromString
        )
        self._list_topics = ch.unary_unary(
            _PUBLISHER + "ListTopics",
            pb.ListTopicsRequest.SerializeToString,
            pb.ListTopicsResponse.FromString,
        )
        self._get_topic = ch.unary_unary(
            _PUBLISHER + "GetTopic", pb.GetTopicRequest.SerializeToString, pb.Topic.FromString
        )
        self._publish = ch.unary_unary(  # requests as bytes (publish_request)
            _REPLAY + "PublishDeduplicated",
            None,
            replay_pb2.PublishDeduplicatedResponse.FromString,
        )
        self._seek_offsets = ch.unary_unary(
            _REPLAY + "SeekOffsets",
            replay_pb2.SeekOffsetsRequest.SerializeToString,
            replay_pb2.SeekOffsetsResponse.FromString,
        )
        self._lookup_offsets = ch.unary_unary(
            _REPLAY + "LookupOffsets",
            replay_pb2.LookupOffsetsRequest.SerializeToString,
            replay_pb2.LookupOffsetsResponse.FromString,
        )
        self._ranges = ch.unary_unary(
            _REPLAY + "GetTopicRanges",
            replay_pb2.GetTopicRangesRequest.SerializeToString,
            replay_pb2.GetTopicRangesResponse.FromString,
        )
        self._create_sub = ch.unary_unary(
            _SUBSCRIBER + "CreateSubscription",
            pb.Subscription.SerializeToString,
            pb.Subscription.FromString,
        )
        self._get_sub = ch.unary_unary(
            _SUBSCRIBER + "GetSubscription",
            pb.GetSubscriptionRequest.SerializeToString,
            pb.Subscription.FromString,
        )
        self._delete_sub = ch.unary_unary(
            _SUBSCRIBER + "DeleteSubscription",
            pb.DeleteSubscriptionRequest.SerializeToString,
            pb.Empty.FromString,
        )
        self._modack = ch.unary_unary(
            _SUBSCRIBER + "ModifyAckDeadline",
            pb.ModifyAckDeadlineRequest.SerializeToString,
            pb.Empty.FromString,
        )
        self._seek = ch.unary_unary(
            _SUBSCRIBER + "Seek", pb.SeekRequest.SerializeToString, pb.SeekResponse.FromString
        )
        self._get_schema = ch.unary_unary(
            _SCHEMAS + "GetSchema", pb.GetSchemaRequest.SerializeToString, pb.Schema.FromString
        )
        self.streaming_pull = ch.stream_stream(
            _SUBSCRIBER + "StreamingPull",
            pb.StreamingPullRequest.SerializeToString,
            _stream_response,
        )

    async def close(self) -> None:
        await self.channel.close()

    def as_caller(self, token: str) -> Gateway:
        """This gateway (its channel) making every call with ``token`` as its credentials."""
        view = copy.copy(self)
        view.publish_in_process = None  # a caller's calls are checked by the gRPC port
        view.use_token(token)
        return view

    def use_token(self, token: str) -> None:
        """Make every later call of this view with ``token`` (a Pulsar connection's refreshed
        credentials: its producers and consumers share the view, so they all switch)."""
        self.metadata = (("authorization", f"Bearer {token}"),)

    async def get_topic(self, topic: str) -> Any | None:
        """The topic, None when it does not exist."""
        try:
            return await self._get_topic(pb.GetTopicRequest(topic=topic), metadata=self.metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise errors.from_rpc_error(e) from e
        return None

    async def list_topics(self, project: str) -> list[str]:
        """The names of every topic of ``project`` (``projects/P``), every page."""
        names: list[str] = []
        token = ""
        while True:
            request = pb.ListTopicsRequest(project=project, page_size=1000, page_token=token)
            try:
                response = await self._list_topics(request, metadata=self.metadata)
            except grpc.aio.AioRpcError as e:
                raise errors.from_rpc_error(e) from e
            names += [t.name for t in response.topics]
            token = response.next_page_token
            if not token:
                return names

    async def get_schema(self, name: str) -> Any:
        """GetSchema (``name`` or ``name@revision``), its definition included."""
        try:
            return await self._get_schema(pb.GetSchemaRequest(name=name), metadata=self.metadata)
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from e

    async def ensure_topic(self, topic: str) -> Any:
        """Pulsar creates topics on first use: get the topic, create it when missing."""
        found = await self.get_topic(topic)
        if found is not None:
            return found
        try:
            return await self._create_topic(pb.Topic(name=topic), metadata=self.metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise errors.from_rpc_error(e) from e
        return await self.ensure_topic(topic)

    async def publish(
        self, topic: str, messages: Sequence[OutMessage], source: int | None = None
    ) -> list[str]:
        """PublishDeduplicated: the message IDs in order (the original ID for a duplicate);
        ``source``: into that publish message source (a partition's producer)."""
        request = publish_request(topic, messages, source)
        if self.publish_in_process is not None:
            try:
                message_ids, _ = await self.publish_in_process(request)
            except PubsubError as e:
                raise errors.from_status(to_status(e)[0], str(e)) from e
            return message_ids
        try:
            response = await self._publish(request, metadata=self.metadata)
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from e
        return list(response.message_ids)

    async def topic_ranges(self, topic: str) -> Any:
        try:
            return await self._ranges(
                replay_pb2.GetTopicRangesRequest(topic=topic), metadata=self.metadata
            )
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from e

    async def get_or_create_subscription(
        self, subscription: str, topic: str, labels: dict[str, str]
    ) -> tuple[Any, bool]:
        """The subscription, created on ``topic`` with ``labels`` when missing; (it, created)."""
        try:
            return await self._get_sub(
                pb.GetSubscriptionRequest(subscription=subscription), metadata=self.metadata
            ), False
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise errors.from_rpc_error(e, subscription=True) from e
        request = pb.Subscription(
            name=subscription, topic=topic, labels=labels, ack_deadline_seconds=60
        )
        try:
            return await self._create_sub(request, metadata=self.metadata), True
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.ALREADY_EXISTS:  # a concurrent subscribe won
                return await self.get_or_create_subscription(subscription, topic, labels)
            raise errors.from_rpc_error(e, subscription=True) from e

    async def delete_subscription(self, subscription: str) -> None:
        try:
            await self._delete_sub(
                pb.DeleteSubscriptionRequest(subscription=subscription), metadata=self.metadata
            )
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e, subscription=True) from e

    async def nack(self, subscription: str, ack_ids: list[str]) -> None:
        """ModifyAckDeadline(0): redeliver now (a stream that ended keeps what it was sent)."""
        for start in range(0, len(ack_ids), 2500):
            request = pb.ModifyAckDeadlineRequest(
                subscription=subscription,
                ack_ids=ack_ids[start : start + 2500],
                ack_deadline_seconds=0,
            )
            try:
                await self._modack(request, metadata=self.metadata)
            except grpc.aio.AioRpcError as e:
                raise errors.from_rpc_error(e, subscription=True) from e

    async def seek_offsets(self, subscription: str, offsets: dict[int, int]) -> None:
        try:
            await self._seek_offsets(
                replay_pb2.SeekOffsetsRequest(subscription=subscription, offsets=offsets),
                metadata=self.metadata,
            )
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e, subscription=True) from e

    async def offsets_for_time(self, topic: str, millis: int) -> dict[int, int]:
        """Per source, the first offset published at or after ``millis``."""
        ts = timestamp_pb2.Timestamp(seconds=millis // 1000, nanos=(millis % 1000) * 1_000_000)
        try:
            found = await self._lookup_offsets(
                replay_pb2.LookupOffsetsRequest(topic=topic, time=ts), metadata=self.metadata
            )
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from e
        return dict(found.offsets)

    async def seek_time(self, subscription: str, millis: int) -> None:
        ts = timestamp_pb2.Timestamp(seconds=millis // 1000, nanos=(millis % 1000) * 1_000_000)
        try:
            await self._seek(
                pb.SeekRequest(subscription=subscription, time=ts), metadata=self.metadata
            )
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e, subscription=True) from e


def _stream_response(raw: bytes) -> Any:
    """A StreamingPullResponse, or the failover notice (an ActiveNotice) a stream that asked
    for them is sent (core/active_notices.py)."""
    active = active_notices.decode(raw)
    if active is not None:
        return active_notices.ActiveNotice(active)
    return pb.StreamingPullResponse.FromString(raw)


def publish_request(topic: str, messages: Sequence[OutMessage], source: int | None) -> bytes:
    """A PublishDeduplicatedRequest's bytes. Messages that are a dedup ID and data only (a
    Pulsar message without properties, keys or times) are spliced together without a
    message object each (``encode_request``: the flat form the server reads back the same
    way); any other request is built with protobuf."""
    if not any(m.attributes or m.ordering_key for m in messages):
        return encode_request(
            topic, [m.dedup_id.encode() for m in messages], [m.data for m in messages], source
        )
    request = replay_pb2.PublishDeduplicatedRequest(
        topic=topic,
        messages=[
            replay_pb2.DeduplicatedMessage(
                dedup_id=m.dedup_id,
                data=m.data,
                attributes=m.attributes,
                ordering_key=m.ordering_key,
            )
            for m in messages
        ],
    )
    if source is not None:
        request.source = source
    return bytes(request.SerializeToString())


async def requests_from(queue: Any) -> AsyncIterator[Any]:
    """A StreamingPull request iterator over an asyncio.Queue (None ends the stream)."""
    while True:
        item = await queue.get()
        if item is None:
            return
        yield item
