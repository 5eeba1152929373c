"""Damaged stored messages, as an operator meets them: a flipped byte in a segment file.

Each test publishes through the official client, stops the server, flips one byte inside one
known entry (sealed or active segment, with or without its index file), restarts it and checks
exactly which messages are delivered, what is reported (/status, /metrics, the CLI, the error a
consumer gets) and what the operator's choices do (skip by label, skip by command, restore the
bytes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.pubsub_v1 import types

from pubsubd.storage import segment_index
from pubsubd.storage.framing import scan_frames
from tests.conftest import make_publisher, make_subscriber
from tests.support.raw import gapic_publisher, http_get
from tests.support.server import ServerProcess, wait_for
from tests.support.status import status

pytestmark = pytest.mark.integration

PROJECT = "test-project"
BATCH = 10  # messages per Publish request: one log entry each
SEGMENT_BYTES = 4096  # ~12 entries of ~350 bytes per segment


@dataclass(frozen=True)
class Hit:
    """The entry a flipped byte landed in."""

    path: Path
    first_offset: int
    end_offset: int


@pytest.fixture
def damaged_server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path / "data",
        env={"PUBSUBD_SEGMENT_BYTES": str(SEGMENT_BYTES), "PUBSUBD_SLI_EVENTS_S": "0"},
    )
    srv.start()
    yield srv
    srv.kill()


def _setup(
    server: ServerProcess, topic: str, sub: str, labels: dict[str, str] | None = None
) -> None:
    publisher = make_publisher(server.endpoint)
    publisher.create_topic(request={"name": topic, "labels": labels or {}})
    subscriber = make_subscriber(server.endpoint)
    subscriber.create_subscription(
        request={"name": sub, "topic": topic, "ack_deadline_seconds": 60}
    )
    subscriber.close()


def _publish(server: ServerProcess, topic: str, requests: int, tag: str = "m") -> list[str]:
    """``requests`` Publish calls of BATCH messages each; returns the message IDs in order."""
    client = gapic_publisher(server.endpoint)
    ids: list[str] = []
    for r in range(requests):
        messages = [
            types.PubsubMessage(data=f"{tag}-{r * BATCH + i:06d}".encode() * 3)
            for i in range(BATCH)
        ]
        ids.extend(client.publish(topic=topic, messages=messages).message_ids)
    return ids


def _source_dir(server: ServerProcess) -> Path:
    """The one topic directory with a log (publish to one topic before calling it)."""
    found = [
        p / "source-0" for p in (server.data_dir / "topics").iterdir() if (p / "source-0").is_dir()
    ]
    assert len(found) == 1, found
    return found[0]


def _frames(directory: Path) -> list[tuple[Path, Any]]:
    out = []
    for path in sorted(directory.glob("*.seg")):
        scan = scan_frames(path.read_bytes())
        out.extend((path, frame) for frame in scan.frames)
    return out


def _flip_entry(directory: Path, index: int, *, at: int = 30) -> Hit:
    """Flip byte ``at`` of the ``index``-th entry of the log (negative: from the end)."""
    path, frame = _frames(directory)[index]
    data = bytearray(path.read_bytes())
    data[frame.position + at] ^= 0x5A
    path.write_bytes(bytes(data))
    return Hit(path, frame.base_offset, frame.base_offset + frame.count)


def _receive(
    server: ServerProcess, sub: str, until: Any, timeout: float = 30.0
) -> tuple[set[int], BaseException | None]:
    """Message IDs (offsets) received and acked through subscribe() until ``until(ids)`` or
    the stream fails; returns them and the stream's error."""
    client = make_subscriber(server.endpoint)
    got: set[int] = set()
    lock = threading.Lock()

    def callback(message: pubsub_v1.subscriber.message.Message) -> None:
        with lock:
            got.add(int(message.message_id))
        message.ack()

    future = client.subscribe(sub, callback)
    error: BaseException | None = None
    try:
        try:
            wait_for(lambda: future.done() or until(got), timeout, "delivery or a stream error")
        except AssertionError as e:  # say what had come and what the server saw (a CI flake)
            with lock:
                came = len(got)
            seen = status(server)["subscriptions"].get(sub)
            raise AssertionError(f"{e}; {came} received; the server's status: {seen}") from None
        if future.done():
            error = future.exception()
    finally:
        future.cancel()
        client.close()
    return got, error


def _metric(server: ServerProcess, name: str) -> float:
    _, body = http_get(server, "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _cli(server: ServerProcess, *args: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "pubsubd", *args, "--endpoint", server.endpoint, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_sealed_segment_damage_stops_only_at_the_damaged_entry(
    damaged_server: ServerProcess,
) -> None:
    server = damaged_server
    topic = f"projects/{PROJECT}/topics/damaged"
    sub = f"projects/{PROJECT}/subscriptions/damaged"
    _setup(server, topic, sub)
    published = [int(i) for i in _publish(server, topic, 60)]
    server.stop()
    directory = _source_dir(server)
    assert len(list(directory.glob("*.seg"))) >= 4
    hit = _flip_entry(directory, 30)  # in a sealed segment; its index file stays
    assert hit.path != sorted(directory.glob("*.seg"))[-1]
    server.start()

    # Stop policy (default): everything before the damage, then a clear DATA_LOSS.
    before = {o for o in published if o < hit.first_offset}
    got, error = _receive(server, sub, lambda ids: False)
    assert got == before
    assert isinstance(error, exceptions.DataLoss), error
    assert hit.path.name in str(error) and "skip-damaged" in str(error)

    # A Pull is told the same, at once, instead of waiting without a word.
    subscriber = make_subscriber(server.endpoint)
    with pytest.raises(exceptions.DataLoss, match="stopped at damaged messages"):
        subscriber.pull(request={"subscription": sub, "max_messages": 10}, timeout=10)

    # Reported: /status (file, bytes, offsets), the subscription's stop, metrics, the CLI.
    page = status(server)
    (damaged,) = page["damaged"]
    assert (damaged["first_offset"], damaged["end_offset"]) == (hit.first_offset, hit.end_offset)
    assert damaged["file"] == str(hit.path) and damaged["topic"] == topic
    stopped = page["subscriptions"][sub]["stopped_at_damage"]
    assert stopped == [
        {
            "source": 0,
            "first_offset": hit.first_offset,
            "end_offset": hit.end_offset,
            "unacked": BATCH,
        }
    ]
    assert _metric(server, "pubsubd_damaged_ranges") == 1
    assert _metric(server, "pubsubd_damaged_messages") == BATCH
    listed = _cli(server, "topics", "damaged", topic, "--project", PROJECT)
    assert [(r["first_offset"], r["end_offset"]) for r in listed] == [
        (hit.first_offset, hit.end_offset)
    ]
    assert "damaged entries" in server.log() and hit.path.name in server.log()

    # The operator skips it: the damaged messages are counted lost, the rest delivered.
    skipped = _cli(server, "topics", "skip-damaged", topic, "--project", PROJECT)
    assert skipped[0]["messages_lost"] == BATCH
    after = {o for o in published if o >= hit.end_offset}
    got, error = _receive(server, sub, lambda ids: after <= ids)
    assert error is None and got == after
    assert _metric(server, 'pubsubd_lost_messages_total{reason="damaged"}') == BATCH
    assert status_lost(server, sub) == BATCH
    subscriber.close()


def status_lost(server: ServerProcess, sub: str) -> int:
    return int(status(server)["subscriptions"][sub]["lost"])


@pytest.mark.parametrize("where", ["sealed", "active"])
def test_damage_found_at_start_up_does_not_stop_the_server_or_other_topics(
    damaged_server: ServerProcess, where: str
) -> None:
    """Without index files the start-up scan meets the damage: the server starts, the damaged
    topic (label skip) delivers everything but the damaged entry, another topic all of it."""
    server = damaged_server
    topic = f"projects/{PROJECT}/topics/skip"
    sub = f"projects/{PROJECT}/subscriptions/skip"
    other_topic = f"projects/{PROJECT}/topics/intact"
    other_sub = f"projects/{PROJECT}/subscriptions/intact"
    _setup(server, topic, sub, labels={"pubsubd-damaged-entries": "skip"})
    published = [int(i) for i in _publish(server, topic, 40)]
    directory = _source_dir(server)
    _setup(server, other_topic, other_sub)
    other = [int(i) for i in _publish(server, other_topic, 20, tag="o")]
    server.stop()
    for index_file in directory.glob(f"*{segment_index.SUFFIX}"):
        index_file.unlink()  # as after a power loss: index files are never fsynced
    hit = _flip_entry(directory, 10 if where == "sealed" else -3, at=5)  # its length field
    is_active = hit.path == sorted(directory.glob("*.seg"))[-1]
    assert is_active == (where == "active")
    server.start()

    got, error = _receive(server, other_sub, lambda ids: set(other) <= ids)
    assert error is None and got == set(other)
    expected = {o for o in published if not hit.first_offset <= o < hit.end_offset}
    got, error = _receive(server, sub, lambda ids: expected <= ids)
    assert error is None and got == expected
    assert status_lost(server, sub) == BATCH
    (damaged,) = status(server)["damaged"]
    assert damaged["found"] == "start-up scan"

    # Publishing and delivery go on past the damage.
    fresh = {int(i) for i in _publish(server, topic, 2, tag="new")}
    got, error = _receive(server, sub, lambda ids: fresh <= ids)
    assert got == fresh


def test_restored_bytes_resume_delivery_without_a_restart(
    damaged_server: ServerProcess,
) -> None:
    server = damaged_server
    topic = f"projects/{PROJECT}/topics/restore"
    sub = f"projects/{PROJECT}/subscriptions/restore"
    _setup(server, topic, sub)
    published = [int(i) for i in _publish(server, topic, 40)]
    server.stop()
    directory = _source_dir(server)
    original = {p: p.read_bytes() for p in directory.glob("*.seg")}
    hit = _flip_entry(directory, 12)
    server.start()
    got, error = _receive(server, sub, lambda ids: False)
    assert isinstance(error, exceptions.DataLoss)
    assert got == {o for o in published if o < hit.first_offset}

    hit.path.write_bytes(original[hit.path])  # the operator restores the file from a copy
    wait_for(lambda: not status(server)["damaged"], 15, "the log to recheck the damage")
    rest = {o for o in published if o >= hit.first_offset}
    got, error = _receive(server, sub, lambda ids: rest <= ids)
    assert error is None and got == rest
    assert status_lost(server, sub) == 0


def test_a_topic_whose_storage_cannot_open_is_the_only_one_out_of_service(
    damaged_server: ServerProcess,
) -> None:
    server = damaged_server
    broken_topic = f"projects/{PROJECT}/topics/broken"
    broken_sub = f"projects/{PROJECT}/subscriptions/broken"
    _setup(server, broken_topic, broken_sub)
    _publish(server, broken_topic, 30)
    directory = _source_dir(server)
    good_topic = f"projects/{PROJECT}/topics/good"
    good_sub = f"projects/{PROJECT}/subscriptions/good"
    _setup(server, good_topic, good_sub)
    good = {int(i) for i in _publish(server, good_topic, 5, tag="g")}
    server.stop()
    first = sorted(directory.glob("*.seg"))[0]
    first.unlink()
    first.mkdir()  # unreadable as a segment: not damage the log can skip, an I/O failure
    (directory / segment_index.index_file_name(int(first.stem))).unlink()
    server.start()

    got, error = _receive(server, good_sub, lambda ids: good <= ids)
    assert error is None and got == good
    subscriber = make_subscriber(server.endpoint)
    with pytest.raises(exceptions.DataLoss, match="cannot be opened"):
        subscriber.pull(request={"subscription": broken_sub, "max_messages": 10}, timeout=10)
    with pytest.raises(exceptions.DataLoss, match="cannot be opened"):
        gapic_publisher(server.endpoint).publish(
            topic=broken_topic, messages=[types.PubsubMessage(data=b"x")], timeout=10
        )
    (why,) = status(server)["failed_topics"].values()
    assert why.startswith("the storage of topic")
    subscriber.close()


def test_raw_pull_gets_data_loss_not_internal(damaged_server: ServerProcess) -> None:
    server = damaged_server
    topic = f"projects/{PROJECT}/topics/raw"
    sub = f"projects/{PROJECT}/subscriptions/raw"
    _setup(server, topic, sub)
    _publish(server, topic, 3)
    server.stop()
    _flip_entry(_source_dir(server), 0)
    server.start()
    with grpc.insecure_channel(server.endpoint) as channel:
        pull = channel.unary_unary(
            "/google.pubsub.v1.Subscriber/Pull",
            request_serializer=types.PullRequest.serialize,
            response_deserializer=types.PullResponse.deserialize,
        )
        with pytest.raises(grpc.RpcError) as caught:
            pull(types.PullRequest(subscription=sub, max_messages=5), timeout=10)
    assert caught.value.code() is grpc.StatusCode.DATA_LOSS
    assert server.alive()
