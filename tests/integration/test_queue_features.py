"""Pulsar-style queue features through labels and attributes: subscription types, nack delay,
outstanding caps and delayed delivery, driven by raw streams and the official client."""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from google.api_core import exceptions

from pubsubd.core import pb
from tests.conftest import make_publisher, make_subscriber
from tests.support.clients import pull_until, setup
from tests.support.raw import RawStream, gapic_publisher
from tests.support.server import ServerProcess, wait_for
from tests.support.status import sub_status

pytestmark = pytest.mark.integration


def _setup(server: ServerProcess, names: Any, **labels: str) -> tuple[Any, Any, str, str]:
    """New clients, a topic and a subscription with the labels (``_`` in a name becomes ``-``)."""
    pub, sub = make_publisher(server.endpoint), make_subscriber(server.endpoint)
    labels = {k.replace("_", "-"): v for k, v in labels.items()}
    topic, name = setup((pub, sub), names, labels=labels)
    return pub, sub, topic, name


def _stream(server: ServerProcess, name: str, client_id: str, max_messages: int = 100) -> RawStream:
    return RawStream(
        server.endpoint,
        pb.StreamingPullRequest(
            subscription=name,
            stream_ack_deadline_seconds=60,
            client_id=client_id,
            max_outstanding_messages=max_messages,
        ),
    )


def _ack(stream: RawStream, messages: list[Any]) -> None:
    stream.send(pb.StreamingPullRequest(ack_ids=[m.ack_id for m in messages]))


def test_bad_queue_labels_are_rejected(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    for labels in (
        {"pubsubd-subscription-type": "roundrobin"},
        {"pubsubd-nack-delay-seconds": "9999"},
        {"pubsubd-max-outstanding-messages": "many"},
        {"pubsubd-unknown-setting": "1"},
    ):
        with pytest.raises(exceptions.InvalidArgument) as e:
            sub.create_subscription(
                request={"name": names.subscription(), "topic": topic, "labels": labels}
            )
        assert next(iter(labels)) in str(e.value)


def test_exclusive_refuses_a_second_client(shared_server: ServerProcess, names: Any) -> None:
    pub, _, topic, name = _setup(shared_server, names, pubsubd_subscription_type="exclusive")
    first = _stream(shared_server, name, "client-a")
    try:
        pub.publish(topic, b"x").result(timeout=30)
        assert len(first.receive(1, 10)) == 1
        second = _stream(shared_server, name, "client-b")
        assert second.status_code(10) == grpc.StatusCode.FAILED_PRECONDITION
        # The same client reconnecting is admitted.
        again = _stream(shared_server, name, "client-a")
        assert again.status_code(1) is None
        again.close()
    finally:
        first.close()


def test_failover_first_client_receives_next_takes_over(
    shared_server: ServerProcess, names: Any
) -> None:
    pub, _, topic, name = _setup(shared_server, names, pubsubd_subscription_type="failover")
    b = _stream(shared_server, name, "consumer-b")
    a = _stream(shared_server, name, "consumer-a")
    try:
        wait_for(lambda: sub_status(shared_server, name).get("consumers") == 2, 10, "2 streams")
        for i in range(20):
            pub.publish(topic, f"m{i}".encode()).result(timeout=30)
        got_a = a.receive(20, 10)
        assert len(got_a) == 20
        assert b.receive_within(1.0) == []
        _ack(a, got_a)
        a.close()
        pub.publish(topic, b"after-failover").result(timeout=30)
        got_b = b.receive(1, 10)
        assert [m.message.data for m in got_b] == [b"after-failover"]
    finally:
        b.close()


def test_key_shared_sends_each_key_to_one_consumer(
    shared_server: ServerProcess, names: Any
) -> None:
    from google.cloud import pubsub_v1

    pub = make_publisher(
        shared_server.endpoint,
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
    )
    sub = make_subscriber(shared_server.endpoint)
    topic, name = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(
        request={
            "name": name,
            "topic": topic,
            "labels": {"pubsubd-subscription-type": "key_shared"},
        }
    )
    streams = [_stream(shared_server, name, f"worker-{i}", 1000) for i in range(3)]
    try:
        wait_for(lambda: sub_status(shared_server, name).get("consumers") == 3, 10, "3 streams")
        keys = [f"key-{i}" for i in range(12)]
        futures = [
            pub.publish(topic, f"{k}:{n}".encode(), ordering_key=k) for n in range(10) for k in keys
        ]
        for f in futures:
            f.result(timeout=30)
        owner: dict[str, set[int]] = defaultdict(set)
        order: dict[str, list[int]] = defaultdict(list)
        total = 0
        deadline = time.monotonic() + 20
        while total < 120 and time.monotonic() < deadline:
            for i, s in enumerate(streams):
                got = s.receive_within(0.2)
                for m in got:
                    key, n = m.message.data.decode().split(":")
                    owner[key].add(i)
                    order[key].append(int(n))
                total += len(got)
                _ack(s, got)
        assert total == 120
        assert all(len(v) == 1 for v in owner.values()), owner
        assert len({next(iter(v)) for v in owner.values()}) > 1, "all keys went to one consumer"
        assert all(order[k] == list(range(10)) for k in keys)
    finally:
        for s in streams:
            s.close()


def test_nack_delay_postpones_redelivery(shared_server: ServerProcess, names: Any) -> None:
    pub, sub, topic, name = _setup(shared_server, names, pubsubd_nack_delay_seconds="2")
    pub.publish(topic, b"later").result(timeout=30)
    first = sub.pull(subscription=name, max_messages=1, timeout=10).received_messages[0]
    sub.modify_ack_deadline(subscription=name, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    nacked = time.monotonic()
    again = sub.pull(subscription=name, max_messages=1, timeout=15).received_messages
    assert again and again[0].message.data == b"later"
    assert time.monotonic() - nacked >= 1.8


def test_subscription_outstanding_cap_pauses_dispatch(
    shared_server: ServerProcess, names: Any
) -> None:
    pub, _, topic, name = _setup(shared_server, names, pubsubd_max_outstanding_messages="3")
    for i in range(10):
        pub.publish(topic, f"m{i}".encode()).result(timeout=30)
    a = _stream(shared_server, name, "a", 100)
    b = _stream(shared_server, name, "b", 100)
    try:
        got = a.receive_within(1.0) + b.receive_within(1.0)
        assert len(got) == 3
        _ack(a, [m for m in got if m in got[:3]])
        _ack(b, got)
        more = a.receive_within(1.5) + b.receive_within(0.5)
        assert len(more) == 3
    finally:
        a.close()
        b.close()


def test_consumer_outstanding_cap_applies_to_each_stream(
    shared_server: ServerProcess, names: Any
) -> None:
    pub, _, topic, name = _setup(
        shared_server, names, pubsubd_consumer_max_outstanding_messages="2"
    )
    for i in range(10):
        pub.publish(topic, f"m{i}".encode()).result(timeout=30)
    a = _stream(shared_server, name, "a", 100)
    b = _stream(shared_server, name, "b", 100)
    try:
        got_a, got_b = a.receive_within(1.5), b.receive_within(0.5)
        assert (len(got_a), len(got_b)) == (2, 2)  # each stream at its own cap, not 10
        _ack(a, got_a)
        assert len(a.receive_within(1.5)) == 2 and b.receive_within(0.5) == []
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("label", "each_stream"),
    [("pubsubd_max_outstanding_bytes", False), ("pubsubd_consumer_max_outstanding_bytes", True)],
)
def test_byte_caps_pause_dispatch(
    shared_server: ServerProcess, names: Any, label: str, each_stream: bool
) -> None:
    """1000-byte messages and a 2500-byte cap: dispatch pauses once the outstanding bytes reach
    the cap, so the third message (the one that crosses it) is the last to go."""
    pub, _, topic, name = _setup(shared_server, names, **{label: "2500"})
    for i in range(10):
        pub.publish(topic, f"{i}".encode() * 1000).result(timeout=30)
    a = _stream(shared_server, name, "a", 100)
    try:
        got = a.receive_within(1.5)
        assert len(got) == 3
        b = _stream(shared_server, name, "b", 100)
        try:
            # Per consumer, a second stream has its own 2500 bytes; per subscription the cap
            # is already reached.
            assert len(b.receive_within(1.5)) == (3 if each_stream else 0)
        finally:
            b.close()
        _ack(a, got)
        assert len(a.receive_within(1.5)) >= 1
    finally:
        a.close()


def test_delayed_delivery_by_attribute(server: ServerProcess, names: Any) -> None:
    pub, sub, topic, name = _setup(server, names)
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)).isoformat().replace("+00:00", "Z")
    pub.publish(topic, b"after", **{"pubsubd.deliver_after": "2"}).result(timeout=30)
    pub.publish(topic, b"at", **{"pubsubd.deliver_at": at}).result(timeout=30)
    pub.publish(topic, b"now").result(timeout=30)
    published = time.monotonic()
    first = sub.pull(subscription=name, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in first] == [b"now"]
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in first])
    got: list[bytes] = []
    while len(got) < 2 and time.monotonic() - published < 15:
        resp = sub.pull(subscription=name, max_messages=10, timeout=10)
        got += [m.message.data for m in resp.received_messages]
        if resp.received_messages:
            sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in resp.received_messages])
    assert sorted(got) == [b"after", b"at"]
    assert time.monotonic() - published >= 1.8


def test_delayed_messages_survive_restart(server: ServerProcess, names: Any) -> None:
    pub, sub, topic, name = _setup(server, names)
    pub.publish(topic, b"delayed", **{"pubsubd.deliver_after": "3"}).result(timeout=30)
    published = time.monotonic()
    port = server.port
    server.kill()
    server.start(port=port)
    sub = make_subscriber(server.endpoint)
    resp = sub.pull(subscription=name, max_messages=1, timeout=15)
    assert [m.message.data for m in resp.received_messages] == [b"delayed"]
    assert time.monotonic() - published >= 2.8


def test_bad_delay_attributes_are_rejected(shared_server: ServerProcess, names: Any) -> None:
    pub = make_publisher(shared_server.endpoint)
    topic = names.topic()
    pub.create_topic(name=topic)
    for attrs in (
        {"pubsubd.deliver_after": "soon"},
        {"pubsubd.deliver_at": "tomorrow"},
        {"pubsubd.deliver_at": "2030-01-01T00:00:00"},
    ):
        with pytest.raises(exceptions.InvalidArgument) as e:
            pub.publish(topic, b"x", **attrs).result(timeout=30)
        assert next(iter(attrs)) in str(e.value)


def test_backlog_quota_blocks_publishers(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, sub = clients
    topic, name = names.topic(), names.subscription()
    pub.create_topic(request={"name": topic, "labels": {"pubsubd-backlog-quota-messages": "5"}})
    sub.create_subscription(name=name, topic=topic)
    for i in range(5):
        pub.publish(topic, f"m{i}".encode()).result(timeout=30)
    # The generated client, one RPC with retry=None: no client retry of RESOURCE_EXHAUSTED.
    gapic = gapic_publisher(shared_server.endpoint)
    with pytest.raises(exceptions.ResourceExhausted) as e:
        gapic.publish(
            request={"topic": topic, "messages": [{"data": b"over"}]},
            retry=None,
            timeout=10,
        )
    assert name in str(e.value) and "pubsubd-backlog-quota-messages" in str(e.value)
    resp = sub.pull(subscription=name, max_messages=5, timeout=10)
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in resp.received_messages])
    gapic.publish(request={"topic": topic, "messages": [{"data": b"fits"}]}, timeout=10)


def test_backlog_byte_quota_counts_the_unacked_messages_bytes(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    """20,000 bytes: ten unacked 2,000-byte messages reach it, however many small acked messages
    sit in the log before them (an average over the whole log would let far more through)."""
    pub, sub = clients
    topic, name = names.topic(), names.subscription()
    pub.create_topic(request={"name": topic, "labels": {"pubsubd-backlog-quota-bytes": "20000"}})
    sub.create_subscription(name=name, topic=topic)
    gapic = gapic_publisher(shared_server.endpoint)
    small = [{"data": b"s"} for _ in range(1000)]
    for _ in range(3):  # 3,000 small messages, all acked: they stay in the log's segment
        gapic.publish(request={"topic": topic, "messages": small}, timeout=10)
    pull_until(sub, name, 3000, ack=True, timeout=60)
    wait_for(lambda: sub_status(shared_server, name).get("backlog") == 0, 10, "acks applied")
    accepted = 0
    with pytest.raises(exceptions.ResourceExhausted) as e:
        for _ in range(50):
            gapic.publish(
                request={"topic": topic, "messages": [{"data": bytes(2000)}]},
                retry=None,
                timeout=10,
            )
            accepted += 1
    assert accepted == 10  # the 11th would start above 20,000 bytes (each is 2,000 + framing)
    assert "pubsubd-backlog-quota-bytes" in str(e.value)


def test_backlog_quota_evicts_oldest(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, sub = clients
    labels = {"pubsubd-backlog-quota-messages": "3", "pubsubd-backlog-policy": "evict_oldest"}
    topic, name = setup(clients, names, labels=labels)
    for i in range(10):
        pub.publish(topic, f"m{i}".encode()).result(timeout=30)
    wait_for(lambda: sub_status(shared_server, name).get("backlog", 4) <= 3, 10, "eviction to 3")
    resp = sub.pull(subscription=name, max_messages=10, timeout=10)
    assert [m.message.data for m in resp.received_messages] == [b"m7", b"m8", b"m9"]


def _streaming(server: ServerProcess, name: str, got: list[bytes]) -> Any:
    """An official-client StreamingPull that records and acks what it receives."""

    def callback(message: Any) -> None:
        got.append(message.data)
        message.ack()

    return make_subscriber(server.endpoint).subscribe(name, callback=callback)


def _consumers(server: ServerProcess, name: str) -> int:
    return int(sub_status(server, name).get("consumers", 0))


def test_exclusive_refuses_pull_while_a_stream_holds_it(
    shared_server: ServerProcess, names: Any
) -> None:
    pub, sub, topic, name = _setup(shared_server, names, pubsubd_subscription_type="exclusive")
    pub.publish(topic, b"pulled").result(timeout=30)
    # No stream: Pull is served.
    first = sub.pull(subscription=name, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in first] == [b"pulled"]
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in first])
    with ThreadPoolExecutor(1) as pool:
        # A Pull waiting when a stream is admitted ends with FAILED_PRECONDITION at once.
        waiting = pool.submit(sub.pull, subscription=name, max_messages=10, timeout=30)
        wait_for(lambda: _consumers(shared_server, name) == 1, 10, "the waiting Pull")
        got: list[bytes] = []
        stream = _streaming(shared_server, name, got)
        try:
            with pytest.raises(exceptions.FailedPrecondition, match="exclusive"):
                waiting.result(timeout=10)
            pub.publish(topic, b"streamed").result(timeout=30)
            wait_for(lambda: got == [b"streamed"], 10, "the stream to receive")
            # While the stream holds the subscription, Pull (which has no client_id) is refused.
            with pytest.raises(exceptions.FailedPrecondition, match="held by a StreamingPull"):
                sub.pull(subscription=name, max_messages=10, timeout=10)
        finally:
            stream.cancel()
            stream.result(timeout=10)
    wait_for(lambda: _consumers(shared_server, name) == 0, 10, "the stream to close")
    # The stream left: Pull is served again.
    pub.publish(topic, b"pulled-again").result(timeout=30)
    again = sub.pull(subscription=name, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in again] == [b"pulled-again"]


def test_failover_pull_is_a_standby_behind_streams(
    shared_server: ServerProcess, names: Any
) -> None:
    pub, sub, topic, name = _setup(shared_server, names, pubsubd_subscription_type="failover")
    got: list[bytes] = []
    stream = _streaming(shared_server, name, got)
    try:
        wait_for(lambda: _consumers(shared_server, name) == 1, 10, "the stream")
        with ThreadPoolExecutor(1) as pool:
            # A Pull while the stream is active is admitted but gets nothing, even for
            # messages published during its wait: the active stream receives them.
            standby = pool.submit(sub.pull, subscription=name, max_messages=10, timeout=4)
            wait_for(lambda: _consumers(shared_server, name) == 2, 10, "the waiting Pull")
            for i in range(3):
                pub.publish(topic, f"m{i}".encode()).result(timeout=30)
            assert standby.result(timeout=10).received_messages == []
        wait_for(lambda: sorted(got) == [b"m0", b"m1", b"m2"], 10, "the stream to receive")
    finally:
        stream.cancel()
        stream.result(timeout=10)
    # A stream with room for one message takes one; a waiting Pull takes over the rest as soon
    # as that stream leaves, without another publish.
    raw = _stream(shared_server, name, "only-one", max_messages=1)
    try:
        for i in range(3):
            pub.publish(topic, f"n{i}".encode()).result(timeout=30)
        assert [m.message.data for m in raw.receive(1, 10)] == [b"n0"]
        with ThreadPoolExecutor(1) as pool:
            standby = pool.submit(sub.pull, subscription=name, max_messages=10, timeout=30)
            wait_for(lambda: _consumers(shared_server, name) == 2, 10, "the waiting Pull")
            assert not standby.done()
            raw.close()
            left = time.monotonic()
            taken = standby.result(timeout=10).received_messages
            assert [m.message.data for m in taken] == [b"n1", b"n2"]
            assert time.monotonic() - left < 5
    finally:
        raw.close()
