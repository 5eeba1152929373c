"""Pulls whose client cancels or vanishes (issue 8, part 3), against a real ``pubsubd serve``.

A cancelled Pull must be unregistered at once; messages handed to a Pull whose client is gone
go to a live consumer at once, not after the (60 s) ack deadline, and without counting as a
delivery attempt. Clients are killed with SIGKILL in their own processes
(``tests.support.killable_puller``); to kill one *after* the server handed it messages, it is
stopped first (SIGSTOP) with a receive window smaller than the response, so the response cannot
leave the server.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.pubsub_v1 import SubscriberAsyncClient, types
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

from tests.support.raw import gapic_publisher
from tests.support.server import ServerProcess, wait_for
from tests.support.status import sub_status

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ACK_DEADLINE_S = 60
# Redelivery "at once": far below the ack deadline, with room for a loaded 2-core CI machine.
AT_ONCE_S = 15.0
PULL = "/google.pubsub.v1.Subscriber/Pull"
PullRequest: Any = types.PullRequest.pb()
PullResponse: Any = types.PullResponse.pb()
BIG = b"x" * 3000  # 1000 of these: a 3 MB response, far beyond a 64 KiB receive window


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Client processes started by a test; killed (SIGKILL) when it ends."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        if p.stdout is not None:
            p.stdout.close()


def _create(clients: tuple[Any, Any], names: Any, dead_letter: bool = False) -> tuple[str, str]:
    pub, sub = clients
    topic, subscription = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    request: dict[str, Any] = {
        "name": subscription,
        "topic": topic,
        "ack_deadline_seconds": ACK_DEADLINE_S,
    }
    if dead_letter:
        pub.create_topic(name=names.topic("dlq"))
        sub.create_subscription(name=names.subscription("dlq"), topic=names.topic("dlq"))
        request["dead_letter_policy"] = {
            "dead_letter_topic": names.topic("dlq"),
            "max_delivery_attempts": 5,
        }
    sub.create_subscription(request=request)
    return topic, subscription


def _consumers(server: ServerProcess, subscription: str) -> int:
    return int(sub_status(server, subscription).get("consumers", -1))


def _start_puller(
    procs: list[subprocess.Popen[str]],
    server: ServerProcess,
    subscription: str,
    mode: str,
) -> subprocess.Popen[str]:
    """A client process whose Pull (or stream) has gone out; see tests/support/killable_puller."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.killable_puller",
            server.endpoint,
            subscription,
            mode,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    assert p.stdout is not None
    for expected in ("ready", "pulling"):
        line = p.stdout.readline().strip()
        assert line == expected, f"puller said {line!r}, expected {expected!r}"
    return p


def _kill(p: subprocess.Popen[str]) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(10)


def _publish_big(server: ServerProcess, topic: str, count: int) -> set[str]:
    """``count`` 3 kB messages, at most 1000 per request (one request is one log entry, so a
    waiting Pull is handed all of a request's messages at once)."""
    publisher = gapic_publisher(server.endpoint)
    ids: set[str] = set()
    for start in range(0, count, 1000):
        n = min(1000, count - start)
        messages = [types.PubsubMessage(data=BIG) for _ in range(n)]
        resp = publisher.publish(topic=topic, messages=messages)
        ids.update(resp.message_ids)
    return ids


def _collect(sub: Any, subscription: str, ids: set[str], timeout: float) -> dict[str, Any]:
    """Pull with the official client until every one of ``ids`` arrived (or ``timeout``)."""
    got: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while not ids <= set(got) and time.monotonic() < deadline:
        resp = sub.pull(
            request={"subscription": subscription, "max_messages": 1000},
            timeout=max(2.0, min(10.0, deadline - time.monotonic())),
        )
        for m in resp.received_messages:
            got[m.message.message_id] = m
    return got


def _ack(sub: Any, subscription: str, received: list[Any]) -> None:
    for i in range(0, len(received), 1000):
        sub.acknowledge(
            subscription=subscription, ack_ids=[m.ack_id for m in received[i : i + 1000]]
        )


def _cancel_official_async_pulls(endpoint: str, count: int, subscription: str, held: Any) -> None:
    """``count`` Pulls of the official asyncio client, cancelled once ``held()`` (the server
    holds them all)."""

    async def run() -> None:
        channel = grpc.aio.insecure_channel(endpoint)
        client = SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(channel=channel))
        request = {"subscription": subscription, "max_messages": 10}
        pulls = [
            asyncio.create_task(client.pull(request=request, timeout=120)) for _ in range(count)
        ]
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(held):
            assert time.monotonic() < deadline, "the Pulls never reached the server"
            await asyncio.sleep(0.05)
        for t in pulls:
            t.cancel()
        results = await asyncio.gather(*pulls, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results), results
        await channel.close()

    asyncio.run(run())


def _status_is(server: ServerProcess, subscription: str, **expected: int) -> bool:
    status = sub_status(server, subscription)
    return all(status.get(k) == v for k, v in expected.items())


def test_cancelled_pulls_are_removed_and_take_nothing(
    shared_server: ServerProcess, clients: tuple[Any, Any], names: Any
) -> None:
    pub, sub = clients
    topic, subscription = _create(clients, names)
    channel = grpc.insecure_channel(shared_server.endpoint)
    pull = channel.unary_unary(
        PULL,
        request_serializer=PullRequest.SerializeToString,
        response_deserializer=PullResponse.FromString,
    )
    try:
        request = PullRequest(subscription=subscription, max_messages=10)
        calls = [pull.future(request, timeout=120) for _ in range(150)]
        wait_for(lambda: _consumers(shared_server, subscription) == 150, 30, "150 waiting Pulls")
        for call in calls:
            call.cancel()
        assert all(call.cancelled() for call in calls)
        wait_for(lambda: _consumers(shared_server, subscription) == 0, 10, "cancelled Pulls gone")
        # The official asyncio client's Pulls, cancelled as tasks.
        _cancel_official_async_pulls(
            shared_server.endpoint,
            50,
            subscription,
            lambda: _consumers(shared_server, subscription) == 50,
        )
        wait_for(lambda: _consumers(shared_server, subscription) == 0, 10, "cancelled Pulls gone")
    finally:
        channel.close()

    futures = [pub.publish(topic, f"m{i}".encode()) for i in range(300)]
    ids = {f.result(timeout=30) for f in futures}
    got = _collect(sub, subscription, ids, AT_ONCE_S)
    assert set(got) == ids, f"the live Pull got {len(got)} of 300"
    status = sub_status(shared_server, subscription)
    assert (status["consumers"], status["outstanding"], status["delivered"]) == (0, 300, 300)
    _ack(sub, subscription, list(got.values()))


def test_killed_waiting_pull_takes_nothing(
    shared_server: ServerProcess,
    clients: tuple[Any, Any],
    names: Any,
    processes: list[subprocess.Popen[str]],
) -> None:
    """An official-client Pull waits in a process killed with SIGKILL; messages published right
    after go to a live Pull at once."""
    pub, sub = clients
    topic, subscription = _create(clients, names)
    p = _start_puller(processes, shared_server, subscription, "official")
    wait_for(lambda: _consumers(shared_server, subscription) == 1, 30, "the Pull waiting")
    _kill(p)
    published_at = time.monotonic()
    ids = {pub.publish(topic, f"m{i}".encode()).result(timeout=30) for i in range(50)}
    got = _collect(sub, subscription, ids, AT_ONCE_S)
    assert set(got) == ids, f"the live Pull got {len(got)} of 50"
    assert time.monotonic() - published_at < AT_ONCE_S
    assert _consumers(shared_server, subscription) == 0
    _ack(sub, subscription, list(got.values()))


def test_pull_killed_after_messages_were_handed_to_it(
    shared_server: ServerProcess,
    clients: tuple[Any, Any],
    names: Any,
    processes: list[subprocess.Popen[str]],
) -> None:
    _, sub = clients
    topic, subscription = _create(clients, names)
    p = _start_puller(processes, shared_server, subscription, "raw")
    wait_for(lambda: _consumers(shared_server, subscription) == 1, 30, "the Pull waiting")
    p.send_signal(signal.SIGSTOP)  # it reads nothing more: the 3 MB response cannot leave
    ids = _publish_big(shared_server, topic, 1000)
    wait_for(
        lambda: _status_is(shared_server, subscription, consumers=0, outstanding=1000),
        10,
        "the messages handed to the stopped Pull",
    )
    _kill(p)
    killed_at = time.monotonic()
    got = _collect(sub, subscription, ids, AT_ONCE_S)
    assert set(got) == ids, f"the live Pull got {len(got)} of 1000"
    assert time.monotonic() - killed_at < AT_ONCE_S
    status = sub_status(shared_server, subscription)
    assert (status["outstanding"], status["delivered"]) == (1000, 1000)  # the live Pull's only
    _ack(sub, subscription, list(got.values()))


def test_killed_stream_gives_back_what_it_never_sent(
    shared_server: ServerProcess,
    clients: tuple[Any, Any],
    names: Any,
    processes: list[subprocess.Popen[str]],
) -> None:
    """A StreamingPull client stops reading and is killed: the response being written may be in
    its hands and waits for its ack deadline; the responses queued behind it come back at once."""
    _, sub = clients
    topic, subscription = _create(clients, names)
    p = _start_puller(processes, shared_server, subscription, "stream")
    wait_for(lambda: _consumers(shared_server, subscription) == 1, 30, "the stream open")
    p.send_signal(signal.SIGSTOP)
    ids = _publish_big(shared_server, topic, 2000)
    wait_for(
        lambda: sub_status(shared_server, subscription).get("outstanding") == 2000,
        10,
        "2000 messages leased to the stopped stream",
    )
    _kill(p)
    killed_at = time.monotonic()
    wait_for(lambda: _consumers(shared_server, subscription) == 0, 10, "the stream gone")
    got = _collect(sub, subscription, ids, 5.0)
    assert time.monotonic() - killed_at < AT_ONCE_S
    # One response of 1000 was being written (kept), the other was queued (given back).
    assert len(got) == 1000
    status = sub_status(shared_server, subscription)
    assert (status["outstanding"], status["delivered"]) == (2000, 2000)
    _ack(sub, subscription, list(got.values()))


def test_cancelled_and_killed_pulls_do_not_dead_letter(
    shared_server: ServerProcess,
    clients: tuple[Any, Any],
    names: Any,
    processes: list[subprocess.Popen[str]],
) -> None:
    """max_delivery_attempts=5: the same messages are handed to six Pulls that are killed before
    their response leaves the server, after 50 cancelled Pulls; the live consumer then sees
    delivery_attempt 1 and nothing is dead-lettered."""
    _, sub = clients
    topic, subscription = _create(clients, names, dead_letter=True)
    dlq_subscription = names.subscription("dlq")
    channel = grpc.insecure_channel(shared_server.endpoint)
    pull = channel.unary_unary(
        PULL,
        request_serializer=PullRequest.SerializeToString,
        response_deserializer=PullResponse.FromString,
    )
    try:
        request = PullRequest(subscription=subscription, max_messages=10)
        calls = [pull.future(request, timeout=120) for _ in range(50)]
        wait_for(lambda: _consumers(shared_server, subscription) == 50, 30, "50 waiting Pulls")
        for call in calls:
            call.cancel()
        wait_for(lambda: _consumers(shared_server, subscription) == 0, 10, "cancelled Pulls gone")
    finally:
        channel.close()

    holder = _start_puller(processes, shared_server, subscription, "raw")
    wait_for(lambda: _consumers(shared_server, subscription) == 1, 30, "the first Pull waiting")
    holder.send_signal(signal.SIGSTOP)
    ids = _publish_big(shared_server, topic, 200)

    def handed_over() -> bool:  # the waiting Pull took them all (and left the consumers)
        return _status_is(shared_server, subscription, consumers=0, outstanding=200)

    wait_for(handed_over, 10, "the messages handed to the stopped Pull")
    for round_ in range(6):
        # The next Pull waits (everything is leased to the stopped one), stops reading, and is
        # handed the messages when the one holding them is killed.
        nxt = _start_puller(processes, shared_server, subscription, "raw")
        wait_for(lambda: _consumers(shared_server, subscription) == 1, 30, f"Pull {round_ + 2}")
        nxt.send_signal(signal.SIGSTOP)
        _kill(holder)
        wait_for(handed_over, AT_ONCE_S, f"the messages handed to Pull {round_ + 2}")
        holder = nxt
    _kill(holder)
    got = _collect(sub, subscription, ids, AT_ONCE_S)
    assert set(got) == ids, f"the live Pull got {len(got)} of 200"
    assert {m.delivery_attempt for m in got.values()} == {1}
    _ack(sub, subscription, list(got.values()))
    assert sub_status(shared_server, subscription)["backlog"] == 0
    assert sub_status(shared_server, dlq_subscription)["backlog"] == 0, "dead-lettered"
