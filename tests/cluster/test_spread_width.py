"""The spread width chosen by load (issue 11, part 5): a heavier subscription is spread over
more subscribing forwarders than a lighter one, while the official clients publish and stream
through a frontend, and every acknowledged publish is still delivered.

One publishing-only and three subscribing-only forwarders, one router run with
``--spread-subscriptions`` and small settings (one subscribing forwarder delivers 100 msg/s, a
subscription over half of that for 2 s spreads, load EWMAs with a 2 s half-life reported every
second). Two topics of 6 sources, each with one subscription: ~60 msg/s for the light one needs
two forwarders to keep each share under 50 msg/s (and fits in two under the gather share:
it stays at two), ~200 msg/s for the heavy one would need four, and three are all there are
(``core/subscription_spread.py``: the width; ``control/routing_table.py``: three heads, source
j following head j mod 3). Checked: the router publishes widths 3 and 2, that many forwarders
serve each subscription's sources, every acknowledged publish is delivered, nothing
unexpected arrives, and each key's first deliveries come in publish order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from pubsubd.cluster.launcher import LocalCluster
from tests.cluster.test_spread_subscription import _served_sources, _status
from tests.conftest import make_publisher, make_subscriber
from tests.support.cluster import spread_cluster, subscription_uid
from tests.support.flood import KeyedFlood, OrderedReceiver
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUBSCRIBING = ["forwarder-2", "forwarder-3", "forwarder-4"]
SOURCES = 6
KEYS = [f"key-{k}" for k in range(4)]
SOURCES_LABEL = "pubsubd-publish-sources"
# Messages a round: one per key and the unkeyed ones; rounds a second.
HEAVY = {"unkeyed": 6, "rounds_per_s": 20}  # ~200 msg/s
LIGHT = {"unkeyed": 2, "rounds_per_s": 10}  # ~60 msg/s


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    env = {"PUBSUBD_LOAD_REPORT_S": "1"}
    router_args = [
        *("--spread-subscriptions", "--spread-capacity", "100"),
        *("--spread-after", "2", "--gather-after", "600", "--load-half-life", "2"),
    ]
    directory = tmp_path_factory.mktemp("spread-width")
    with spread_cluster(directory, env, router_args, subscribing=3) as c:
        yield c


def test_a_heavier_subscription_is_spread_over_more_forwarders_losing_nothing(
    cluster: LocalCluster, names: Any
) -> None:
    endpoint = cluster.grpc
    admin, subscriber = make_publisher(endpoint), make_subscriber(endpoint)
    subscriptions: dict[str, str] = {}
    for kind in ("heavy", "light"):
        topic, subscription = names.topic(f"width-{kind}"), names.subscription(f"width-{kind}")
        admin.create_topic(request={"name": topic, "labels": {SOURCES_LABEL: str(SOURCES)}})
        subscriber.create_subscription(
            request={"name": subscription, "topic": topic, "enable_message_ordering": True}
        )
        subscriptions[kind] = subscription
    subscriber.close()
    uids = {kind: subscription_uid(cluster, name) for kind, name in subscriptions.items()}
    receivers = {kind: OrderedReceiver(endpoint, name) for kind, name in subscriptions.items()}
    floods = {
        kind: KeyedFlood(
            endpoint,
            names.topic(f"width-{kind}"),
            keys=KEYS,
            batch_messages=10,
            rounds=20_000,
            **settings,  # type: ignore[arg-type]
        ).start()
        for kind, settings in (("heavy", HEAVY), ("light", LIGHT))
    }
    started = time.monotonic()
    acked: dict[str, set[bytes]] = {}
    try:
        wanted = {uids["heavy"]: 3, uids["light"]: 2}

        def widths() -> bool:
            return dict(_status(cluster, "router-1")["spread_widths"]) == wanted

        wait_for(widths, 40, "the heavy subscription spread over 3 forwarders, the light over 2")
        spread_after = time.monotonic() - started

        def serving(kind: str) -> list[str]:
            return [n for n in SUBSCRIBING if _served_sources(cluster, n, subscriptions[kind])]

        def served_as_wide() -> bool:
            owned = {
                kind: sorted(s for n in SUBSCRIBING for s in _served_sources(cluster, n, name))
                for kind, name in subscriptions.items()
            }
            every = list(range(SOURCES))
            return (
                owned == {"heavy": every, "light": every}
                and len(serving("heavy")) == 3
                and len(serving("light")) == 2
            )

        wait_for(served_as_wide, 30, "the forwarders serving as wide as published")
        time.sleep(3)  # a few more passes under the same load: the widths hold
        assert dict(_status(cluster, "router-1")["spread_widths"]) == wanted
    finally:
        for kind, flood in floods.items():
            acked[kind] = flood.stop()
    try:
        for kind, receiver in receivers.items():
            wait_for(lambda r=receiver, k=kind: r.has(acked[k]), 60, f"every {kind} message")
    finally:
        for receiver in receivers.values():
            receiver.close()
    report = []
    for kind, receiver in receivers.items():
        flood = floods[kind]
        duplicates = sum(c - 1 for c in receiver.received.values() if c > 1)
        report.append(f"{kind}: {len(acked[kind])} acknowledged, {duplicates} redelivered")
        assert not flood.errors, f"{kind}: publishes that failed for good: {dict(flood.errors)}"
        assert not set(receiver.received) - flood.sent, f"{kind}: messages nobody published"
        out_of_order = [d for d in receiver.out_of_order if not d.startswith("u:")]
        assert not out_of_order, f"{kind}: keys out of order: {out_of_order[:10]}"
    print(
        f"widths 3 and 2 published {spread_after:.1f} s after the floods started; "
        + "; ".join(report)
    )
