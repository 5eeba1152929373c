"""Where a frontend sends a call (frontend/targets.py, pure): the resource read from the wire
bytes, and the forwarders in the order they are tried."""

from __future__ import annotations

import pytest

from pubsubd.control.routing_table import Forwarder, publishing_unit, subscribing_unit
from pubsubd.core import pb
from pubsubd.frontend.targets import resource_name, targets

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/t"
SUB = "projects/p/subscriptions/s"
FORWARDERS = {
    "a": Forwarder("a", "127.0.0.1:1", "z1"),
    "b": Forwarder("b", "127.0.0.1:2", "z2"),
    "c": Forwarder("c", "127.0.0.1:3", "z2"),
}


def test_the_resource_is_read_from_the_request_bytes() -> None:
    publish = pb.PublishRequest(
        topic=TOPIC,
        messages=[pb.PubsubMessage(data=b"x" * 100_000, attributes={"k": "v"}, ordering_key="o")],
    )
    pub = "/google.pubsub.v1.Publisher/"
    sub = "/google.pubsub.v1.Subscriber/"
    assert resource_name(pub + "Publish", publish.SerializeToString()) == ("topic", TOPIC)
    update = pb.UpdateTopicRequest(topic=pb.Topic(name=TOPIC, labels={"a": "b"}))
    update.update_mask.paths.append("labels")
    assert resource_name(pub + "UpdateTopic", update.SerializeToString()) == ("topic", TOPIC)
    pull = pb.StreamingPullRequest(subscription=SUB, stream_ack_deadline_seconds=10)
    assert resource_name(sub + "StreamingPull", pull.SerializeToString()) == ("subscription", SUB)
    ack = pb.AcknowledgeRequest(subscription=SUB, ack_ids=["1", "2"])
    assert resource_name(sub + "Acknowledge", ack.SerializeToString()) == ("subscription", SUB)
    # A creation goes where its sync point or cursors are: the topic's, the subscription's.
    create = pb.Subscription(name=SUB, topic=TOPIC)
    assert resource_name(sub + "CreateSubscription", create.SerializeToString()) == (
        "topic",
        TOPIC,
    )
    snapshot = pb.CreateSnapshotRequest(name="projects/p/snapshots/x", subscription=SUB)
    assert resource_name(sub + "CreateSnapshot", snapshot.SerializeToString()) == (
        "subscription",
        SUB,
    )
    # Not about one resource, or not readable: no name (the call goes to any forwarder).
    assert resource_name(pub + "CreateTopic", pb.Topic(name=TOPIC).SerializeToString()) is None
    assert resource_name(pub + "Publish", b"\xff\xff\xff") is None
    assert resource_name(pub + "Publish", b"") is None
    assert resource_name(pub + "Publish", b"\x0a\x05ab") is None  # cut short


def test_a_routed_resource_goes_to_its_list_and_anything_else_to_the_zone_first() -> None:
    routes = {publishing_unit("tu", 0): ("c", "a", "gone"), subscribing_unit("su", 0): ("b",)}

    def pick(resource: tuple[str, str] | None) -> list[str]:
        return [
            f.forwarder_id
            for f in targets(
                resource,
                topic_uids={TOPIC: "tu"},
                subscription_uids={SUB: "su"},
                route_of=lambda u: routes.get(u, ()),
                forwarders=FORWARDERS,
                zone="z2",
            )
        ]

    assert pick(("topic", TOPIC)) == ["c", "a"]  # unregistered ones left out
    assert pick(("subscription", SUB)) == ["b"]
    assert pick(None) == ["b", "c", "a"]  # the frontend's zone first
    assert pick(("topic", "projects/p/topics/new")) == ["b", "c", "a"]  # not routed yet


def test_the_owner_first_then_the_zone_s_fallbacks_and_drained_ones_last() -> None:
    more = {**FORWARDERS, "d": Forwarder("d", "127.0.0.1:4", "z2")}
    route = ("a", "b", "d", "c")  # owner a (z1), then the ring's order

    def pick(zone: str, drained: frozenset[str] = frozenset()) -> list[str]:
        return [
            f.forwarder_id
            for f in targets(
                ("topic", TOPIC),
                topic_uids={TOPIC: "tu"},
                subscription_uids={},
                route_of=lambda u: route,
                forwarders=more,
                zone=zone,
                drained=lambda f: f.forwarder_id in drained,
            )
        ]

    assert pick("z2") == ["a", "b", "d", "c"]  # the owner stays first in any zone
    assert pick("z1") == ["a", "b", "d", "c"]  # no other z1 fallback: ring order
    more["c"] = Forwarder("c", "127.0.0.1:3", "z1")
    assert pick("z1") == ["a", "c", "b", "d"]  # the z1 fallback first
    assert pick("z1", frozenset({"c"})) == ["a", "b", "d", "c"]  # drained: last
