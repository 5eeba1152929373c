"""A busy subscription spread over two subscribing forwarders by source (issue 11, part 4).

One publishing-only forwarder and two subscribing-only ones behind a router run with
``--spread-all`` and a frontend: each of the topic's 8 publish message sources of
the subscription is placed on its own (control/routing_table.py, ``Route.spread``), each
subscribing forwarder serves only the sources it owns (``planner.served_sources``), and the
frontend fans the official client's StreamingPull out to both, its acks back to the forwarder
that leased each message (frontend/spread_proxy.py).

Checked with the official client through the frontend: keyed messages delivered exactly once
in per-key order, by both forwarders; then a kill -9 of one subscribing forwarder under a
publish flood: its sources go to the other, and every acknowledged publish is delivered.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import queue
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import _pulsar
import grpc
import pulsar
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from pubsubd.cluster.launcher import LocalCluster
from pubsubd.core import pb
from tests.cluster.test_frontends import Receiver
from tests.conftest import make_publisher, make_subscriber
from tests.support import browser
from tests.support.cluster import spread_cluster
from tests.support.flood import Flood
from tests.support.raw import gapic_publisher
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUBSCRIBING = ["forwarder-2", "forwarder-3"]
SOURCES = 8
HALF_LIFE_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # The load EWMAs' half-life is the router's (the forwarders follow it): not the default.
    router_args = ["--spread-all", "--load-half-life", str(HALF_LIFE_S)]
    with spread_cluster(tmp_path_factory.mktemp("spread"), {}, router_args) as c:
        yield c


def _http(cluster: LocalCluster, name: str) -> str:
    """The base URL of a process's HTTP port (/status, /metrics, the dashboard)."""
    process = cluster.process(name)
    return f"http://127.0.0.1:{process.args[process.args.index('--http-port') + 1]}"


def _status(cluster: LocalCluster, name: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{_http(cluster, name)}/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _served_sources(cluster: LocalCluster, name: str, subscription: str) -> list[int]:
    spread = _status(cluster, name)["cluster"]["subscription_ownership"]["spread_subscriptions"]
    return list(spread.get(subscription, []))


def _delivered(cluster: LocalCluster, name: str, subscription: str) -> int:
    found = _status(cluster, name)["subscriptions"].get(subscription)
    return int(found["delivered"]) if found else 0


def _spread_over_both(cluster: LocalCluster, subscription: str) -> bool:
    served = [_served_sources(cluster, name, subscription) for name in SUBSCRIBING]
    return all(served) and sorted(served[0] + served[1]) == list(range(SOURCES))


def _topic(publisher: pubsub_v1.PublisherClient, name: str) -> None:
    publisher.create_topic(
        request={"name": name, "labels": {"pubsubd-publish-sources": str(SOURCES)}}
    )


class _KeyedReceiver:
    """subscribe() through the frontend, acking everything, recording each key's order."""

    def __init__(self, endpoint: str, subscription: str) -> None:
        self.by_key: dict[str, list[int]] = {}
        self.count = 0
        self._lock = threading.Lock()
        self._sub = make_subscriber(endpoint)
        self._future = self._sub.subscribe(subscription, self._callback)

    def _callback(self, message: Any) -> None:
        key, seq = message.data.decode().split(":")
        with self._lock:
            self.by_key.setdefault(key, []).append(int(seq))
            self.count += 1
        message.ack()

    def close(self) -> None:
        self._future.cancel()
        self._future.result(timeout=30)
        self._sub.close()


def test_a_spread_subscription_is_served_by_both_forwarders_in_key_order(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = cluster.grpc
    publisher = make_publisher(
        endpoint, publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    subscriber = make_subscriber(endpoint)
    topic, subscription = names.topic("spread"), names.subscription("spread")
    _topic(publisher, topic)
    subscriber.create_subscription(
        request={"name": subscription, "topic": topic, "enable_message_ordering": True}
    )
    subscriber.close()
    wait_for(lambda: _spread_over_both(cluster, subscription), 30, "the sources spread")
    keys, per_key = 24, 25
    futures = [
        publisher.publish(topic, f"k{k}:{i}".encode(), ordering_key=f"k{k}")
        for i in range(per_key)
        for k in range(keys)
    ]
    for f in futures:
        f.result(timeout=60)
    receiver = _KeyedReceiver(endpoint, subscription)
    try:
        wait_for(lambda: receiver.count >= keys * per_key, 60, "every message delivered")
        time.sleep(1.0)  # a duplicate would come now
    finally:
        receiver.close()
    assert receiver.count == keys * per_key, "messages delivered more than once"
    assert sorted(receiver.by_key) == sorted(f"k{k}" for k in range(keys))
    for key, seqs in receiver.by_key.items():
        assert seqs == list(range(per_key)), f"{key} out of order: {seqs}"
    served = {name: _delivered(cluster, name, subscription) for name in SUBSCRIBING}
    print(f"delivered per subscribing forwarder: {served}")
    assert all(served.values()), f"a forwarder served nothing: {served}"
    assert sum(served.values()) == keys * per_key
    assert _status(cluster, "frontend-1")["spread_streams"] >= 1  # fanned out by the frontend


def _pull_all(subscriber: Any, subscription: str, count: int) -> list[str]:
    """Pull and acknowledge until ``count`` messages came; their data, in arrival order."""
    got: list[str] = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        response = subscriber.pull(
            request={"subscription": subscription, "max_messages": 50}, timeout=30
        )
        if not response.received_messages:
            continue
        got.extend(m.message.data.decode() for m in response.received_messages)
        subscriber.acknowledge(
            request={
                "subscription": subscription,
                "ack_ids": [m.ack_id for m in response.received_messages],
            }
        )
    return got


def test_unary_pull_acks_and_seek_reach_every_forwarder_of_a_spread_subscription(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = cluster.grpc
    # Keyed, so the messages go to every source (an unkeyed batch is one source's entry).
    publisher = make_publisher(
        endpoint, publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    subscriber = make_subscriber(endpoint)
    topic, subscription = names.topic("spread-pull"), names.subscription("spread-pull")
    _topic(publisher, topic)
    subscriber.create_subscription(
        request={"name": subscription, "topic": topic, "retain_acked_messages": True}
    )
    wait_for(lambda: _spread_over_both(cluster, subscription), 30, "the sources spread")
    sent = [f"m{i}" for i in range(200)]
    for f in [
        publisher.publish(topic, data.encode(), ordering_key=f"k{i % 32}")
        for i, data in enumerate(sent)
    ]:
        f.result(timeout=60)
    got = _pull_all(subscriber, subscription, len(sent))
    assert sorted(got) == sorted(sent), "each message pulled once"
    # Each Acknowledge was split by source: every forwarder's acks arrived there, and nothing
    # stays leased (a raced Pull's response that arrived too late was handed back).
    time.sleep(0.5)
    statuses = {n: _status(cluster, n)["subscriptions"][subscription] for n in SUBSCRIBING}
    print({n: (s["served_sources"], s["delivered"], s["acked"]) for n, s in statuses.items()})
    assert all(s["acked"] > 0 and s["outstanding"] == 0 for s in statuses.values()), statuses
    assert sum(s["acked"] for s in statuses.values()) == len(sent), statuses
    # Seek to a time before everything, on every forwarder: all of it comes again.
    subscriber.seek(
        request={
            "subscription": subscription,
            "time": datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1),
        }
    )
    again = _pull_all(subscriber, subscription, len(sent))
    assert sorted(again) == sorted(sent), "the whole topic again after Seek"
    subscriber.close()


def _metric(cluster: LocalCluster, name: str, metric: str, subscription: str) -> float:
    with urllib.request.urlopen(f"{_http(cluster, name)}/metrics", timeout=10) as r:
        text = r.read().decode()
    wanted = f'{metric}{{subscription="{subscription}"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if wanted in line)


def test_a_spread_subscription_s_backlog_is_the_sum_of_its_forwarders_shares(
    cluster: LocalCluster, names: Any
) -> None:
    """Each subscribing forwarder reports the backlog of the sources it serves (``/status``,
    ``pubsubd_subscription_backlog_messages``), so the figures of a spread subscription's
    forwarders add up to the whole subscription's, not each to (about) all of it."""
    endpoint = cluster.grpc
    publisher = make_publisher(
        endpoint, publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    subscriber = make_subscriber(endpoint)
    topic, subscription = names.topic("spread-backlog"), names.subscription("spread-backlog")
    _topic(publisher, topic)
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    wait_for(lambda: _spread_over_both(cluster, subscription), 30, "the sources spread")
    sent = 160
    for f in [
        publisher.publish(topic, f"b{i}".encode(), ordering_key=f"k{i % 32}") for i in range(sent)
    ]:
        f.result(timeout=60)

    def shares() -> dict[str, int]:
        return {
            n: int(_status(cluster, n)["subscriptions"][subscription]["backlog"])
            for n in SUBSCRIBING
        }

    wait_for(lambda: sum(shares().values()) >= sent, 30, "the whole backlog reported")
    time.sleep(1.0)  # every forwarder has read every commit by now: nothing more comes
    reported = shares()
    print(f"backlog by forwarder: {reported} (published {sent})")
    assert sum(reported.values()) == sent and all(reported.values()), reported
    metric = "pubsubd_subscription_backlog_messages"
    gauges = {n: _metric(cluster, n, metric, subscription) for n in SUBSCRIBING}
    assert sum(gauges.values()) == sent, gauges
    # Acked through the frontend: every share goes down to nothing.
    got = _drain(subscriber, subscription, 3.0)
    assert sorted(got) == sorted(f"b{i}" for i in range(sent))
    wait_for(lambda: not any(shares().values()), 10, "the backlog acked on both forwarders")
    subscriber.close()


def _routing_show(cluster: LocalCluster) -> dict[str, Any]:
    shown = subprocess.run(
        [sys.executable, "-m", "pubsubd", "routing", "show", "--json", "--cluster", cluster.zk],
        check=True,
        capture_output=True,
        timeout=60,
        text=True,
    )
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


def _whole(shown: dict[str, Any], subscription: str) -> dict[str, Any] | None:
    found = [s for s in shown["subscriptions"] if s["subscription"] == subscription]
    return found[0] if found else None


def test_routing_show_and_the_router_give_a_spread_subscription_s_whole_backlog(
    cluster: LocalCluster, names: Any
) -> None:
    """One place shows a spread subscription whole (core/backlog_view.py): ``pubsubd routing
    show``, the dashboard and the leading router's /status add up the shares the forwarders'
    load reports carry: the whole is published minus acked, each share is what that
    forwarder's /status says, with the sources it serves. The forwarders report with the
    router's half-life."""
    endpoint = cluster.grpc
    publisher = make_publisher(
        endpoint, publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    subscriber = make_subscriber(endpoint)
    topic, subscription = names.topic("spread-whole"), names.subscription("spread-whole")
    _topic(publisher, topic)
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    wait_for(lambda: _spread_over_both(cluster, subscription), 30, "the sources spread")
    sent = 160
    for f in [
        publisher.publish(topic, f"w{i}".encode(), ordering_key=f"k{i % 32}") for i in range(sent)
    ]:
        f.result(timeout=60)
    acked = len(_pull_all(subscriber, subscription, 60))  # each acked once pulled
    expected = sent - acked
    assert 60 <= acked < sent

    def settled() -> dict[str, Any] | None:
        whole = _whole(_routing_show(cluster), subscription)
        if whole is None or whole["backlog_messages"] != expected:
            time.sleep(0.5)  # a report every 5 s
            return None
        return whole

    wait_for(settled, 30, f"routing show: a whole backlog of {expected}")
    shown = _routing_show(cluster)
    whole = _whole(shown, subscription)
    assert whole is not None
    statuses = {n: _status(cluster, n)["subscriptions"][subscription] for n in SUBSCRIBING}
    print(
        f"published {sent}, acked {acked}; whole {whole['backlog_messages']} = "
        + " + ".join(f"{f}: {s['backlog_messages']}" for f, s in whole["forwarders"].items())
    )
    ids = {n: _status(cluster, n)["cluster"]["forwarder"]["id"] for n in SUBSCRIBING}
    assert set(whole["forwarders"]) == set(ids.values())
    for name, forwarder_id in ids.items():
        share = whole["forwarders"][forwarder_id]
        assert share["backlog_messages"] == statuses[name]["backlog"], (name, share)
        assert share["sources"] == _served_sources(cluster, name, subscription)
    assert sum(s["backlog_messages"] for s in whole["forwarders"].values()) == expected
    assert whole["spread"] and whole["complete"], whole
    # pubsubd cluster status shows the same whole (the same code, control/cluster_view.py).
    described = subprocess.run(
        [sys.executable, "-m", "pubsubd", "cluster", "status", "--json",
         "--data-dir", str(cluster.directory)],
        check=True, capture_output=True, timeout=60, text=True,
    )  # fmt: skip
    in_status = _whole(json.loads(described.stdout)["storage"]["routing"], subscription)
    assert in_status is not None and in_status["spread"] and in_status["complete"], in_status
    assert {
        f: (s["sources"], s["backlog_messages"]) for f, s in in_status["forwarders"].items()
    } == {f: (s["sources"], s["backlog_messages"]) for f, s in whole["forwarders"].items()}

    # The leading router shows the same whole (from the same reports, as of its last pass).
    def router_whole() -> dict[str, Any]:
        listed = _status(cluster, "router-1")["subscription_backlogs"]["subscriptions"]
        return listed.get(subscription) or {}  # type: ignore[no-any-return]

    wait_for(lambda: router_whole().get("backlog_messages") == expected, 10, "the router's pass")
    assert {
        f: (s["sources"], s["backlog_messages"]) for f, s in router_whole()["forwarders"].items()
    } == {f: (s["sources"], s["backlog_messages"]) for f, s in whole["forwarders"].items()}
    router = _status(cluster, "router-1")
    # And a forwarder's dashboard (/api/cluster, the /ui/cluster page in headless Chromium).
    browser.require()
    dashboard = _http(cluster, SUBSCRIBING[0])
    on_page = browser.read(browser.dump_dom(f"{dashboard}/ui/cluster")).rows["backlogs"]
    with urllib.request.urlopen(f"{dashboard}/api/cluster", timeout=15) as r:
        api = _whole(json.loads(r.read())["routing"], subscription)
    assert api is not None and api["backlog_messages"] == expected, api
    assert on_page[subscription]["backlog_messages"] == str(expected), on_page
    assert on_page[subscription]["spread"] == "yes", on_page
    # The router's half-life, published with its pass, is what the forwarders report with.
    assert router["load_half_life_s"] == shown["router"]["load_half_life_s"] == HALF_LIFE_S
    for name in SUBSCRIBING:
        assert _status(cluster, name)["cluster"]["load_report"]["half_life_s"] == HALF_LIFE_S
    # Everything acked: the whole goes to nothing (a spread subscription stays listed).
    rest = _drain(subscriber, subscription, 3.0)
    assert len(rest) == expected
    wait_for(
        lambda: (_whole(_routing_show(cluster), subscription) or {}).get("backlog_messages") == 0,
        30,
        "routing show: nothing left",
    )
    subscriber.close()


def _drain(subscriber: Any, subscription: str, seconds: float) -> list[str]:
    """Whatever else comes within ``seconds`` (Pull with return_immediately, acked)."""
    got: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with warnings.catch_warnings():  # the client frowns on return_immediately
            warnings.simplefilter("ignore", DeprecationWarning)
            response = subscriber.pull(
                request={
                    "subscription": subscription,
                    "max_messages": 50,
                    "return_immediately": True,
                },
                timeout=10,
            )
        if not response.received_messages:
            time.sleep(0.2)
            continue
        got.extend(m.message.data.decode() for m in response.received_messages)
        subscriber.acknowledge(
            request={
                "subscription": subscription,
                "ack_ids": [m.ack_id for m in response.received_messages],
            }
        )
    return got


def test_a_snapshot_of_a_spread_subscription_has_the_acks_of_every_forwarder(
    cluster: LocalCluster, names: Any
) -> None:
    """CreateSnapshot is answered by one of the subscription's forwarders; it reads the
    positions of the sources the other one serves from that one (data/subscribe/
    leg_cursors.py), so a Seek to the snapshot redelivers nothing acknowledged before it, on
    either forwarder's sources, and everything published after it."""
    endpoint = cluster.grpc
    publisher = make_publisher(
        endpoint, publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    subscriber = make_subscriber(endpoint)
    topic, subscription = names.topic("spread-snap"), names.subscription("spread-snap")
    snapshot = subscription.replace("/subscriptions/", "/snapshots/")
    _topic(publisher, topic)
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    wait_for(lambda: _spread_over_both(cluster, subscription), 30, "the sources spread")

    def publish(prefix: str, count: int) -> list[str]:
        sent = [f"{prefix}{i}" for i in range(count)]
        for f in [
            publisher.publish(topic, data.encode(), ordering_key=f"k{i % 32}")
            for i, data in enumerate(sent)
        ]:
            f.result(timeout=60)
        return sent

    before = publish("before-", 200)
    assert sorted(_pull_all(subscriber, subscription, len(before))) == sorted(before)
    statuses = {n: _status(cluster, n)["subscriptions"][subscription] for n in SUBSCRIBING}
    assert all(s["acked"] > 0 for s in statuses.values()), statuses  # acks on both
    subscriber.create_snapshot(request={"name": snapshot, "subscription": subscription})
    after = publish("after-", 100)
    subscriber.seek(request={"subscription": subscription, "snapshot": snapshot})
    again = _pull_all(subscriber, subscription, len(after))
    again += _drain(subscriber, subscription, 2.0)
    redelivered = sorted(set(again) & set(before))
    assert not redelivered, f"{len(redelivered)} acked before the snapshot came again"
    assert sorted(again) == sorted(after)
    subscriber.delete_snapshot(request={"snapshot": snapshot})
    subscriber.close()


def test_a_window_moving_stream_leases_its_window_once_over_both_forwarders(
    cluster: LocalCluster, names: Any
) -> None:
    """A stream that moves its message window on later requests (as the Pulsar front does)
    has it split over the legs (frontend/leg_windows.py): it holds about the window, not the
    window on each leg (before: 2 x 10 = 20 held)."""
    endpoint = cluster.grpc
    # Keyed, so the messages go to every source (an unkeyed batch is one source's entry, and
    # every batch may land on one forwarder's half).
    publisher = make_publisher(
        endpoint, publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    subscriber = make_subscriber(endpoint)
    topic, subscription = names.topic("spread-window"), names.subscription("spread-window")
    _topic(publisher, topic)
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    subscriber.close()
    wait_for(lambda: _spread_over_both(cluster, subscription), 30, "the sources spread")
    for f in [publisher.publish(topic, b"w", ordering_key=f"k{i % 32}") for i in range(200)]:
        f.result(timeout=60)  # spread over the 8 sources
    requests: queue.Queue[Any] = queue.Queue()
    requests.put(
        pb.StreamingPullRequest(
            subscription=subscription, stream_ack_deadline_seconds=60, max_outstanding_messages=1
        )
    )
    channel = grpc.insecure_channel(endpoint)
    call = channel.stream_stream(
        "/google.pubsub.v1.Subscriber/StreamingPull",
        request_serializer=pb.StreamingPullRequest.SerializeToString,
        response_deserializer=pb.StreamingPullResponse.FromString,
    )(iter(requests.get, None))
    held: list[str] = []
    lock = threading.Lock()

    def read() -> None:
        with contextlib.suppress(grpc.RpcError):
            for response in call:
                with lock:
                    held.extend(m.ack_id for m in response.received_messages)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(held) >= 1, 30, "the first message")
        time.sleep(1.0)
        requests.put(pb.StreamingPullRequest(max_outstanding_messages=10))
        wait_for(lambda: len(held) >= 10, 30, "the window filled")
        time.sleep(2.0)  # anything over the window would come now
        # 10, plus at most one a leg delivered under the first window (1 each) and one a
        # leg may be over (each leg's window is at least 1).
        assert 10 <= len(held) <= 13, f"{len(held)} held for a window of 10"
        with lock:
            acked, held[:] = list(held), []
        requests.put(pb.StreamingPullRequest(ack_ids=acked, max_outstanding_messages=10))
        wait_for(lambda: len(held) >= 10, 30, "the window filled again")
        time.sleep(2.0)
        assert len(held) <= 13, f"{len(held)} held for a window of 10 after acks"
    finally:
        requests.put(None)
        call.cancel()
        reader.join(timeout=10)
        channel.close()


def test_a_pulsar_partition_consumer_opens_only_the_leg_serving_its_partition(
    cluster: LocalCluster, names: Any
) -> None:
    """Through the frontend's Pulsar port, a consumer of an 8-source topic is 8 partition
    consumers, each a stream asking for its source: each is opened on the one forwarder
    serving that source (before: on both, the other taking nothing), and every message
    arrives once."""
    endpoint = cluster.grpc
    publisher, subscriber = make_publisher(endpoint), make_subscriber(endpoint)
    topic = names.topic("spread-pulsar")
    topic_id = topic.rsplit("/", 1)[1]
    _topic(publisher, topic)
    # The Pulsar name of subscription "p" of this topic (pulsar/names.py).
    pulsar_subscription = f"{topic.split('/topics/')[0]}/subscriptions/{topic_id}.p"
    subscriber.create_subscription(request={"name": pulsar_subscription, "topic": topic})
    subscriber.close()
    wait_for(lambda: _spread_over_both(cluster, pulsar_subscription), 30, "the sources spread")
    frontend = cluster.process("frontend-1")
    port = frontend.args[frontend.args.index("--pulsar-port") + 1]
    client = pulsar.Client(
        f"pulsar://127.0.0.1:{port}",
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error),
    )
    try:
        project = topic.split("/")[1]
        consumer = client.subscribe(
            f"persistent://{project}/default/{topic_id}",
            "p",
            consumer_type=pulsar.ConsumerType.Shared,
        )
        sent = [f"m{i}".encode() for i in range(80)]
        for f in [publisher.publish(topic, data) for data in sent]:
            f.result(timeout=60)
        got = []
        while len(got) < len(sent):
            msg = consumer.receive(30_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
        with contextlib.suppress(pulsar.Timeout):
            got.append(consumer.receive(1000).data())  # a duplicate would come now
        assert sorted(got) == sorted(sent)
        consumers = {
            name: _status(cluster, name)["subscriptions"][pulsar_subscription]["consumers"]
            for name in SUBSCRIBING
        }
        served = {
            name: len(_served_sources(cluster, name, pulsar_subscription)) for name in SUBSCRIBING
        }
        # One stream per partition it serves, none for the other's (before: 8 on each).
        assert consumers == served and sum(consumers.values()) == SOURCES, (consumers, served)
        consumer.close()
    finally:
        client.close()


# Last: the kill leaves the survivor holding every unit moved at the kill, and those stay
# within the router's hysteresis window, so a subscription made after it may not spread.
def test_a_killed_forwarder_s_sources_go_to_the_other_and_nothing_acked_is_lost(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = cluster.grpc
    publisher, subscriber = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic("spread-kill"), names.subscription("spread-kill")
    _topic(publisher, topic)
    subscriber.create_subscription(name=subscription, topic=topic)
    subscriber.close()
    wait_for(lambda: _spread_over_both(cluster, subscription), 30, "the sources spread")
    receiver = Receiver(endpoint, subscription)
    flood = Flood(endpoint, topic, rate=300).start()
    victim, survivor = SUBSCRIBING
    try:
        wait_for(lambda: receiver.count() >= 200, 60, "delivery under way")
        cluster.kill(victim)
        started = time.monotonic()
        wait_for(
            lambda: _served_sources(cluster, survivor, subscription) == list(range(SOURCES)),
            30,
            "the survivor serves every source",
        )
        print(f"kill -9 -> the survivor serves every source: {time.monotonic() - started:.2f} s")
        # The whole backlog is the survivor's alone, complete (the victim's report outlives it
        # until its session expires; it stops counting once the router deleted its
        # registration: ~4 s after the kill here, ~12 s if it counted until the expiry).
        survivor_id = _status(cluster, survivor)["cluster"]["forwarder"]["id"]

        def survivor_alone() -> bool:
            whole = _whole(_routing_show(cluster), subscription) or {}
            return set(whole.get("forwarders", ())) == {survivor_id} and whole["complete"]

        wait_for(survivor_alone, 20, "routing show: the whole on the survivor alone")
        print(f"kill -9 -> routing show whole on the survivor: {time.monotonic() - started:.2f} s")
        before = receiver.count()
        wait_for(lambda: receiver.count() >= before + 300, 60, "delivery goes on after")
    finally:
        flood.stop()
    acked, sent = flood.snapshot(), flood.sent
    try:
        wait_for(lambda: receiver.has(acked), 90, "every acknowledged message delivered")
    finally:
        receiver.close()
        cluster.restart(victim)
    assert not flood.errors, f"publishes that failed for good: {dict(flood.errors)}"
    assert not receiver.received - sent, "messages nobody published"
    print(f"{len(acked)} acknowledged publishes, every one delivered")


QUOTA = 20  # the backlog quotas, in messages
QUOTA_LABEL = "pubsubd-backlog-quota-messages"


def _blocks_at_the_quota(
    endpoint: str, topic: str, subscription: str, when_blocked: Callable[[], None] = lambda: None
) -> float:
    """Publish one message at a time (keyed over 16 keys, so over the sources; no client
    retry) until refused: exactly ``QUOTA`` accepted, the next refused with RESOURCE_EXHAUSTED
    naming the subscription and the quota, as in the one-process server; then pull and ack
    them all: publishing is accepted again, exactly ``QUOTA`` more. ``when_blocked`` checks
    what it likes while the first ``QUOTA`` are unacked. Returns how long after the last ack
    publishing was accepted again."""
    gapic = gapic_publisher(endpoint)
    subscriber = make_subscriber(endpoint)
    refusals: list[str] = []
    sent = 0

    def publish() -> bool:
        nonlocal sent
        message = {"data": f"m{sent}".encode(), "ordering_key": f"k{sent % 16}"}
        try:
            gapic.publish(request={"topic": topic, "messages": [message]}, retry=None, timeout=10)
        except exceptions.ResourceExhausted as e:
            refusals.append(str(e))
            return False
        sent += 1
        return True

    def accepted_until_refused() -> int:
        count = 0
        while count <= 2 * QUOTA and publish():
            count += 1
        return count

    assert accepted_until_refused() == QUOTA
    assert subscription in refusals[-1] and QUOTA_LABEL in refusals[-1]
    when_blocked()
    got = _pull_all(subscriber, subscription, QUOTA)
    assert len(got) == QUOTA
    acked_at = time.monotonic()
    while not publish():  # the acks reach the topic's owner within their ack flush
        assert time.monotonic() - acked_at < 10, "still blocked 10 s after every ack"
        time.sleep(0.02)
    unblocked_after = time.monotonic() - acked_at
    # the whole backlog again (the publish that found it unblocked is one), no more, no less
    assert accepted_until_refused() == QUOTA - 1
    subscriber.close()
    return unblocked_after


def test_a_topic_quota_blocks_a_spread_subscription_at_its_whole_backlog(
    cluster: LocalCluster, names: Any
) -> None:
    """A topic's ``block_publishers`` quota is evaluated at the topic's owner over every
    source (data/publish/owner_quotas.py): a subscription spread over both subscribing
    forwarders blocks publishers at the same backlog as in the one-process server. Each
    forwarder alone knows its own sources only (the others' as of its attach): counted there,
    publishing stayed blocked after the acks, or was blocked again after a few."""
    endpoint = cluster.grpc
    admin, subscriber = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic("spread-quota"), names.subscription("spread-quota")
    labels = {"pubsubd-publish-sources": str(SOURCES), QUOTA_LABEL: str(QUOTA)}
    admin.create_topic(request={"name": topic, "labels": labels})
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    wait_for(lambda: _spread_over_both(cluster, subscription), 30, "the sources spread")

    def split_over_both() -> None:
        served = [_status(cluster, n)["subscriptions"][subscription] for n in SUBSCRIBING]
        backlogs = [int(s["backlog"]) for s in served]
        assert sum(backlogs) == QUOTA and all(backlogs), f"both hold some: {backlogs}"

    after = _blocks_at_the_quota(endpoint, topic, subscription, split_over_both)
    print(f"spread, topic quota: accepted again {after * 1000:.0f} ms after the last ack")


def test_a_subscription_s_own_quota_blocks_at_its_backlog_from_a_forwarder_apart(
    cluster: LocalCluster, names: Any
) -> None:
    """A subscription with a quota of its own is never spread: it is served whole by a
    subscribing forwarder apart from its topic's owner, and the owner evaluates the quota
    (the dispatcher's block reached the owner up to an ack flush after the commit, so one
    publish more got through)."""
    endpoint = cluster.grpc
    admin, subscriber = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic("own-quota"), names.subscription("own-quota")
    admin.create_topic(request={"name": topic, "labels": {"pubsubd-publish-sources": "4"}})
    subscriber.create_subscription(
        request={"name": subscription, "topic": topic, "labels": {QUOTA_LABEL: str(QUOTA)}}
    )
    wait_for(
        lambda: any(subscription in _status(cluster, n)["subscriptions"] for n in SUBSCRIBING),
        30,
        "the subscription served",
    )
    assert not any(_served_sources(cluster, n, subscription) for n in SUBSCRIBING)  # whole
    after = _blocks_at_the_quota(endpoint, topic, subscription)
    print(f"whole, own quota: accepted again {after * 1000:.0f} ms after the last ack")


def test_a_topic_evict_oldest_quota_evicts_nothing_under_the_whole_backlog(
    cluster: LocalCluster, names: Any
) -> None:
    """A topic with an evict_oldest quota of 20 over 8 sources (the router spreads every
    spreadable subscription here): 16 published and all acked, then 16 more. The whole
    backlog (16) is under the quota, so after three quota checks all 16 are delivered. The
    subscription is served whole by one subscribing forwarder (control/routing_views.py
    ``spreadable``), whose dispatcher sees every ack. Spread, each forwarder counted the other
    forwarders' sources as of its attach (their later acks never reach it), so each thought
    the backlog over 20 and evicted its own sources' messages: some of the 16 were lost."""
    endpoint = cluster.grpc
    admin, subscriber = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic("evicting"), names.subscription("evicting")
    labels = {
        "pubsubd-publish-sources": str(SOURCES),
        QUOTA_LABEL: str(QUOTA),
        "pubsubd-backlog-policy": "evict_oldest",
    }
    admin.create_topic(request={"name": topic, "labels": labels})
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    wait_for(
        lambda: any(subscription in _status(cluster, n)["subscriptions"] for n in SUBSCRIBING),
        30,
        "the subscription served",
    )
    time.sleep(2.0)  # the router's next passes: placed as it stays
    gapic = gapic_publisher(endpoint)

    def publish(prefix: str) -> None:
        for i in range(16):  # keyed over 16 keys: over the sources
            message = {"data": f"{prefix}-{i}".encode(), "ordering_key": f"k{i}"}
            gapic.publish(request={"topic": topic, "messages": [message]}, timeout=10)

    publish("first")
    assert len(_pull_all(subscriber, subscription, 16)) == 16
    time.sleep(1.0)  # the acks flushed
    publish("second")
    time.sleep(3.5)  # three quota checks (PUBSUBD_QUOTA_CHECK_S, 1 s)
    got = _pull_all(subscriber, subscription, 16)
    assert sorted(got) == sorted(f"second-{i}" for i in range(16)), f"{16 - len(got)} evicted"
    assert not any(_served_sources(cluster, n, subscription) for n in SUBSCRIBING)  # whole
    subscriber.close()
