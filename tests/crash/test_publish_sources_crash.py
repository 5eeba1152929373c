"""Crash test of a topic with three publish message sources: kill -9 during a flood of keyed and
unkeyed publishes, restart, and every acknowledged publish is delivered, from every source."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from google.cloud import pubsub_v1

from tests.conftest import make_publisher, make_subscriber
from tests.support.drain import drain
from tests.support.replay_client import ReplayClient
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.crash

TOPIC = "projects/crash/topics/sources"
SUB = "projects/crash/subscriptions/sources-sub"
# A third of the messages unkeyed, the rest over 40 keys (the official subscriber hands out one
# message of a key at a time, the next once the last is acked: few keys drain slowly).
KEYS = [""] * 20 + [f"k{i}" for i in range(40)]


def test_kill9_mid_publish_to_three_sources_loses_no_acknowledged_message(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        pub = make_publisher(
            server.endpoint,
            publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=100, max_latency=0.005),
        )
        sub = make_subscriber(server.endpoint)
        pub.create_topic(request={"name": TOPIC, "labels": {"pubsubd-publish-sources": "3"}})
        sub.create_subscription(name=SUB, topic=TOPIC)
        sub.close()

        acked: dict[bytes, str] = {}
        lock = threading.Lock()
        stop = threading.Event()

        def on_done(data: bytes):  # type: ignore[no-untyped-def]
            def done(f):  # type: ignore[no-untyped-def]
                if f.exception() is None:
                    with lock:
                        acked[data] = f.result()

            return done

        def flood() -> None:
            i = 0
            while not stop.is_set() and i < 200_000:
                data = f"msg-{i:07d}".encode()
                key = KEYS[i % len(KEYS)]
                try:
                    future = pub.publish(TOPIC, data, ordering_key=key, n=str(i))
                except Exception:  # a key paused by a failed publish (the server died)
                    continue
                future.add_done_callback(on_done(data))
                i += 1
                if i % 1000 == 0:
                    stop.wait(0.001)

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        wait_for(lambda: len(acked) >= 6000, 60, "6000 acknowledged publishes")
        port = server.port
        server.kill()  # kill -9 while publishes are in flight
        stop.set()
        t.join(10)
        with lock:
            before = dict(acked)
        assert {int(mid) >> 48 for mid in before.values()} == {0, 1, 2}

        server.start(port=port)
        pub.stop()  # retried publishes may now succeed: they count as acknowledged
        with lock:
            expected = set(acked)

        received = drain(server.endpoint, SUB, expected)
        missing = expected - received
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
        replay = ReplayClient(server.endpoint)
        ranges = replay.GetTopicRanges(topic=TOPIC).sources
        assert [r.source for r in ranges] == [0, 1, 2]
        assert all(r.latest_offset > 0 for r in ranges)
        replay.close()
    finally:
        server.kill()
