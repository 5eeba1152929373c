"""Raw protobuf classes of google.pubsub.v1 from the official client package, plus gRPC paths.

``google-cloud-pubsub`` ships proto-plus wrappers; ``.pb()`` returns the C-backed (upb) class
behind each one. The benchmark's raw clients and the null server use these directly, independent
of pubsubd's own code.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import empty_pb2
from google.pubsub_v1 import types as _t

Topic: Any = _t.Topic.pb()
Subscription: Any = _t.Subscription.pb()
PubsubMessage: Any = _t.PubsubMessage.pb()
ReceivedMessage: Any = _t.ReceivedMessage.pb()
PublishRequest: Any = _t.PublishRequest.pb()
PublishResponse: Any = _t.PublishResponse.pb()
GetTopicRequest: Any = _t.GetTopicRequest.pb()
DeleteTopicRequest: Any = _t.DeleteTopicRequest.pb()
GetSubscriptionRequest: Any = _t.GetSubscriptionRequest.pb()
DeleteSubscriptionRequest: Any = _t.DeleteSubscriptionRequest.pb()
AcknowledgeRequest: Any = _t.AcknowledgeRequest.pb()
ModifyAckDeadlineRequest: Any = _t.ModifyAckDeadlineRequest.pb()
PullRequest: Any = _t.PullRequest.pb()
PullResponse: Any = _t.PullResponse.pb()
StreamingPullRequest: Any = _t.StreamingPullRequest.pb()
StreamingPullResponse: Any = _t.StreamingPullResponse.pb()
Empty: Any = empty_pb2.Empty

PUBLISHER = "google.pubsub.v1.Publisher"
SUBSCRIBER = "google.pubsub.v1.Subscriber"
PUBLISH = f"/{PUBLISHER}/Publish"
STREAMING_PULL = f"/{SUBSCRIBER}/StreamingPull"
ACKNOWLEDGE = f"/{SUBSCRIBER}/Acknowledge"


def subscriber_stubs(channel: grpc.aio.Channel) -> tuple[Any, Any]:
    """The raw StreamingPull and unary Acknowledge callables of ``channel``."""
    streaming_pull = channel.stream_stream(
        STREAMING_PULL,
        request_serializer=StreamingPullRequest.SerializeToString,
        response_deserializer=StreamingPullResponse.FromString,
    )
    acknowledge = channel.unary_unary(
        ACKNOWLEDGE,
        request_serializer=AcknowledgeRequest.SerializeToString,
        response_deserializer=Empty.FromString,
    )
    return streaming_pull, acknowledge


# Attribute sets of the feature workloads (bench/workloads.py), by message index in a request.
ATTRIBUTES: dict[str, Any] = {
    "": lambda i: {},
    # two attributes; "half" alternates, so the filter attributes.half = "yes" matches half
    "half": lambda i: {"half": "yes" if i % 2 else "no", "origin": "bench"},
    # delayed-delivery path, due at once
    "delay": lambda i: {"pubsubd.deliver_after": "0"},
    # waits in the delay index, then falls due while a stream is open
    "delay3": lambda i: {"pubsubd.deliver_after": "3"},
    # waits an hour: every message becomes a row of the on-disk delay index
    "delay3600": lambda i: {"pubsubd.deliver_after": "3600"},
}
HALF_FILTER = 'attributes.half = "yes"'


def publish_request(
    topic: str, count: int, size: int, attributes: str = "", ordering_key: str = ""
) -> bytes:
    """A serialized PublishRequest of ``count`` messages of ``size`` data bytes each, with the
    attribute set ``attributes`` (see ATTRIBUTES) and one ordering key for all of them."""
    data = b"x" * size
    attrs = ATTRIBUTES[attributes]
    request = PublishRequest(topic=topic)
    request.messages.extend(
        PubsubMessage(data=data, attributes=attrs(i), ordering_key=ordering_key)
        for i in range(count)
    )
    return bytes(request.SerializeToString())
