"""Crash test of the whole server: kill -9 during a publish flood, restart, nothing acked is lost.

The official PublisherClient publishes as fast as it can; every message whose future resolved was
acknowledged by the server, so after kill -9 and a restart on the same data dir each of them must
be delivered to the subscription. Acks taken before the crash are checked too: a message acked
and journaled before the crash may come back (at-least-once), but nothing unacked may be missing.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from google.cloud import pubsub_v1

from tests.conftest import make_publisher, make_subscriber
from tests.support.drain import drain
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.crash

TOPIC = "projects/crash/topics/flood"
SUB = "projects/crash/subscriptions/flood-sub"


@pytest.mark.parametrize("kill_after", [3000, 12000])
def test_kill9_mid_publish_loses_no_acknowledged_message(tmp_path: Path, kill_after: int) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        pub = make_publisher(
            server.endpoint,
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=200, max_latency=0.005),
        )
        sub = make_subscriber(server.endpoint)
        pub.create_topic(name=TOPIC)
        sub.create_subscription(name=SUB, topic=TOPIC)
        sub.close()

        acked: set[bytes] = set()
        lock = threading.Lock()
        stop = threading.Event()

        def on_done(data: bytes):  # type: ignore[no-untyped-def]
            def done(f):  # type: ignore[no-untyped-def]
                if f.exception() is None:
                    with lock:
                        acked.add(data)

            return done

        def flood() -> None:
            i = 0
            while not stop.is_set() and i < 200_000:
                data = f"msg-{i:07d}".encode()
                pub.publish(TOPIC, data, n=str(i)).add_done_callback(on_done(data))
                i += 1
                if i % 1000 == 0:
                    stop.wait(0.001)

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        wait_for(lambda: len(acked) >= kill_after, 60, f"{kill_after} acknowledged publishes")
        port = server.port
        server.kill()  # kill -9 while publishes are in flight
        stop.set()
        t.join(10)
        with lock:
            acked_before_crash = set(acked)
        assert len(acked_before_crash) >= kill_after

        server.start(port=port)
        # Retried publishes may now succeed against the restarted server; they count as acked.
        pub.stop()
        with lock:
            all_acked = set(acked)
        received = drain(server.endpoint, SUB, all_acked)
        missing = all_acked - received
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    finally:
        server.kill()


def test_kill9_after_acks_keeps_unacked_backlog(tmp_path: Path) -> None:
    """Ack part of a backlog, crash, restart: every unacked message is still delivered."""
    server = ServerProcess(tmp_path / "data").start()
    try:
        pub = make_publisher(server.endpoint)
        sub = make_subscriber(server.endpoint)
        pub.create_topic(name=TOPIC)
        sub.create_subscription(name=SUB, topic=TOPIC)
        futures = [pub.publish(TOPIC, f"m{i}".encode()) for i in range(500)]
        for f in futures:
            f.result(timeout=30)
        acked: set[bytes] = set()
        while len(acked) < 200:
            resp = sub.pull(subscription=SUB, max_messages=50, timeout=10)
            take = [m for m in resp.received_messages if int(m.message.data[1:]) % 2 == 0]
            if take:
                sub.acknowledge(subscription=SUB, ack_ids=[m.ack_id for m in take])
                acked.update(m.message.data for m in take)
        port = server.port
        server.kill()
        server.start(port=port)
        unacked = {f"m{i}".encode() for i in range(500)} - acked
        received = drain(server.endpoint, SUB, unacked)
        assert unacked <= received
    finally:
        server.kill()
