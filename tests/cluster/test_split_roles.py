"""Publishing and subscribing forwarders as separate processes (issue 11, part 4).

The cluster runs one publishing-only forwarder (``pubsubd forwarder --no-subscribing``) and two
subscribing-only ones (``--no-publishing``) behind a router and a frontend. The router then
places topics among the publishing forwarders and subscriptions among the subscribing ones
(control/routing_table.py, "split"); a subscribing forwarder reads its subscriptions' topics
from copies it keeps over the owner's ``pubsubd.internal.v1.Sources/Tail``, and sends acks to
the owner, which keeps every subscription's ack state (data/subscribe/remote_sources.py).

Checked with the official client through the frontend: every message delivered to two
subscriptions served on copies, acks landing at the owner (a new subscriber receives only what
came after), a snapshot and Seek to it, Seek to a time, and a kill -9 of the
subscribing forwarder serving a subscription under a publish flood: the other one takes the
subscription over and every acknowledged publish is delivered. Ledgers roll at 64 KiB here, so
a topic has several closed ledgers: a subscription moved to a forwarder with no copy of its
topic catches up from the storage nodes, and the owner's ``Tail`` sends only the open
ledger's part (every message delivered once, in order per key).
"""

from __future__ import annotations

import datetime
import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from pubsubd.cluster.launcher import LocalCluster
from pubsubd.core.quotas import MESSAGES_LABEL as QUOTA_LABEL
from tests.cluster.test_frontends import Receiver
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import (
    environment,
    spread_cluster,
    subscription_server,
    topic_owner,
    topic_uid,
)
from tests.support.flood import Flood
from tests.support.raw import gapic_publisher
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PUBLISHING = "forwarder-1"
SUBSCRIBING = ["forwarder-2", "forwarder-3"]
LEDGER_BYTES = 64 << 10
# bytes/s: a catch-up of ~1 MB (16 ledgers) takes ~30 s, so the kill lands in it even when a
# loaded machine answers the status polls slowly (at 128 KiB/s, ~7 s, one CI run's copy had
# finished before the kill).
SLOW_FILL_BYTES = 32 << 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("split")
    # Small ledgers (several closed ones per topic), and copies that catch up from the
    # storage nodes whatever the gap (data/subscribe/remote_sources.py).
    small = {"PUBSUBD_LEDGER_BYTES": str(LEDGER_BYTES), "PUBSUBD_COPY_FILL_MIN_MESSAGES": "1"}
    # The spread tests' cluster (one publishing-only forwarder, two subscribing-only ones),
    # with a router that does not spread.
    with spread_cluster(directory, small, router_args=[]) as c:
        yield c


class _Receiver(Receiver):
    """Closes only once the client's stream is down, so its last acks were sent (the shared
    Receiver closes its channel at once: acks still queued then are lost, and redelivered)."""

    def close(self) -> None:
        self._future.cancel()
        self._future.result(timeout=30)
        self._sub.close()


def _status(cluster: LocalCluster, name: str) -> dict[str, Any]:
    process = cluster.process(name)
    port = process.args[process.args.index("--http-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
        return json.loads(r.read())["cluster"]  # type: ignore[no-any-return]


def _on_copies(cluster: LocalCluster, name: str) -> int:
    return int(_status(cluster, name)["subscription_ownership"]["on_copies"])


def _server(cluster: LocalCluster, subscription: str) -> str:
    return subscription_server(cluster, subscription)


def test_subscriptions_are_served_apart_from_their_topic(cluster: LocalCluster, names: Any) -> None:
    endpoint = cluster.grpc
    pub, sub = make_publisher(endpoint), make_subscriber(endpoint)
    topic = names.topic("split")
    subscriptions = [names.subscription(f"split-{i}") for i in range(2)]
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscriptions[0], topic=topic)
    # Acked messages stay for Seek to bring back (retain_acked_messages).
    sub.create_subscription(
        request={"name": subscriptions[1], "topic": topic, "retain_acked_messages": True}
    )
    wait_for(lambda: topic_owner(cluster, topic) == PUBLISHING, 30, "the topic is placed")
    wait_for(
        lambda: all(_server(cluster, s) in SUBSCRIBING for s in subscriptions),
        30,
        "the subscriptions are placed on subscribing forwarders",
    )
    sent = {f"first-{i}".encode() for i in range(300)}
    for f in [pub.publish(topic, data) for data in sorted(sent)]:
        f.result(timeout=60)
    receivers = [_Receiver(endpoint, s) for s in subscriptions]
    try:
        wait_for(lambda: all(r.has(sent) for r in receivers), 60, "every message delivered")
    finally:
        for r in receivers:
            r.close()
    assert all(not (r.received - sent) for r in receivers)
    assert sum(_on_copies(cluster, name) for name in SUBSCRIBING) == 2
    assert _status(cluster, PUBLISHING)["ownership"]["owned_topics"] >= 1
    assert _status(cluster, PUBLISHING)["subscription_ownership"]["served_subscriptions"] == 0

    # The acks reached the topic's owner: a new subscriber receives only what came after.
    time.sleep(1.0)  # the acks' flush window, and the owner's journal flush
    later = {f"later-{i}".encode() for i in range(50)}
    for f in [pub.publish(topic, data) for data in sorted(later)]:
        f.result(timeout=60)
    again = _Receiver(endpoint, subscriptions[0])
    try:
        wait_for(lambda: again.has(later), 60, "the later messages delivered")
        time.sleep(1.0)
    finally:
        again.close()
    assert again.received == later, f"{len(again.received - later)} acked ones came again"

    # A snapshot taken on the subscribing forwarder (its cursors, positions from the copy), then
    # Seek back to it: what was acked after it is delivered again, nothing before it.
    snapshot = subscriptions[0].replace("/subscriptions/", "/snapshots/")
    time.sleep(1.0)  # the later acks reach the owner
    sub.create_snapshot(name=snapshot, subscription=subscriptions[0])
    after = {f"after-{i}".encode() for i in range(30)}
    for f in [pub.publish(topic, data) for data in sorted(after)]:
        f.result(timeout=60)
    acked = _Receiver(endpoint, subscriptions[0])
    try:
        wait_for(lambda: acked.has(after), 60, "the messages after the snapshot delivered")
        time.sleep(1.0)
    finally:
        acked.close()
    sub.seek(request={"subscription": subscriptions[0], "snapshot": snapshot})
    back = _Receiver(endpoint, subscriptions[0])
    try:
        wait_for(lambda: back.has(after), 60, "the messages after the snapshot delivered again")
        time.sleep(1.0)
    finally:
        back.close()
    assert back.received == after

    # Seek to a time before everything: every message is unacked again (retained acked),
    # read on the copy.
    sub.seek(
        request={
            "subscription": subscriptions[1],
            "time": datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1),
        }
    )
    replayed = _Receiver(endpoint, subscriptions[1])
    try:
        wait_for(lambda: replayed.has(sent | later), 60, "the whole topic delivered again")
    finally:
        replayed.close()
    sub.close()


def test_a_killed_subscribing_forwarder_s_subscription_is_served_by_the_other(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = cluster.grpc
    pub, sub = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic("killed-sub"), names.subscription("killed-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    sub.close()
    wait_for(lambda: _server(cluster, subscription) in SUBSCRIBING, 30, "the subscription placed")
    server = _server(cluster, subscription)
    receiver = Receiver(endpoint, subscription)
    flood = Flood(endpoint, topic, rate=300).start()
    try:
        wait_for(lambda: receiver.count() >= 200, 60, "delivery under way")
        cluster.kill(server)
        started = time.monotonic()
        wait_for(
            lambda: _server(cluster, subscription) not in ("", server), 60, "another serves it"
        )
        print(
            f"kill -9 -> the subscription is routed elsewhere: {time.monotonic() - started:.2f} s"
        )
        before = receiver.count()
        wait_for(lambda: receiver.count() >= before + 300, 60, "delivery goes on after")
    finally:
        flood.stop()
    acked, sent = flood.snapshot(), flood.sent
    try:
        wait_for(lambda: receiver.has(acked), 90, "every acknowledged message delivered")
    finally:
        receiver.close()
        cluster.restart(server)
    assert not flood.errors, f"publishes that failed for good: {dict(flood.errors)}"
    assert not receiver.received - sent, "messages nobody published"


class _OrderedReceiver:
    """subscribe() through the frontend, acking everything, recording what arrived in order."""

    def __init__(self, endpoint: str, subscription: str) -> None:
        self.arrived: list[bytes] = []
        self._lock = threading.Lock()
        self._sub = make_subscriber(endpoint)
        self._future = self._sub.subscribe(subscription, self._callback)

    def _callback(self, message: Any) -> None:
        with self._lock:
            self.arrived.append(message.data)
        message.ack()

    def snapshot(self) -> list[bytes]:
        with self._lock:
            return list(self.arrived)

    def close(self) -> None:
        self._future.cancel()
        self._sub.close()


def _fills(cluster: LocalCluster, name: str, uid: str) -> tuple[int, int]:
    """Messages a subscribing forwarder's copy of the topic with storage ``uid`` took from the
    storage nodes and from the topic's owner."""
    fills = _status(cluster, name)["subscription_ownership"]["copies"]["fills_by_topic"]
    found = fills.get(uid, {"nodes": 0, "owner": 0})
    return int(found["nodes"]), int(found["owner"])


@dataclass
class _Backlog:
    """A topic with several closed ledgers of keyed messages, its subscription served by
    ``first``; ``fresh`` (the other subscribing forwarder) has no copy of it."""

    topic: str
    uid: str
    subscription: str
    first: str
    fresh: str
    sent: dict[str, list[bytes]]

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.sent.values())

    def check_delivery(self, arrived: list[bytes]) -> None:
        """Every message once, in order per key."""
        counts = Counter(arrived)
        assert not [m for m, n in counts.items() if n > 1], "messages delivered twice"
        for key, messages in self.sent.items():
            assert [m for m in arrived if m.startswith(f"{key}-".encode())] == messages


def _backlog(cluster: LocalCluster, names: Any, label: str) -> _Backlog:
    endpoint = cluster.grpc
    pub = make_publisher(
        endpoint, publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    sub = make_subscriber(endpoint)
    topic, subscription = names.topic(label), names.subscription(label)
    pub.create_topic(name=topic)
    sub.create_subscription(
        request={"name": subscription, "topic": topic, "enable_message_ordering": True}
    )
    sub.close()
    wait_for(lambda: topic_owner(cluster, topic) == PUBLISHING, 30, "the topic is placed")
    wait_for(lambda: _server(cluster, subscription) in SUBSCRIBING, 30, "the subscription placed")
    first = _server(cluster, subscription)
    (fresh,) = [name for name in SUBSCRIBING if name != first]
    # ~1 MB over 4 keys: over a dozen 64 KiB ledgers, all but the last closed.
    keys = [f"k{i}" for i in range(4)]
    sent = {key: [f"{key}-{i:05d}-".encode().ljust(200, b".") for i in range(1000)] for key in keys}
    futures = [
        pub.publish(topic, sent[key][i], ordering_key=key) for i in range(1000) for key in keys
    ]
    for f in futures:
        f.result(timeout=60)
    uid = topic_uid(cluster, topic)
    assert _fills(cluster, fresh, uid) == (0, 0)  # no copy of the topic there
    return _Backlog(topic, uid, subscription, first, fresh, sent)


def _receive(cluster: LocalCluster, backlog: _Backlog) -> list[bytes]:
    """Everything, through the frontend, once ``fresh`` serves the subscription (``first``
    is started again after)."""
    receiver = _OrderedReceiver(cluster.grpc, backlog.subscription)
    try:
        wait_for(
            lambda: _server(cluster, backlog.subscription) == backlog.fresh, 60, "fresh serves it"
        )
        wait_for(lambda: len(receiver.snapshot()) >= backlog.total, 60, "every message delivered")
        time.sleep(1.0)  # anything delivered twice shows up
    finally:
        receiver.close()
        cluster.restart(backlog.first)
    return receiver.snapshot()


def test_a_moved_subscription_s_copy_catches_up_from_the_storage_nodes(
    cluster: LocalCluster, names: Any
) -> None:
    backlog = _backlog(cluster, names, "catch-up")
    total = backlog.total
    # The forwarder serving the subscription stops: the other, with no copy of the topic, takes
    # it over and catches up.
    cluster.stop(backlog.first)
    backlog.check_delivery(_receive(cluster, backlog))
    from_nodes, from_owner = _fills(cluster, backlog.fresh, backlog.uid)
    print(f"catch-up of {total} messages: {from_nodes} from the storage nodes, {from_owner} "
          "over the owner's Tail")  # fmt: skip
    assert from_nodes + from_owner == total
    # Only the open ledger's part came from the owner (a ledger holds ~300 of these).
    assert from_nodes >= total * 3 // 4, (from_nodes, from_owner)
    assert from_owner <= total // 4, (from_nodes, from_owner)


def test_a_catch_up_cut_by_kill_9_resumes_from_the_copy_s_end(
    cluster: LocalCluster, names: Any
) -> None:
    backlog = _backlog(cluster, names, "catch-up-killed")
    total = backlog.total
    # The other forwarder runs with a slow catch-up, so the kill lands in the middle of it.
    cluster.stop(backlog.fresh)
    with environment({"PUBSUBD_COPY_FILL_RATE_BYTES": str(SLOW_FILL_BYTES)}):
        cluster.restart(backlog.fresh)
    cluster.stop(backlog.first)
    wait_for(
        lambda: _fills(cluster, backlog.fresh, backlog.uid)[0] > 0, 60, "the catch-up under way"
    )
    cluster.kill(backlog.fresh)
    cluster.restart(backlog.fresh)  # the usual rate again
    backlog.check_delivery(_receive(cluster, backlog))
    from_nodes, from_owner = _fills(cluster, backlog.fresh, backlog.uid)
    kept = total - from_nodes - from_owner
    print(f"after kill -9 mid-catch-up: {kept} messages kept by the copy, {from_nodes} from "
          f"the storage nodes, {from_owner} over the owner's Tail")  # fmt: skip
    # The copy went on from what the killed process had written, not from the start, and the
    # owner still sent only the open ledger's part.
    assert from_nodes > 0 and kept > 0, (from_nodes, from_owner)
    assert from_owner <= total // 4, (from_nodes, from_owner)


def test_a_subscription_created_through_one_forwarder_is_pulled_at_once_through_another(
    cluster: LocalCluster, names: Any
) -> None:
    """CreateSubscription is answered by the topic's owner (the publishing forwarder); the
    subscription is served by a subscribing forwarder the router names a moment later. A Pull
    sent at once, through the frontend or to a subscribing forwarder directly, and a stream
    opened at once through the frontend, each get the message published right after the
    create, with the official client and no NOT_FOUND: until the subscription is placed
    every forwarder refuses it as "not served here" (UNAVAILABLE, which the frontend and the
    client retry), and the one that gains it catches up with the metadata store before it
    serves it (data/ownership.py ``SubscriptionOwnership``)."""
    publisher = make_publisher(cluster.grpc)
    topic = names.topic("created-then-pulled")
    publisher.create_topic(name=topic)
    wait_for(lambda: topic_owner(cluster, topic) == PUBLISHING, 30, "the topic is placed")
    creator = make_subscriber(cluster.grpc)
    readers = {
        a: make_subscriber(a)
        for a in (cluster.grpc, *(cluster.process(n).address for n in SUBSCRIBING))
    }
    not_found: list[str] = []
    waits: list[float] = []
    for i in range(8):
        name = names.subscription(f"created-{i}")
        creator.create_subscription(name=name, topic=topic)
        data = f"m-{i}".encode()
        publisher.publish(topic, data).result(timeout=30)
        address = cluster.grpc
        if i % 2:  # directly to its subscribing forwarder, as soon as the router names it
            wait_for(lambda n=name: _server(cluster, n), 30, "the subscription is placed")
            address = cluster.process(_server(cluster, name)).address
        started = time.monotonic()
        try:
            pulled = readers[address].pull(
                request={"subscription": name, "max_messages": 10}, timeout=30
            )
        except exceptions.NotFound:
            not_found.append(name)
            continue
        waits.append(time.monotonic() - started)
        assert [m.message.data for m in pulled.received_messages] == [data]
    streamed = names.subscription("created-streamed")
    creator.create_subscription(name=streamed, topic=topic)
    publisher.publish(topic, b"streamed").result(timeout=30)
    receiver = _Receiver(cluster.grpc, streamed)
    try:
        wait_for(lambda: receiver.has({b"streamed"}) or receiver._future.done(), 30, "streamed")
        assert not receiver._future.done(), receiver._future.exception()
    finally:
        receiver.close()
    assert not_found == [], f"NOT_FOUND right after the create: {not_found}"
    print(f"first Pull answered after {min(waits):.3f}-{max(waits):.3f} s")
    for client in (creator, *readers.values()):
        client.close()


QUOTA = 20  # a block_publishers backlog quota, in messages


def test_a_topic_s_new_owner_counts_its_subscriptions_backlog_at_once(
    cluster: LocalCluster, names: Any
) -> None:
    """A topic with a block_publishers quota of 20 and an idle subscription served by a
    subscribing forwarder: 12 published, then the topic's owner restarts (SIGTERM; the topic is
    taken over by the new process). The new owner knows the subscription's backlog as soon as
    it serves the topic (it opens every subscription's ack journal when it gains the topic,
    data/reconcile.py): exactly 8 more are accepted and the next is refused. Before, it
    counted the subscription only once its subscribing forwarder attached again there, which
    an idle one does on its next ack: every publish was accepted."""
    admin = make_publisher(cluster.grpc)
    topic, subscription = names.topic("moved-quota"), names.subscription("moved-quota")
    admin.create_topic(request={"name": topic, "labels": {QUOTA_LABEL: str(QUOTA)}})
    make_subscriber(cluster.grpc).create_subscription(name=subscription, topic=topic)
    wait_for(lambda: _server(cluster, subscription) in SUBSCRIBING, 30, "the subscription placed")
    gapic = gapic_publisher(cluster.grpc)

    def publish(data: bytes) -> bool:
        try:
            gapic.publish(
                request={"topic": topic, "messages": [{"data": data}]}, retry=None, timeout=10
            )
        except exceptions.ResourceExhausted:
            return False
        return True

    assert all(publish(f"before-{i}".encode()) for i in range(12))
    cluster.stop(PUBLISHING)
    cluster.restart(PUBLISHING)

    def served_again() -> bool:
        try:
            return publish(b"after-0")
        except (exceptions.ServiceUnavailable, exceptions.DeadlineExceeded):
            return False

    wait_for(served_again, 60, "the topic served by its new owner")
    accepted = 1
    while accepted <= QUOTA and publish(f"after-{accepted}".encode()):
        accepted += 1
    assert accepted == QUOTA - 12, f"{12 + accepted} accepted in all at a quota of {QUOTA}"
