"""kill -9 with many delayed messages waiting in the on-disk delay index, then again while they
are falling due: after each restart every delayed message is delivered once it is due, never
before, none is lost, and what was acked before the second crash does not come back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_publisher, make_subscriber
from tests.support.raw import PublishRequest, PubsubMessage, gapic_publisher
from tests.support.server import ServerProcess
from tests.support.status import wait_trim_passes

pytestmark = pytest.mark.crash

TOPIC = "projects/crash/topics/delays"
SUB = "projects/crash/subscriptions/delays-sub"
DELAYED = 20_000
DELAY_S = 8.0


def _pull_all(
    sub: Any,
    want: int,
    timeout: float,
    unique_of: set[bytes] | None = None,
    including: bytes | None = None,
) -> tuple[list[bytes], list[float]]:
    """Pull and ack until ``want`` messages came (not counting those in ``unique_of``) and,
    if given, ``including`` among them."""
    got: list[bytes] = []
    times: list[float] = []
    deadline = time.monotonic() + timeout

    def count() -> int:
        return len(got) if unique_of is None else len(set(got) - unique_of)

    def done() -> bool:
        return count() >= want and (including is None or including in got)

    while not done() and time.monotonic() < deadline:
        resp = sub.pull(subscription=SUB, max_messages=1000, timeout=10)
        now = time.time()
        got += [m.message.data for m in resp.received_messages]
        times += [now] * len(resp.received_messages)
        if resp.received_messages:
            sub.acknowledge(subscription=SUB, ack_ids=[m.ack_id for m in resp.received_messages])
    return got, times


def test_delayed_messages_survive_kill9_before_and_while_falling_due(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        make_publisher(server.endpoint).create_topic(name=TOPIC)
        sub = make_subscriber(server.endpoint)
        sub.create_subscription(name=SUB, topic=TOPIC)
        raw = gapic_publisher(server.endpoint)
        attrs = {"pubsubd.deliver_after": str(DELAY_S)}
        published = time.time()
        for b in range(DELAYED // 1000):
            msgs = [PubsubMessage(data=f"d{b}-{i}".encode(), attributes=attrs) for i in range(1000)]
            raw.publish(request=PublishRequest(topic=TOPIC, messages=msgs))
        raw.publish(request=PublishRequest(topic=TOPIC, messages=[PubsubMessage(data=b"now")]))
        sub.close()
        port = server.port
        server.kill()  # kill -9: the delayed messages wait in the log and the index

        server.start(port=port)
        sub = make_subscriber(server.endpoint)
        # The undelayed message once; part of the delayed ones as they fall due, never before
        # (a pull's receive time bounds its delivery time from above; ``published`` is before
        # any of them was published). On a busy machine the restart may come after they are
        # all due: then they may come before the undelayed one, which is later in the log, so
        # the pulls go on until it came (CI: once all 20,000 were due before the restart).
        some, times = _pull_all(sub, 5001, DELAY_S + 30, including=b"now")
        assert some.count(b"now") == 1
        delayed_times = times[: some.index(b"now")] + times[some.index(b"now") + 1 :]
        assert len(some) >= 5001 and min(delayed_times) >= published + DELAY_S
        some.remove(b"now")
        sub.close()
        # Acks are journaled by a background flush (every 50 ms plus the fsync), and every trim
        # pass flushes them first: after a whole pass every ack answered so far is on disk when
        # the process dies. At the default interval (2 s) a flush already under way when that
        # pass began has had 2 s to finish.
        wait_trim_passes(server)
        server.kill()

        server.start(port=port)
        sub = make_subscriber(server.endpoint)
        expected = {f"d{b}-{i}".encode() for b in range(DELAYED // 1000) for i in range(1000)}
        # Pull until every unique message is in (acks lost in the kill come back as extras).
        rest, _ = _pull_all(sub, len(expected - set(some)), 60, unique_of=set(some))
        assert set(some) | set(rest) == expected  # none lost
        # Every ack answered before that trim pass was durable: none comes back.
        assert set(some) & set(rest) == set()
        assert sub.pull(subscription=SUB, max_messages=10, timeout=2).received_messages == []
        sub.close()
    finally:
        server.kill()
