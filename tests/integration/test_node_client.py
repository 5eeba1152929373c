"""The official Node client (``@google-cloud/pubsub``, pinned in ``tests/node/package-lock.json``)
against a real ``pubsubd serve`` on an ephemeral loopback port (and each cluster deployment of
``tests/conftest.py``, through its frontend), reached through ``PUBSUB_EMULATOR_HOST``: publish
with batching, subscribe with flow control, ordering keys, nack redelivery (plain, ordered,
dead-lettered) and errors with their gRPC codes. Each test runs one node process
(``tests/node/*.mjs``) that prints its counts as one JSON line; the assertions are here. One
server per deployment serves the whole module (names are unique per test) and must still be up
after each."""

from __future__ import annotations

import json
import math
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import node
from tests.support.cluster import ClusterServer
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

PROJECT = "node-project"

# gRPC status codes as Node code sees them (err.code).
OK, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS = 0, 3, 5, 6


Server = ServerProcess | ClusterServer


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The module's server (``tests/conftest.py``): one process, and each cluster deployment."""
    node.require()
    return shared_server


@pytest.fixture
def suffix() -> str:
    return uuid.uuid4().hex[:10]


def scenario(server: Server, script: str, **args: object) -> dict[str, object]:
    run = node.run_scenario(script, server.endpoint, {"project": PROJECT, **args})
    assert server.alive(), f"pubsubd died during {script}:\n{server.log()}"
    return run.result


def serving_http(server: Server) -> list[str]:
    """HTTP addresses of the processes that serve topics (a cluster's serve or forwarders)."""
    if isinstance(server, ServerProcess):
        return [f"{server.host}:{server.http_port}"]
    return [
        f"127.0.0.1:{p.args[p.args.index('--http-port') + 1]}"
        for p in server.cluster.processes
        if p.role in ("serve", "forwarder")
    ]


def publish_requests(server: Server, topic: str) -> float:
    """Publish RPCs answered OK for ``topic``, from the /metrics of every serving process."""
    total = 0.0
    for address in serving_http(server):
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (
                    sample.name == "pubsubd_topic_publish_requests_total"
                    and sample.labels.get("topic") == topic
                    and sample.labels.get("code") == "OK"
                ):
                    total += sample.value
    return total


def no_tracebacks(server: Server) -> None:
    log = server.log()
    assert "Traceback" not in log, log


def test_node_publish_with_batching_loses_and_duplicates_nothing(
    server: Server, suffix: str
) -> None:
    count, per_batch = 2000, 100
    r = scenario(
        server,
        "publish_batching.mjs",
        topic=f"batching-{suffix}",
        subscription=f"batching-{suffix}",
        count=count,
        max_messages=per_batch,
        max_ms=50,
        receive_timeout_s=30,
        settle_ms=500,
    )
    assert r["publish_failure_count"] == 0, r["publish_failures"]
    assert r["distinct_ids"] == count  # one message ID per message
    assert (r["lost"], r["duplicated"], r["unexpected"]) == (0, 0, 0), r
    assert r["data_mismatches"] == 0
    assert r["subscriber_errors"] == []
    # The client batched: at most `per_batch` messages a request, and far fewer requests than
    # messages (a time-flushed batch may be smaller).
    requests = publish_requests(server, str(r["topic"]))
    assert math.ceil(count / per_batch) <= requests <= count / 10, requests


def test_node_subscriber_flow_control_bounds_outstanding_messages(
    server: Server, suffix: str
) -> None:
    max_messages = 10
    r = scenario(
        server,
        "flow_control.mjs",
        topic=f"flow-{suffix}",
        subscription=f"flow-{suffix}",
        count=120,
        max_messages=max_messages,
        hold_ms=20,
        receive_timeout_s=30,
        settle_ms=300,
    )
    for mode in ("server", "client"):
        counts = r[mode]
        assert isinstance(counts, dict)
        assert counts["errors"] == [], (mode, counts)
        assert (counts["lost"], counts["duplicated"], counts["unexpected"]) == (0, 0, 0), (
            mode,
            counts,
        )
        # Never more in the application's hands than allowed, and the bound was reached (so
        # the messages did overlap: a subscriber taking one at a time would not show it).
        assert counts["max_outstanding"] == max_messages, (mode, counts)


def test_node_ordering_keys_keep_per_key_order(server: Server, suffix: str) -> None:
    keys, per_key = 20, 50
    r = scenario(
        server,
        "ordering.mjs",
        topic=f"ordering-{suffix}",
        subscription=f"ordering-{suffix}",
        sources=4,  # keys spread over four publish message sources
        keys=keys,
        per_key=per_key,
        batch=50,
        max_hold_ms=5,
        receive_timeout_s=30,
        settle_ms=300,
    )
    assert r["errors"] == []
    assert r["keys_seen"] == keys
    assert r["out_of_order"] == 0, r["out_of_order_examples"]
    assert (r["lost"], r["unexpected"], r["redeliveries"]) == (0, 0, 0), r
    assert r["received"] == keys * per_key


def test_node_nack_redelivers_in_order_and_dead_letters(server: Server, suffix: str) -> None:
    keys, per_key, nack_seq = 5, 20, 5
    r = scenario(
        server,
        "nack.mjs",
        topic=f"nack-{suffix}",
        subscription=f"nack-{suffix}",
        keys=keys,
        per_key=per_key,
        nack_seq=nack_seq,
        ack_delay_ms=500,
        receive_timeout_s=30,
        settle_ms=300,
    )
    total = keys * per_key
    assert r["errors"] == []
    plain, ordered, dead = r["plain"], r["ordered"], r["dead_letter"]
    assert isinstance(plain, dict) and isinstance(ordered, dict) and isinstance(dead, dict)
    # Every nacked message came back once and was then acked.
    assert (plain["lost"], plain["unexpected"]) == (0, 0), plain
    assert plain["delivered_twice"] == total, plain
    # Ordered: per key nothing out of order; the nacked message came back followed by every
    # later message of its key, although the application had acked those after the nack.
    assert (ordered["lost"], ordered["unexpected"]) == (0, 0), ordered
    assert ordered["violations"] == 0, ordered["violation_examples"]
    assert ordered["keys_nacked"] == keys
    assert ordered["keys_redelivered_through_last"] == keys, ordered
    # Nothing redelivered beyond that (at most the nacked message and all later ones per key).
    assert total + keys <= ordered["deliveries"] <= total + keys * (per_key - nack_seq), ordered
    # Dead letter: attempts 1..5 seen on each message, then it reached the dead-letter
    # subscription once, with the CloudPubSubDeadLetterSource* attributes.
    assert dead["attempts_1_to_5"] == total, dead["attempts_other_examples"]
    assert (dead["lost"], dead["duplicated"], dead["unexpected"]) == (0, 0, 0), dead
    assert dead["with_source_attributes"] == total


def test_node_errors_surface_grpc_codes_and_server_stays_up(server: Server, suffix: str) -> None:
    r = scenario(server, "errors.mjs", suffix=suffix)
    cases = r["cases"]
    assert isinstance(cases, dict)
    expected = {
        "publish_to_missing_topic": NOT_FOUND,
        "publish_to_invalid_topic_name": INVALID_ARGUMENT,
        "publish_to_too_short_topic_name": INVALID_ARGUMENT,
        "publish_attribute_key_too_long": INVALID_ARGUMENT,
        "publish_too_large": INVALID_ARGUMENT,
        "create_existing_topic": ALREADY_EXISTS,
        "delete_missing_topic": NOT_FOUND,
        "create_subscription_of_missing_topic": NOT_FOUND,
        "create_subscription_ack_deadline_too_long": INVALID_ARGUMENT,
        "create_subscription_bad_filter": INVALID_ARGUMENT,
        "get_missing_subscription": NOT_FOUND,
        "seek_to_missing_snapshot": NOT_FOUND,
        "subscribe_to_missing_subscription": NOT_FOUND,
        "ordered_publish_to_missing_topic": NOT_FOUND,
        "ordered_publish_after_resume": OK,
    }
    assert {k: v["code"] for k, v in cases.items()} == expected, cases
    # The details name what was wrong.
    assert f"missing-{suffix}" in cases["publish_to_missing_topic"]["details"]
    assert "bad topic name!" in cases["publish_to_invalid_topic_name"]["details"]
    assert "ack_deadline_seconds" in cases["create_subscription_ack_deadline_too_long"]["details"]
    after = r["after"]
    assert isinstance(after, dict)
    assert [m["data"] for m in after["received"]] == ["still up"]
    no_tracebacks(server)


def test_node_client_is_the_pinned_one() -> None:
    # The installed client is the one package-lock.json pins (`make test` runs npm ci again
    # when the lock changes).
    node.require()
    lock = json.loads((node.NODE_DIR / "package-lock.json").read_text())
    pinned = lock["packages"]["node_modules/@google-cloud/pubsub"]["version"]
    assert node.client_version() == pinned
