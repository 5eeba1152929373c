"""Who the Pulsar front hands messages to, with the official ``pulsar-client`` against a real
``pubsubd serve --pulsar-port 0``: Shared consumers sized by their permits, the active consumer
of a Failover subscription told (ACTIVE_CONSUMER_CHANGE), and seek into a delivered batch."""

from __future__ import annotations

import uuid
from typing import Any

import pulsar
import pytest

pytestmark = pytest.mark.integration


def _topic(tag: str) -> str:
    return f"persistent://test-project/default/{tag}-{uuid.uuid4().hex[:8]}"


def _drain(consumer: Any, timeout_ms: int = 700) -> list[Any]:
    """Receive and ack until nothing comes for ``timeout_ms``."""
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_ms)
        except pulsar.Timeout:
            return got
        got.append(msg)
        consumer.acknowledge(msg)


def test_a_shared_consumer_takes_only_what_its_permits_allow(
    pulsar_client: pulsar.Client,
) -> None:
    """A Shared consumer that does not receive holds its receiver queue's worth, no more: the
    other consumer gets the rest, and every message goes out once."""
    topic = _topic("permits")
    idle = pulsar_client.subscribe(
        topic, "work", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5
    )
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    sent = [f"m{i}".encode() for i in range(60)]
    for data in sent:
        producer.send(data)
    busy = pulsar_client.subscribe(
        topic, "work", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5
    )
    by_busy = _drain(busy)
    # The idle consumer was handed its 5 permits' worth (its client queues them), not the
    # backlog: before flow followed permits it took all 60 and the other got none.
    assert len(by_busy) >= len(sent) - 6
    by_idle = _drain(idle)
    assert 1 <= len(by_idle) <= 6
    got = [m.data() for m in by_busy + by_idle]
    assert sorted(got) == sorted(sent)  # each once: nothing lost, nothing twice
    assert {m.redelivery_count() for m in by_busy + by_idle} == {0}
