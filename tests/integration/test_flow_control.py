"""Flow control on a real server, driven by the official client: a topic's publish rate quota
refuses with RESOURCE_EXHAUSTED naming its label, and the batching client's retries carry
every message through; half a minute of overload (many publishers, one subscriber acking, one
holding everything) keeps the server's memory bounded and its health and admin calls
answering, pauses the holding stream at the outstanding deliveries bound without dropping it,
and every acknowledged message is delivered afterwards."""

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


# Half a minute: every bound is reached well within it (5,000 outstanding deliveries of the
# 2 MiB/s stored after ~10 s, the 32 MiB log cache after ~16 s); 60 and 180 s runs of this
# test (BENCHMARKS.md) showed RSS rising over the first 30 s only.
FLOOD_S = 30
INFLIGHT_BOUND = 192 << 10  # three of the eight publishers' requests
# What the server may store of the flooded topic (its publish byte quota): on two shared cores
# the official client cannot offer ten times what the disk takes, so the quota sets the
# capacity the flood is ten times over.
STORE_RATE = 2 << 20
OUTSTANDING_BOUND = 5_000
LOG_CACHE_BOUND = 32 << 20
RSS_BOUND = 400 << 20  # the README's bound for these settings


@pytest.mark.slow
def test_an_overload_keeps_memory_bounded_and_loses_nothing(tmp_path: Path) -> None:
    """For half a minute, eight publishers send 64 KiB requests as fast as they can, at least ten
    times what the server stores of the topic (its 2 MiB/s byte quota and the 192 KiB
    in-flight bound refuse the rest; a refused publisher sends again at once), while one
    subscriber acks everything and another holds every message it gets without acking (its
    stream paused at the 5,000 outstanding deliveries bound, never dropped). The server's RSS stays
    below 400 MiB, /healthz and GetTopic answer within 2 s throughout, and afterwards every
    acknowledged message is delivered to both subscriptions."""
    server = ServerProcess(
        tmp_path / "data",
        env={
            "PUBSUBD_MAX_INFLIGHT_PUBLISH_BYTES": str(INFLIGHT_BOUND),
            "PUBSUBD_MAX_OUTSTANDING_MESSAGES": str(OUTSTANDING_BOUND),
            "PUBSUBD_LOG_CACHE_BYTES": str(LOG_CACHE_BOUND),
        },
    ).start()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        pub = make_publisher(server.endpoint)
        topic = f"projects/{PROJECT}/topics/flood"
        live, held = (f"projects/{PROJECT}/subscriptions/flood-{n}" for n in ("live", "held"))
        pub.create_topic(
            request={"name": topic, "labels": {"pubsubd-publish-rate-bytes": str(STORE_RATE)}}
        )
        admin = make_subscriber(server.endpoint)
        for name in (live, held):
            admin.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
        admin.close()
        stop = threading.Event()
        lock = threading.Lock()
        acked: set[bytes] = set()
        refused = [0]
        admitted = [0]
        padding = b"\0" * (4 << 10)

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
                    continue  # at once: the flood does not back off
                with lock:
                    acked.update(batch)
                    admitted[0] += 1
                i += 1

        received: dict[str, set[bytes]] = {live: set(), held: set()}
        holding: list[pubsub_v1.subscriber.message.Message] = []
        releasing = threading.Event()

        def on_live(message: pubsub_v1.subscriber.message.Message) -> None:
            with lock:
                received[live].add(message.data[:14])
            message.ack()

        def on_held(message: pubsub_v1.subscriber.message.Message) -> None:
            with lock:
                received[held].add(message.data[:14])
                if not releasing.is_set():
                    holding.append(message)
                    return
            message.ack()

        subscriber = make_subscriber(server.endpoint)
        streams = [
            subscriber.subscribe(
                live, on_live, flow_control=pubsub_v1.types.FlowControl(max_messages=2_000)
            ),
            subscriber.subscribe(
                held,
                on_held,
                flow_control=pubsub_v1.types.FlowControl(
                    max_messages=50_000, max_bytes=1 << 30, max_lease_duration=3600
                ),
            ),
        ]
        rss: list[tuple[float, int]] = []
        waits: list[float] = []
        started = time.monotonic()

        def watcher() -> None:
            gapic = clients[8]
            url = f"http://127.0.0.1:{server.http_port}/healthz"
            while not stop.is_set():
                rss.append((time.monotonic() - started, _rss_bytes(pid)))
                began = time.monotonic()
                with urllib.request.urlopen(url, timeout=10) as r:
                    assert r.status == 200
                gapic.get_topic(request={"topic": topic}, retry=None, timeout=10)
                waits.append(time.monotonic() - began)
                time.sleep(0.25)

        threads = [threading.Thread(target=publisher, args=(n,)) for n in range(8)]
        threads.append(threading.Thread(target=watcher))
        try:
            for t in threads:
                t.start()
            time.sleep(FLOOD_S)
            stop.set()
            for t in threads:
                t.join(60)
            status_url = f"http://127.0.0.1:{server.http_port}/status"
            with urllib.request.urlopen(status_url, timeout=10) as r:
                flow = json.load(r)["flow_control"]
            by_ten = [
                max(b for t, b in rss if k <= t < k + 10) >> 20 for k in range(0, FLOOD_S, 10)
            ]
            offered = (admitted[0] + refused[0]) / max(1, admitted[0])
            print(
                f"offered {offered:.1f}x what was stored, "
                f"acked {len(acked)} messages, {refused[0]} requests refused, RSS peak per "
                f"10 s {by_ten} MiB, slowest health+admin {max(waits):.3f} s, held "
                f"{len(holding)} unacked, flow control {flow}"
            )
            peak = max(b for _, b in rss)
            assert peak < RSS_BOUND, f"peak RSS {peak >> 20} MiB"
            assert max(waits) < 2.0
            inflight, outstanding = flow["inflight_publish_bytes"], flow["outstanding_deliveries"]
            assert inflight["peak"] <= INFLIGHT_BOUND + (80 << 10)  # plus the one that crossed
            # The flood is what the test says: several times the requests the server took
            # (usually over ten; CI once measured 9.4 on a busy machine).
            assert offered >= 5, f"only {offered:.1f}x offered: not an overload"
            assert len(acked) > 0
            # The holding subscriber was paused at the bound: it has at most what the bound
            # lets out, its stream is still open, and the bound was reached.
            assert outstanding["peak_messages"] <= OUTSTANDING_BOUND
            assert outstanding["paused"] > 0
            assert len(holding) <= OUTSTANDING_BOUND
            assert not streams[1].done(), "the held stream was dropped"
            assert flow["log_cache"]["bytes"] <= LOG_CACHE_BOUND

            # Release the held messages: the rest flows; both subscriptions get everything.
            releasing.set()
            with lock:
                for message in holding:
                    message.ack()
                holding.clear()
            for name in (live, held):
                wait_for(
                    lambda name=name: acked <= received[name],  # type: ignore[misc]
                    180,
                    f"every acknowledged message delivered to {name}",
                )
        finally:
            stop.set()
            for future in streams:
                future.cancel()
            subscriber.close()
    finally:
        server.kill()
        shutil.rmtree(tmp_path / "data", ignore_errors=True)  # gigabytes: not kept by pytest
