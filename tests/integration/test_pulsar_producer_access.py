"""Producer access modes (Shared, Exclusive, WaitForExclusive, ExclusiveWithFencing) with the
official ``pulsar-client`` against a real ``pubsubd serve --pulsar-port 0``; the rules are
pulsar/access.py's (Pulsar's)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tests.conftest import make_publisher
from tests.support.pulsar import make_client
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

EXCLUSIVE = pulsar.ProducerAccessMode.Exclusive
WAIT = pulsar.ProducerAccessMode.WaitForExclusive
FENCING = pulsar.ProducerAccessMode.ExclusiveWithFencing


def _topic() -> str:
    return f"persistent://test-project/default/access-{uuid.uuid4().hex[:8]}"


def _drain(consumer: Any) -> list[bytes]:
    out = []
    while True:
        try:
            msg = consumer.receive(700)
        except pulsar.Timeout:
            return out
        consumer.acknowledge(msg)
        out.append(msg.data())


def test_an_exclusive_producer_keeps_others_out_until_it_closes(
    pulsar_client: pulsar.Client, pulsar_url: str
) -> None:
    topic = _topic()
    consumer = pulsar_client.subscribe(topic, "all", consumer_type=pulsar.ConsumerType.Shared)
    first = pulsar_client.create_producer(topic, access_mode=EXCLUSIVE)
    first.send(b"one")
    other = make_client(pulsar_url)  # another application: another connection
    try:
        with pytest.raises(pulsar.ProducerFenced):
            other.create_producer(topic, access_mode=EXCLUSIVE)
        with pytest.raises(pulsar.ProducerBusy):
            other.create_producer(topic)  # Shared
        first.close()
        second = other.create_producer(topic, access_mode=EXCLUSIVE)
        second.send(b"two")
        # Shared producers keep an exclusive one out in turn.
        second.close()
        shared = other.create_producer(topic)
        with pytest.raises(pulsar.ProducerFenced):
            pulsar_client.create_producer(topic, access_mode=EXCLUSIVE)
        shared.close()
    finally:
        other.close()
    assert _drain(consumer) == [b"one", b"two"]


def test_a_waiting_producer_gets_the_topic_when_the_holder_closes(
    pulsar_client: pulsar.Client, pulsar_url: str
) -> None:
    topic = _topic()
    consumer = pulsar_client.subscribe(topic, "all", consumer_type=pulsar.ConsumerType.Shared)
    holder = pulsar_client.create_producer(topic, access_mode=EXCLUSIVE)
    holder.send(b"first")
    other = make_client(pulsar_url)
    made: list[Any] = []
    waiter = threading.Thread(
        target=lambda: made.append(other.create_producer(topic, access_mode=WAIT))
    )
    try:
        waiter.start()
        waiter.join(1.5)
        assert waiter.is_alive() and not made  # queued (producer_ready false), not refused
        holder.send(b"second")
        holder.close()
        waiter.join(5)
        assert len(made) == 1
        made[0].send(b"third")
        made[0].close()
    finally:
        waiter.join(5)
        other.close()
    assert _drain(consumer) == [b"first", b"second", b"third"]


def test_a_fencing_producer_closes_the_holder_which_stays_fenced(
    pulsar_client: pulsar.Client, pulsar_url: str
) -> None:
    topic = _topic()
    consumer = pulsar_client.subscribe(topic, "all", consumer_type=pulsar.ConsumerType.Shared)
    old = pulsar_client.create_producer(topic, access_mode=EXCLUSIVE)
    old.send(b"old")
    other = make_client(pulsar_url)
    try:
        new = other.create_producer(topic, access_mode=FENCING)
        new.send(b"new")
        # The old producer was closed; it reconnects with its topic epoch and is refused.
        with pytest.raises(pulsar.ProducerFenced):
            old.send(b"too late")
        with pytest.raises(pulsar.ProducerFenced):
            old.send(b"still too late")
        new.send(b"newer")
        new.close()
    finally:
        other.close()
    assert _drain(consumer) == [b"old", b"new", b"newer"]


def test_each_partition_has_its_own_exclusive_producer(
    pulsar_client: pulsar.Client, pulsar_url: str, pulsar_server: ServerProcess
) -> None:
    """A partitioned producer asks for each partition; a second one is refused."""
    local = f"access-parts-{uuid.uuid4().hex[:8]}"
    publisher = make_publisher(pulsar_server.endpoint)
    publisher.create_topic(
        request={
            "name": f"projects/test-project/topics/{local}",
            "labels": {"pubsubd-publish-sources": "3"},
        }
    )
    topic = f"persistent://test-project/default/{local}"
    first = pulsar_client.create_producer(topic, access_mode=EXCLUSIVE)
    first.send(b"x")
    other = make_client(pulsar_url)
    try:
        with pytest.raises(pulsar.ProducerFenced):
            other.create_producer(topic, access_mode=EXCLUSIVE)
        first.close()
        other.create_producer(topic, access_mode=EXCLUSIVE).close()
    finally:
        other.close()


_HOLDER = textwrap.dedent(
    """
    import sys, time, pulsar, _pulsar
    c = pulsar.Client(sys.argv[1], logger=pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error))
    p = c.create_producer(sys.argv[2], access_mode=pulsar.ProducerAccessMode.Exclusive)
    p.send(b"from the killed holder")
    print("holding", flush=True)
    time.sleep(60)
    """
)


def test_a_killed_holders_topic_passes_to_the_waiting_producer(
    pulsar_client: pulsar.Client, pulsar_url: str, tmp_path: Path
) -> None:
    topic = _topic()
    consumer = pulsar_client.subscribe(topic, "all", consumer_type=pulsar.ConsumerType.Shared)
    script = tmp_path / "holder.py"
    script.write_text(_HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(script), pulsar_url, topic], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "holding"
        made: list[Any] = []
        waiter = threading.Thread(
            target=lambda: made.append(pulsar_client.create_producer(topic, access_mode=WAIT))
        )
        waiter.start()
        waiter.join(1)
        assert not made
        proc.kill()  # its connection drops: the topic is free
        waiter.join(5)
        assert len(made) == 1
        made[0].send(b"from the waiter")
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert _drain(consumer) == [b"from the killed holder", b"from the waiter"]
