"""Crash test of snapshots: kill -9 after CreateSnapshot, restart, Seek to the snapshot.

Every message the snapshot captured (its unacked backlog plus everything published after it) must
be delivered again, even though the subscription acked all of it before the crash and the trim
loop ran over tiny segments meanwhile: the snapshot's pin, restored at start-up from the metadata
store, keeps those segments.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from google.cloud import pubsub_v1

from tests.conftest import make_publisher, make_subscriber
from tests.support.server import ServerProcess
from tests.support.status import FAST_TRIM_INTERVAL_S, wait_trim_passes
from tests.support.storage import segments

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

TOPIC = "projects/crash/topics/snap-topic"
SUB = "projects/crash/subscriptions/snap-sub"
SNAP = "projects/crash/snapshots/snap"


def _pull_all(sub: pubsub_v1.SubscriberClient, want: set[bytes], timeout: float = 60) -> set[bytes]:
    got: set[bytes] = set()
    deadline = time.monotonic() + timeout
    while not want <= got and time.monotonic() < deadline:
        resp = sub.pull(subscription=SUB, max_messages=500, timeout=10)
        if resp.received_messages:
            sub.acknowledge(subscription=SUB, ack_ids=[m.ack_id for m in resp.received_messages])
            got.update(m.message.data for m in resp.received_messages)
    return got


@pytest.mark.parametrize("trims", [False, True], ids=["kill-at-once", "kill-after-trims"])
def test_kill9_after_snapshot_then_seek_delivers_everything_captured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trims: bool
) -> None:
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")  # tiny segments: trimming really happens
    monkeypatch.setenv("PUBSUBD_TRIM_INTERVAL_S", FAST_TRIM_INTERVAL_S)  # passes waited for
    server = ServerProcess(tmp_path / "data").start()
    try:
        pub = make_publisher(
            server.endpoint, batch_settings=pubsub_v1.types.BatchSettings(max_messages=10)
        )
        sub = make_subscriber(server.endpoint)
        pub.create_topic(name=TOPIC)
        sub.create_subscription(name=SUB, topic=TOPIC)
        pad = b"." * 150

        def publish(lo: int, hi: int) -> set[bytes]:
            datas = [b"m%05d" % i + pad for i in range(lo, hi)]
            for f in [pub.publish(TOPIC, d) for d in datas]:
                f.result(timeout=30)
            return set(datas)

        first = publish(0, 300)
        # Ack a part of the backlog before the snapshot: not captured.
        acked_before = _pull_all(sub, set(sorted(first)[:100]))
        snap = sub.create_snapshot(request={"name": SNAP, "subscription": SUB})
        later = publish(300, 450)
        captured = (first - acked_before) | later
        # The subscription consumes everything: only the snapshot still needs the messages.
        assert captured <= _pull_all(sub, captured)
        if trims:
            wait_trim_passes(server)  # acks flushed, a whole trim pass over the tiny segments
            assert len(segments(server.data_dir)) > 5

        port = server.port
        server.kill()
        server.start(port=port)

        assert sub.get_snapshot(snapshot=SNAP).expire_time == snap.expire_time
        wait_trim_passes(server)  # a trim pass after restart must not drop what it pins
        sub.seek(request={"subscription": SUB, "snapshot": SNAP})
        received = _pull_all(sub, captured)
        missing = captured - received
        assert not missing, f"{len(missing)} captured messages lost, e.g. {sorted(missing)[:3]}"
    finally:
        server.kill()
