"""A subscribing forwarder serving a subscription whose topic another process owns.

The owner is a real ``pubsubd serve`` process, published to with the official client. The
subscribing side runs in this test: a ``SubscribingForwarder`` whose topic is a
``RemoteSources`` (data/subscribe/remote_sources.py): a local read-only copy filled over the
owner's ``pubsubd.internal.v1.Sources/Tail``, acks sent to the owner, which keeps the ack state.
Checked: every message delivered once from the copy, live commits followed, acks durable on the
owner (its cursor, read back over ``CursorStates``), a kill -9 and restart of the owner on the
same port survived (the copy resumes, acks flushed before the crash stay), and bad requests
refused with INVALID_ARGUMENT while the owner stays up.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.pubsub_v1.types import PullResponse

from pubsubd._gen.pubsubd.internal.v1 import sources_pb2 as s
from pubsubd.core import pb
from pubsubd.core.errors import Unavailable
from pubsubd.data import sources_wire as wire
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.data.subscribe.remote_sources import RemoteSources
from pubsubd.storage.metadata import SqliteMetadataStore
from tests.conftest import make_publisher, make_subscriber
from tests.support.server import ServerProcess

PROJECT = "remote-sources"
TOPIC = f"projects/{PROJECT}/topics/remote-topic"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/remote-sub"


def _decode(framed: list[bytes]) -> list[Any]:
    """Framed ReceivedMessages (core/wire.py: PullResponse fields) as protobuf objects."""
    return list(PullResponse.deserialize(b"".join(framed)).received_messages)


async def _pull_all(fwd: SubscribingForwarder, want: int, timeout_s: float = 20.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        response = await fwd.pull(SUBSCRIPTION, 1000, 1.0)
        got.extend(_decode(response.messages))
    return got


async def _mark_delete(endpoint: str, topic_uid: str, sub_uid: str) -> int:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(
            f"/{wire.SERVICE}/CursorStates",
            request_serializer=s.SubscriptionRequest.SerializeToString,
            response_deserializer=s.AttachResponse.FromString,
        )
        response = await call(
            s.SubscriptionRequest(
                protocol_version=wire.PROTOCOL_VERSION,
                topic_uid=topic_uid,
                subscription_uid=sub_uid,
            ),
            timeout=5,
        )
    return int(wire.cursors_from_wire(response.cursors)[0].mark_delete)


def _only_dir(path: Path) -> str:
    (found,) = [p.name for p in path.iterdir() if p.is_dir()]
    return found


@pytest.fixture
def owner(tmp_path: Path) -> Any:
    srv = ServerProcess(tmp_path / "owner").start()
    yield srv
    srv.kill()


async def test_a_subscription_is_served_from_a_copy_of_a_topic_owned_elsewhere(
    owner: ServerProcess, tmp_path: Path
) -> None:
    publisher = make_publisher(owner.endpoint)
    admin = make_subscriber(owner.endpoint)
    publisher.create_topic(name=TOPIC)
    # Created on the owner too, so its ack state lives there under the subscription's uid.
    admin.create_subscription(name=SUBSCRIPTION, topic=TOPIC, ack_deadline_seconds=30)
    admin.close()
    futures = [publisher.publish(TOPIC, f"m-{i}".encode()) for i in range(200)]
    for f in futures:
        f.result(timeout=30)
    topic_uid = _only_dir(owner.data_dir / "topics")
    store = SqliteMetadataStore(owner.data_dir)  # read beside the server (SQLite WAL)
    (sub_uid,) = [r.uid for r in store.load_subscriptions() if r.name == SUBSCRIPTION]

    remote = RemoteSources(tmp_path / "copy", lambda _uid: [owner.endpoint])
    fwd = SubscribingForwarder(route=lambda _uid: remote)
    subscription = pb.Subscription(name=SUBSCRIPTION, topic=TOPIC, ack_deadline_seconds=30)
    try:
        cursors = await remote.prepare(topic_uid, sub_uid, {0: 0})
        assert cursors[0].mark_delete == 0
        fwd.open(SUBSCRIPTION, subscription, sub_uid, topic_uid, {0: 0})

        first = await _pull_all(fwd, 200)
        assert sorted(m.message.data for m in first) == sorted(
            f"m-{i}".encode() for i in range(200)
        )
        fwd.acknowledge(SUBSCRIPTION, [m.ack_id for m in first])
        await remote.flush_acks(topic_uid, sub_uid)
        assert await _mark_delete(owner.endpoint, topic_uid, sub_uid) == 200

        # Live: published after the copy caught up, it arrives over the open Tail.
        for f in [publisher.publish(TOPIC, f"live-{i}".encode()) for i in range(50)]:
            f.result(timeout=30)
        live = await _pull_all(fwd, 50)
        assert sorted(m.message.data for m in live) == sorted(
            f"live-{i}".encode() for i in range(50)
        )
        fwd.acknowledge(SUBSCRIPTION, [m.ack_id for m in live])
        await remote.flush_acks(topic_uid, sub_uid)
        assert await _mark_delete(owner.endpoint, topic_uid, sub_uid) == 250

        # kill -9 of the owner, then a restart on the same port: the copy goes on, and the
        # acks made durable before the crash stay.
        restarts = remote.tail_restarts
        owner.kill()
        owner.start(port=owner.port)
        publisher = make_publisher(owner.endpoint)
        for f in [publisher.publish(TOPIC, f"after-{i}".encode()) for i in range(20)]:
            f.result(timeout=30)
        after = await _pull_all(fwd, 20)
        assert sorted(m.message.data for m in after) == sorted(
            f"after-{i}".encode() for i in range(20)
        )
        assert remote.tail_restarts > restarts
        fwd.acknowledge(SUBSCRIPTION, [m.ack_id for m in after])
        await remote.flush_acks(topic_uid, sub_uid)
        assert await _mark_delete(owner.endpoint, topic_uid, sub_uid) == 270
        # Nothing more, and nothing twice.
        assert await _pull_all(fwd, 1, timeout_s=1.5) == []

        # Served here no more: once nothing reads the topic, its copy goes.
        copy = tmp_path / "copy" / "topics" / topic_uid
        assert copy.is_dir()
        fwd.close_subscription(SUBSCRIPTION, Unavailable("moved"))
        remote.forget(topic_uid, sub_uid)
        for _ in range(200):
            if not copy.exists():
                break
            await asyncio.sleep(0.05)
        assert not copy.exists()
    finally:
        await fwd.close()
        await remote.close()


@pytest.mark.parametrize(
    ("method", "request_type", "fields"),
    [
        ("Attach", s.AttachRequest, {"topic_uid": "x", "subscription_uid": "y"}),  # no version
        (
            "RecordAcks",
            s.RecordAcksRequest,
            {
                "protocol_version": 1,
                "topic_uid": "x",
                "subscription_uid": "y",
                "acks": [s.CursorState(source=0, ranges=[5, 3])],
            },
        ),
        ("FlushAcks", s.SubscriptionRequest, {"protocol_version": 1, "topic_uid": "x"}),
    ],
)
async def test_bad_requests_are_refused_and_the_owner_stays_up(
    owner: ServerProcess, method: str, request_type: Any, fields: dict[str, Any]
) -> None:
    async with grpc.aio.insecure_channel(owner.endpoint) as channel:
        call = channel.unary_unary(
            f"/{wire.SERVICE}/{method}",
            request_serializer=request_type.SerializeToString,
            response_deserializer=s.Done.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(request_type(**fields), timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        tail = channel.unary_stream(
            f"/{wire.SERVICE}/Tail",
            request_serializer=None,
            response_deserializer=s.TailResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as garbage:
            async for _ in tail(b"\xff\xff\xff", timeout=5):
                pass
        assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await asyncio.sleep(0)
    assert owner.alive()
