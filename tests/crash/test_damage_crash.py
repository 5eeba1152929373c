"""kill -9 mid-flood, then a flipped byte in a sealed segment: after the restart every
acknowledged message is delivered except exactly the damaged entry's, which are counted lost,
and the torn tail the crash may have left is cut, not mistaken for damage."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1 import types

from pubsubd.storage import segment_index
from pubsubd.storage.framing import decode_frame_at, scan_frames
from tests.conftest import make_publisher, make_subscriber
from tests.support.drain import drain
from tests.support.raw import http_get
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.crash

TOPIC = "projects/crash/topics/damaged-flood"
SUB = "projects/crash/subscriptions/damaged-flood"


@pytest.mark.parametrize("with_index", [True, False])
def test_kill9_then_a_flipped_byte_loses_only_the_damaged_entry(
    tmp_path: Path, with_index: bool
) -> None:
    server = ServerProcess(
        tmp_path / "data",
        env={"PUBSUBD_SEGMENT_BYTES": "65536", "PUBSUBD_SLI_EVENTS_S": "0"},
    ).start()
    try:
        pub = make_publisher(
            server.endpoint,
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=50, max_latency=0.005),
        )
        # Retention keeps the acknowledged segments: a trim pass after the drain would
        # otherwise drop the damaged segment, and its range from /status, before the check.
        pub.create_topic(
            request={
                "name": TOPIC,
                "labels": {"pubsubd-damaged-entries": "skip"},
                "message_retention_duration": {"seconds": 3600},
            }
        )
        sub = make_subscriber(server.endpoint)
        sub.create_subscription(name=SUB, topic=TOPIC)
        sub.close()
        acked: set[bytes] = set()
        lock = threading.Lock()
        stop = threading.Event()

        def flood() -> None:
            i = 0
            while not stop.is_set() and i < 100_000:
                data = f"msg-{i:07d}".encode()

                def done(f: object, data: bytes = data) -> None:
                    if f.exception() is None:  # type: ignore[attr-defined]
                        with lock:
                            acked.add(data)

                pub.publish(TOPIC, data).add_done_callback(done)
                i += 1
                if i % 500 == 0:
                    stop.wait(0.001)

        thread = threading.Thread(target=flood, daemon=True)
        thread.start()
        wait_for(lambda: len(acked) >= 8000, 60, "8000 acknowledged publishes")
        port = server.port
        server.kill()
        stop.set()
        thread.join(10)
        pub.stop()
        with lock:
            all_acked = set(acked)

        (directory,) = [p / "source-0" for p in (server.data_dir / "topics").iterdir()]
        segments = sorted(directory.glob("*.seg"))
        assert len(segments) >= 3
        sealed = segments[1]
        data = bytearray(sealed.read_bytes())
        frames = scan_frames(bytes(data)).frames
        frame = frames[len(frames) // 2]
        entry, _ = decode_frame_at(bytes(data), frame.position)
        damaged = {m.data for m in types.PublishRequest.deserialize(entry.payload).messages}
        data[frame.position + frame.length // 2] ^= 0xFF
        sealed.write_bytes(bytes(data))
        if not with_index:
            (directory / segment_index.index_file_name(int(sealed.stem))).unlink()

        server.start(port=port)
        expected = all_acked - damaged
        received = drain(server.endpoint, SUB, expected)
        assert expected <= received
        assert not received & damaged
        _, body = http_get(server, "/status")
        status = json.loads(body)
        assert [(d["first_offset"], d["end_offset"]) for d in status["damaged"]] == [
            (frame.base_offset, frame.base_offset + frame.count)
        ]
        assert status["subscriptions"][SUB]["lost"] == frame.count
    finally:
        server.kill()
