"""kill -9 right after CommitCursor and DeleteCursor answered: after the restart the committed
cursor has its positions, the deleted one is gone (not listed, no longer pinning the log)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import make_publisher
from tests.support.raw import PublishRequest, PubsubMessage, gapic_publisher
from tests.support.replay_client import ReplayClient
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.crash

TOPIC = "projects/crash/topics/cursors"


def test_cursor_commits_and_deletes_survive_kill9(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PUBSUBD_SEGMENT_BYTES", "4096")
    server = ServerProcess(tmp_path / "data").start()
    try:
        make_publisher(server.endpoint).create_topic(name=TOPIC)
        raw = gapic_publisher(server.endpoint)
        for b in range(20):
            msgs = [PubsubMessage(data=bytes(200) + f"{b}-{i}".encode()) for i in range(10)]
            raw.publish(request=PublishRequest(topic=TOPIC, messages=msgs))
        replay = ReplayClient(server.endpoint)
        replay.CommitCursor(topic=TOPIC, name="kept", offsets={0: 150})
        replay.CommitCursor(topic=TOPIC, name="dropped", offsets={0: 0})
        replay.DeleteCursor(topic=TOPIC, name="dropped")
        replay.close()
        port = server.port
        server.kill()  # kill -9 right after the answers

        server.start(port=port)
        replay = ReplayClient(server.endpoint)
        listed = replay.ListCursors(topic=TOPIC).cursors
        assert [(c.name, dict(c.offsets)) for c in listed] == [("kept", {0: 150})]
        # Only "kept" pins the log now (a topic without subscriptions keeps nothing else):
        # retention trims the segments below 150 and keeps the rest.
        deadline = time.monotonic() + 15

        def earliest() -> int:
            return int(replay.GetTopicRanges(topic=TOPIC).sources[0].earliest_offset)

        wait_for(lambda: earliest() > 0, deadline - time.monotonic(), "trim below 'kept'")
        assert 0 < earliest() <= 150
        replay.close()
    finally:
        server.kill()
