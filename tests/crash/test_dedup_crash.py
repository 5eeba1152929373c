"""kill -9 after deduplicated publishes, restart, publish the same dedup IDs again: nothing is
stored twice and the original message IDs come back, even after a subscription acked everything
and retention trimmed what it could (the dedup window pins the log)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_publisher, make_subscriber
from tests.support.clients import pull_until
from tests.support.replay_client import ReplayClient
from tests.support.server import ServerProcess
from tests.support.status import FAST_TRIM_INTERVAL_S, wait_trim_passes

pytestmark = pytest.mark.crash

TOPIC = "projects/crash/topics/dedup"
SUB = "projects/crash/subscriptions/dedup-sub"


def _batches(n: int, size: int, runs: bool) -> list[list[dict[str, object]]]:
    # runs: the Spark sink's "query:batch:partition:row" IDs, kept by the window as runs
    def dedup_id(b: int, i: int) -> str:
        return f"query:{b}:0:{i}" if runs else f"id-{b}-{i}"

    return [
        [
            {"dedup_id": dedup_id(b, i), "data": bytes(200) + f"{b}-{i}".encode()}
            for i in range(size)
        ]
        for b in range(n)
    ]


@pytest.mark.parametrize(("ack_and_trim", "runs"), [(False, False), (True, False), (True, True)])
def test_dedup_window_survives_kill9(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ack_and_trim: bool, runs: bool
) -> None:
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")
    monkeypatch.setenv("PUBSUBD_TRIM_INTERVAL_S", FAST_TRIM_INTERVAL_S)
    server = ServerProcess(tmp_path / "data").start()
    try:
        sub = make_subscriber(server.endpoint)
        replay = ReplayClient(server.endpoint)
        make_publisher(server.endpoint).create_topic(name=TOPIC)
        sub.create_subscription(name=SUB, topic=TOPIC)
        batches = _batches(30, 10, runs)
        original = [
            list(replay.PublishDeduplicated(topic=TOPIC, messages=b).message_ids) for b in batches
        ]
        assert [m for ids in original for m in ids] == [str(i) for i in range(300)]
        if ack_and_trim:
            pull_until(sub, SUB, 300, ack=True, max_messages=100, timeout=60)
            wait_trim_passes(server)  # a whole trim pass: only the dedup pin keeps the segments
            assert replay.GetTopicRanges(topic=TOPIC).sources[0].earliest_offset == 0
        replay.close()
        sub.close()
        port = server.port
        server.kill()  # kill -9 right after the last acknowledged publish
        server.start(port=port)
        replay = ReplayClient(server.endpoint)
        for batch, ids in zip(batches, original, strict=True):
            again = replay.PublishDeduplicated(topic=TOPIC, messages=batch)
            assert again.duplicates == len(batch)
            assert list(again.message_ids) == ids
        (rng,) = replay.GetTopicRanges(topic=TOPIC).sources
        assert rng.latest_offset == 300  # nothing stored twice
        assert "dedup window of topic" in server.log()
        replay.close()
    finally:
        server.kill()
