"""Source growth and spreading by load together (issue 11, part 5): a flooded topic gets more
publish message sources by itself and its subscription, busy, is spread over both subscribing
forwarders by itself, while the official clients publish and stream through a frontend.

One publishing-only and two subscribing-only forwarders, one router run with
``--spread-subscriptions`` (spreading by load, ``core/subscription_spread.py``) and small
settings so that it all happens in seconds: a source takes 100 msg/s (source growth,
``core/source_growth.py``, grows after 1 s over), one subscribing forwarder delivers 200 msg/s
(a subscription over half of it for 2 s spreads), forwarders report their load every second.
The topic starts with two sources (both take ordering keys); a flood of ~400 msg/s, keyed and
unkeyed, makes it grow (unkeyed messages go to the new sources) and its subscription spread.
Checked: every acknowledged publish is delivered, nothing unexpected arrives, each key's first
deliveries come in publish order, and both subscribing forwarders deliver once it is spread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.cloud import pubsub_v1

from pubsubd.cluster.launcher import LocalCluster
from tests.cluster.test_spread_subscription import _delivered, _served_sources, _status
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import spread_cluster
from tests.support.flood import KeyedFlood, OrderedReceiver
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUBSCRIBING = ["forwarder-2", "forwarder-3"]
KEYS = [f"key-{k}" for k in range(8)]
UNKEYED_PER_ROUND = 12  # with one message per key: 20 messages a round
ROUNDS_PER_S = 20  # ~400 msg/s
SOURCES_LABEL = "pubsubd-publish-sources"
ACTIVE_LABEL = "pubsubd-active-publish-sources"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    growth = {
        "PUBSUBD_SOURCE_CAPACITY": "100",
        "PUBSUBD_SOURCE_GROW_AFTER_S": "1",
        "PUBSUBD_SOURCE_SAMPLE_S": "0.5",
        "PUBSUBD_LOAD_REPORT_S": "1",
    }
    router_args = [
        *("--spread-subscriptions", "--spread-capacity", "200"),
        *("--spread-after", "2", "--gather-after", "600"),
    ]
    with spread_cluster(tmp_path_factory.mktemp("spread-by-load"), growth, router_args) as c:
        yield c


def _labels(publisher: pubsub_v1.PublisherClient, topic: str) -> dict[str, str]:
    return dict(publisher.get_topic(request={"topic": topic}).labels)


def test_a_flooded_topic_grows_and_its_subscription_spreads_losing_nothing(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = cluster.grpc
    admin, subscriber = make_publisher(endpoint), make_subscriber(endpoint)
    topic, subscription = names.topic("grow-spread"), names.subscription("grow-spread")
    admin.create_topic(request={"name": topic, "labels": {SOURCES_LABEL: "2"}})
    subscriber.create_subscription(
        request={"name": subscription, "topic": topic, "enable_message_ordering": True}
    )
    subscriber.close()
    # Quiet: served whole by one subscribing forwarder, spread nowhere.
    wait_for(
        lambda: any(subscription in _status(cluster, n)["subscriptions"] for n in SUBSCRIBING),
        30,
        "the subscription served",
    )
    assert not any(_served_sources(cluster, n, subscription) for n in SUBSCRIBING)
    assert _status(cluster, "router-1")["spread"] == []
    receiver = OrderedReceiver(endpoint, subscription)
    flood = KeyedFlood(
        endpoint,
        topic,
        keys=KEYS,
        rounds_per_s=ROUNDS_PER_S,
        unkeyed=UNKEYED_PER_ROUND,
        batch_messages=20,
        rounds=20_000,
    ).start()
    started = time.monotonic()
    grown_after = spread_after = 0.0
    try:
        wait_for(lambda: int(_labels(admin, topic).get(ACTIVE_LABEL, "2")) > 2, 30, "growth")
        grown_after = time.monotonic() - started

        def spread_over_both() -> bool:
            served = [_served_sources(cluster, n, subscription) for n in SUBSCRIBING]
            sources = int(_labels(admin, topic)[SOURCES_LABEL])
            return all(served) and sorted(served[0] + served[1]) == list(range(sources))

        wait_for(spread_over_both, 30, "the subscription spread over both forwarders")
        spread_after = time.monotonic() - started
        before = {n: _delivered(cluster, n, subscription) for n in SUBSCRIBING}
        wait_for(
            lambda: all(_delivered(cluster, n, subscription) > before[n] for n in SUBSCRIBING),
            30,
            "both forwarders delivering",
        )
    finally:
        acked = flood.stop()
    labels = _labels(admin, topic)
    assert len(_status(cluster, "router-1")["spread"]) == 1
    try:
        wait_for(lambda: receiver.has(acked), 60, "every acknowledged message delivered")
    finally:
        receiver.close()
    duplicates = sum(c - 1 for c in receiver.received.values() if c > 1)
    print(
        f"grown to {labels[ACTIVE_LABEL]} active sources after {grown_after:.1f} s, spread "
        f"over both subscribing forwarders after {spread_after:.1f} s; {len(acked)} acknowledged "
        f"publishes, every one delivered; {duplicates} redelivered"
    )
    assert not flood.errors, f"publishes that failed for good: {dict(flood.errors)}"
    assert not set(receiver.received) - flood.sent, "messages nobody published"
    # The receiver reads ``u`` as one more key: unkeyed messages have no order to keep.
    out_of_order = [d for d in receiver.out_of_order if not d.startswith("u:")]
    assert not out_of_order, f"keys out of order: {out_of_order[:10]}"
    keyed = [d for d in acked if not d.startswith(b"u:")]
    assert len(keyed) > 100 and len(acked) - len(keyed) > 100  # both kinds went through
