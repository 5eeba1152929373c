"""Dead-letter forwarding: the message a failing delivery becomes on the dead-letter topic (pure).

After ``max_delivery_attempts`` deliveries, the next failure republishes the message to the
subscription's dead-letter topic as a new message (new message ID) with the original data,
attributes and ordering key plus Google's ``CloudPubSubDeadLetter*`` attributes, then acks it on
the source subscription (docs/GOOGLE_API.md §7.4).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pubsubd.core import pb


def should_dead_letter(subscription: Any, deliveries: int) -> bool:
    policy = subscription.dead_letter_policy
    return bool(
        subscription.HasField("dead_letter_policy")
        and policy.dead_letter_topic
        and deliveries >= policy.max_delivery_attempts
    )


def _rfc3339(seconds: int, nanos: int) -> str:
    t = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).replace(microsecond=nanos // 1000)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{nanos // 1_000_000:03d}Z"


def dead_letter_request(
    subscription_name: str, message: Any, deliveries: int, dead_letter_topic: str
) -> bytes:
    """A serialized PublishRequest carrying ``message`` to the dead-letter topic."""
    _, project, _, sub_id = subscription_name.split("/", 3)
    out = pb.PubsubMessage(data=message.data, ordering_key=message.ordering_key)
    out.attributes.update(message.attributes)
    out.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] = str(deliveries)
    out.attributes["CloudPubSubDeadLetterSourceSubscription"] = sub_id
    out.attributes["CloudPubSubDeadLetterSourceSubscriptionProject"] = project
    out.attributes["CloudPubSubDeadLetterSourceTopicPublishTime"] = _rfc3339(
        message.publish_time.seconds, message.publish_time.nanos
    )
    return bytes(pb.PublishRequest(topic=dead_letter_topic, messages=[out]).SerializeToString())
