"""Segments are deleted once every subscription has acked past them, and not before."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from google.cloud import pubsub_v1

from tests.conftest import make_publisher, make_subscriber
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.integration


def _segments(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("topics/*/source-*/*.seg"))


def test_fully_acked_segments_are_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")  # tiny segments: many roll-overs
    server = ServerProcess(tmp_path / "data").start()
    try:
        # Small batches: one entry of ~2 KB per 10 messages, two entries per segment.
        pub = make_publisher(
            server.endpoint, batch_settings=pubsub_v1.types.BatchSettings(max_messages=10)
        )
        sub = make_subscriber(server.endpoint)
        topic, fast, slow = (
            "projects/trim/topics/trim-topic",
            "projects/trim/subscriptions/fast",
            "projects/trim/subscriptions/slow",
        )
        pub.create_topic(name=topic)
        sub.create_subscription(name=fast, topic=topic)
        sub.create_subscription(name=slow, topic=topic)
        for f in [pub.publish(topic, os.urandom(200)) for _ in range(300)]:
            f.result(timeout=30)
        wait_for(lambda: len(_segments(server.data_dir)) > 5, 10, "several segments")
        before = len(_segments(server.data_dir))

        def ack_all(name: str) -> None:
            acked = 0
            while acked < 300:
                resp = sub.pull(subscription=name, max_messages=100, timeout=10)
                sub.acknowledge(
                    subscription=name, ack_ids=[m.ack_id for m in resp.received_messages]
                )
                acked += len(resp.received_messages)

        ack_all(fast)
        # The slow subscription still needs everything: nothing may be deleted, even after
        # two trim passes (every 2 s).
        time.sleep(4.5)
        assert len(_segments(server.data_dir)) == before
        ack_all(slow)
        wait_for(lambda: len(_segments(server.data_dir)) <= 2, 15, "acked segments to be deleted")
        # What is left still works after a restart: new messages flow, old ones do not return.
        port = server.port
        server.stop()
        server.start(port=port)
        pub.publish(topic, b"after-trim").result(timeout=30)
        resp = sub.pull(subscription=slow, max_messages=10, timeout=10)
        assert [m.message.data for m in resp.received_messages] == [b"after-trim"]
    finally:
        server.kill()
