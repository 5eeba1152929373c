"""Exactly-once: an ack that succeeded survives kill -9; nothing acked comes back after restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_publisher, make_subscriber
from tests.support.server import ServerProcess

pytestmark = pytest.mark.crash

TOPIC = "projects/eo/topics/eo-topic"
SUB = "projects/eo/subscriptions/eo-sub"


def test_successful_exactly_once_acks_survive_kill9(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
        pub.create_topic(name=TOPIC)
        sub.create_subscription(
            request={"name": SUB, "topic": TOPIC, "enable_exactly_once_delivery": True}
        )
        for f in [pub.publish(TOPIC, f"m{i}".encode()) for i in range(200)]:
            f.result(timeout=30)
        acked: set[bytes] = set()
        while len(acked) < 120:
            resp = sub.pull(subscription=SUB, max_messages=40, timeout=10)
            sub.acknowledge(subscription=SUB, ack_ids=[m.ack_id for m in resp.received_messages])
            acked.update(m.message.data for m in resp.received_messages)
        port = server.port
        server.kill()  # right after the acks were answered: they must already be durable
        server.start(port=port)
        sub = make_subscriber(server.endpoint)
        received: set[bytes] = set()
        while True:
            resp = sub.pull(subscription=SUB, max_messages=100, timeout=10)
            if not resp.received_messages:
                break
            received.update(m.message.data for m in resp.received_messages)
            sub.acknowledge(subscription=SUB, ack_ids=[m.ack_id for m in resp.received_messages])
        assert not (received & acked), f"{len(received & acked)} acked messages redelivered"
        assert received == {f"m{i}".encode() for i in range(200)} - acked
    finally:
        server.kill()
