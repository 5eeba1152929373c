"""What delivery does at damaged stored messages, from a topic label (pure).

| label                     | value                                                          |
|---------------------------|----------------------------------------------------------------|
| pubsubd-damaged-entries   | ``stop`` (default) or ``skip``                                 |

A read that reaches a damaged range of a publish message source (``storage/damage.py``: bytes
that fail their CRC, a lost sector or file) cannot deliver the messages stored there.

- ``stop``: the subscription stops at the damage in that source, as Kafka and Pulsar do by
  default: nothing is skipped without an operator's say. The other sources keep delivering;
  a consumer that has nothing else to receive gets DATA_LOSS naming the damage and the way
  out, and delivery resumes by itself once the bytes are restored (the log rechecks them) or
  the operator skips them (``pubsubd topics skip-damaged``).
- ``skip``: every subscription acknowledges the damaged messages as it reaches them; they are
  counted as lost (``pubsubd_lost_messages_total{reason="damaged"}``) and logged.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from pubsubd.core.errors import InvalidArgument

LABEL = "pubsubd-damaged-entries"


class DamagePolicy(enum.Enum):
    STOP = "stop"
    SKIP = "skip"


def parse(labels: Mapping[str, str]) -> DamagePolicy:
    """The policy a topic's labels name (``stop`` when absent); INVALID_ARGUMENT otherwise."""
    raw = labels.get(LABEL)
    if raw is None:
        return DamagePolicy.STOP
    try:
        return DamagePolicy(raw)
    except ValueError:
        choices = ", ".join(p.value for p in DamagePolicy)
        raise InvalidArgument(f"labels[{LABEL!r}]: {raw!r} must be one of {choices}") from None
