"""Unit tests for pubsubd.core.validation: Google's documented request limits."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pubsubd.core import pb, validation
from pubsubd.core.errors import InvalidArgument, InvalidResourceName, OutOfRange

pytestmark = pytest.mark.unit

TOPIC = "projects/p/topics/topic1"
SUB = "projects/p/subscriptions/sub1"


def request(*messages: Any) -> Any:
    return pb.PublishRequest(topic=TOPIC, messages=list(messages))


def msg(data: bytes = b"x", **kw: Any) -> Any:
    return pb.PubsubMessage(data=data, **kw)


def check(req: Any, size: int | None = None) -> None:
    validation.publish_request(req, req.ByteSize() if size is None else size, now_s=time.time())


# --- publish ---------------------------------------------------------------------------------


def test_publish_ok() -> None:
    check(request(msg()))
    check(request(*[msg() for _ in range(1000)]))
    check(request(msg(b"", attributes={"k": "v"})))  # attributes only is fine
    check(request(msg(ordering_key="k"), msg(ordering_key="k")))


def test_publish_no_messages() -> None:
    with pytest.raises(InvalidArgument, match="messages"):
        check(request())


def test_publish_1001_messages() -> None:
    with pytest.raises(InvalidArgument, match="1001"):
        check(request(*[msg() for _ in range(1001)]))


def test_publish_request_size() -> None:
    check(request(msg()), validation.MAX_PUBLISH_REQUEST_BYTES)
    with pytest.raises(InvalidArgument, match="request_size"):
        check(request(msg()), validation.MAX_PUBLISH_REQUEST_BYTES + 1)


def test_publish_empty_message() -> None:
    with pytest.raises(InvalidArgument, match=r"messages\[1\]"):
        check(request(msg(), msg(b"")))


def test_publish_attribute_count() -> None:
    check(request(msg(attributes={f"k{i}": "v" for i in range(100)})))
    with pytest.raises(InvalidArgument, match="101 attributes"):
        check(request(msg(attributes={f"k{i}": "v" for i in range(101)})))


def test_publish_attribute_key_length() -> None:
    check(request(msg(attributes={"k" * 256: "v"})))
    with pytest.raises(InvalidArgument, match="key"):
        check(request(msg(attributes={"k" * 257: "v"})))
    # bytes, not characters
    with pytest.raises(InvalidArgument, match="key"):
        check(request(msg(attributes={"\u00e9" * 129: "v"})))


def test_publish_attribute_value_length() -> None:
    check(request(msg(attributes={"k": "v" * 1024})))
    with pytest.raises(InvalidArgument, match="value"):
        check(request(msg(attributes={"k": "v" * 1025})))


def test_publish_empty_attribute_key() -> None:
    with pytest.raises(InvalidArgument, match="empty"):
        check(request(msg(attributes={"": "v"})))


def test_publish_ordering_key_length() -> None:
    check(request(msg(ordering_key="o" * 1024)))
    with pytest.raises(InvalidArgument, match="ordering_key"):
        check(request(msg(ordering_key="o" * 1025)))


def test_publish_mixed_ordering_keys() -> None:
    with pytest.raises(InvalidArgument, match="same ordering_key"):
        check(request(msg(ordering_key="a"), msg(ordering_key="b")))
    with pytest.raises(InvalidArgument, match="same ordering_key"):
        check(request(msg(ordering_key="a"), msg()))
    with pytest.raises(InvalidArgument, match="same ordering_key"):
        check(request(msg(), msg(ordering_key="a")))


def test_publish_ignores_message_id_and_publish_time() -> None:
    m = msg(message_id="123")
    m.publish_time.seconds = 1
    check(request(m))


# --- ack deadlines ---------------------------------------------------------------------------


def test_ack_deadline() -> None:
    assert validation.ack_deadline("f", 0) == 10
    assert validation.ack_deadline("f", 10) == 10
    assert validation.ack_deadline("f", 600) == 600
    for bad in (9, 601, -1, 1):
        with pytest.raises(InvalidArgument, match="f"):
            validation.ack_deadline("f", bad)


def test_modify_deadline() -> None:
    validation.modify_deadline(0)
    validation.modify_deadline(600)
    for bad in (-1, 601):
        with pytest.raises(InvalidArgument):
            validation.modify_deadline(bad)


# --- subscriptions ---------------------------------------------------------------------------


def sub(**kw: Any) -> Any:
    return pb.Subscription(name=SUB, topic=TOPIC, **kw)


def test_subscription_defaults() -> None:
    s = sub()
    validation.subscription(s)
    assert s.ack_deadline_seconds == 10
    assert s.HasField("message_retention_duration")
    assert s.message_retention_duration.seconds == 7 * 24 * 3600
    assert not s.push_config.push_endpoint
    assert "x-goog-version" not in s.push_config.attributes


def test_subscription_keeps_given_values() -> None:
    s = sub(ack_deadline_seconds=60)
    s.message_retention_duration.seconds = 3600
    validation.subscription(s)
    assert s.ack_deadline_seconds == 60
    assert s.message_retention_duration.seconds == 3600


def test_subscription_invalid_name() -> None:
    with pytest.raises(InvalidResourceName):
        validation.subscription(pb.Subscription(name="projects/p/subscriptions/1x", topic=TOPIC))
    with pytest.raises(InvalidResourceName):
        validation.subscription(pb.Subscription(name=TOPIC, topic=TOPIC))


def test_subscription_bad_ack_deadline() -> None:
    with pytest.raises(InvalidArgument, match="ack_deadline_seconds"):
        validation.subscription(sub(ack_deadline_seconds=601))


def test_subscription_push_version_default() -> None:
    s = sub()
    s.push_config.push_endpoint = "https://example.com/push"
    validation.subscription(s)
    assert s.push_config.attributes["x-goog-version"] == "v1"
    s = sub()
    s.push_config.push_endpoint = "https://example.com/push"
    s.push_config.attributes["x-goog-version"] = "v1beta1"
    validation.subscription(s)
    assert s.push_config.attributes["x-goog-version"] == "v1beta1"


@pytest.mark.parametrize("seconds", [0, 599, 31 * 24 * 3600 + 1])
def test_subscription_retention_out_of_range(seconds: int) -> None:
    s = sub()
    s.message_retention_duration.seconds = seconds
    with pytest.raises(InvalidArgument, match="message_retention_duration"):
        validation.subscription(s)


def test_subscription_retention_bounds_ok() -> None:
    for seconds in (600, 31 * 24 * 3600):
        s = sub()
        s.message_retention_duration.seconds = seconds
        validation.subscription(s)


def test_subscription_expiration_ttl() -> None:
    s = sub()
    s.expiration_policy.ttl.seconds = 24 * 3600 - 1
    with pytest.raises(InvalidArgument, match=r"expiration_policy\.ttl"):
        validation.subscription(s)
    s = sub()
    s.expiration_policy.ttl.seconds = 24 * 3600
    validation.subscription(s)
    s = sub()
    s.expiration_policy.SetInParent()  # no ttl: never expires
    validation.subscription(s)


@pytest.mark.parametrize("attempts", [4, 101, 1, -1])
def test_subscription_dead_letter_attempts_out_of_range(attempts: int) -> None:
    s = sub()
    s.dead_letter_policy.dead_letter_topic = "projects/p/topics/dlq"
    s.dead_letter_policy.max_delivery_attempts = attempts
    with pytest.raises(OutOfRange, match="max_delivery_attempts"):
        validation.subscription(s)


def test_subscription_dead_letter_attempts_ok() -> None:
    for attempts, expected in ((0, 5), (5, 5), (100, 100)):
        s = sub()
        s.dead_letter_policy.dead_letter_topic = "projects/p/topics/dlq"
        s.dead_letter_policy.max_delivery_attempts = attempts
        validation.subscription(s)
        assert s.dead_letter_policy.max_delivery_attempts == expected


def test_subscription_dead_letter_topic_name() -> None:
    s = sub()
    s.dead_letter_policy.dead_letter_topic = "projects/p/topics/goog-dlq"
    with pytest.raises(InvalidResourceName):
        validation.subscription(s)


def test_subscription_retry_policy() -> None:
    s = sub()
    s.retry_policy.minimum_backoff.seconds = 601
    with pytest.raises(InvalidArgument, match="minimum_backoff"):
        validation.subscription(s)
    s = sub()
    s.retry_policy.maximum_backoff.seconds = 600
    validation.subscription(s)


def test_subscription_filter_length() -> None:
    validation.subscription(sub(filter="attributes:" + "a" * 245))
    with pytest.raises(InvalidArgument, match="filter"):
        validation.subscription(sub(filter="a" * 257))


@pytest.mark.parametrize(
    "second", ["bigquery_config", "cloud_storage_config", "bigtable_config", None]
)
def test_subscription_two_delivery_configs(second: str | None) -> None:
    s = sub()
    s.push_config.push_endpoint = "https://example.com/push"
    if second is None:
        s.bigquery_config.table = "p.d.t"
        s.cloud_storage_config.bucket = "b"
    else:
        getattr(s, second).SetInParent()
    with pytest.raises(InvalidArgument, match="only one delivery type"):
        validation.subscription(s)


def test_subscription_one_delivery_config_ok() -> None:
    s = sub()
    s.bigquery_config.table = "p.d.t"
    validation.subscription(s)


@pytest.mark.parametrize(
    "labels",
    [
        {"Upper": "v"},
        {"": "v"},
        {"1abc": "v"},
        {"k": "Upper"},
        {"k": "a" * 64},
        {"k" * 64: "v"},
        {f"k{i}": "v" for i in range(65)},
    ],
)
def test_subscription_bad_labels(labels: dict[str, str]) -> None:
    s = sub()
    s.labels.update(labels)
    with pytest.raises(InvalidArgument, match="labels"):
        validation.subscription(s)


def test_subscription_good_labels() -> None:
    s = sub()
    s.labels.update({"env": "prod", "team_x-1": "", f"k{'a' * 61}": "v-1_2"})
    validation.subscription(s)


# --- topics ----------------------------------------------------------------------------------


def test_topic() -> None:
    validation.topic(pb.Topic(name=TOPIC))
    t = pb.Topic(name=TOPIC)
    t.message_retention_duration.seconds = 599
    with pytest.raises(InvalidArgument, match="message_retention_duration"):
        validation.topic(t)
    t = pb.Topic(name=TOPIC)
    t.message_storage_policy.SetInParent()
    with pytest.raises(InvalidArgument, match="allowed_persistence_regions"):
        validation.topic(t)
    with pytest.raises(InvalidResourceName):
        validation.topic(pb.Topic(name="projects/p/topics/goog"))
