"""Flow control on a real server, driven by the official client: a topic's publish rate quota
refuses with RESOURCE_EXHAUSTED naming its label, and the batching client's retries carry
every message through; an overload (many publishers sending large requests, nobody consuming)
keeps the server's memory bounded and its health and admin calls answering, and every
acknowledged message is delivered afterwards."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support.raw import gapic_publisher
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.integration


def test_a_publish_rate_quota_refuses_then_the_client_retries_through(
    server: ServerProcess,
) -> None:
    pub = make_publisher(server.endpoint)
    topic = f"projects/{PROJECT}/topics/rated"
    with pytest.raises(exceptions.InvalidArgument, match="pubsubd-publish-rate-messages"):
        pub.create_topic(request={"name": topic, "labels": {"pubsubd-publish-rate-messages": "0"}})
    pub.create_topic(request={"name": topic, "labels": {"pubsubd-publish-rate-messages": "20"}})
    gapic = gapic_publisher(server.endpoint)
    started = time.monotonic()
    admitted = 0
    refusal = None
    for _ in range(400):  # one message per request, as fast as one client goes
        try:
            gapic.publish(
                request={"topic": topic, "messages": [{"data": b"x"}]}, retry=None, timeout=10
            )
            admitted += 1
        except exceptions.ResourceExhausted as e:
            refusal = str(e)
            break
    elapsed = time.monotonic() - started
    assert refusal is not None and "pubsubd-publish-rate-messages" in refusal
    assert 20 <= admitted <= 20 + 20 * elapsed + 1  # one second's burst, then the rate

    # The batching client retries RESOURCE_EXHAUSTED: 60 more messages all go through, at
    # about the rate (a first batch may borrow a second's worth).
    started = time.monotonic()
    futures = [pub.publish(topic, b"m%d" % i) for i in range(60)]
    ids = [f.result(timeout=60) for f in futures]
    assert len(set(ids)) == 60
    assert time.monotonic() - started >= 0.9


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_an_overload_keeps_memory_bounded_and_loses_nothing(tmp_path: Path) -> None:
    """Eight publishers send 1 MiB requests as fast as they can for 10 s while nobody
    consumes, against an in-flight bound of 8 MiB. The server's RSS stays below 400 MiB (the
    README's bound for these settings), /healthz and GetTopic answer within 2 s throughout,
    and every acknowledged message is delivered afterwards."""
    server = ServerProcess(
        tmp_path / "data", env={"PUBSUBD_MAX_INFLIGHT_PUBLISH_BYTES": str(8 << 20)}
    ).start()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        pub = make_publisher(server.endpoint)
        topic = f"projects/{PROJECT}/topics/flood"
        subscription = f"projects/{PROJECT}/subscriptions/flood"
        pub.create_topic(name=topic)
        make_subscriber(server.endpoint).create_subscription(name=subscription, topic=topic)
        stop = threading.Event()
        lock = threading.Lock()
        acked: set[bytes] = set()
        refused = [0]
        padding = b"\0" * (64 << 10)

        # The generated clients are made here, one at a time: gapic_publisher sets
        # PUBSUB_EMULATOR_HOST for the moment it builds one, and threads building them at
        # once would see each other's unset (then the client looks for Google credentials).
        clients = [gapic_publisher(server.endpoint) for _ in range(9)]

        def publisher(n: int) -> None:
            gapic = clients[n]
            i = 0
            while not stop.is_set():
                batch = [b"%02d-%08d-%02d" % (n, i, j) for j in range(16)]
                try:
                    gapic.publish(
                        request={
                            "topic": topic,
                            "messages": [{"data": k + padding} for k in batch],
                        },
                        retry=None,
                        timeout=30,
                    )
                except exceptions.ResourceExhausted:
                    with lock:
                        refused[0] += 1
                    time.sleep(0.01)
                    continue
                with lock:
                    acked.update(batch)
                i += 1

        rss: list[int] = []
        waits: list[float] = []

        def watcher() -> None:
            gapic = clients[8]
            url = f"http://127.0.0.1:{server.http_port}/healthz"
            while not stop.is_set():
                rss.append(_rss_bytes(pid))
                started = time.monotonic()
                with urllib.request.urlopen(url, timeout=10) as r:
                    assert r.status == 200
                gapic.get_topic(request={"topic": topic}, retry=None, timeout=10)
                waits.append(time.monotonic() - started)
                time.sleep(0.25)

        threads = [threading.Thread(target=publisher, args=(n,)) for n in range(8)]
        threads.append(threading.Thread(target=watcher))
        for t in threads:
            t.start()
        time.sleep(10)
        stop.set()
        for t in threads:
            t.join(60)
        status_url = f"http://127.0.0.1:{server.http_port}/status"
        with urllib.request.urlopen(status_url, timeout=10) as r:
            flow = json.load(r)["flow_control"]["inflight_publish_bytes"]
        print(
            f"acked {len(acked)} messages, {refused[0]} requests refused, peak RSS "
            f"{max(rss) >> 20} MiB, slowest health+admin {max(waits):.3f} s, in flight {flow}"
        )
        assert max(rss) < 400 << 20
        assert max(waits) < 2.0
        assert flow["peak"] <= (8 << 20) + (1100 << 10)  # the bound, plus the one that crossed it
        assert len(acked) > 0

        received: set[bytes] = set()
        sub = make_subscriber(server.endpoint)

        def callback(message: pubsub_v1.subscriber.message.Message) -> None:
            with lock:
                received.add(message.data[:14])
            message.ack()

        flow_control = pubsub_v1.types.FlowControl(max_messages=500, max_bytes=64 << 20)
        future = sub.subscribe(subscription, callback, flow_control=flow_control)
        try:
            wait_for(lambda: acked <= received, 120, "every acknowledged message delivered")
        finally:
            future.cancel()
            sub.close()
    finally:
        server.kill()
        shutil.rmtree(tmp_path / "data", ignore_errors=True)  # gigabytes: not kept by pytest
