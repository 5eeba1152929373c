"""Who the Pulsar front hands messages to, with the official ``pulsar-client`` against a real
``pubsubd serve --pulsar-port 0``: Shared consumers sized by their permits, the active consumer
of a Failover subscription told (ACTIVE_CONSUMER_CHANGE), and seek into a delivered batch."""

from __future__ import annotations

import uuid
from typing import Any

import pulsar
import pytest

from pubsubd.core import failover_rank
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


def test_what_a_stalled_consumer_had_read_ahead_goes_to_another_uncounted(
    pulsar_client: pulsar.Client,
) -> None:
    """The server reads ahead of a consumer's permits (up to its receiver queue) and gives
    that back, never sent, once the consumer stops sending FLOWs: another Shared consumer
    gets all but the stalled one's client queue, none of it counted as a redelivery; what
    the stalled client had been sent comes back counted when it closes."""
    topic = _topic("ahead")
    stalled = pulsar_client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    producer = pulsar_client.create_producer(
        topic, batching_enabled=True, batching_max_messages=1000, block_if_queue_full=True
    )
    sent = [f"m{i}".encode() for i in range(3000)]
    for data in sent:
        producer.send_async(data, None)
    producer.flush()
    stalled.receive(5000)  # its client queues up to 1,000 and it stops there
    busy = pulsar_client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    by_busy = _drain(busy)
    assert 2000 - 1 <= len(by_busy) <= 2000
    assert {m.redelivery_count() for m in by_busy} == {0}
    stalled.close()  # what its client was sent comes back, counted
    back = _drain(busy)
    assert 1000 <= len(back) <= 1001
    assert {m.redelivery_count() for m in back} == {1}
    got = [m.data() for m in by_busy + back]
    assert sorted(got) == sorted(sent)  # each once: nothing lost, nothing twice


# --- ACTIVE_CONSUMER_CHANGE -----------------------------------------------------------------
# pulsar-client 3.13's Python wrapper does not expose the C++ client's ConsumerEventListener,
# so these speak the protocol themselves.


def _subscribe(
    conn: RawConnection, topic: str, consumer_id: int, name: str, priority: int = 0
) -> None:
    cmd = BaseCommand(type=Type.Value("SUBSCRIBE"))
    cmd.subscribe.priority_level = priority
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


# --- the active consumer, chosen as Pulsar does ---------------------------------------------
# A non-partitioned topic: the consumers at the best priority level on a hash ring of their
# names, the topic's name picking one (core/failover_rank.py). These topics' names were chosen
# so that the ring picks neither the first consumer to subscribe nor the first by name.
RING_TOPIC = "persistent://test-project/default/fo-ring"  # ann+bob: bob; +cat: cat
RAW_RING_TOPIC = "persistent://test-project/default/fo-ring-raw"  # ann+bob: bob


def test_the_ring_names_these_tests_expectations() -> None:
    assert failover_rank.ring_choice(("ann", "bob"), RING_TOPIC) == 1
    assert failover_rank.ring_choice(("ann", "bob", "cat"), RING_TOPIC) == 2
    assert failover_rank.ring_choice(("ann", "bob"), RAW_RING_TOPIC) == 1


def _receivers(consumers: dict[str, Any], producer: Any, tag: str) -> dict[str, int]:
    """Publish 4 messages; how many each consumer received (drained and acked)."""
    for i in range(4):
        producer.send(f"{tag}{i}".encode())
    got = {name: len(_drain(c, 500)) for name, c in consumers.items()}
    assert sum(got.values()) == 4
    return {name: n for name, n in got.items() if n}


def test_a_failover_topics_active_consumer_is_the_one_pulsars_ring_names(
    pulsar_client: pulsar.Client,
) -> None:
    """Two, then three consumers, then the active one leaving: each time the one Pulsar's rule
    names receives everything (before: the first to subscribe, ann, at every step)."""
    failover = pulsar.ConsumerType.Failover
    consumers = {
        name: pulsar_client.subscribe(
            RING_TOPIC, "ring", consumer_type=failover, consumer_name=name
        )
        for name in ("ann", "bob")
    }
    producer = pulsar_client.create_producer(RING_TOPIC, batching_enabled=False)
    assert _receivers(consumers, producer, "two") == {"bob": 4}
    consumers["cat"] = pulsar_client.subscribe(
        RING_TOPIC, "ring", consumer_type=failover, consumer_name="cat"
    )
    assert _receivers(consumers, producer, "three") == {"cat": 4}
    consumers.pop("cat").close()
    assert _receivers(consumers, producer, "left") == {"bob": 4}
    consumers.pop("bob").close()
    assert _receivers(consumers, producer, "last") == {"ann": 4}


def test_a_better_priority_level_takes_over_and_every_change_is_told(
    pulsar_server: ServerProcess,
) -> None:
    """Priority levels and ACTIVE_CONSUMER_CHANGE over the raw protocol (the Python client
    sets no priority level): zed (level 1) alone, then bob (level 0) takes over; ann (level 0)
    joins as standby (the ring keeps bob); bob leaves: ann; ann leaves: zed."""
    port = pulsar_server.pulsar_port
    zed, bob, ann = _connection(port), _connection(port), _connection(port)
    _subscribe(zed, RAW_RING_TOPIC, 1, "zed", priority=1)
    assert _next_change(zed) == (1, True)
    _subscribe(bob, RAW_RING_TOPIC, 2, "bob")
    assert _next_change(bob) == (2, True)
    assert _next_change(zed) == (1, False)
    _subscribe(ann, RAW_RING_TOPIC, 3, "ann")
    assert _next_change(ann) == (3, False)
    assert _changes(bob) == [] and _changes(zed) == []
    bob.close()
    assert _next_change(ann) == (3, True)
    assert _changes(zed) == []
    ann.close()
    assert _next_change(zed) == (1, True)
    zed.close()


def test_two_failover_consumers_share_four_partitions_by_name(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    """Partition N to the consumer at N mod 2 by name, whatever the order they subscribe in;
    one leaving hands its partitions to the other."""
    topic = _topic("four-partitions")
    make_publisher(pulsar_server.endpoint).create_topic(
        request={
            "name": "projects/test-project/topics/" + topic.rsplit("/", 1)[1],
            "labels": {"pubsubd-publish-sources": "4"},
        }
    )
    failover = pulsar.ConsumerType.Failover
    late = pulsar_client.subscribe(topic, "fo", consumer_type=failover, consumer_name="late")
    early = pulsar_client.subscribe(topic, "fo", consumer_type=failover, consumer_name="early")
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    for i in range(8):  # round-robin: two per partition
        producer.send(f"p{i}".encode())
    by_early = sorted(m.message_id().partition() for m in _drain(early, 500))
    by_late = sorted(m.message_id().partition() for m in _drain(late, 500))
    assert (by_early, by_late) == ([0, 0, 2, 2], [1, 1, 3, 3])
    early.close()
    for i in range(8):
        producer.send(f"q{i}".encode())
    assert sorted(m.message_id().partition() for m in _drain(late, 1000)) == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]


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
