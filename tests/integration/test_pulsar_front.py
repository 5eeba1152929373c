"""The official ``pulsar-client`` (PyPI) against a real ``pubsubd serve`` with --pulsar-port 0.

One server for the module. Mixed use with the official google-cloud-pubsub client, a consumer
process killed with unacked messages, and malformed frames on a raw socket.
"""

from __future__ import annotations

import datetime as dt
import re
import struct
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import _pulsar
import grpc
import pulsar
import pytest

from pubsubd._gen.pubsubd.v1 import replay_pb2
from pubsubd.core import pb
from pubsubd.pulsar import frames
from pubsubd.pulsar.api import BaseCommand, MessageMetadata, ServerError, Type
from tests.conftest import make_publisher, make_subscriber
from tests.support.pulsar import RawConnection
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.integration

TENANT = "test-project"


def _name(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def _topic(tag: str) -> tuple[str, str]:
    """(Pulsar topic, its Google name): the documented mapping."""
    local = _name(tag)
    return f"persistent://{TENANT}/default/{local}", f"projects/{TENANT}/topics/{local}"


@pytest.mark.parametrize(
    "codec",
    [
        pulsar.CompressionType.NONE,
        pulsar.CompressionType.LZ4,
        pulsar.CompressionType.ZLib,
        pulsar.CompressionType.ZSTD,
        pulsar.CompressionType.SNAPPY,
    ],
)
def test_batched_compressed_produce_reaches_a_shared_consumer(
    pulsar_client: pulsar.Client, codec: Any
) -> None:
    topic, _ = _topic("batch")
    consumer = pulsar_client.subscribe(topic, "sub-a", consumer_type=pulsar.ConsumerType.Shared)
    producer = pulsar_client.create_producer(
        topic, compression_type=codec, batching_enabled=True, batching_max_publish_delay_ms=20
    )
    ids = []
    for i in range(40):
        producer.send_async(
            f"m{i}".encode() * 20,
            lambda res, mid: ids.append((res, mid)),
            properties={"i": str(i)},
            partition_key=f"k{i % 3}",
            event_timestamp=1000 + i,
        )
    producer.flush()
    wait_for(lambda: len(ids) == 40, 5, "40 receipts")
    assert all(res == pulsar.Result.Ok for res, _ in ids)
    got = {}
    for _ in range(40):
        msg = consumer.receive(5000)
        got[msg.properties()["i"]] = msg
        consumer.acknowledge(msg)
    assert sorted(got, key=int) == [str(i) for i in range(40)]
    sample = got["7"]
    assert sample.data() == b"m7" * 20
    assert sample.partition_key() == "k1"
    assert sample.event_timestamp() == 1007
    assert sample.redelivery_count() == 0
    with pytest.raises(pulsar.Timeout):
        consumer.receive(300)


def test_pulsar_and_google_clients_see_each_others_messages(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    topic, google_topic = _topic("mixed")
    pulsar_sub = _name("psub")
    consumer = pulsar_client.subscribe(topic, pulsar_sub, consumer_type=pulsar.ConsumerType.Shared)
    subscriber = make_subscriber(pulsar_server.endpoint)
    google_sub = f"projects/{TENANT}/subscriptions/{_name('gsub')}"
    subscriber.create_subscription(name=google_sub, topic=google_topic)
    # The subscription the Pulsar consumer created is an ordinary one.
    listed = [s.name for s in subscriber.list_subscriptions(project=f"projects/{TENANT}")]
    topic_id = google_topic.rsplit("/", 1)[1]
    assert f"projects/{TENANT}/subscriptions/{topic_id}.{pulsar_sub}" in listed

    producer = pulsar_client.create_producer(topic)
    producer.send(b"from pulsar", properties={"color": "red"}, partition_key="key-1")
    publisher = make_publisher(pulsar_server.endpoint)
    publisher.publish(google_topic, b"from google", flavor="mint").result(timeout=10)

    pulled: list[Any] = []
    deadline = time.monotonic() + 10
    while len(pulled) < 2 and time.monotonic() < deadline:
        response = subscriber.pull(subscription=google_sub, max_messages=10, timeout=5)
        pulled += response.received_messages
        if response.received_messages:
            subscriber.acknowledge(
                subscription=google_sub, ack_ids=[m.ack_id for m in response.received_messages]
            )
    by_data = {m.message.data: m.message for m in pulled}
    assert set(by_data) == {b"from pulsar", b"from google"}
    assert dict(by_data[b"from pulsar"].attributes) == {"color": "red"}
    assert by_data[b"from pulsar"].ordering_key == "key-1"

    received = {}
    for _ in range(2):
        msg = consumer.receive(5000)
        received[msg.data()] = msg
        consumer.acknowledge(msg)
    assert set(received) == {b"from pulsar", b"from google"}
    assert received[b"from google"].properties() == {"flavor": "mint"}
    # A Pulsar consumer names the Google-made subscription by its full name.
    on_google_sub = pulsar_client.subscribe(
        topic, google_sub, consumer_type=pulsar.ConsumerType.Shared
    )
    publisher.publish(google_topic, b"third").result(timeout=10)
    msg = on_google_sub.receive(5000)
    assert msg.data() == b"third"
    on_google_sub.acknowledge(msg)
    subscriber.close()


def test_nacks_count_redeliveries_and_the_clients_dead_letter_policy_works(
    pulsar_client: pulsar.Client,
) -> None:
    topic, _ = _topic("nack")
    dlq, _ = _topic("nack-dlq")
    dlq_consumer = pulsar_client.subscribe(
        dlq, "dlq-watch", consumer_type=pulsar.ConsumerType.Shared
    )
    consumer = pulsar_client.subscribe(
        topic,
        "retrying",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=2, dead_letter_topic=dlq
        ),
    )
    pulsar_client.create_producer(topic).send(b"poison")
    counts = []
    for _ in range(3):
        msg = consumer.receive(5000)
        counts.append(msg.redelivery_count())
        consumer.negative_acknowledge(msg)
    assert counts == [0, 1, 2]
    dead = dlq_consumer.receive(10000)
    assert dead.data() == b"poison"
    dlq_consumer.acknowledge(dead)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)


def test_exclusive_subscription_refuses_a_second_consumer_and_cumulative_acks(
    pulsar_client: pulsar.Client,
) -> None:
    topic, _ = _topic("excl")
    first = pulsar_client.subscribe(topic, "only-one", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        pulsar_client.subscribe(topic, "only-one", consumer_type=pulsar.ConsumerType.Exclusive)
    producer = pulsar_client.create_producer(topic)
    for i in range(10):
        producer.send(f"e{i}".encode())
    msgs = [first.receive(5000) for _ in range(10)]
    assert [m.data() for m in msgs] == [f"e{i}".encode() for i in range(10)]
    first.acknowledge_cumulative(msgs[6])
    first.close()
    again = pulsar_client.subscribe(topic, "only-one", consumer_type=pulsar.ConsumerType.Exclusive)
    rest = [again.receive(5000).data() for _ in range(3)]
    assert rest == [b"e7", b"e8", b"e9"]
    with pytest.raises(pulsar.Timeout):
        again.receive(300)


def test_a_subscription_of_another_type_is_refused_clearly(pulsar_client: pulsar.Client) -> None:
    topic, _ = _topic("types")
    pulsar_client.subscribe(topic, "typed", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.NotAllowedError):
        pulsar_client.subscribe(topic, "typed", consumer_type=pulsar.ConsumerType.Failover)


def test_failover_delivers_to_one_consumer_at_a_time(pulsar_client: pulsar.Client) -> None:
    topic, _ = _topic("failover")
    a = pulsar_client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover)
    b = pulsar_client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover)
    producer = pulsar_client.create_producer(topic)
    for i in range(6):
        producer.send(f"f{i}".encode())
    received: dict[str, list[bytes]] = {"a": [], "b": []}
    for tag, consumer in (("a", a), ("b", b)):
        while True:
            try:
                msg = consumer.receive(700)
            except pulsar.Timeout:
                break
            received[tag].append(msg.data())
            consumer.acknowledge(msg)
    assert sorted(received["a"] + received["b"]) == [f"f{i}".encode() for i in range(6)]
    assert [] in received.values()  # one consumer took everything


def test_key_shared_keeps_each_key_on_one_consumer(pulsar_client: pulsar.Client) -> None:
    topic, _ = _topic("keys")
    consumers = [
        pulsar_client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
        for _ in range(2)
    ]
    producer = pulsar_client.create_producer(topic, batching_type=pulsar.BatchingType.KeyBased)
    for i in range(40):
        producer.send(f"{i}".encode(), partition_key=f"key-{i % 8}")
    owner: dict[str, int] = {}
    seen = 0
    deadline = time.monotonic() + 10
    while seen < 40 and time.monotonic() < deadline:
        for n, consumer in enumerate(consumers):
            try:
                msg = consumer.receive(100)
            except pulsar.Timeout:
                continue
            seen += 1
            assert owner.setdefault(msg.partition_key(), n) == n
            consumer.acknowledge(msg)
    assert seen == 40


_KILLED_CONSUMER = textwrap.dedent(
    """
    import sys, time, pulsar, _pulsar
    c = pulsar.Client(sys.argv[1], logger=pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error))
    consumer = c.subscribe(sys.argv[2], "work", consumer_type=pulsar.ConsumerType.Shared)
    print("subscribed", flush=True)
    for _ in range(int(sys.argv[3])):
        consumer.receive(10000)
    print("received", flush=True)
    time.sleep(60)
    """
)


def test_a_killed_consumers_unacked_messages_are_redelivered(
    pulsar_client: pulsar.Client, pulsar_url: str, tmp_path: Path
) -> None:
    topic, _ = _topic("killed")
    script = tmp_path / "consumer.py"
    script.write_text(_KILLED_CONSUMER)
    proc = subprocess.Popen(
        [sys.executable, str(script), pulsar_url, topic, "10"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "subscribed"
        producer = pulsar_client.create_producer(topic)
        for i in range(10):
            producer.send(f"w{i}".encode())
        assert proc.stdout.readline().strip() == "received"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    started = time.monotonic()
    other = pulsar_client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    got = []
    for _ in range(10):
        msg = other.receive(10000)
        got.append((msg.data(), msg.redelivery_count()))
        other.acknowledge(msg)
    assert sorted(d for d, _ in got) == sorted(f"w{i}".encode() for i in range(10))
    assert all(count == 1 for _, count in got)  # handed out once before
    assert time.monotonic() - started < 5  # given back at once, not after a lease deadline


def test_deliver_after_holds_the_message(pulsar_client: pulsar.Client) -> None:
    topic, _ = _topic("delay")
    consumer = pulsar_client.subscribe(topic, "later", consumer_type=pulsar.ConsumerType.Shared)
    producer = pulsar_client.create_producer(topic)
    sent = time.monotonic()
    producer.send(b"later", deliver_after=dt.timedelta(seconds=1.5))
    producer.send(b"now")
    assert consumer.receive(5000).data() == b"now"
    msg = consumer.receive(5000)
    assert msg.data() == b"later" and time.monotonic() - sent >= 1.4
    consumer.acknowledge(msg)


def test_names_the_api_refuses_fail_at_once(pulsar_client: pulsar.Client) -> None:
    started = time.monotonic()
    with pytest.raises(pulsar.NotAllowedError):
        pulsar_client.create_producer(
            f"persistent://{TENANT}/default/ab"
        )  # a topic ID needs 3+ chars
    with pytest.raises(pulsar.NotAllowedError):
        pulsar_client.create_producer(f"non-persistent://{TENANT}/default/volatile")
    assert time.monotonic() - started < 3  # not retried until the 5 s operation timeout


def test_unsubscribe_deletes_the_subscription(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    topic, _ = _topic("unsub")
    sub = _name("gone")
    consumer = pulsar_client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    subscriber = make_subscriber(pulsar_server.endpoint)
    path = f"projects/{TENANT}/subscriptions/{topic.rsplit('/', 1)[1]}.{sub}"
    assert path in [s.name for s in subscriber.list_subscriptions(project=f"projects/{TENANT}")]
    consumer.unsubscribe()
    assert path not in [s.name for s in subscriber.list_subscriptions(project=f"projects/{TENANT}")]
    subscriber.close()


# --- the raw protocol ----------------------------------------------------------------------


def _expect_error_then_close(conn: RawConnection) -> str:
    reply = conn.read()
    assert reply is not None
    cmd, _ = reply
    assert cmd.type == Type.Value("ERROR")
    assert conn.read() is None  # then the server closes the connection
    return str(cmd.error.message)


def test_malformed_frames_get_an_error_and_the_server_stays_up(
    pulsar_server: ServerProcess, pulsar_client: pulsar.Client
) -> None:
    port = pulsar_server.pulsar_port
    oversized = RawConnection(port)
    oversized.send(struct.pack(">I", 1 << 30) + b"junk")
    assert "over the" in _expect_error_then_close(oversized)

    garbage = RawConnection(port)
    garbage.connect()
    garbage.send(frames.encode_command(b"\xff\xff\xff\xff\xff"))
    assert "malformed command" in _expect_error_then_close(garbage)

    bad_sizes = RawConnection(port)
    bad_sizes.send(struct.pack(">II", 8, 1000) + b"abcd")
    assert "command size" in _expect_error_then_close(bad_sizes)

    early = RawConnection(port)
    ping = BaseCommand(type=Type.Value("PING"))
    ping.ping.SetInParent()
    early.command(ping)
    assert "CONNECT first" in _expect_error_then_close(early)

    # An authentication method the front does not speak (a "token" is accepted, and passed on,
    # as a broker without authentication does: tests/integration/test_tls_auth.py).
    athenz = RawConnection(port)
    auth = BaseCommand(type=Type.Value("CONNECT"))
    auth.connect.client_version = "raw-test"
    auth.connect.auth_method_name = "athenz"
    auth.connect.auth_data = b"secret"
    athenz.command(auth)
    assert "authentication" in _expect_error_then_close(athenz)

    # An unsupported request is answered and the connection stays.
    schema = RawConnection(port)
    schema.connect()
    ask = BaseCommand(type=Type.Value("CONSUMER_STATS"))
    ask.consumerStats.request_id = 9
    ask.consumerStats.consumer_id = 1
    schema.command(ask)
    reply = schema.read()
    assert reply is not None and reply[0].type == Type.Value("ERROR")
    assert reply[0].error.request_id == 9
    assert reply[0].error.error == ServerError.Value("NotAllowedError")
    schema.command(ping)
    pong = schema.read()
    assert pong is not None and pong[0].type == Type.Value("PONG")
    for conn in (oversized, garbage, bad_sizes, early, athenz, schema):
        conn.close()

    topic, _ = _topic("still-up")
    consumer = pulsar_client.subscribe(topic, "up", consumer_type=pulsar.ConsumerType.Shared)
    pulsar_client.create_producer(topic).send(b"alive")
    assert consumer.receive(5000).data() == b"alive"


def test_transactions_are_refused_clearly_and_the_connection_stays(
    pulsar_server: ServerProcess,
) -> None:
    """pulsar-client 3.13's Python wrapper has no transactions; a client that has them (Java,
    Go) connects to the transaction coordinator, then opens transactions: each request is
    answered with NotAllowedError naming transactions."""
    conn = RawConnection(pulsar_server.pulsar_port)
    conn.connect()
    for request_id, (kind, field) in enumerate(
        [
            ("TC_CLIENT_CONNECT_REQUEST", "tcClientConnectRequest"),
            ("NEW_TXN", "newTxn"),
            ("END_TXN", "endTxn"),
        ],
        start=1,
    ):
        cmd = BaseCommand(type=Type.Value(kind))
        getattr(cmd, field).request_id = request_id
        conn.command(cmd)
        reply = conn.read()
        assert reply is not None and reply[0].type == Type.Value("ERROR")
        assert reply[0].error.request_id == request_id
        assert reply[0].error.error == ServerError.Value("NotAllowedError")
        assert reply[0].error.message == f"transactions are not supported by pubsubd ({kind})"
    ping = BaseCommand(type=Type.Value("PING"))
    ping.ping.SetInParent()
    conn.command(ping)
    pong = conn.read()
    assert pong is not None and pong[0].type == Type.Value("PONG")
    conn.close()


def _send(producer_id: int, sequence_id: int, payload: bytes, corrupt: bool = False) -> bytes:
    cmd = BaseCommand(type=Type.Value("SEND"))
    cmd.send.producer_id = producer_id
    cmd.send.sequence_id = sequence_id
    meta = MessageMetadata(producer_name="raw-producer", sequence_id=sequence_id, publish_time=1)
    data = bytearray(
        frames.encode_payload_command(cmd.SerializeToString(), meta.SerializeToString(), payload)
    )
    if corrupt:
        data[-1] ^= 0xFF
    return bytes(data)


def test_a_repeated_sequence_id_is_stored_once_and_a_bad_checksum_is_refused(
    pulsar_server: ServerProcess,
) -> None:
    topic, google_topic = _topic("dedup")
    subscriber = make_subscriber(pulsar_server.endpoint)
    conn = RawConnection(pulsar_server.pulsar_port)
    conn.connect()
    producer = BaseCommand(type=Type.Value("PRODUCER"))
    producer.producer.topic = topic
    producer.producer.producer_id = 1
    producer.producer.request_id = 1
    producer.producer.producer_name = "raw-producer"
    conn.command(producer)
    reply = conn.read()
    assert reply is not None and reply[0].type == Type.Value("PRODUCER_SUCCESS")
    assert reply[0].producer_success.last_sequence_id == -1
    google_sub = f"projects/{TENANT}/subscriptions/{_name('dd')}"
    subscriber.create_subscription(name=google_sub, topic=google_topic)

    receipts = []
    for seq, payload in ((0, b"first"), (0, b"first"), (1, b"second")):
        conn.send(_send(1, seq, payload))
        reply = conn.read()
        assert reply is not None and reply[0].type == Type.Value("SEND_RECEIPT")
        receipts.append(reply[0].send_receipt)
    assert receipts[0].message_id == receipts[1].message_id != receipts[2].message_id
    conn.send(_send(1, 2, b"corrupt", corrupt=True))
    reply = conn.read()
    assert reply is not None and reply[0].type == Type.Value("SEND_ERROR")
    assert reply[0].send_error.error == ServerError.Value("ChecksumError")
    conn.close()

    response = subscriber.pull(subscription=google_sub, max_messages=10, timeout=5)
    assert sorted(m.message.data for m in response.received_messages) == [b"first", b"second"]
    subscriber.close()

    # The producer name comes back with the highest sequence ID stored.
    again = RawConnection(pulsar_server.pulsar_port)
    again.connect()
    again.command(producer)
    reply = again.read()
    assert reply is not None and reply[0].producer_success.last_sequence_id == 1
    again.close()


def test_earliest_position_and_seek_by_time(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    # Google's rule: only a topic's retention lets a subscription go back before it existed,
    # or back to acked messages. The topic is made with the Google API, retaining 10 minutes.
    topic, google_topic = _topic("seek")
    publisher = make_publisher(pulsar_server.endpoint)
    publisher.create_topic(
        request={"name": google_topic, "message_retention_duration": {"seconds": 600}}
    )
    keeper = pulsar_client.subscribe(topic, "keeper", consumer_type=pulsar.ConsumerType.Shared)
    producer = pulsar_client.create_producer(topic)
    before = int(time.time() * 1000) - 1
    for i in range(3):
        producer.send(f"s{i}".encode())
    late = pulsar_client.subscribe(
        topic,
        "late",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    assert sorted(late.receive(5000).data() for _ in range(3)) == [b"s0", b"s1", b"s2"]
    latest = pulsar_client.subscribe(topic, "latest", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.Timeout):
        latest.receive(300)
    for _ in range(3):
        keeper.acknowledge(keeper.receive(5000))
    keeper.seek(before)
    again = []
    for _ in range(3):
        msg = keeper.receive(5000)
        again.append(msg.data())
        keeper.acknowledge(msg)
    assert sorted(again) == [b"s0", b"s1", b"s2"]


def _drain(consumer: Any, timeout_ms: int = 300) -> list[Any]:
    """Every message the consumer gets until none comes for ``timeout_ms`` (acked)."""
    out = []
    while True:
        try:
            msg = consumer.receive(timeout_ms)
        except pulsar.Timeout:
            return out
        out.append(msg)
        consumer.acknowledge(msg)


def test_a_topics_publish_message_sources_are_its_partitions(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    topic, google_topic = _topic("parts")
    publisher = make_publisher(pulsar_server.endpoint)
    publisher.create_topic(
        request={"name": google_topic, "labels": {"pubsubd-publish-sources": "3"}}
    )
    assert pulsar_client.get_topic_partitions(topic) == [f"{topic}-partition-{n}" for n in range(3)]
    before = int(time.time() * 1000) - 1
    everything = pulsar_client.subscribe(
        topic, "all", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=100
    )
    only_1 = pulsar_client.subscribe(
        f"{topic}-partition-1", "one", consumer_type=pulsar.ConsumerType.Shared
    )
    # The client routes a key to one partition (its hash); unkeyed messages go round-robin.
    keyed = pulsar_client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    for i in range(60):
        keyed.send_async(f"{i % 6}:{i // 6}".encode(), None, partition_key=f"key-{i % 6}")
    keyed.flush()
    round_robin = pulsar_client.create_producer(topic)
    unkeyed = [round_robin.send(f"u{i}".encode()) for i in range(6)]
    assert sorted(m.partition() for m in unkeyed) == [0, 0, 1, 1, 2, 2]
    assert all(m.ledger_id() == m.partition() for m in unkeyed)  # ledger = source = partition
    direct = pulsar_client.create_producer(f"{topic}-partition-2").send(b"direct")
    assert direct.ledger_id() == 2  # stored in source 2

    got = _drain(everything)
    assert len(got) == 67
    per_key: dict[str, list[int]] = {}
    key_partition: dict[str, int] = {}
    for msg in got:
        mid = msg.message_id()
        assert mid.ledger_id() == mid.partition()  # the message's source is its partition
        if msg.partition_key():
            key, n = msg.data().decode().split(":")
            per_key.setdefault(key, []).append(int(n))
            assert key_partition.setdefault(key, mid.partition()) == mid.partition()
    assert per_key == {str(k): list(range(10)) for k in range(6)}  # each key in order
    assert len(set(key_partition.values())) > 1  # spread over partitions
    in_1 = sorted(m.data() for m in got if m.message_id().partition() == 1)
    # A consumer of partition 1 gets its messages and no other.
    assert sorted(m.data() for m in _drain(only_1)) == in_1
    # seek(time) of a partition's consumer: that partition again, acked messages included.
    only_1.seek(before)
    assert sorted(m.data() for m in _drain(only_1, 1000)) == in_1
    # A reader of partition 1 reads the same, then has nothing more.
    reader = pulsar_client.create_reader(f"{topic}-partition-1", pulsar.MessageId.earliest)
    read = []
    while reader.has_message_available():
        read.append(reader.read_next(5000).data())
    assert sorted(read) == in_1
    reader.close()
    # A reader of the whole topic is a reader per partition: it reads everything.
    whole = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
    read = []
    while whole.has_message_available():
        read.append(whole.read_next(5000).data())
    assert sorted(read) == sorted(m.data() for m in got)
    whole.close()
    with pytest.raises(pulsar.NotAllowedError):
        pulsar_client.create_producer(f"{topic}-partition-3")  # the topic has sources 0..2
    # A Failover subscription shares the partitions out as Pulsar does: the consumers sorted by
    # name, partition N to the one at N mod their count; when one closes, the other takes its
    # partitions. A partitioned consumer is one client: an Exclusive subscription refuses a
    # second.
    failover = pulsar.ConsumerType.Failover
    a = pulsar_client.subscribe(topic, "fo", consumer_type=failover, consumer_name="a")
    b = pulsar_client.subscribe(topic, "fo", consumer_type=failover, consumer_name="b")
    for i in range(6):  # two per partition
        round_robin.send(f"f{i}".encode())
    parts_a = sorted(m.message_id().partition() for m in _drain(a, 500))
    parts_b = sorted(m.message_id().partition() for m in _drain(b, 500))
    assert (parts_a, parts_b) == ([0, 0, 2, 2], [1, 1])
    b.close()
    for i in range(6):
        round_robin.send(f"g{i}".encode())
    assert sorted(m.message_id().partition() for m in _drain(a, 1000)) == [0, 0, 1, 1, 2, 2]
    pulsar_client.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        pulsar_client.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)


def test_readers_last_message_id_and_seek_by_message_id(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    topic, google_topic = _topic("reader")
    keeper = pulsar_client.subscribe(topic, "keeper", consumer_type=pulsar.ConsumerType.Exclusive)
    empty = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
    assert not empty.has_message_available()  # nothing published yet
    empty.close()
    producer = pulsar_client.create_producer(topic)
    ids = [producer.send(f"m{i}".encode()) for i in range(5)]
    assert [m.data() for m in _drain(keeper)] == [f"m{i}".encode() for i in range(5)]

    # A reader is a temporary subscription: listed while it reads, deleted when it closes.
    reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
    read = []
    while reader.has_message_available():
        read.append(reader.read_next(5000).data())
    assert read == [f"m{i}".encode() for i in range(5)]  # acked messages too, in order
    subscriber = make_subscriber(pulsar_server.endpoint)
    readers = [
        s.name
        for s in subscriber.list_subscriptions(project=f"projects/{TENANT}")
        if s.topic == google_topic and s.labels.get("pulsar-reader") == "true"
    ]
    assert len(readers) == 1
    reader.close()
    wait_for(
        lambda: (
            not any(
                s.name in readers
                for s in subscriber.list_subscriptions(project=f"projects/{TENANT}")
            )
        ),
        timeout=5,
    )
    after = pulsar_client.create_reader(topic, ids[1])
    assert after.read_next(5000).data() == b"m2"  # the start message itself is excluded
    after.close()
    inclusive = pulsar_client.create_reader(topic, ids[1], start_message_id_inclusive=True)
    assert inclusive.read_next(5000).data() == b"m1"
    inclusive.close()

    # seek(ID) on a durable subscription: the messages after it come again, nothing else.
    keeper.seek(ids[2])
    assert [m.data() for m in _drain(keeper, 1000)] == [b"m3", b"m4"]
    subscriber.close()


def test_the_servers_source_pieces_refuse_bad_input(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    """What the front relies on, called as any client would: a malformed ``pubsubd-sources``
    stream header and a SeekOffsets of a source the topic lacks are INVALID_ARGUMENT; a seek to
    another partition's message ID is refused; the server stays up."""
    topic, google_topic = _topic("badsrc")
    consumer = pulsar_client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    topic_id = google_topic.rsplit("/", 1)[1]
    subscription = f"projects/{TENANT}/subscriptions/{topic_id}.s"
    with grpc.insecure_channel(pulsar_server.endpoint) as channel:
        seek = channel.unary_unary(
            "/pubsubd.v1.Replay/SeekOffsets",
            request_serializer=replay_pb2.SeekOffsetsRequest.SerializeToString,
            response_deserializer=replay_pb2.SeekOffsetsResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as bad:
            seek(replay_pb2.SeekOffsetsRequest(subscription=subscription, offsets={3: 0}))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        seek(replay_pb2.SeekOffsetsRequest(subscription=subscription, offsets={0: 0}))
        pull = channel.stream_stream(
            "/google.pubsub.v1.Subscriber/StreamingPull",
            request_serializer=pb.StreamingPullRequest.SerializeToString,
            response_deserializer=pb.StreamingPullResponse.FromString,
        )
        first = pb.StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=10)
        with pytest.raises(grpc.RpcError) as bad:
            next(iter(pull(iter([first]), metadata=(("pubsubd-sources", "one"),))))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "pubsubd-sources" in (bad.value.details() or "")
    with pytest.raises(pulsar.NotAllowedError):
        consumer.seek(pulsar.MessageId(-1, 7, 0, -1))  # ledger = source 7: not this topic's
    producer = pulsar_client.create_producer(topic)
    producer.send(b"still up")
    assert consumer.receive(5000).data() == b"still up"


def test_multi_topic_and_pattern_consumers(pulsar_client: pulsar.Client) -> None:
    """A list of topics is a consumer per topic (each its own subscription); a pattern lists
    its namespace's topics (GET_TOPICS_OF_NAMESPACE). Discovery of later topics: the next
    test."""
    ns = f"multi{uuid.uuid4().hex[:6]}"
    alpha, beta = (f"persistent://{TENANT}/{ns}/{t}" for t in ("alpha", "beta"))
    producers = {t: pulsar_client.create_producer(t) for t in (alpha, beta)}
    pulsar_client.create_producer(f"persistent://{TENANT}/default/{ns}-outside").send(b"not listed")
    listed = pulsar_client.subscribe(
        [alpha, beta], "both", consumer_type=pulsar.ConsumerType.Shared
    )
    pattern = pulsar_client.subscribe(
        re.compile(f"persistent://{TENANT}/{ns}/.*"),
        "pattern",
        consumer_type=pulsar.ConsumerType.Shared,
    )
    for topic, producer in producers.items():
        producer.send(topic.rsplit("/", 1)[1].encode())
    for consumer in (listed, pattern):
        got = {}
        for _ in range(2):
            msg = consumer.receive(5000)
            got[msg.topic_name()] = msg.data()
            consumer.acknowledge(msg)
        assert got == {alpha: b"alpha", beta: b"beta"}
        assert _drain(consumer) == []


def test_a_pattern_consumer_discovers_a_topic_created_later(
    pulsar_client: pulsar.Client, pulsar_server: ServerProcess
) -> None:
    """The client lists the namespace again every ``pattern_auto_discovery_period`` seconds
    (GET_TOPICS_OF_NAMESPACE; the C++ client sends no pattern or hash and uses no topic-list
    watch) and subscribes to the new topics it matches. pulsar-client 3.13's ``subscribe``
    checks that argument but never passes it on, so the consumer is made with the wrapper's
    own configuration object. The topics retain messages (made with the Google API), so the
    consumer's Earliest position takes what was published before it found the topic."""
    ns = f"found{uuid.uuid4().hex[:6]}"
    publisher = make_publisher(pulsar_server.endpoint)
    retained = {"seconds": 600}

    def create(local: str) -> str:
        name = f"projects/{TENANT}/topics/{ns}.{local}"
        publisher.create_topic(request={"name": name, "message_retention_duration": retained})
        return f"persistent://{TENANT}/{ns}/{local}"

    alpha = create("alpha")
    pulsar_client.create_producer(alpha).send(b"alpha")
    conf = _pulsar.ConsumerConfiguration()
    conf.consumer_type(pulsar.ConsumerType.Shared)
    conf.subscription_initial_position(pulsar.InitialPosition.Earliest)
    conf.pattern_auto_discovery_period(1)
    pattern = f"persistent://{TENANT}/{ns}/.*"
    consumer = pulsar_client._client.subscribe_pattern(pattern, "disc", conf)
    first = consumer.receive(5000)
    assert (first.topic_name(), first.data()) == (alpha, b"alpha")
    consumer.acknowledge(first)
    gamma = create("gamma")  # a new topic: found within about a second
    pulsar_client.create_producer(gamma).send(b"gamma")
    later = consumer.receive(8000)
    assert (later.topic_name(), later.data()) == (gamma, b"gamma")
    consumer.acknowledge(later)
    consumer.close()
