"""Pure parts of delivery policies: key ordering, retry backoff, delay queue, dead-letter body."""

from __future__ import annotations

import pytest

from pubsubd.core import pb
from pubsubd.data.subscribe.dead_letter import dead_letter_request, should_dead_letter
from pubsubd.data.subscribe.ordering import KeyOrdering
from pubsubd.data.subscribe.retry import DelayQueue, backoff_s

pytestmark = pytest.mark.unit


def test_busy_key_holds_newer_messages_until_batch_acked() -> None:
    o = KeyOrdering()
    o.delivered("k", 1)
    o.delivered("k", 2)
    o.hold("k", 3)
    assert o.take_ready(10) == []
    o.acked(1)
    assert o.take_ready(10) == []  # 2 still outstanding
    o.acked(2)
    assert o.take_ready(10) == [("k", [3])]


def test_fail_returns_later_outstanding_and_requeues_in_order() -> None:
    o = KeyOrdering()
    for p in (10, 11, 12):
        o.delivered("k", p)
    o.hold("k", 13)
    assert o.fail(11) == [11, 12]
    o.acked(10)
    assert o.take_ready(10) == [("k", [11, 12, 13])]


def test_later_messages_put_back_by_a_failure_await_redelivery_until_delivered() -> None:
    o = KeyOrdering()
    for p in (10, 11, 12):
        o.delivered("k", p)
    o.fail(11)
    assert not o.awaits_redelivery(10)  # still outstanding: its ack ID is live
    assert not o.awaits_redelivery(11)  # the failed one itself
    assert o.awaits_redelivery(12)  # behind 11: an ack for it now names the ended delivery
    o.acked(10)
    [(key, batch)] = o.take_ready(10)
    for p in batch:
        o.delivered(key, p)
    assert not o.awaits_redelivery(12)


def test_blocked_key_waits_for_unblock() -> None:
    o = KeyOrdering()
    o.delivered("k", 1)
    o.fail(1)
    o.block("k")
    assert o.take_ready(10) == []
    o.unblock("k")
    assert o.take_ready(10) == [("k", [1])]


def test_take_ready_respects_limit_and_give_back() -> None:
    o = KeyOrdering()
    o.delivered("k", 0)
    for p in range(1, 6):
        o.hold("k", p)
    o.acked(0)
    [(key, batch)] = o.take_ready(3)
    assert (key, batch) == ("k", [1, 2, 3])
    o.give_back("k", [3])
    assert o.take_ready(10) == [("k", [3, 4, 5])]


def test_independent_keys_do_not_block_each_other() -> None:
    o = KeyOrdering()
    o.delivered("a", 1)
    o.hold("a", 2)
    o.delivered("b", 3)
    o.hold("b", 4)
    o.acked(3)
    assert o.take_ready(10) == [("b", [4])]


def _sub(**retry: int) -> object:
    s = pb.Subscription(name="projects/p/subscriptions/s")
    if retry:
        for k, v in retry.items():
            getattr(s.retry_policy, k).seconds = v
    return s


def test_backoff_without_policy_is_zero() -> None:
    assert backoff_s(pb.Subscription(), 3) == 0.0


def test_backoff_doubles_up_to_maximum() -> None:
    s = _sub(minimum_backoff=2, maximum_backoff=9)
    assert [backoff_s(s, n) for n in range(1, 6)] == [2, 4, 8, 9, 9]


def test_backoff_defaults_when_policy_fields_unset() -> None:
    s = pb.Subscription()
    s.retry_policy.SetInParent()
    assert backoff_s(s, 1) == 10.0
    assert backoff_s(s, 10) == 600.0


def test_delay_queue_returns_due_positions_once_in_order() -> None:
    q = DelayQueue()
    q.add(5, 3.0)
    q.add(7, 1.0)
    q.add(5, 0.5)  # already queued: ignored
    assert q.next_due() == 1.0
    assert q.due(0.9) == []
    assert q.due(3.0) == [7, 5]
    assert len(q) == 0


def test_dead_letter_request_carries_google_attributes() -> None:
    m = pb.PubsubMessage(data=b"x", ordering_key="k")
    m.attributes["a"] = "b"
    m.publish_time.seconds = 1_700_000_000
    m.publish_time.nanos = 123_456_789
    raw = dead_letter_request("projects/proj/subscriptions/sub-1", m, 5, "projects/proj/topics/d")
    req = pb.PublishRequest.FromString(raw)
    out = req.messages[0]
    assert req.topic == "projects/proj/topics/d"
    assert out.data == b"x" and out.ordering_key == "k"
    assert dict(out.attributes) == {
        "a": "b",
        "CloudPubSubDeadLetterSourceDeliveryCount": "5",
        "CloudPubSubDeadLetterSourceSubscription": "sub-1",
        "CloudPubSubDeadLetterSourceSubscriptionProject": "proj",
        "CloudPubSubDeadLetterSourceTopicPublishTime": "2023-11-14T22:13:20.123Z",
    }


def test_should_dead_letter_only_with_topic_and_enough_attempts() -> None:
    s = pb.Subscription()
    assert not should_dead_letter(s, 100)
    s.dead_letter_policy.dead_letter_topic = "projects/p/topics/d"
    s.dead_letter_policy.max_delivery_attempts = 5
    assert not should_dead_letter(s, 4)
    assert should_dead_letter(s, 5)
