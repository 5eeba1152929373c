"""Delivery semantics with the official clients (docs/GOOGLE_API.md §7, §8).

Leases, acks, nacks, deadline changes, flow control, fan-out and sharing, big messages, long-poll
Pull, and what survives a graceful restart.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.pubsub_v1.types import BatchSettings, FlowControl

from tests.conftest import make_publisher, make_subscriber
from tests.support.clients import publish, pull, pull_until, setup
from tests.support.raw import RawStream, StreamingPullRequest
from tests.support.server import ServerProcess, wait_for
from tests.support.status import sub_status

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]

ACK_DEADLINE_S = 10


class Collector:
    """A subscribe() callback that records every delivery and acks it."""

    def __init__(self, ack: bool = True) -> None:
        self.lock = threading.Lock()
        self.deliveries: list[Any] = []
        self.ack = ack

    def __call__(self, message: Any) -> None:
        with self.lock:
            self.deliveries.append(message)
        if self.ack:
            message.ack()

    def ids(self) -> Counter[str]:
        with self.lock:
            return Counter(m.message_id for m in self.deliveries)


# --- throughput and exactly-once with acks -----------------------------------------------------


def test_batched_publish_and_subscribe_every_message_once(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    pub = make_publisher(
        shared_server.endpoint, batch_settings=BatchSettings(max_messages=50, max_latency=0.01)
    )
    count = 2000
    datas = [f"message-{i}".encode() for i in range(count)]
    ids = publish(pub, topic, *datas)
    assert len(set(ids)) == count, "every publish got its own message ID"

    subscriber = make_subscriber(shared_server.endpoint)
    collector = Collector()
    future = subscriber.subscribe(sname, collector, flow_control=FlowControl(max_messages=10))
    try:
        wait_for(lambda: set(collector.ids()) == set(ids), 60, "every message")
        received = collector.ids()
        duplicates = sum(n - 1 for n in received.values())
        assert duplicates == 0, f"{duplicates} redeliveries although every message was acked"
        with collector.lock:
            assert {m.data for m in collector.deliveries} == set(datas)
        wait_for(lambda: sub_status(shared_server, sname).get("backlog") == 0, 10, "acks applied")
    finally:
        future.cancel()
        subscriber.close()


def test_server_side_flow_control(shared_server: ServerProcess, clients: Any, names: Any) -> None:
    pub, sub = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    publish(pub, topic, *(f"m{i}".encode() for i in range(20)))
    stream = RawStream(
        shared_server.endpoint,
        StreamingPullRequest(
            subscription=sname, stream_ack_deadline_seconds=60, max_outstanding_messages=5
        ),
    )
    try:
        first = stream.receive(5, 10)
        assert len(first) == 5
        assert stream.receive_within(2) == [], "no more than max_outstanding_messages unacked"
        # Acked by the unary RPC (as the official client does): the stream gets 5 more.
        sub.acknowledge(subscription=sname, ack_ids=[m.ack_id for m in first])
        second = stream.receive(5, 10)
        assert len(second) == 5
        assert stream.receive_within(0.5) == []
        # Acked on the stream itself, and a nack (deadline 0) on the stream: both free room.
        stream.send(
            StreamingPullRequest(
                ack_ids=[m.ack_id for m in second[:4]],
                modify_deadline_ack_ids=[second[4].ack_id],
                modify_deadline_seconds=[0],
            )
        )
        third = stream.receive(5, 10)
        assert len(third) == 5
        assert second[4].message.message_id in {m.message.message_id for m in third}
        assert stream.receive_within(0.5) == []
        seen = [m.message.message_id for m in first + second[:4] + third]
        assert len(set(seen)) == len(seen) == 14
    finally:
        stream.close()


def test_server_side_flow_control_bytes(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, _ = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    publish(pub, topic, *(b"x" * 1000 for _ in range(10)))
    stream = RawStream(
        shared_server.endpoint,
        StreamingPullRequest(
            subscription=sname, stream_ack_deadline_seconds=60, max_outstanding_bytes=2500
        ),
    )
    try:
        got = stream.receive(2, 10)
        got += stream.receive_within(1)
        assert 2 <= len(got) <= 3, f"{len(got)} messages of 1000 bytes within 2500 bytes"
    finally:
        stream.close()


# --- Pull, ack, nack, deadlines ---------------------------------------------------------------


def test_pull_and_ack(shared_server: ServerProcess, clients: Any, names: Any) -> None:
    pub, sub = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    ids = publish(pub, topic, b"a", b"b", b"c")
    got = pull_until(sub, sname, 3)
    assert sorted(m.message.message_id for m in got) == sorted(ids)
    assert {m.message.data for m in got} == {b"a", b"b", b"c"}
    assert all(m.message.publish_time for m in got)
    assert len({m.ack_id for m in got}) == 3
    sub.acknowledge(subscription=sname, ack_ids=[m.ack_id for m in got])
    wait_for(lambda: sub_status(shared_server, sname).get("backlog") == 0, 10, "acks applied")
    # Acking again is not an error in normal mode.
    sub.acknowledge(subscription=sname, ack_ids=[m.ack_id for m in got])
    assert pull(sub, sname, 1) == []


def test_nack_redelivers_quickly_with_new_ack_id(clients: Any, names: Any) -> None:
    pub, sub = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=600)[0]
    [mid] = publish(pub, topic, b"nack me")
    [first] = pull_until(sub, sname, 1)
    start = time.monotonic()
    sub.modify_ack_deadline(subscription=sname, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    [again] = pull_until(sub, sname, 1, timeout=15)
    assert time.monotonic() - start < 10  # not the 600 s ack deadline (slack for a busy CI host)
    assert again.message.message_id == mid
    assert again.ack_id != first.ack_id
    sub.acknowledge(subscription=sname, ack_ids=[again.ack_id])
    assert pull(sub, sname, 1) == []


def test_ack_deadline_expiry_and_extension(clients: Any, names: Any) -> None:
    """Expired leases come back after the deadline; a ModifyAckDeadline postpones that."""
    pub, sub = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    ids = publish(pub, topic, b"expires", b"extended")
    got = pull_until(sub, sname, 2)
    leased_at = time.monotonic()
    by_data = {m.message.data: m for m in got}
    sub.modify_ack_deadline(
        subscription=sname, ack_ids=[by_data[b"extended"].ack_id], ack_deadline_seconds=30
    )
    assert pull(sub, sname, 2) == [], "nothing comes back before the deadline"

    redelivered = pull_until(sub, sname, 1, timeout=ACK_DEADLINE_S + 5)
    assert time.monotonic() - leased_at >= ACK_DEADLINE_S - 1
    assert [m.message.data for m in redelivered] == [b"expires"]
    assert redelivered[0].message.message_id == ids[0]
    assert redelivered[0].ack_id != by_data[b"expires"].ack_id

    # Wait (long-poll) until 12 s after the lease: the extended message must not come back.
    wait_s = max(0.0, leased_at + 12 - time.monotonic())
    assert pull(sub, sname, wait_s) == [], "the extended message came back before 30 s"
    assert time.monotonic() - leased_at >= 12
    sub.acknowledge(
        subscription=sname, ack_ids=[redelivered[0].ack_id, by_data[b"extended"].ack_id]
    )


def test_lease_expiry_without_any_consumer(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    """Leases expire on time even when nobody is pulling, whatever their deadlines.

    Two messages are leased, then their deadlines are set to 1 s and 2 s. With no Pull or stream
    connected, both leases must end, and one Pull afterwards gets both messages back.
    """
    pub, sub = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    ids = publish(pub, topic, b"a", b"b")
    got = pull_until(sub, sname, 2)
    for m, seconds in zip(got, (1, 2), strict=True):
        sub.modify_ack_deadline(
            subscription=sname, ack_ids=[m.ack_id], ack_deadline_seconds=seconds
        )
    assert sub_status(shared_server, sname)["outstanding"] == 2
    status: dict[str, Any] = {}

    def expired() -> bool:
        status.update(sub_status(shared_server, sname))
        return status["outstanding"] == 0

    try:
        wait_for(expired, 6, "both leases to expire")
        in_time = True
    except AssertionError:
        in_time = False
    resp = sub.pull(request={"subscription": sname, "max_messages": 10, "return_immediately": True})
    redelivered = sorted(m.message.message_id for m in resp.received_messages)
    assert in_time and redelivered == sorted(ids), (
        f"6 s after deadlines of 1 s and 2 s with no consumer connected, the server still holds "
        f"{status['outstanding']} lease(s), and one Pull got {len(redelivered)} of 2 messages"
    )


# --- who gets what ----------------------------------------------------------------------------


def test_subscription_starts_at_its_creation(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = setup(clients, names, names.subscription("early"), ack_deadline_seconds=ACK_DEADLINE_S)[
        0
    ]
    before = publish(pub, topic, *(f"before-{i}".encode() for i in range(5)))
    late = names.subscription("late")
    sub.create_subscription(name=late, topic=topic)
    after = publish(pub, topic, *(f"after-{i}".encode() for i in range(5)))
    got = pull_until(sub, late, 5)
    assert sorted(m.message.message_id for m in got) == sorted(after)
    assert not {m.message.message_id for m in got} & set(before)
    assert pull(sub, late, 1) == []
    early = pull_until(sub, names.subscription("early"), 10)
    assert sorted(m.message.message_id for m in early) == sorted(before + after)


def test_fan_out_to_every_subscription(clients: Any, names: Any) -> None:
    pub, sub = clients
    subs = [names.subscription("one"), names.subscription("two")]
    topic = setup(clients, names, *subs, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    ids = publish(pub, topic, *(f"m{i}".encode() for i in range(50)))
    for s in subs:
        got = pull_until(sub, s, 50)
        assert sorted(m.message.message_id for m in got) == sorted(ids)
        sub.acknowledge(subscription=s, ack_ids=[m.ack_id for m in got])


def test_two_subscribers_share_one_subscription(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, _ = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    subscribers = [make_subscriber(shared_server.endpoint) for _ in range(2)]
    collectors = [Collector(), Collector()]
    futures = [
        s.subscribe(sname, c, flow_control=FlowControl(max_messages=5))
        for s, c in zip(subscribers, collectors, strict=True)
    ]
    try:
        wait_for(lambda: sub_status(shared_server, sname).get("consumers") == 2, 15, "2 streams")
        ids = publish(pub, topic, *(f"m{i}".encode() for i in range(200)))
        wait_for(
            lambda: set(collectors[0].ids()) | set(collectors[1].ids()) == set(ids),
            30,
            "every message on one of the two subscribers",
        )
        a, b = collectors[0].ids(), collectors[1].ids()
        assert a and b, f"both subscribers got messages ({len(a)} and {len(b)})"
        assert not set(a) & set(b), "a message went to both subscribers"
        assert sum(a.values()) + sum(b.values()) == 200, "no message was delivered twice"
    finally:
        for f in futures:
            f.cancel()
        for s in subscribers:
            s.close()


# --- big messages -----------------------------------------------------------------------------


def test_9mb_message_roundtrip(shared_server: ServerProcess, clients: Any, names: Any) -> None:
    pub, _ = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    data = random.Random(3).randbytes(9_000_000)
    [mid] = publish(pub, topic, data)
    big = make_subscriber(shared_server.endpoint, big_messages=True)
    try:
        [got] = pull_until(big, sname, 1)
        assert got.message.message_id == mid
        assert got.message.data == data
        big.acknowledge(subscription=sname, ack_ids=[got.ack_id])
    finally:
        big.close()


def test_responses_fit_an_emulator_mode_client(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    """Several 1.5 MB messages never go out in one response above the client's 4 MiB limit."""
    pub, sub = clients
    sname, streamed = names.subscription("pull"), names.subscription("stream")
    topic = setup(clients, names, sname, streamed, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    ids = publish(pub, topic, *(bytes([i]) * 1_500_000 for i in range(5)))
    got = pull_until(sub, sname, 5)  # the plain emulator-mode client: 4 MiB receive limit
    assert sorted(m.message.message_id for m in got) == sorted(ids)
    subscriber = make_subscriber(shared_server.endpoint)
    collector = Collector()
    future = subscriber.subscribe(streamed, collector)
    try:
        wait_for(lambda: set(collector.ids()) == set(ids), 30, "every big message streamed")
    finally:
        future.cancel()
        subscriber.close()


# --- long-poll Pull ---------------------------------------------------------------------------


def test_pull_long_poll_empty_returns_before_deadline(clients: Any, names: Any) -> None:
    _, sub = clients
    sname = names.subscription()
    setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)
    start = time.monotonic()
    resp = sub.pull(
        request={"subscription": sname, "max_messages": 10, "return_immediately": False},
        timeout=5,
    )
    elapsed = time.monotonic() - start
    assert list(resp.received_messages) == []
    assert 2 <= elapsed < 5, f"answered after {elapsed:.1f}s"


def test_waiting_pull_returns_published_message_promptly(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, sub = clients
    sname = names.subscription()
    topic = setup(clients, names, sname, ack_deadline_seconds=ACK_DEADLINE_S)[0]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            sub.pull, request={"subscription": sname, "max_messages": 10}, timeout=30
        )
        wait_for(lambda: sub_status(shared_server, sname).get("consumers") == 1, 10, "the Pull")
        published_at = time.monotonic()
        [mid] = publish(pub, topic, b"wake up")
        resp = waiting.result(timeout=30)
        assert time.monotonic() - published_at < 10  # woken by the publish, not the 30 s timeout
    assert [m.message.message_id for m in resp.received_messages] == [mid]


# --- restarts ---------------------------------------------------------------------------------


def test_graceful_restart_keeps_resources_and_unacked_messages(
    server: ServerProcess, names: Any
) -> None:
    pub = make_publisher(server.endpoint)
    sub = make_subscriber(server.endpoint)
    topic, sname = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=sname, topic=topic)
    # Admin state the restart must keep too: a deleted topic, a deleted subscription.
    gone_topic, orphan, gone_sub = names.topic("gone"), names.subscription("orphan"), sname + "-x"
    pub.create_topic(name=gone_topic)
    sub.create_subscription(name=orphan, topic=gone_topic)
    sub.create_subscription(name=gone_sub, topic=topic)
    pub.delete_topic(topic=gone_topic)
    sub.delete_subscription(subscription=gone_sub)
    ids = publish(pub, topic, *(f"m{i}".encode() for i in range(100)))
    got = pull_until(sub, sname, 100)
    assert len({m.message.message_id for m in got}) == 100
    to_ack = random.Random(5).sample(got, 40)
    sub.acknowledge(subscription=sname, ack_ids=[m.ack_id for m in to_ack])
    acked = {m.message.message_id for m in to_ack}
    sub.close()

    port = server.port
    assert server.stop() == 0
    server.start(port=port)
    assert server.port == port

    pub = make_publisher(server.endpoint)
    sub = make_subscriber(server.endpoint)
    try:
        assert pub.get_topic(topic=topic).name == topic
        assert sub.get_subscription(subscription=sname).topic == topic
        assert list(pub.list_topic_subscriptions(topic=topic)) == [sname]
        assert sub.get_subscription(subscription=orphan).topic == "_deleted-topic_"
        with pytest.raises(exceptions.NotFound):
            pub.get_topic(topic=gone_topic)
        with pytest.raises(exceptions.NotFound):
            sub.get_subscription(subscription=gone_sub)
        after = pull_until(sub, sname, 60)
        after_ids = [m.message.message_id for m in after]
        assert sorted(after_ids) == sorted(set(ids) - acked), "exactly the unacked messages"
        assert pull(sub, sname, 2) == [], "nothing acked came back"
        [new_id] = publish(pub, topic, b"new")
        assert new_id not in ids, "message IDs stay unique across a restart"
    finally:
        sub.close()


def test_subscribe_survives_graceful_restart(server: ServerProcess, names: Any) -> None:
    pub = make_publisher(server.endpoint)
    sub = make_subscriber(server.endpoint)
    topic, sname = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=sname, topic=topic)
    collector = Collector()
    streaming = make_subscriber(server.endpoint)
    future = streaming.subscribe(sname, collector)
    try:
        [before] = publish(pub, topic, b"before")
        wait_for(lambda: before in collector.ids(), 15, "the message before the restart")
        port = server.port
        server.stop()
        server.start(port=port)
        pub = make_publisher(server.endpoint)
        [after] = publish(pub, topic, b"after")
        wait_for(lambda: after in collector.ids(), 30, "the message after the restart")
        assert not future.done(), "the subscribe() future ended instead of reconnecting"
    finally:
        future.cancel()
        streaming.close()
        sub.close()
