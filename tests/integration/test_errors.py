"""Google's status codes for bad requests (docs/GOOGLE_API.md §2, §5, §6).

Limits are checked with the generated (GAPIC) client, which sends exactly what it is given: the
hand-written PublisherClient splits batches and rejects oversize messages before they are sent.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.publisher.exceptions import MessageTooLargeError

from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support.raw import gapic_publisher, http_get
from tests.support.server import ServerProcess, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]

MB = 1_000_000


@pytest.fixture(scope="module")
def clients(shared_server: ServerProcess) -> Any:
    """Overrides tests/conftest.py's pair: the GAPIC publisher, which checks nothing itself."""
    gapic = gapic_publisher(shared_server.endpoint)
    sub = make_subscriber(shared_server.endpoint)
    yield gapic, sub
    sub.close()


@pytest.fixture
def topic(clients: Any, names: Any) -> str:
    gapic, _ = clients
    name = names.topic()
    gapic.create_topic(name=name)
    return name


@pytest.fixture
def subscription(clients: Any, names: Any, topic: str) -> str:
    _, sub = clients
    name = names.subscription()
    sub.create_subscription(name=name, topic=topic)
    return name


def _publish(gapic: Any, topic: str, *messages: dict[str, Any]) -> list[str]:
    return list(gapic.publish(topic=topic, messages=list(messages), timeout=30).message_ids)


def _pull_one(sub: pubsub_v1.SubscriberClient, subscription: str) -> Any:
    got: list[Any] = []

    def pulled() -> bool:
        resp = sub.pull(
            request={"subscription": subscription, "max_messages": 1, "return_immediately": True}
        )
        got.extend(resp.received_messages)
        return bool(got)

    wait_for(pulled, 10, "a message to pull")
    return got[0]


# --- resource names ---------------------------------------------------------------------------

BAD_IDS = {
    "too-short": "ab",
    "too-long": "a" * 256,
    "starts-with-digit": "1abc",
    "space": "ab c",
    "dollar": "abc$def",
    "non-ascii": "t\u00f3pico",
    "starts-with-goog": "goog-thing",
}


@pytest.mark.parametrize("bad_id", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_bad_topic_name_invalid_argument(clients: Any, bad_id: str) -> None:
    gapic, _ = clients
    bad = f"projects/{PROJECT}/topics/{bad_id}"
    with pytest.raises(exceptions.InvalidArgument) as e:
        gapic.create_topic(name=bad)
    assert bad in e.value.message
    with pytest.raises(exceptions.InvalidArgument) as e:
        gapic.get_topic(topic=bad)
    assert bad in e.value.message
    with pytest.raises(exceptions.InvalidArgument) as e:
        gapic.publish(topic=bad, messages=[{"data": b"x"}])
    assert bad in e.value.message


@pytest.mark.parametrize("bad_id", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_bad_subscription_name_invalid_argument(clients: Any, topic: str, bad_id: str) -> None:
    _, sub = clients
    bad = f"projects/{PROJECT}/subscriptions/{bad_id}"
    with pytest.raises(exceptions.InvalidArgument) as e:
        sub.create_subscription(name=bad, topic=topic)
    assert bad in e.value.message
    with pytest.raises(exceptions.InvalidArgument) as e:
        sub.pull(request={"subscription": bad, "max_messages": 1, "return_immediately": True})
    assert bad in e.value.message


@pytest.mark.parametrize(
    "bad",
    [
        f"projects/{PROJECT}/subscriptions/abc-topic",
        "projects//topics/abc-topic",
        f"project/{PROJECT}/topics/abc-topic",
        f"projects/{PROJECT}/topics/abc/extra",
        "abc-topic",
    ],
    ids=["wrong-collection", "empty-project", "bad-prefix", "extra-segment", "bare-id"],
)
def test_malformed_topic_name_invalid_argument(clients: Any, bad: str) -> None:
    gapic, _ = clients
    with pytest.raises(exceptions.InvalidArgument) as e:
        gapic.create_topic(name=bad)
    assert bad in e.value.message


def test_subscription_name_in_topic_collection_invalid_argument(clients: Any, topic: str) -> None:
    _, sub = clients
    bad = f"projects/{PROJECT}/topics/abc-sub"
    with pytest.raises(exceptions.InvalidArgument) as e:
        sub.create_subscription(name=bad, topic=topic)
    assert bad in e.value.message


def test_edge_valid_names_accepted(clients: Any, names: Any) -> None:
    gapic, _ = clients
    for rid in ("abc", "a" * 255, f"A-_.~+%b{names.suffix}"):
        name = f"projects/{PROJECT}/topics/{rid}"
        if rid == "abc":
            name = f"projects/abc-{names.suffix}/topics/abc"
        assert gapic.create_topic(name=name).name == name


# --- publish limits ---------------------------------------------------------------------------


def test_1001_messages_invalid_argument(clients: Any, topic: str) -> None:
    gapic, _ = clients
    with pytest.raises(exceptions.InvalidArgument):
        _publish(gapic, topic, *({"data": b"x"} for _ in range(1001)))
    assert len(_publish(gapic, topic, *({"data": b"x"} for _ in range(1000)))) == 1000


def test_request_over_10mb_invalid_argument(clients: Any, topic: str) -> None:
    gapic, _ = clients
    with pytest.raises(exceptions.InvalidArgument):
        _publish(gapic, topic, {"data": b"x" * 10_500_000})
    # Several messages adding up to more than 10 MB are rejected too.
    with pytest.raises(exceptions.InvalidArgument):
        _publish(gapic, topic, *({"data": b"y" * MB} for _ in range(11)))
    # Just below the limit is fine.
    assert len(_publish(gapic, topic, {"data": b"z" * 9_900_000})) == 1


def test_oversize_message_rejected_by_official_client(
    shared_server: ServerProcess, topic: str
) -> None:
    pub = make_publisher(shared_server.endpoint)
    with pytest.raises(MessageTooLargeError):
        pub.publish(topic, b"x" * 10_500_000)


def test_empty_message_invalid_argument(clients: Any, topic: str) -> None:
    gapic, _ = clients
    with pytest.raises(exceptions.InvalidArgument):
        _publish(gapic, topic, {"data": b""})
    with pytest.raises(exceptions.InvalidArgument):
        _publish(gapic, topic, {"data": b"ok"}, {})
    # Attributes alone make a valid message.
    assert len(_publish(gapic, topic, {"attributes": {"k": "v"}})) == 1


def test_attribute_and_ordering_key_limits(clients: Any, topic: str) -> None:
    gapic, _ = clients
    too_many = {f"k{i}": "v" for i in range(101)}
    at_limit = {f"k{i}": "v" for i in range(100)}
    rejected = [
        {"data": b"x", "attributes": too_many},
        {"data": b"x", "attributes": {"k" * 257: "v"}},
        {"data": b"x", "attributes": {"k": "v" * 1025}},
        {"data": b"x", "ordering_key": "o" * 1025},
    ]
    for message in rejected:
        with pytest.raises(exceptions.InvalidArgument):
            _publish(gapic, topic, message)
    accepted = [
        {"data": b"x", "attributes": at_limit},
        {"data": b"x", "attributes": {"k" * 256: "v"}},
        {"data": b"x", "attributes": {"k": "v" * 1024}},
        {"data": b"x", "ordering_key": "o" * 1024},
    ]
    for message in accepted:
        assert len(_publish(gapic, topic, message)) == 1


def test_mixed_ordering_keys_in_one_request_invalid_argument(clients: Any, topic: str) -> None:
    gapic, _ = clients
    with pytest.raises(exceptions.InvalidArgument):
        _publish(gapic, topic, {"data": b"a", "ordering_key": "k1"}, {"data": b"b"})


def test_publish_to_missing_topic_not_found(clients: Any, names: Any) -> None:
    gapic, _ = clients
    with pytest.raises(exceptions.NotFound):
        _publish(gapic, names.topic("missing"), {"data": b"x"})


# --- subscription settings --------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [5, 9, 601, -1])
def test_bad_ack_deadline_on_create_invalid_argument(
    clients: Any, names: Any, topic: str, seconds: int
) -> None:
    _, sub = clients
    with pytest.raises(exceptions.InvalidArgument):
        sub.create_subscription(
            request={
                "name": names.subscription(f"d{seconds}".replace("-", "m")),
                "topic": topic,
                "ack_deadline_seconds": seconds,
            }
        )


def test_edge_ack_deadlines_accepted(clients: Any, names: Any, topic: str) -> None:
    _, sub = clients
    for seconds in (10, 600):
        created = sub.create_subscription(
            request={
                "name": names.subscription(f"d{seconds}"),
                "topic": topic,
                "ack_deadline_seconds": seconds,
            }
        )
        assert created.ack_deadline_seconds == seconds


def test_bad_subscription_settings_invalid_argument(clients: Any, names: Any, topic: str) -> None:
    _, sub = clients
    bad_settings: list[dict[str, Any]] = [
        {"message_retention_duration": {"seconds": 60}},
        {"message_retention_duration": {"seconds": 32 * 24 * 3600}},
        {"expiration_policy": {"ttl": {"seconds": 3600}}},
        {"labels": {"Upper": "x"}},
        {"filter": "attributes:" + "k" * 300},
    ]
    for i, settings in enumerate(bad_settings):
        with pytest.raises(exceptions.InvalidArgument):
            sub.create_subscription(
                request={"name": names.subscription(f"bad{i}"), "topic": topic, **settings}
            )


@pytest.mark.parametrize("attempts", [4, 101])
def test_dead_letter_attempts_out_of_range(
    clients: Any, names: Any, topic: str, attempts: int
) -> None:
    _, sub = clients
    with pytest.raises((exceptions.OutOfRange, exceptions.InvalidArgument)):
        sub.create_subscription(
            request={
                "name": names.subscription(f"dl{attempts}"),
                "topic": topic,
                "dead_letter_policy": {
                    "dead_letter_topic": topic,
                    "max_delivery_attempts": attempts,
                },
            }
        )


# --- acks and pulls ---------------------------------------------------------------------------


def test_modify_ack_deadline_out_of_range_invalid_argument(
    clients: Any, topic: str, subscription: str
) -> None:
    gapic, sub = clients
    _publish(gapic, topic, {"data": b"m"})
    received = _pull_one(sub, subscription)
    for seconds in (601, -1):
        with pytest.raises(exceptions.InvalidArgument):
            sub.modify_ack_deadline(
                subscription=subscription, ack_ids=[received.ack_id], ack_deadline_seconds=seconds
            )
    # The ack ID itself is fine.
    sub.modify_ack_deadline(
        subscription=subscription, ack_ids=[received.ack_id], ack_deadline_seconds=600
    )
    sub.acknowledge(subscription=subscription, ack_ids=[received.ack_id])


def test_acknowledge_empty_list_invalid_argument(clients: Any, subscription: str) -> None:
    _, sub = clients
    with pytest.raises(exceptions.InvalidArgument):
        sub.acknowledge(subscription=subscription, ack_ids=[])
    with pytest.raises(exceptions.InvalidArgument):
        sub.modify_ack_deadline(subscription=subscription, ack_ids=[], ack_deadline_seconds=10)


@pytest.mark.parametrize(
    "ack_id",
    ["garbage", "", "a-b-c-d", "x" * 5000, "12345678-0-0-1", "\u00e9\u00e9-0-0-1"],
    ids=["word", "empty", "four-words", "huge", "other-incarnation", "non-ascii"],
)
def test_malformed_ack_id_invalid_argument(clients: Any, subscription: str, ack_id: str) -> None:
    _, sub = clients
    with pytest.raises(exceptions.InvalidArgument):
        sub.acknowledge(subscription=subscription, ack_ids=[ack_id])
    with pytest.raises(exceptions.InvalidArgument):
        sub.modify_ack_deadline(
            subscription=subscription, ack_ids=[ack_id], ack_deadline_seconds=10
        )


def test_ack_on_missing_subscription_not_found(clients: Any, names: Any) -> None:
    _, sub = clients
    with pytest.raises(exceptions.NotFound):
        sub.acknowledge(subscription=names.subscription("missing"), ack_ids=["a-0-0-1"])


@pytest.mark.parametrize("max_messages", [0, -1])
def test_pull_max_messages_not_positive_invalid_argument(
    clients: Any, subscription: str, max_messages: int
) -> None:
    _, sub = clients
    with pytest.raises(exceptions.InvalidArgument):
        sub.pull(
            request={
                "subscription": subscription,
                "max_messages": max_messages,
                "return_immediately": True,
            }
        )


# --- after all of the above ------------------------------------------------------------------


def test_server_still_alive_and_clean(shared_server: ServerProcess, clients: Any) -> None:
    """Every bad request above was answered; none crashed a handler or the process."""
    gapic, _ = clients
    assert shared_server.alive()
    assert http_get(shared_server, "/healthz")[0] == 200
    assert gapic.list_topics(request={"project": f"projects/{PROJECT}", "page_size": 1})
    assert "Traceback" not in shared_server.log(), "a bad request raised inside the server"
