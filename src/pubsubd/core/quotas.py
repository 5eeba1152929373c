"""Backlog quotas (Pulsar-style): how big a subscription's backlog may grow, and what then (pure).

Set as labels on a topic (for every subscription of it) or on a subscription (overriding the
topic's), so any official client can set them:

| label                                  | value                                          |
|----------------------------------------|------------------------------------------------|
| pubsubd-backlog-quota-messages         | max unacked messages per subscription          |
| pubsubd-backlog-quota-bytes            | max unacked bytes, as stored (see below)       |
| pubsubd-backlog-quota-age-seconds      | max age of the oldest unacked message          |
| pubsubd-backlog-policy                 | block_publishers (default) or evict_oldest     |

``block_publishers``: Publish fails with RESOURCE_EXHAUSTED naming the subscription and quota
while any subscription of the topic is over it. ``evict_oldest``: the oldest unacked messages
of an over-quota subscription are acknowledged by the server until it is within the quota.

Bytes are the unacked messages' stored bytes, from the log's index (``SourceLog.stored_bytes``:
a stored batch's frame bytes shared evenly among its messages), computed by the dispatcher.

Retention by size is a topic label too: ``pubsubd-retention-bytes`` (a positive whole number)
keeps the topic's newest segments, acked or not, while they total at most that many bytes
(``data/retention.py``: ``size_pin``, ``topic_pin``). It is a topic setting only: on a
subscription it is an unknown pubsubd label.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from pubsubd.core.errors import InvalidArgument

MESSAGES_LABEL = "pubsubd-backlog-quota-messages"
BYTES_LABEL = "pubsubd-backlog-quota-bytes"
AGE_LABEL = "pubsubd-backlog-quota-age-seconds"
POLICY_LABEL = "pubsubd-backlog-policy"
LABELS = frozenset({MESSAGES_LABEL, BYTES_LABEL, AGE_LABEL, POLICY_LABEL})
RETENTION_BYTES_LABEL = "pubsubd-retention-bytes"  # a topic label, not in LABELS
_LIMIT = 1 << 50


class Policy(enum.Enum):
    BLOCK_PUBLISHERS = "block_publishers"
    EVICT_OLDEST = "evict_oldest"


@dataclass(frozen=True, slots=True)
class BacklogQuota:
    messages: int = 0  # 0 = no limit of this kind
    bytes: int = 0
    age_s: int = 0
    policy: Policy = Policy.BLOCK_PUBLISHERS


@dataclass(frozen=True, slots=True)
class Backlog:
    messages: int
    bytes: int
    oldest_age_s: float


def positive_int(labels: Mapping[str, str], key: str) -> int:
    """A label's positive whole number (0 when absent); InvalidArgument naming a bad one."""
    raw = labels.get(key)
    if raw is None:
        return 0
    if not raw.isdigit() or not 1 <= int(raw) <= _LIMIT:
        raise InvalidArgument(f"labels[{key!r}]: {raw!r} must be a positive whole number")
    return int(raw)


def parse(labels: Mapping[str, str]) -> BacklogQuota | None:
    """The quota set by ``labels``, None if none; raise InvalidArgument naming a bad label."""
    if not any(k in labels for k in LABELS):
        return None
    raw_policy = labels.get(POLICY_LABEL, Policy.BLOCK_PUBLISHERS.value)
    try:
        policy = Policy(raw_policy)
    except ValueError:
        allowed = ", ".join(p.value for p in Policy)
        raise InvalidArgument(
            f"labels[{POLICY_LABEL!r}]: {raw_policy!r}; one of {allowed}"
        ) from None
    quota = BacklogQuota(
        positive_int(labels, MESSAGES_LABEL),
        positive_int(labels, BYTES_LABEL),
        positive_int(labels, AGE_LABEL),
        policy,
    )
    if not (quota.messages or quota.bytes or quota.age_s):
        raise InvalidArgument(
            f"labels[{POLICY_LABEL!r}]: a policy needs a limit ({MESSAGES_LABEL}, "
            f"{BYTES_LABEL} or {AGE_LABEL})"
        )
    return quota


def retention_bytes(labels: Mapping[str, str]) -> int | None:
    """A topic's retention size from its labels (None: not set); InvalidArgument if bad."""
    return positive_int(labels, RETENTION_BYTES_LABEL) if RETENTION_BYTES_LABEL in labels else None


def exceeded(quota: BacklogQuota, backlog: Backlog) -> str | None:
    """Which limit the backlog is at or over, as a phrase for an error message; None if none."""
    if quota.messages and backlog.messages >= quota.messages:
        return f"{backlog.messages} unacked messages, quota {quota.messages} ({MESSAGES_LABEL})"
    if quota.bytes and backlog.bytes >= quota.bytes:
        return f"about {backlog.bytes} unacked bytes, quota {quota.bytes} ({BYTES_LABEL})"
    if quota.age_s and backlog.oldest_age_s >= quota.age_s:
        return (
            f"oldest unacked message {backlog.oldest_age_s:.0f}s old, quota {quota.age_s}s "
            f"({AGE_LABEL})"
        )
    return None


def excess_messages(quota: BacklogQuota, backlog: Backlog, average_size: float) -> int:
    """How many of the oldest messages to evict to get within the count and byte limits."""
    excess = 0
    if quota.messages and backlog.messages > quota.messages:
        excess = backlog.messages - quota.messages
    if quota.bytes and backlog.bytes > quota.bytes and average_size > 0:
        excess = max(excess, int((backlog.bytes - quota.bytes) / average_size + 0.999))
    return min(excess, backlog.messages)
