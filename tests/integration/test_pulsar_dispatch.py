"""Who the Pulsar front hands messages to, with the official ``pulsar-client`` against a real
``pubsubd serve --pulsar-port 0``: Shared consumers sized by their permits, the active consumer
of a Failover subscription told (ACTIVE_CONSUMER_CHANGE), and seek into a delivered batch."""

from __future__ import annotations

import uuid
from typing import Any

import pulsar
import pytest

from pubsubd.pulsar.api import BaseCommand, CommandSubscribe, Type
from tests.conftest import make_publisher
from tests.support.pulsar import RawConnection
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration


def _topic(tag: str) -> str:
    return f"persistent://test-project/default/{tag}-{uuid.uuid4().hex[:8]}"


def _drain(consumer: Any, timeout_ms: int = 700) -> list[Any]:
    """Receive and ack until nothing comes for ``timeout_ms``."""
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_ms)
        except pulsar.Timeout:
            return got
        got.append(msg)
        consumer.acknowledge(msg)


def test_a_shared_consumer_takes_only_what_its_permits_allow(
    pulsar_client: pulsar.Client,
) -> None:
    """A Shared consumer that does not receive holds its receiver queue's worth, no more: the
    other consumer gets the rest, and every message goes out once."""
    topic = _topic("permits")
    idle = pulsar_client.subscribe(
        topic, "work", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5
    )
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    sent = [f"m{i}".encode() for i in range(60)]
    for data in sent:
        producer.send(data)
    busy = pulsar_client.subscribe(
        topic, "work", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5
    )
    by_busy = _drain(busy)
    # The idle consumer was handed its 5 permits' worth (its client queues them), not the
    # backlog: before flow followed permits it took all 60 and the other got none.
    assert len(by_busy) >= len(sent) - 6
    by_idle = _drain(idle)
    assert 1 <= len(by_idle) <= 6
    got = [m.data() for m in by_busy + by_idle]
    assert sorted(got) == sorted(sent)  # each once: nothing lost, nothing twice
    assert {m.redelivery_count() for m in by_busy + by_idle} == {0}


# --- ACTIVE_CONSUMER_CHANGE -----------------------------------------------------------------
# pulsar-client 3.13's Python wrapper does not expose the C++ client's ConsumerEventListener,
# so these speak the protocol themselves.


def _subscribe(conn: RawConnection, topic: str, consumer_id: int, name: str) -> None:
    cmd = BaseCommand(type=Type.Value("SUBSCRIBE"))
    cmd.subscribe.topic = topic
    cmd.subscribe.subscription = "standby"
    cmd.subscribe.subType = CommandSubscribe.Failover
    cmd.subscribe.consumer_id = consumer_id
    cmd.subscribe.request_id = consumer_id
    cmd.subscribe.consumer_name = name
    conn.command(cmd)


def _connection(port: int) -> RawConnection:
    conn = RawConnection(port)
    conn.connect()
    return conn


def _next_change(conn: RawConnection) -> tuple[int, bool]:
    """The next ACTIVE_CONSUMER_CHANGE (consumer ID, is_active), skipping other commands."""
    while True:
        reply = conn.read()
        assert reply is not None, "the server closed the connection"
        cmd, _ = reply
        if cmd.type == Type.Value("ERROR"):
            raise AssertionError(cmd.error.message)
        if cmd.type == Type.Value("ACTIVE_CONSUMER_CHANGE"):
            change = cmd.active_consumer_change
            return int(change.consumer_id), bool(change.is_active)


def _changes(conn: RawConnection, quiet_s: float = 0.7) -> list[tuple[int, bool]]:
    """Every ACTIVE_CONSUMER_CHANGE until none comes for ``quiet_s``."""
    got = []
    conn.sock.settimeout(quiet_s)
    try:
        while True:
            got.append(_next_change(conn))
    except TimeoutError:
        return got
    finally:
        conn.sock.settimeout(5)


def test_failover_consumers_are_told_when_they_become_or_stop_being_active(
    pulsar_server: ServerProcess,
) -> None:
    port = pulsar_server.pulsar_port
    topic = _topic("failover-events")
    first, second = _connection(port), _connection(port)
    _subscribe(first, topic, 7, "first")
    assert _next_change(first) == (7, True)  # alone: active at once
    _subscribe(second, topic, 9, "second")
    _, second_active = _next_change(second)
    if second_active:  # the server's order put it first: the other one is told it stopped
        assert _next_change(first) == (7, False)
        active, standby, standby_id = second, first, 7
    else:
        assert _changes(first) == []  # still the active one: nothing to tell it
        active, standby, standby_id = first, second, 9
    # The active consumer's connection drops: the standby takes over and is told so.
    active.close()
    assert _next_change(standby) == (standby_id, True)
    standby.close()


def test_a_partitioned_failover_subscription_tells_each_partitions_consumer(
    pulsar_server: ServerProcess,
) -> None:
    """Partition N goes to the consumer at N mod count by name (as Pulsar shares partitions
    out); each partition's consumer is told whether it is that one."""
    topic = _topic("failover-partitions")
    publisher = make_publisher(pulsar_server.endpoint)
    publisher.create_topic(
        request={
            "name": "projects/test-project/topics/" + topic.rsplit("/", 1)[1],
            "labels": {"pubsubd-publish-sources": "2"},
        }
    )
    port = pulsar_server.pulsar_port
    a, b = _connection(port), _connection(port)  # one connection per client, as the client
    for partition, consumer_id in ((0, 1), (1, 2)):
        _subscribe(a, f"{topic}-partition-{partition}", consumer_id, "a")
    assert sorted(_changes(a)) == [(1, True), (2, True)]  # alone: every partition
    for partition, consumer_id in ((0, 3), (1, 4)):
        _subscribe(b, f"{topic}-partition-{partition}", consumer_id, "b")
    # Names a < b: partition 0 stays with a, partition 1 moves to b.
    assert sorted(_changes(b)) == [(3, False), (4, True)]
    assert _changes(a) == [(2, False)]
    b.close()  # b leaves: a takes partition 1 back
    assert _changes(a) == [(2, True)]
    a.close()


# --- seek into a delivered batch --------------------------------------------------------------


@pytest.mark.parametrize("batch_index_acks", [False, True])
def test_seek_into_a_delivered_batch_resumes_after_the_batchs_first_message(
    pulsar_client: pulsar.Client, batch_index_acks: bool
) -> None:
    """pulsar-client 3.13 sends SEEK with the batch's (ledger, entry) only, no batch_index or
    ack_set, so the front cannot tell which message of the batch was named: delivery resumes
    with the batch's second message (documented in README). What comes again is acked like
    anything else: nothing is left behind for the next consumer."""
    topic = _topic("seek-batch")
    consumer = pulsar_client.subscribe(
        topic,
        "seeker",
        consumer_type=pulsar.ConsumerType.Exclusive,
        batch_index_ack_enabled=batch_index_acks,
    )
    producer = pulsar_client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10, block_if_queue_full=True
    )
    for i in range(10):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    got = [consumer.receive(5000) for _ in range(10)]
    assert {m.message_id().entry_id() for m in got} == {got[0].message_id().entry_id()}
    assert [m.message_id().batch_index() for m in got] == list(range(10))  # one batch
    for msg in got:
        consumer.acknowledge(msg)
    consumer.seek(got[4].message_id())
    again = [m.data() for m in _drain(consumer, 1500)]
    assert again == [f"m{i}".encode() for i in range(1, 10)]  # m5.. in Pulsar
    consumer.close()
    reopened = pulsar_client.subscribe(topic, "seeker", consumer_type=pulsar.ConsumerType.Exclusive)
    assert _drain(reopened) == []
