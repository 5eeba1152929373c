"""Batched delivery to the official ``pulsar-client`` and its batch acks, against a real
``pubsubd serve --pulsar-port 0``.

The front delivers consecutive stored messages as one Pulsar batch; the client splits it. These
tests check what the client's acks of batch entries do: batch-index acks (``ack_set``), whole
batch acks (the client's default), cumulative acks over batches, nacks, and a consumer process
killed with part of a batch acked.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest

pytestmark = pytest.mark.integration


def _topic() -> str:
    return f"persistent://test-project/default/batches-{uuid.uuid4().hex[:8]}"


def _publish(pulsar_client: pulsar.Client, topic: str, count: int, tag: str = "m") -> list[bytes]:
    """``count`` messages sent as one producer batch (one Publish: one publish time)."""
    producer = pulsar_client.create_producer(
        topic, batching_enabled=True, batching_max_messages=count, block_if_queue_full=True
    )
    sent = [f"{tag}{i}".encode() for i in range(count)]
    for data in sent:
        producer.send_async(data, None)
    producer.flush()
    producer.close()
    return sent


def _receive_all(consumer: Any, timeout_ms: int = 1000) -> list[Any]:
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_ms))
        except pulsar.Timeout:
            return out


def test_batch_index_acks_and_nacks_bring_back_only_the_nacked_messages(
    pulsar_client: pulsar.Client,
) -> None:
    topic = _topic()
    consumer = pulsar_client.subscribe(
        topic,
        "bia",
        consumer_type=pulsar.ConsumerType.Shared,
        batch_index_ack_enabled=True,
        negative_ack_redelivery_delay_ms=200,
    )
    sent = _publish(pulsar_client, topic, 300)
    got = [consumer.receive(5000) for _ in range(300)]
    assert [m.data() for m in got] == sent
    assert max(m.message_id().batch_index() for m in got) > 0  # delivered in batches
    nacked = []
    for i, msg in enumerate(got):
        if i % 10 == 3:
            consumer.negative_acknowledge(msg)
            nacked.append(msg.data())
        else:
            consumer.acknowledge(msg)
    again = [consumer.receive(5000) for _ in range(len(nacked))]
    assert sorted(m.data() for m in again) == sorted(nacked)
    assert {m.redelivery_count() for m in again} == {1}
    for msg in again:
        consumer.acknowledge(msg)
    assert _receive_all(consumer, 700) == []
    consumer.close()  # what was acked stays acked for the next consumer
    again = pulsar_client.subscribe(topic, "bia", consumer_type=pulsar.ConsumerType.Shared)
    assert _receive_all(again, 500) == []


def test_without_batch_index_acks_a_nacked_batch_comes_back_whole(
    pulsar_client: pulsar.Client,
) -> None:
    """The client's default: it acks a batch once every message of it is acked, so a nack of
    one message redelivers its batch (as Pulsar does); batches acked whole stay acked."""
    topic = _topic()
    consumer = pulsar_client.subscribe(
        topic,
        "whole",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=200,
    )
    first = _publish(pulsar_client, topic, 20, "a")
    second = _publish(pulsar_client, topic, 20, "b")
    got = [consumer.receive(5000) for _ in range(40)]
    assert [m.data() for m in got] == first + second
    entries = {m.data(): m.message_id().entry_id() for m in got}
    nacked = got[25]  # in the second producer batch
    for msg in got:
        if msg is nacked:
            consumer.negative_acknowledge(msg)
        else:
            consumer.acknowledge(msg)
    batch = {d for d, e in entries.items() if e == entries[nacked.data()]}
    assert nacked.data() in batch and not batch & set(first)
    again = [consumer.receive(5000) for _ in range(len(batch))]
    assert {m.data() for m in again} == batch
    assert {m.redelivery_count() for m in again} == {1}
    for msg in again:
        consumer.acknowledge(msg)
    assert _receive_all(consumer, 700) == []


@pytest.mark.parametrize("batch_index_acks", [True, False])
def test_cumulative_acks_over_batches(pulsar_client: pulsar.Client, batch_index_acks: bool) -> None:
    """Up to the acked message with batch-index acks; without them a cumulative ack inside a
    batch covers only the batches before it (the client acks the entry before it)."""
    topic = _topic()
    options = {"consumer_type": pulsar.ConsumerType.Exclusive}
    if batch_index_acks:
        options["batch_index_ack_enabled"] = True
    consumer = pulsar_client.subscribe(topic, "cumulative", **options)
    sent = _publish(pulsar_client, topic, 30, "a") + _publish(pulsar_client, topic, 30, "b")
    got = [consumer.receive(5000) for _ in range(60)]
    assert [m.data() for m in got] == sent
    target = 44
    consumer.acknowledge_cumulative(got[target])
    time.sleep(0.3)  # the client sends acks in 100 ms groups
    consumer.close()
    again = pulsar_client.subscribe(topic, "cumulative", **options)
    rest = [m.data() for m in _receive_all(again, 700)]
    if batch_index_acks:
        assert rest == sent[target + 1 :]
    else:
        entry = got[target].message_id().entry_id()
        start = next(i for i, m in enumerate(got) if m.message_id().entry_id() == entry)
        assert 30 <= start <= target and rest == sent[start:]
    again.close()


def test_a_batch_nacked_past_the_limit_goes_to_the_clients_dead_letter_topic(
    pulsar_client: pulsar.Client,
) -> None:
    """The redelivery count of a redelivered batch is right, so the client's dead-letter
    policy sends every message of it on, and its ack of the batch acks them all."""
    topic, dlq = _topic(), _topic()
    dead = pulsar_client.subscribe(dlq, "watch", consumer_type=pulsar.ConsumerType.Shared)
    consumer = pulsar_client.subscribe(
        topic,
        "retrying",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, dead_letter_topic=dlq
        ),
    )
    sent = _publish(pulsar_client, topic, 5)
    for count in (0, 1):
        got = [consumer.receive(5000) for _ in range(5)]
        assert [m.data() for m in got] == sent
        assert {m.redelivery_count() for m in got} == {count}
        assert {m.message_id().entry_id() for m in got} == {got[0].message_id().entry_id()}
        for msg in got:
            consumer.negative_acknowledge(msg)
    dead_letters = [dead.receive(10000) for _ in range(5)]
    assert sorted(m.data() for m in dead_letters) == sorted(sent)
    assert _receive_all(consumer, 700) == []


_KILLED = textwrap.dedent(
    """
    import sys, time, pulsar, _pulsar
    c = pulsar.Client(sys.argv[1], logger=pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error))
    consumer = c.subscribe(sys.argv[2], "work", consumer_type=pulsar.ConsumerType.Shared,
                           batch_index_ack_enabled=True)
    print("subscribed", flush=True)
    for i in range(int(sys.argv[3])):
        msg = consumer.receive(10000)
        if i % 2 == 0:
            consumer.acknowledge(msg)
    time.sleep(0.5)  # the acks go out in 100 ms groups
    print("received", flush=True)
    time.sleep(60)
    """
)


def test_a_killed_consumer_gets_back_only_what_it_left_unacked_in_its_batches(
    pulsar_client: pulsar.Client, pulsar_url: str, tmp_path: Path
) -> None:
    topic = _topic()
    script = tmp_path / "consumer.py"
    script.write_text(_KILLED)
    proc = subprocess.Popen(
        [sys.executable, str(script), pulsar_url, topic, "100"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "subscribed"
        sent = _publish(pulsar_client, topic, 100, "w")
        assert proc.stdout.readline().strip() == "received"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    other = pulsar_client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    got = _receive_all(other, 1500)
    assert sorted(m.data() for m in got) == sorted(sent[1::2])
    assert {m.redelivery_count() for m in got} == {1}  # handed out once before
    for msg in got:
        other.acknowledge(msg)


def test_two_shared_consumers_drain_a_batched_backlog_once(pulsar_client: pulsar.Client) -> None:
    topic = _topic()
    pulsar_client.subscribe(topic, "many", consumer_type=pulsar.ConsumerType.Shared).close()
    sent = []
    for part in range(4):
        sent += _publish(pulsar_client, topic, 500, f"p{part}-")
    consumers = [
        pulsar_client.subscribe(
            topic, "many", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=200
        )
        for _ in range(2)
    ]
    seen: list[list[bytes]] = [[], []]

    def drain(n: int) -> None:  # each consumer in a thread, as an application runs them
        for msg in _receive_all(consumers[n], 1500):
            seen[n].append(msg.data())
            consumers[n].acknowledge(msg)

    threads = [threading.Thread(target=drain, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(seen[0] + seen[1]) == sorted(sent)  # each once


def test_half_a_batch_acked_then_closed_brings_back_only_the_other_half(
    pulsar_client: pulsar.Client,
) -> None:
    """Batch-index acks (``ack_set``) ack exactly the messages they name: after a close and a
    new subscribe, only the unacked half of the batch comes again."""
    topic = _topic()
    options: dict[str, Any] = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "batch_index_ack_enabled": True,
    }
    consumer = pulsar_client.subscribe(topic, "half", **options)
    sent = _publish(pulsar_client, topic, 40)
    got = [consumer.receive(5000) for _ in range(40)]
    assert [m.data() for m in got] == sent
    assert len({m.message_id().entry_id() for m in got}) == 1  # one batch
    for msg in got[::2]:
        consumer.acknowledge(msg)
    time.sleep(0.3)  # the client sends acks in 100 ms groups
    consumer.close()
    again = pulsar_client.subscribe(topic, "half", **options)
    rest = _receive_all(again, 1000)
    assert sorted(m.data() for m in rest) == sorted(sent[1::2])
    for msg in rest:
        again.acknowledge(msg)
    time.sleep(0.3)
    again.close()
    assert _receive_all(pulsar_client.subscribe(topic, "half", **options), 500) == []
