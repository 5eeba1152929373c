"""Receive a subscription through the official subscribe() until every expected payload came
(crash tests: "every acknowledged publish is delivered after the restart")."""

from __future__ import annotations

import threading

from google.cloud import pubsub_v1

from tests.conftest import make_subscriber
from tests.support.server import wait_for


def drain(
    endpoint: str, subscription: str, expected: set[bytes], timeout: float = 60.0
) -> set[bytes]:
    """Ack everything received until ``expected`` is covered; return every payload received.
    On a connection of its own: after a restart, not the process's shared one in backoff."""
    sub = make_subscriber(endpoint, fresh_connection=True)
    received: set[bytes] = set()
    lock = threading.Lock()

    def callback(message: pubsub_v1.subscriber.message.Message) -> None:
        with lock:
            received.add(message.data)
        message.ack()

    # A 10 s stream lease: a message handed to a stream the client abandons (the client may
    # reopen its stream while the server restarts) is redelivered within the wait below.
    flow = pubsub_v1.types.FlowControl(max_messages=2000, max_duration_per_lease_extension=10)
    future = sub.subscribe(subscription, callback, flow_control=flow)
    try:
        wait_for(lambda: expected <= received, timeout, "every acknowledged publish delivered")
    finally:
        future.cancel()
        sub.close()
    return received
