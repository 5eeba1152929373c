"""Segments are deleted once every subscription has acked past them, and not before."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from google.cloud import pubsub_v1

from tests.conftest import make_publisher, make_subscriber
from tests.support.clients import pull_until
from tests.support.server import ServerProcess, wait_for
from tests.support.status import FAST_TRIM_INTERVAL_S, wait_trim_passes
from tests.support.storage import segments

pytestmark = pytest.mark.integration


def test_fully_acked_segments_are_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")  # tiny segments: many roll-overs
    monkeypatch.setenv("PUBSUBD_TRIM_INTERVAL_S", FAST_TRIM_INTERVAL_S)
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
        wait_for(lambda: len(segments(server.data_dir)) > 5, 10, "several segments")
        before = len(segments(server.data_dir))

        pull_until(sub, fast, 300, ack=True, max_messages=100, timeout=60)
        # The slow subscription still needs everything: nothing may be deleted, even after a
        # whole trim pass that began after the acks.
        wait_trim_passes(server)
        assert len(segments(server.data_dir)) == before
        pull_until(sub, slow, 300, ack=True, max_messages=100, timeout=60)
        wait_for(lambda: len(segments(server.data_dir)) <= 2, 15, "acked segments to be deleted")
        # What is left still works after a restart: new messages flow, old ones do not return.
        port = server.port
        server.stop()
        server.start(port=port)
        pub.publish(topic, b"after-trim").result(timeout=30)
        resp = sub.pull(subscription=slow, max_messages=10, timeout=10)
        assert [m.message.data for m in resp.received_messages] == [b"after-trim"]
    finally:
        server.kill()


def test_retention_bytes_keeps_the_newest_acked_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Topic label pubsubd-retention-bytes: acked data beyond the limit is trimmed, the newest
    segments within it stay readable (Replay API range, Seek to a time before them)."""
    from google.api_core import exceptions
    from google.protobuf import timestamp_pb2

    from tests.support.replay_client import ReplayClient

    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")
    monkeypatch.setenv("PUBSUBD_TRIM_INTERVAL_S", FAST_TRIM_INTERVAL_S)
    server = ServerProcess(tmp_path / "data").start()
    limit = 12288  # about three segments of the ~60 KB published
    try:
        pub = make_publisher(
            server.endpoint, batch_settings=pubsub_v1.types.BatchSettings(max_messages=10)
        )
        sub = make_subscriber(server.endpoint)
        replay = ReplayClient(server.endpoint)
        topic, name = "projects/trim/topics/sized", "projects/trim/subscriptions/sized"
        with pytest.raises(exceptions.InvalidArgument, match="pubsubd-retention-bytes"):
            pub.create_topic(request={"name": topic, "labels": {"pubsubd-retention-bytes": "0"}})
        pub.create_topic(request={"name": topic, "labels": {"pubsubd-retention-bytes": str(limit)}})
        sub.create_subscription(name=name, topic=topic)
        before = time.time()
        futures = [pub.publish(topic, b"%04d" % i + os.urandom(196)) for i in range(300)]
        for f in futures:
            f.result(timeout=30)

        # This topic's log (the server may keep other topics of its own in the data dir).
        log_dir = max(
            server.data_dir.glob("topics/*/source-0"), key=lambda d: len(list(d.glob("*.seg")))
        )

        def stored() -> int:
            total = 0
            for seg in log_dir.glob("*.seg"):
                with contextlib.suppress(FileNotFoundError):  # trimmed while we look
                    total += seg.stat().st_size
            return total

        def earliest() -> int:
            return int(replay.GetTopicRanges(topic=topic).sources[0].earliest_offset)

        assert stored() > 4 * limit
        wait_trim_passes(server)  # unacked: a whole trim pass deletes nothing, whatever the limit
        assert earliest() == 0
        first: dict[int, bytes] = {}
        while len(first) < 300:
            resp = sub.pull(subscription=name, max_messages=100, timeout=10)
            sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in resp.received_messages])
            first.update(
                (int(m.message.message_id), m.message.data) for m in resp.received_messages
            )
        wait_for(lambda: stored() <= limit, 15, "acked segments beyond the limit to be trimmed")
        wait_trim_passes(server)  # a whole pass more: what is within the limit stays
        low = earliest()
        assert 0 < low < 280 and stored() <= limit
        # Seek to before the first publish: every retained message comes back, nothing older.
        seek_time = timestamp_pb2.Timestamp()
        seek_time.FromNanoseconds(int(before * 1e9))
        sub.seek(request={"subscription": name, "time": seek_time})
        got: dict[int, bytes] = {}
        while len(got) < 300 - low:
            resp = sub.pull(subscription=name, max_messages=100, timeout=10)
            assert resp.received_messages, f"only {len(got)} of {300 - low} replayed"
            for m in resp.received_messages:
                got[int(m.message.message_id)] = m.message.data
        assert sorted(got) == list(range(low, 300))
        # (the client sends batches concurrently, so IDs need not follow the publish order)
        assert all(data == first[i] for i, data in got.items())
        replay.close()
    finally:
        server.kill()
