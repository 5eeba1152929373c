"""Pure parsing and decisions of queue settings, backlog quotas and delay attributes."""

from __future__ import annotations

import pytest

from pubsubd.core import delays, queue_settings, quotas
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.queue_settings import SubscriptionType

pytestmark = pytest.mark.unit


def test_queue_settings_defaults_and_values() -> None:
    assert queue_settings.parse({}) == queue_settings.QueueSettings()
    s = queue_settings.parse(
        {
            "pubsubd-subscription-type": "failover",
            "pubsubd-nack-delay-seconds": "30",
            "pubsubd-max-outstanding-messages": "100",
            "pubsubd-max-outstanding-bytes": "1000000",
            "pubsubd-consumer-max-outstanding-messages": "10",
            "pubsubd-consumer-max-outstanding-bytes": "65536",
            "team": "payments",  # ordinary labels are left alone
        }
    )
    assert s.type is SubscriptionType.FAILOVER
    assert s.nack_delay_s == 30 and s.max_outstanding_messages == 100
    assert s.max_outstanding_bytes == 1_000_000 and s.consumer_max_outstanding_messages == 10
    assert s.consumer_max_outstanding_bytes == 65536
    assert not s.always_report_attempts
    assert queue_settings.parse({"pubsubd-delivery-attempts": "always"}).always_report_attempts


@pytest.mark.parametrize(
    "labels",
    [
        {"pubsubd-subscription-type": "fifo"},
        {"pubsubd-nack-delay-seconds": "601"},
        {"pubsubd-max-outstanding-messages": "0"},
        {"pubsubd-max-outstanding-bytes": "-1"},
        {"pubsubd-consumer-max-outstanding-bytes": "0"},
        {"pubsubd-consumer-max-outstanding-messages": "lots"},
        {"pubsubd-typo": "1"},
        {"pubsubd-delivery-attempts": "sometimes"},
    ],
)
def test_queue_settings_reject_bad_labels(labels: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument, match=next(iter(labels))):
        queue_settings.parse(labels)


def test_quota_parse_and_exceeded() -> None:
    assert quotas.parse({"team": "x"}) is None
    q = quotas.parse({"pubsubd-backlog-quota-messages": "10"})
    assert q == quotas.BacklogQuota(messages=10)
    assert quotas.exceeded(q, quotas.Backlog(9, 0, 0.0)) is None
    assert "quota 10" in (quotas.exceeded(q, quotas.Backlog(10, 0, 0.0)) or "")
    age = quotas.parse({"pubsubd-backlog-quota-age-seconds": "60"})
    assert age is not None
    assert quotas.exceeded(age, quotas.Backlog(1, 0, 61.0)) is not None


def test_quota_policy_needs_a_limit_and_a_known_name() -> None:
    with pytest.raises(InvalidArgument):
        quotas.parse({"pubsubd-backlog-policy": "evict_oldest"})
    with pytest.raises(InvalidArgument):
        quotas.parse({"pubsubd-backlog-quota-messages": "5", "pubsubd-backlog-policy": "drop"})


def test_excess_messages_by_count_and_bytes() -> None:
    q = quotas.BacklogQuota(messages=10, bytes=1000, policy=quotas.Policy.EVICT_OLDEST)
    assert quotas.excess_messages(q, quotas.Backlog(12, 600, 0), 50.0) == 2
    assert quotas.excess_messages(q, quotas.Backlog(8, 1500, 0), 100.0) == 5


def test_delay_attributes() -> None:
    assert delays.deliver_at({}, 100.0) is None
    assert delays.deliver_at({"pubsubd.deliver_after": "2.5"}, 100.0) == 102.5
    assert delays.deliver_at({"pubsubd.deliver_at": "1970-01-01T00:01:40Z"}, 50.0) == 100.0
    for bad in (
        {"pubsubd.deliver_after": "x"},
        {"pubsubd.deliver_after": "-1"},
        {"pubsubd.deliver_at": "1970-01-01T00:01:40"},
        {"pubsubd.deliver_at": "Z", "pubsubd.deliver_after": "1"},
    ):
        with pytest.raises(InvalidArgument):
            delays.deliver_at(bad, 0.0)
