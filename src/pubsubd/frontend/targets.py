"""Where a frontend sends a call (pure): the resource a google.pubsub.v1 request names, read
from its wire bytes without decoding the rest (a Publish carries megabytes of payload), and the
ordered forwarders that serve it.

* Calls on one topic (Publish, GetTopic, UpdateTopic, DeleteTopic, ListTopicSubscriptions,
  ListTopicSnapshots, CreateSubscription by the topic it names, the replay API's calls and
  SkipDamagedRanges) go to the owner of the topic's first publish message source,
  ``p/{uid}/0``, then its fallbacks: those of the frontend's zone first, drained ones last
  (SCALE_OUT.md §3: the nearest first, the next zone when none there is healthy).
* Calls on one subscription (Pull, StreamingPull's first request, Acknowledge,
  ModifyAckDeadline, GetSubscription, UpdateSubscription, DeleteSubscription,
  ModifyPushConfig, Seek, the replay API's SeekOffsets, CreateSnapshot by the subscription it
  names) go to the owner of
  ``s/{uid}/0``, then its fallbacks.
* Everything else (topic creation, lists, other snapshot calls, schemas, IAM), and a name no
  route knows yet (just created, not routed), goes to any forwarder: those of the frontend's
  zone first, then the others, drained ones last, each group by ID.

Forwarders that are not registered are left out of every list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pubsubd.control.routing_table import Forwarder, publishing_unit, subscribing_unit
from pubsubd.core.wire import read_varint

__all__ = ["SUBSCRIPTION_METHODS", "TOPIC_METHODS", "resource_name", "targets"]

PUBLISHER = "/google.pubsub.v1.Publisher/"
SUBSCRIBER = "/google.pubsub.v1.Subscriber/"
REPLAY = "/pubsubd.v1.Replay/"
ADMIN = "/pubsubd.v1.Admin/"

# Method -> the path of field numbers to the resource name (each a length-delimited field).
TOPIC_METHODS: dict[str, tuple[int, ...]] = {
    PUBLISHER + "Publish": (1,),
    PUBLISHER + "GetTopic": (1,),
    PUBLISHER + "UpdateTopic": (1, 1),  # UpdateTopicRequest.topic.name
    PUBLISHER + "DeleteTopic": (1,),
    PUBLISHER + "ListTopicSubscriptions": (1,),
    PUBLISHER + "ListTopicSnapshots": (1,),
    SUBSCRIBER + "CreateSubscription": (2,),  # Subscription.topic: its sync point is there
    **{
        REPLAY + m: (1,)
        for m in (
            "GetTopicRanges",
            "LookupOffsets",
            "Read",
            "GetCursor",
            "CommitCursor",
            "PublishDeduplicated",
            "ListCursors",
            "DeleteCursor",
        )
    },
    ADMIN + "ListDamagedRanges": (1,),  # empty (every topic): any forwarder
    ADMIN + "SkipDamagedRanges": (1,),
}
SUBSCRIPTION_METHODS: dict[str, tuple[int, ...]] = {
    SUBSCRIBER + "Pull": (1,),
    SUBSCRIBER + "StreamingPull": (1,),
    SUBSCRIBER + "Acknowledge": (1,),
    SUBSCRIBER + "ModifyAckDeadline": (1,),
    SUBSCRIBER + "GetSubscription": (1,),
    SUBSCRIBER + "UpdateSubscription": (1, 1),  # UpdateSubscriptionRequest.subscription.name
    SUBSCRIBER + "DeleteSubscription": (1,),
    SUBSCRIBER + "ModifyPushConfig": (1,),
    SUBSCRIBER + "Seek": (1,),
    SUBSCRIBER + "CreateSnapshot": (2,),  # CreateSnapshotRequest.subscription
    REPLAY + "SeekOffsets": (1,),  # SeekOffsetsRequest.subscription
    # A REST Pull response its client never got (api/rest/front.py): GiveBackRequest.subscription
    "/pubsubd.internal.v1.Forwarder/GiveBack": (2,),
}


def _field(data: bytes, number: int) -> bytes | None:
    """The first length-delimited field ``number`` of a serialized message, else None."""
    at = 0
    while at < len(data):
        tag = read_varint(data, at)
        if tag is None:
            return None
        key, at = tag
        wire = key & 7
        if wire == 0:
            skipped = read_varint(data, at)
            if skipped is None:
                return None
            at = skipped[1]
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            length = read_varint(data, at)
            if length is None:
                return None
            size, at = length
            if key >> 3 == number:
                return data[at : at + size] if at + size <= len(data) else None
            at += size
        else:
            return None  # groups: not in these messages
    return None


def resource_name(method: str, request: bytes) -> tuple[str, str] | None:
    """``("topic" | "subscription", name)`` a request of ``method`` is about, else None."""
    for kind, methods in (("topic", TOPIC_METHODS), ("subscription", SUBSCRIPTION_METHODS)):
        path = methods.get(method)
        if path is None:
            continue
        value: bytes | None = request
        for number in path:
            value = _field(value, number) if value is not None else None
        if not value:
            return None
        try:
            return kind, value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def targets(
    resource: tuple[str, str] | None,
    *,
    topic_uids: Mapping[str, str],
    subscription_uids: Mapping[str, str],
    route_of: Callable[[str], Sequence[str]],
    forwarders: Mapping[str, Forwarder],
    zone: str,
    drained: Callable[[Forwarder], bool] = lambda _: False,
) -> list[Forwarder]:
    """The forwarders to try for a call on ``resource``, best first (see the module)."""
    route: Sequence[str] = ()
    if resource is not None:
        kind, name = resource
        if kind == "topic" and name in topic_uids:
            route = route_of(publishing_unit(topic_uids[name], 0))
        elif kind == "subscription" and name in subscription_uids:
            route = route_of(subscribing_unit(subscription_uids[name], 0))
    listed = [forwarders[f] for f in route if f in forwarders]
    if listed:
        # The owner first wherever it is (a source has one writer); of the fallbacks, those
        # in the frontend's zone first, drained ones last, each group in the route's order.
        head, *rest = listed
        return [head, *sorted(rest, key=lambda f: (drained(f), f.zone != zone))]
    return sorted(forwarders.values(), key=lambda f: (drained(f), f.zone != zone, f.forwarder_id))
