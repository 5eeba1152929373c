"""Push subscriptions (docs/GOOGLE_API.md §4 push_config, §6 ModifyPushConfig, §7.11).

The endpoints are HTTP servers on 127.0.0.1 ephemeral ports started by the tests
(tests/support/push_endpoint.py); nothing leaves the machine.
"""

from __future__ import annotations

import base64
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from tests.conftest import make_publisher, make_subscriber
from tests.support.clients import publish, pull_until
from tests.support.push_endpoint import PushEndpoint, RawEndpoint, dead_port
from tests.support.server import ServerProcess, wait_for
from tests.support.status import status, sub_status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def endpoint() -> Iterator[PushEndpoint]:
    ep = PushEndpoint().start()
    yield ep
    ep.stop()


def _create(sub: pubsub_v1.SubscriberClient, name: str, topic: str, **fields: Any) -> Any:
    return sub.create_subscription(request={"name": name, "topic": topic, **fields})


# --- delivery ---------------------------------------------------------------------------------


def test_push_delivers_wrapped_messages_and_acks_on_2xx(
    shared_server: ServerProcess, clients: Any, names: Any, endpoint: PushEndpoint
) -> None:
    pub, sub = clients
    topic, name = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    created = _create(sub, name, topic, push_config={"push_endpoint": endpoint.url})
    assert created.push_config.push_endpoint == endpoint.url
    assert created.push_config.attributes["x-goog-version"] == "v1"

    ids = publish(pub, topic, b"one", b"two", b"\x00\xffbinary", color="red")
    wait_for(lambda: endpoint.count() >= 3, 10, "3 pushes")
    requests = endpoint.snapshot()
    by_id = {r.json()["message"]["messageId"]: r for r in requests}
    assert set(by_id) == set(ids)
    for message_id, data in zip(ids, [b"one", b"two", b"\x00\xffbinary"], strict=True):
        r = by_id[message_id]
        assert r.path == "/push"
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["subscription"] == name
        assert "deliveryAttempt" not in body
        m = body["message"]
        assert base64.b64decode(m["data"]) == data
        assert m["attributes"] == {"color": "red"}
        assert m["message_id"] == message_id
        assert m["publishTime"] == m["publish_time"]
        assert m["publishTime"].endswith("Z") and m["publishTime"].startswith("20")
        assert "orderingKey" not in m

    # Acknowledged: nothing left, nothing pushed again.
    wait_for(lambda: sub_status(shared_server, name).get("backlog") == 0, 10, "backlog drained")
    entry = sub_status(shared_server, name)
    assert entry["push"]["acked"] == 3 and entry["push"]["failed"] == 0
    time.sleep(1.0)  # a negative check, so a fixed wait: no push comes again
    assert endpoint.count() == 3


def test_push_many_messages_concurrently(
    shared_server: ServerProcess, clients: Any, names: Any, endpoint: PushEndpoint
) -> None:
    pub, sub = clients
    topic, name = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    _create(sub, name, topic, push_config={"push_endpoint": endpoint.url})
    datas = [f"m{i}".encode() for i in range(300)]
    publish(pub, topic, *datas)
    try:
        wait_for(lambda: endpoint.count() >= 300, 30, "300 pushes")
    except AssertionError as e:  # what the pusher was doing (it failed once in CI, cluster)
        status = sub_status(shared_server, name)
        raise AssertionError(
            f"{e}: {endpoint.count()} pushed; backlog {status['backlog']}, push {status['push']}"
        ) from None
    assert sorted(endpoint.acked_data()) == sorted(datas)
    wait_for(lambda: sub_status(shared_server, name).get("backlog") == 0, 10, "backlog drained")
    assert sub_status(shared_server, name)["push"]["window"] > 4  # it grew


def test_failing_endpoint_gets_the_message_again_with_growing_gaps(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    failures = 5
    ep = PushEndpoint(lambda n: 500 if n < failures else 200).start()
    try:
        pub, sub = clients
        topic, name = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        _create(sub, name, topic, push_config={"push_endpoint": ep.url})
        publish(pub, topic, b"retry me")
        wait_for(lambda: ep.count() >= failures + 1, 30, "the push to succeed")
        requests = ep.snapshot()
        assert [r.status for r in requests[: failures + 1]] == [500] * failures + [200]
        assert {r.data() for r in requests} == {b"retry me"}
        gaps = [b.at - a.at for a, b in itertools.pairwise(requests)]
        # Exponential backoff from 100 ms: 0.1, 0.2, 0.4, 0.8, 1.6 s.
        for i, gap in enumerate(gaps[:failures]):
            assert gap >= 0.1 * 2**i * 0.9, gaps
        assert gaps[failures - 1] > 4 * gaps[0], gaps
        wait_for(lambda: sub_status(shared_server, name).get("backlog") == 0, 10, "acked")
        time.sleep(0.5)  # a negative check, so a fixed wait
        assert ep.count() == failures + 1  # acked: not pushed again
    finally:
        ep.stop()


def test_delivery_attempt_with_dead_letter_policy(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    ep = PushEndpoint(lambda n: 503 if n < 2 else 204).start()
    try:
        pub, sub = clients
        topic, dlq, name = names.topic(), names.topic("dlq"), names.subscription()
        pub.create_topic(name=topic)
        pub.create_topic(name=dlq)
        _create(
            sub,
            name,
            topic,
            push_config={"push_endpoint": ep.url},
            dead_letter_policy={"dead_letter_topic": dlq, "max_delivery_attempts": 10},
        )
        publish(pub, topic, b"counted")
        wait_for(lambda: ep.count() >= 3, 20, "3 pushes")
        attempts = [r.json()["deliveryAttempt"] for r in ep.snapshot()[:3]]
        assert attempts == [1, 2, 3]
        wait_for(lambda: sub_status(shared_server, name).get("backlog") == 0, 10, "acked")
    finally:
        ep.stop()


def test_ordering_keys_are_pushed_in_order_even_after_failures(
    shared_server: ServerProcess, names: Any
) -> None:
    # Every third request fails: each key's messages must still be acknowledged in order.
    ep = PushEndpoint(lambda n: 500 if n % 3 == 0 else 200).start()
    pub = make_publisher(
        shared_server.endpoint,
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
    )
    sub = make_subscriber(shared_server.endpoint)
    try:
        topic, name = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        _create(
            sub,
            name,
            topic,
            push_config={"push_endpoint": ep.url},
            enable_message_ordering=True,
        )
        keys = ["a", "b", "c"]
        futures = [
            pub.publish(topic, f"{k}:{i}".encode(), ordering_key=k) for i in range(10) for k in keys
        ]
        for f in futures:
            f.result(timeout=60)
        wait_for(lambda: len(ep.acked_data()) >= 30, 60, "30 acknowledged pushes")
        acked = [r.json()["message"] for r in ep.snapshot() if r.status < 300]
        for k in keys:
            seq = [base64.b64decode(m["data"]).decode() for m in acked if m["orderingKey"] == k]
            assert seq == [f"{k}:{i}" for i in range(10)], seq
    finally:
        sub.close()
        ep.stop()


# --- formats ----------------------------------------------------------------------------------


def test_no_wrapper_sends_raw_data_and_metadata_headers(
    shared_server: ServerProcess, clients: Any, names: Any, endpoint: PushEndpoint
) -> None:
    pub, sub = clients
    topic, meta, bare = names.topic(), names.subscription("meta"), names.subscription("bare")
    pub.create_topic(name=topic)
    _create(
        sub,
        meta,
        topic,
        push_config={
            "push_endpoint": endpoint.url + "?s=meta",
            "no_wrapper": {"write_metadata": True},
        },
    )
    created = _create(
        sub,
        bare,
        topic,
        push_config={"push_endpoint": endpoint.url + "?s=bare", "no_wrapper": {}},
    )
    assert created.push_config.no_wrapper.write_metadata is False
    [message_id] = publish(pub, topic, b"\x00raw bytes\xff", tenant="acme")
    wait_for(lambda: endpoint.count() >= 2, 10, "2 pushes")
    by_path = {r.path: r for r in endpoint.snapshot()}
    with_meta, without = by_path["/push?s=meta"], by_path["/push?s=bare"]
    for r in (with_meta, without):
        assert r.body == b"\x00raw bytes\xff"
    h = with_meta.headers
    assert h["x-goog-pubsub-subscription-name"] == meta
    assert h["x-goog-pubsub-message-id"] == message_id
    assert h["x-goog-pubsub-publish-time"].endswith("Z")
    assert h["tenant"] == "acme"
    assert not [k for k in without.headers if k.startswith("x-goog-pubsub")]
    assert "tenant" not in without.headers


def test_invalid_push_endpoint_is_rejected(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, name = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    for bad in ("not a url", "ftp://127.0.0.1/x", "http:///nohost"):
        with pytest.raises(exceptions.InvalidArgument):
            _create(sub, name, topic, push_config={"push_endpoint": bad})
    _create(sub, name, topic)
    with pytest.raises(exceptions.InvalidArgument):
        sub.modify_push_config(
            request={"subscription": name, "push_config": {"push_endpoint": "nope"}}
        )
    with pytest.raises(exceptions.NotFound):
        sub.modify_push_config(
            request={"subscription": names.subscription("missing"), "push_config": {}}
        )


# --- switching between push and pull ----------------------------------------------------------


def test_modify_push_config_switches_to_pull_and_back(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    failing = PushEndpoint(lambda _n: 500).start()
    good = PushEndpoint().start()
    try:
        pub, sub = clients
        topic, name = names.topic(), names.subscription()
        pub.create_topic(name=topic)
        _create(sub, name, topic, push_config={"push_endpoint": failing.url})
        publish(pub, topic, b"a", b"b", b"c")
        wait_for(lambda: failing.count() >= 1, 10, "a push attempt")

        # Empty push config: a pull subscription; the held messages come back at once.
        sub.modify_push_config(request={"subscription": name, "push_config": {}})
        got = sub.get_subscription(subscription=name)
        assert not got.push_config.push_endpoint
        pulled = pull_until(sub, name, 3, max_messages=100)
        assert sorted(m.message.data for m in pulled) == [b"a", b"b", b"c"]
        # Counted once the pulls show the change in force where the subscription is served
        # (in a cluster it gets there through ZooKeeper, a moment after the call returns).
        pushes = failing.count()
        # Ack one, nack the others; messages published meanwhile accumulate.
        first = next(m for m in pulled if m.message.data == b"a")
        sub.acknowledge(request={"subscription": name, "ack_ids": [first.ack_id]})
        sub.modify_ack_deadline(
            request={
                "subscription": name,
                "ack_ids": [m.ack_id for m in pulled if m is not first],
                "ack_deadline_seconds": 0,
            }
        )
        publish(pub, topic, b"d")
        time.sleep(0.5)  # a negative check, so a fixed wait
        assert failing.count() == pushes  # no pushes while it is a pull subscription

        # Back to push, to a working endpoint: the rest is pushed and acked.
        sub.modify_push_config(
            request={"subscription": name, "push_config": {"push_endpoint": good.url}}
        )
        got = sub.get_subscription(subscription=name)
        assert got.push_config.push_endpoint == good.url
        assert got.push_config.attributes["x-goog-version"] == "v1"
        wait_for(lambda: good.count() >= 3, 10, "3 pushes")
        assert sorted(good.acked_data()) == [b"b", b"c", b"d"]
        wait_for(lambda: sub_status(shared_server, name).get("backlog") == 0, 10, "acked")
        assert failing.count() == pushes
    finally:
        failing.stop()
        good.stop()


def test_update_subscription_push_config(
    shared_server: ServerProcess, clients: Any, names: Any, endpoint: PushEndpoint
) -> None:
    pub, sub = clients
    topic, name = names.topic(), names.subscription()
    pub.create_topic(name=topic)
    _create(sub, name, topic)
    sub.update_subscription(
        request={
            "subscription": {"name": name, "push_config": {"push_endpoint": endpoint.url}},
            "update_mask": {"paths": ["push_config"]},
        }
    )
    publish(pub, topic, b"via update")
    wait_for(lambda: endpoint.count() >= 1, 10, "a push")
    assert endpoint.acked_data() == [b"via update"]
    wait_for(lambda: sub_status(shared_server, name).get("backlog") == 0, 10, "acked")
    # Clearing push_config through the mask makes it a pull subscription again.
    sub.update_subscription(
        request={"subscription": {"name": name}, "update_mask": {"paths": ["push_config"]}}
    )
    assert "push" not in sub_status(shared_server, name)
    publish(pub, topic, b"pulled")
    assert [m.message.data for m in pull_until(sub, name, 1, ack=True, max_messages=100)] == [
        b"pulled"
    ]
    assert endpoint.count() == 1


# --- bad endpoints ----------------------------------------------------------------------------


def test_dead_endpoints_do_not_disturb_other_subscriptions(
    shared_server: ServerProcess, clients: Any, names: Any, endpoint: PushEndpoint
) -> None:
    garbage = RawEndpoint(b"this is not HTTP\r\n\r\n").start()
    silent = RawEndpoint(b"").start()
    try:
        pub, sub = clients
        topic = names.topic()
        pub.create_topic(name=topic)
        dead = {
            names.subscription("refused"): f"http://127.0.0.1:{dead_port()}/push",
            names.subscription("garbage"): garbage.url,
            names.subscription("silent"): silent.url,
        }
        for name, url in dead.items():
            _create(sub, name, topic, push_config={"push_endpoint": url})
        good, pull = names.subscription("good"), names.subscription("pull")
        _create(sub, good, topic, push_config={"push_endpoint": endpoint.url})
        _create(sub, pull, topic)

        datas = [f"m{i}".encode() for i in range(50)]
        publish(pub, topic, *datas)
        wait_for(lambda: endpoint.count() >= 50, 20, "50 pushes to the good endpoint")
        assert sorted(endpoint.acked_data()) == sorted(datas)
        assert sorted(
            m.message.data for m in pull_until(sub, pull, 50, ack=True, max_messages=100)
        ) == sorted(datas)
        wait_for(lambda: garbage.connections >= 2, 10, "garbage endpoint retried")
        subs = status(shared_server)["subscriptions"]
        for name in dead:
            assert subs[name]["backlog"] == 50
            assert subs[name]["push"]["acked"] == 0
        assert subs[names.subscription("refused")]["push"]["failed"] >= 1
        assert "Error" in subs[names.subscription("refused")]["push"]["last_error"]
        # Not hammered: the failing subscriptions back off instead of retrying the backlog
        # (a negative check, so a fixed wait).
        time.sleep(1.0)
        assert garbage.connections < 20
        # Deleting a subscription with pushes in flight (the silent one) is clean.
        for name in dead:
            sub.delete_subscription(subscription=name)
        assert shared_server.alive()
        publish(pub, topic, b"after")
        wait_for(lambda: endpoint.count() >= 51, 10, "the good endpoint still served")
    finally:
        garbage.stop()
        silent.stop()


def test_push_survives_restart_and_shutdown_is_clean(server: ServerProcess, names: Any) -> None:
    good = PushEndpoint().start()
    silent = RawEndpoint(b"").start()
    try:
        pub = make_publisher(server.endpoint)
        sub = make_subscriber(server.endpoint)
        topic, name, hung = names.topic(), names.subscription(), names.subscription("hung")
        pub.create_topic(name=topic)
        _create(sub, name, topic, push_config={"push_endpoint": good.url})
        _create(sub, hung, topic, push_config={"push_endpoint": silent.url})
        publish(pub, topic, b"before")
        wait_for(lambda: good.count() >= 1, 10, "a push")
        wait_for(lambda: silent.connections >= 1, 10, "a push in flight")
        sub.close()
        # A push in flight to an endpoint that never answers does not hold up shutdown.
        started = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - started < 10
        assert "Traceback" not in server.log()

        server.start()
        pub = make_publisher(server.endpoint)
        sub = make_subscriber(server.endpoint)
        # The push subscriptions are push subscriptions again after the restart.
        publish(pub, topic, b"after")
        wait_for(lambda: b"after" in good.acked_data(), 10, "a push after restart")
        assert good.acked_data().count(b"before") == 1
        assert sub_status(server, hung)["push"]["endpoint"] == silent.url
        sub.close()
    finally:
        good.stop()
        silent.stop()
