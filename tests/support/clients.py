"""Steps with the official clients that many test modules take: create a topic with its
subscriptions, publish and wait for the message IDs, pull, pull until enough came, and an
instant that falls between two publishes.

``clients`` is the ``(PublisherClient, SubscriberClient)`` pair of the ``clients`` fixture
(tests/conftest.py); ``names`` the ``names`` fixture.
"""

from __future__ import annotations

import time
from typing import Any

from google.cloud import pubsub_v1

from tests.support.server import wait_for


def setup(clients: Any, names: Any, *subscriptions: str, **fields: Any) -> tuple[str, str]:
    """A new topic and subscriptions to it (default: ``names.subscription()``), each created
    with the Subscription ``fields``; returns the topic and the first subscription."""
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    subscriptions = subscriptions or (names.subscription(),)
    for name in subscriptions:
        sub.create_subscription(request={"name": name, "topic": topic, **fields})
    return topic, subscriptions[0]


def publish(pub: pubsub_v1.PublisherClient, topic: str, *datas: bytes, **attrs: str) -> list[str]:
    """Publish every payload (with the same attributes) and wait: the message IDs in order."""
    futures = [pub.publish(topic, d, **attrs) for d in datas]
    return [f.result(timeout=60) for f in futures]


def pull(
    sub: pubsub_v1.SubscriberClient, name: str, wait_s: float = 2.0, max_messages: int = 1000
) -> list[Any]:
    """One long-poll Pull; the server answers (maybe empty) about 1 s before ``wait_s + 1``."""
    resp = sub.pull(
        request={"subscription": name, "max_messages": max_messages}, timeout=wait_s + 1
    )
    return list(resp.received_messages)


def pull_until(
    sub: pubsub_v1.SubscriberClient,
    name: str,
    count: int,
    *,
    ack: bool = False,
    timeout: float = 20.0,
    max_messages: int = 1000,
) -> list[Any]:
    """Pull (acking each response if ``ack``) until at least ``count`` messages came; every
    received message, in order. Fails after ``timeout`` seconds."""
    got: list[Any] = []
    if count <= 0:
        return got

    def more() -> bool:
        msgs = pull(sub, name, 2.0, max_messages)
        if ack and msgs:
            sub.acknowledge(request={"subscription": name, "ack_ids": [m.ack_id for m in msgs]})
        got.extend(msgs)
        return len(got) >= count

    wait_for(more, timeout, f"{count} messages on {name}")
    return got


def instant_between_publishes(margin_s: float = 0.002) -> float:
    """A wall-clock time after every publish answered so far and before every publish sent
    after this returns, by ``margin_s`` on each side (readers compare publish times to the
    millisecond at worst; the server shares this machine's clock). Waits that long for the
    clock instead of sleeping a fixed time."""
    boundary = time.time() + margin_s
    wait_for(lambda: time.time() >= boundary + margin_s, 5, "the clock to pass the boundary")
    return boundary
