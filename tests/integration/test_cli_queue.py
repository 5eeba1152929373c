"""The CLI's options for delivery and queue features map onto the API fields and labels."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import make_subscriber
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration


def _cli(server: ServerProcess, *args: str) -> Any:
    env = dict(os.environ, PUBSUB_EMULATOR_HOST=server.endpoint, PUBSUB_PROJECT_ID="cli")
    out = subprocess.run(
        [sys.executable, "-m", "pubsubd", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_cli_creates_queue_subscriptions_and_delayed_messages(
    shared_server: ServerProcess,
) -> None:
    created = _cli(
        shared_server,
        "topics",
        "create",
        "cli-orders",
        "--backlog-quota-messages",
        "1000",
        "--retention-bytes",
        "1048576",
    )
    assert created[0]["labels"]["pubsubd-retention-bytes"] == "1048576"
    _cli(shared_server, "topics", "create", "cli-dead")
    _cli(
        shared_server,
        "subscriptions",
        "create",
        "cli-worker",
        "--topic",
        "cli-orders",
        "--type",
        "failover",
        "--nack-delay",
        "5",
        "--filter",
        'attributes.kind = "order"',
        "--ordering",
        "--dead-letter-topic",
        "cli-dead",
        "--min-backoff",
        "1",
        "--max-backoff",
        "10",
    )
    sub = make_subscriber(shared_server.endpoint)
    s = sub.get_subscription(subscription="projects/cli/subscriptions/cli-worker")
    assert s.labels["pubsubd-subscription-type"] == "failover"
    assert s.labels["pubsubd-nack-delay-seconds"] == "5"
    assert s.filter == 'attributes.kind = "order"'
    assert s.enable_message_ordering
    assert s.dead_letter_policy.dead_letter_topic == "projects/cli/topics/cli-dead"
    assert s.retry_policy.minimum_backoff.total_seconds() == 1
    _cli(shared_server, "publish", "cli-orders", "soon", "-a", "kind=order", "--deliver-after", "3")
    got: list[Any] = []
    for _ in range(20):
        got = _cli(shared_server, "pull", "cli-worker", "--ack", "--wait")
        if got:
            break
    received = dt.datetime.now(dt.UTC)
    assert [m["data"] for m in got] == ["soon"]
    assert got[0]["attributes"]["pubsubd.deliver_after"] == "3"
    published = dt.datetime.fromisoformat(got[0]["publish_time"])
    assert (received - published).total_seconds() >= 2.9  # not delivered before its time
