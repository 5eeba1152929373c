"""Many names, few files: topics and subscriptions cost no file descriptors or files until
they are used, and idle topics give their file descriptors back (BENCHMARKS.md, "Scale of
names")."""

from __future__ import annotations

import os
from concurrent import futures
from pathlib import Path

import pytest

from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.integration

TOPICS = 300
PUBLISHED = 40  # topics that get one message each
SLACK = 20  # fds the server may open meanwhile for other reasons (threads, sockets, SQLite)


def _fds(server: ServerProcess) -> int:
    assert server.proc is not None
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def _entries(path: Path) -> list[Path]:
    return list(path.rglob("*")) if path.exists() else []


def test_unused_names_cost_no_fds_and_idle_topics_release_theirs(
    server: ServerProcess, names: object
) -> None:
    pub = make_publisher(server.endpoint)
    sub = make_subscriber(server.endpoint)
    suffix = names.suffix  # type: ignore[attr-defined]
    topics = [f"projects/{PROJECT}/topics/many-{i:03d}-{suffix}" for i in range(TOPICS)]
    subs = [f"projects/{PROJECT}/subscriptions/many-{i:03d}-{suffix}" for i in range(TOPICS)]
    try:
        pub.create_topic(name=topics[0])  # warm up: channels, threads, metadata store
        before = _fds(server)
        with futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda t: pub.create_topic(name=t), topics[1:]))
            pairs = zip(subs, topics, strict=True)
            list(pool.map(lambda st: sub.create_subscription(name=st[0], topic=st[1]), pairs))
        created = _fds(server)
        assert created - before < SLACK, (before, created)
        # Only metadata: no topic or subscription directories.
        assert _entries(server.data_dir / "topics") == []
        assert _entries(server.data_dir / "subscriptions") == []

        for f in [pub.publish(t, b"m") for t in topics[:PUBLISHED]]:
            f.result(timeout=30)
        assert len(list((server.data_dir / "topics").iterdir())) == PUBLISHED
        # Idle for two trim passes (2-4 s): every published topic closes its files again.
        wait_for(lambda: _fds(server) - before < SLACK, 15, "idle topics to release their fds")

        # Released topics still deliver what they hold.
        for s in subs[:3]:
            resp = sub.pull(subscription=s, max_messages=10, timeout=10)
            assert [m.message.data for m in resp.received_messages] == [b"m"]
    finally:
        pub.stop()
        sub.close()
