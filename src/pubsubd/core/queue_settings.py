"""Queue features of a subscription (Pulsar-style), read from the subscription's labels (pure).

Google's API has no fields for them, so they travel as labels, which every official client can
set and which pubsubd validates. Label keys and values follow Google's label rules (lowercase,
digits, ``-`` and ``_``):

| label                                       | value                                    |
|---------------------------------------------|------------------------------------------|
| pubsubd-subscription-type                   | shared (default), exclusive, failover, key_shared |
| pubsubd-nack-delay-seconds                  | 0-600, wait before redelivering a nack   |
| pubsubd-max-outstanding-messages            | cap on delivered, unacked messages       |
| pubsubd-max-outstanding-bytes               | the same cap in bytes                    |
| pubsubd-consumer-max-outstanding-messages   | cap per consumer (stream or Pull)        |
| pubsubd-consumer-max-outstanding-bytes      | the same per-consumer cap in bytes       |
| pubsubd-backlog-quota-*, pubsubd-backlog-policy | backlog quota (control/quotas.py)    |
| pubsubd-delivery-attempts                   | ``always``: ``delivery_attempt`` set on  |
|                                             | every delivery, without a dead-letter    |
|                                             | policy too (the Pulsar redelivery count) |

Subscription types: *shared* hands each message to one consumer, round-robin, message by
message; *exclusive* admits one StreamingPull client (by ``client_id``) and refuses others with
FAILED_PRECONDITION; *failover* admits several but only the first by ``client_id`` receives, the
next takes over when it disconnects; *key_shared* sends every message of an ordering key to the
same consumer while it stays connected.

Unary Pull has no ``client_id``, so it never counts as the same client as a stream. *exclusive*:
a Pull is refused with FAILED_PRECONDITION while any StreamingPull client is connected (Pulls
waiting when a stream is admitted end with it too); with no stream connected Pulls are served,
and they never hold the subscription against a stream that comes later. *failover*: a Pull is a
standby ranked after every stream: it gets nothing (an empty response when its wait ends) while
a stream is connected, and a waiting Pull takes over as soon as the last stream leaves.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from pubsubd.core import quotas
from pubsubd.core.errors import InvalidArgument

PREFIX = "pubsubd-"
TYPE_LABEL = "pubsubd-subscription-type"
NACK_DELAY_LABEL = "pubsubd-nack-delay-seconds"
MAX_OUTSTANDING_MESSAGES_LABEL = "pubsubd-max-outstanding-messages"
MAX_OUTSTANDING_BYTES_LABEL = "pubsubd-max-outstanding-bytes"
CONSUMER_MAX_OUTSTANDING_LABEL = "pubsubd-consumer-max-outstanding-messages"
CONSUMER_MAX_OUTSTANDING_BYTES_LABEL = "pubsubd-consumer-max-outstanding-bytes"
DELIVERY_ATTEMPTS_LABEL = "pubsubd-delivery-attempts"
KNOWN = frozenset(
    {
        TYPE_LABEL,
        NACK_DELAY_LABEL,
        MAX_OUTSTANDING_MESSAGES_LABEL,
        MAX_OUTSTANDING_BYTES_LABEL,
        CONSUMER_MAX_OUTSTANDING_LABEL,
        CONSUMER_MAX_OUTSTANDING_BYTES_LABEL,
        DELIVERY_ATTEMPTS_LABEL,
    }
    | quotas.LABELS
)
MAX_NACK_DELAY_S = 600


class SubscriptionType(enum.Enum):
    SHARED = "shared"
    EXCLUSIVE = "exclusive"
    FAILOVER = "failover"
    KEY_SHARED = "key_shared"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    type: SubscriptionType = SubscriptionType.SHARED
    nack_delay_s: int = 0
    max_outstanding_messages: int = 0  # 0 = no cap
    max_outstanding_bytes: int = 0
    consumer_max_outstanding_messages: int = 0
    consumer_max_outstanding_bytes: int = 0
    quota: quotas.BacklogQuota | None = None  # the subscription's own backlog quota, if any
    always_report_attempts: bool = False  # delivery_attempt without a dead-letter policy


# What a subscription without labels gets; immutable, so every such subscription shares it.
DEFAULT = QueueSettings()


def _int(labels: Mapping[str, str], key: str, low: int, high: int) -> int:
    raw = labels.get(key)
    if raw is None:
        return 0
    if not raw.isdigit():
        raise InvalidArgument(f"labels[{key!r}]: {raw!r} is not a whole number")
    value = int(raw)
    if not low <= value <= high:
        raise InvalidArgument(f"labels[{key!r}]: {value} must be between {low} and {high}")
    return value


def parse(labels: Mapping[str, str]) -> QueueSettings:
    """Settings from a subscription's labels; raise InvalidArgument naming a bad label."""
    if not labels:
        return DEFAULT
    for key in labels:
        if key.startswith(PREFIX) and key not in KNOWN:
            raise InvalidArgument(
                f"labels[{key!r}]: unknown pubsubd setting; known: {', '.join(sorted(KNOWN))}"
            )
    raw_type = labels.get(TYPE_LABEL, SubscriptionType.SHARED.value)
    try:
        kind = SubscriptionType(raw_type)
    except ValueError:
        allowed = ", ".join(t.value for t in SubscriptionType)
        raise InvalidArgument(f"labels[{TYPE_LABEL!r}]: {raw_type!r}; one of {allowed}") from None
    attempts = labels.get(DELIVERY_ATTEMPTS_LABEL)
    if attempts not in (None, "always"):
        raise InvalidArgument(f"labels[{DELIVERY_ATTEMPTS_LABEL!r}]: {attempts!r}; only 'always'")
    big = 1 << 40
    return QueueSettings(
        type=kind,
        nack_delay_s=_int(labels, NACK_DELAY_LABEL, 0, MAX_NACK_DELAY_S),
        max_outstanding_messages=_int(labels, MAX_OUTSTANDING_MESSAGES_LABEL, 1, big),
        max_outstanding_bytes=_int(labels, MAX_OUTSTANDING_BYTES_LABEL, 1, big),
        consumer_max_outstanding_messages=_int(labels, CONSUMER_MAX_OUTSTANDING_LABEL, 1, big),
        consumer_max_outstanding_bytes=_int(labels, CONSUMER_MAX_OUTSTANDING_BYTES_LABEL, 1, big),
        quota=quotas.parse(labels),
        always_report_attempts=attempts == "always",
    )
