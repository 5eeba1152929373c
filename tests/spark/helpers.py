"""Publish to and read back from a real pubsubd for the Spark tests."""

from __future__ import annotations

from typing import Any

from pubsubd.spark.client import ReplayClient
from tests.conftest import make_publisher


def create_topics(endpoint: str, *topics: str) -> None:
    publisher = make_publisher(endpoint)
    for topic in topics:
        publisher.create_topic(name=topic)


def publish(endpoint: str, topic: str, start: int, count: int) -> list[str]:
    """Publish ``m{start}`` .. ``m{start+count-1}`` (attribute seq, two ordering keys); wait."""
    publisher = make_publisher(endpoint)
    futures = [
        publisher.publish(topic, f"m{i}".encode(), seq=str(i)) for i in range(start, start + count)
    ]
    return [f.result(timeout=30) for f in futures]


def read_topic(endpoint: str, topic: str) -> list[Any]:
    """Every retained message of partition 0, through the replay API."""
    client = ReplayClient(endpoint)
    try:
        bounds = client.topic_bounds(topic)
        out: list[Any] = []
        for partition, b in bounds.items():
            cur = b.earliest
            while cur < b.latest:
                messages, cur = client.read(topic, partition, cur, b.latest, 1000)
                out.extend(messages)
        return out
    finally:
        client.close()
