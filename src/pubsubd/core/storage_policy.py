"""Where a topic's messages may be stored in a cluster, from the Topic itself (pure).

- ``message_storage_policy.allowed_persistence_regions``: the storage nodes' zones its ledgers
  may use (Google's regions map onto pubsubd's zones); empty or unset: any zone.
- label ``pubsubd-storage-replicas``: copies of each ledger, 1-15 (default: the server's
  ``--replicas``; at most the storage nodes there are), acknowledged at a majority of them.

One process with embedded storage keeps everything on its disk and ignores both (it validates
the label all the same, so a topic created there works in a cluster).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pubsubd.core.errors import InvalidArgument

REPLICAS_LABEL = "pubsubd-storage-replicas"
MAX_REPLICAS = 15


@dataclass(frozen=True, slots=True)
class TopicStorage:
    replicas: int | None = None  # None: the server's default
    zones: frozenset[str] = field(default_factory=frozenset)  # empty: any zone


def replicas(labels: Mapping[str, str]) -> int | None:
    raw = labels.get(REPLICAS_LABEL)
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_REPLICAS:
        raise InvalidArgument(
            f"labels[{REPLICAS_LABEL!r}]: {raw!r} must be a whole number from 1 to {MAX_REPLICAS}"
        )
    return int(raw)


def parse(topic: Any) -> TopicStorage:
    """The storage policy of a ``google.pubsub.v1.Topic``; INVALID_ARGUMENT for a bad label."""
    zones = frozenset(topic.message_storage_policy.allowed_persistence_regions)
    return TopicStorage(replicas(topic.labels), zones)
