"""Retry backoff, dead-letter topics, message ordering and exactly-once delivery, end to end."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.protobuf import duration_pb2

from tests.conftest import make_publisher
from tests.support.clients import setup
from tests.support.server import ServerProcess, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]


def _pull_one(sub: Any, name: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = sub.pull(subscription=name, max_messages=1, timeout=timeout)
        if resp.received_messages:
            return resp.received_messages[0]
    raise AssertionError(f"no message on {name} within {timeout}s")


def test_retry_policy_backs_off_after_nack(clients: Any, names: Any) -> None:
    pub, sub = clients
    backoff = {
        "minimum_backoff": duration_pb2.Duration(seconds=2),
        "maximum_backoff": duration_pb2.Duration(seconds=4),
    }
    topic, name = setup(clients, names, retry_policy=backoff)
    pub.publish(topic, b"retry me").result(timeout=30)
    first = _pull_one(sub, name)
    sub.modify_ack_deadline(subscription=name, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    nacked_at = time.monotonic()
    again = _pull_one(sub, name, timeout=15)
    waited = time.monotonic() - nacked_at
    assert again.message.message_id == first.message.message_id
    assert waited >= 1.8, f"redelivered after {waited:.2f}s, before the 2 s minimum backoff"
    # The second failure waits twice as long (4 s, the maximum).
    sub.modify_ack_deadline(subscription=name, ack_ids=[again.ack_id], ack_deadline_seconds=0)
    nacked_at = time.monotonic()
    third = _pull_one(sub, name, timeout=15)
    assert time.monotonic() - nacked_at >= 3.8
    sub.acknowledge(subscription=name, ack_ids=[third.ack_id])


def test_dead_letter_after_max_attempts(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, dlq_topic = names.topic("main"), names.topic("dlq")
    name, dlq_sub = names.subscription("main"), names.subscription("dlq")
    pub.create_topic(name=topic)
    pub.create_topic(name=dlq_topic)
    sub.create_subscription(name=dlq_sub, topic=dlq_topic)
    created = sub.create_subscription(
        request={
            "name": name,
            "topic": topic,
            "dead_letter_policy": {"dead_letter_topic": dlq_topic, "max_delivery_attempts": 5},
        }
    )
    assert created.dead_letter_policy.max_delivery_attempts == 5
    pub.publish(topic, b"poison", origin="test").result(timeout=30)
    attempts = []
    for _ in range(5):
        m = _pull_one(sub, name)
        attempts.append(m.delivery_attempt)
        sub.modify_ack_deadline(subscription=name, ack_ids=[m.ack_id], ack_deadline_seconds=0)
    assert attempts == [1, 2, 3, 4, 5]
    dead = _pull_one(sub, dlq_sub)
    attrs = dict(dead.message.attributes)
    assert dead.message.data == b"poison"
    assert attrs["origin"] == "test"
    assert attrs["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert attrs["CloudPubSubDeadLetterSourceSubscription"] == name.rsplit("/", 1)[1]
    assert attrs["CloudPubSubDeadLetterSourceSubscriptionProject"] == name.split("/")[1]
    assert attrs["CloudPubSubDeadLetterSourceTopicPublishTime"].endswith("Z")
    # Gone from the source subscription.
    resp = sub.pull(subscription=name, max_messages=5, return_immediately=True, timeout=10)
    assert not resp.received_messages


def test_ordering_keys_delivered_in_order_to_subscribe(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub = make_publisher(
        shared_server.endpoint,
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=7, max_latency=0.005),
    )
    _, sub = clients
    topic, name = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True})
    keys = ["alpha", "beta", "gamma"]
    futures = [
        pub.publish(topic, f"{k}:{i}".encode(), ordering_key=k) for i in range(150) for k in keys
    ]
    for f in futures:
        f.result(timeout=30)
    seen: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def callback(message: Any) -> None:
        key, i = message.data.decode().split(":")
        with lock:
            seen[key].append(int(i))
        message.ack()

    future = sub.subscribe(name, callback)
    try:
        wait_for(lambda: sum(len(v) for v in seen.values()) >= 450, 30, "all ordered messages")
    finally:
        future.cancel()
    for k in keys:
        assert seen[k] == list(range(150)), f"key {k} out of order"


def test_ordering_nack_redelivers_the_rest_of_the_key_in_order(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub = make_publisher(
        shared_server.endpoint,
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
    )
    _, sub = clients
    topic, name = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True})
    for i in range(3):
        pub.publish(topic, f"k{i}".encode(), ordering_key="k").result(timeout=30)
    batch = sub.pull(subscription=name, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in batch] == [b"k0", b"k1", b"k2"]
    # While the key's batch is outstanding, a newer message of the key is held back.
    pub.publish(topic, b"k3", ordering_key="k").result(timeout=30)
    resp = sub.pull(subscription=name, max_messages=10, return_immediately=True, timeout=10)
    assert not resp.received_messages
    sub.acknowledge(subscription=name, ack_ids=[batch[0].ack_id])
    sub.modify_ack_deadline(subscription=name, ack_ids=[batch[1].ack_id], ack_deadline_seconds=0)
    again = sub.pull(subscription=name, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in again] == [b"k1", b"k2", b"k3"]
    # The old ack ID of k2 no longer holds a lease; acking the new ones finishes the key.
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in again])
    resp = sub.pull(subscription=name, max_messages=10, return_immediately=True, timeout=10)
    assert not resp.received_messages


def test_exactly_once_rejects_stale_ack_ids(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names, enable_exactly_once_delivery=True)
    pub.publish(topic, b"once").result(timeout=30)
    first = _pull_one(sub, name)
    sub.modify_ack_deadline(subscription=name, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    with pytest.raises(exceptions.InvalidArgument) as excinfo:
        sub.acknowledge(subscription=name, ack_ids=[first.ack_id])
    assert excinfo.value.reason == "EXACTLY_ONCE_ACKID_FAILURE"
    assert excinfo.value.metadata == {first.ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}
    # The stale ack did not ack: the message comes back, and its live ack ID works.
    second = _pull_one(sub, name)
    assert second.message.message_id == first.message.message_id
    sub.acknowledge(subscription=name, ack_ids=[second.ack_id])
    resp = sub.pull(subscription=name, max_messages=5, return_immediately=True, timeout=10)
    assert not resp.received_messages


def test_exactly_once_ack_with_response_through_subscribe(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = setup(clients, names, enable_exactly_once_delivery=True)
    for i in range(20):
        pub.publish(topic, f"m{i}".encode()).result(timeout=30)
    results: dict[bytes, Any] = {}
    lock = threading.Lock()

    def callback(message: Any) -> None:
        outcome = message.ack_with_response()
        try:
            outcome.result(timeout=20)
            value: Any = "ok"
        except Exception as e:  # an AcknowledgeError would land here
            value = e
        with lock:
            results.setdefault(message.data, value)

    future = sub.subscribe(name, callback)
    try:
        wait_for(lambda: len(results) >= 20, 30, "20 exactly-once acks")
    finally:
        future.cancel()
    assert all(v == "ok" for v in results.values()), results
    resp = sub.pull(subscription=name, max_messages=25, return_immediately=True, timeout=10)
    assert not resp.received_messages


def test_ack_ids_from_before_a_seek_ack_nothing(clients: Any, names: Any) -> None:
    import datetime as dt

    pub, sub = clients
    topic, name = setup(clients, names, retain_acked_messages=True)
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    pub.publish(topic, b"replay").result(timeout=30)
    old = _pull_one(sub, name)
    sub.seek(request={"subscription": name, "time": before})
    sub.acknowledge(subscription=name, ack_ids=[old.ack_id])  # stale: must not ack
    again = _pull_one(sub, name)
    assert again.message.data == b"replay"
    sub.acknowledge(subscription=name, ack_ids=[again.ack_id])
