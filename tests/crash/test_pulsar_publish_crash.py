"""kill -9 while the official pulsar-client produces one message per SEND (its publishes made in
the server's process, pulsar/gateway.py), restart: every message whose receipt the client got is
stored, at the offset its receipt named, once, in the order sent."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tests.conftest import make_publisher, make_subscriber
from tests.support.pulsar import make_client
from tests.support.replay_client import ReplayClient
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.crash

TOPIC = "projects/crash/topics/pulsar-sends"
SUB = "projects/crash/subscriptions/pulsar-sends-sub"
PULSAR_TOPIC = "persistent://crash/default/pulsar-sends"
MESSAGES = 5000  # more than get a receipt before the kill
RECEIPTS_BEFORE_KILL = 300


def test_every_message_with_a_receipt_survives_kill9(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", pulsar=True).start()  # fsync always: the default
    client = None
    try:
        make_publisher(server.endpoint).create_topic(name=TOPIC)
        make_subscriber(server.endpoint).create_subscription(name=SUB, topic=TOPIC)
        client = make_client(f"pulsar://127.0.0.1:{server.pulsar_port}")
        producer = client.create_producer(
            PULSAR_TOPIC,
            batching_enabled=False,  # one message per SEND
            block_if_queue_full=True,
            max_pending_messages=100,
            send_timeout_millis=3000,
        )
        receipts: dict[int, Any] = {}  # message index -> its MessageId
        lock = threading.Lock()

        def sent(index: int) -> Any:
            def done(result: Any, message_id: Any) -> None:
                if result == pulsar.Result.Ok:
                    with lock:
                        receipts[index] = message_id

            return done

        def produce() -> None:
            for i in range(MESSAGES):
                producer.send_async(b"m-%d" % i, sent(i))

        sender = threading.Thread(target=produce, daemon=True)
        sender.start()
        wait_for(lambda: len(receipts) >= RECEIPTS_BEFORE_KILL, 60, "receipts before the kill")
        port = server.port
        server.kill()  # kill -9 with SENDs in flight
        with lock:
            acknowledged = dict(receipts)
        assert len(acknowledged) < MESSAGES  # the kill came mid-stream
        client.close()  # gives up on what is pending (send timeout)
        client = None
        sender.join(30)

        server.start(port=port)
        replay = ReplayClient(server.endpoint)
        try:
            stored = replay.read_all(TOPIC)
        finally:
            replay.close()
        data = [m.data for m in stored]
        index_of = {d: i for i, d in enumerate(data)}
        assert len(index_of) == len(data), "a message was stored twice"
        sent_order = [int(d.split(b"-")[1]) for d in data]
        assert sent_order == sorted(sent_order), "stored out of the order sent"
        for i, message_id in acknowledged.items():
            offset = index_of.get(b"m-%d" % i)
            assert offset is not None, f"message {i} had a receipt and is lost"
            assert int(stored[offset].message_id) == offset
            assert message_id.entry_id() == offset, f"message {i}'s receipt names another entry"
        assert len(data) >= len(acknowledged)
    finally:
        if client is not None:
            client.close()
        server.kill()
