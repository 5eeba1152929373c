"""Raw protobuf classes of google.pubsub.v1 from the official client package, plus gRPC paths.

``google-cloud-pubsub`` ships proto-plus wrappers; ``.pb()`` returns the C-backed (upb) class
behind each one. The benchmark's raw clients and the null server use these directly, independent
of pubsubd's own code.
"""

from __future__ import annotations

from typing import Any

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
StreamingPullRequest: Any = _t.StreamingPullRequest.pb()
StreamingPullResponse: Any = _t.StreamingPullResponse.pb()
Empty: Any = empty_pb2.Empty

PUBLISHER = "google.pubsub.v1.Publisher"
SUBSCRIBER = "google.pubsub.v1.Subscriber"
PUBLISH = f"/{PUBLISHER}/Publish"
STREAMING_PULL = f"/{SUBSCRIBER}/StreamingPull"
ACKNOWLEDGE = f"/{SUBSCRIBER}/Acknowledge"


def publish_request(topic: str, count: int, size: int) -> bytes:
    """A serialized PublishRequest of ``count`` messages of ``size`` data bytes each."""
    data = b"x" * size
    request = PublishRequest(topic=topic)
    request.messages.extend(PubsubMessage(data=data) for _ in range(count))
    return bytes(request.SerializeToString())
