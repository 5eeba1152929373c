"""The storage node protocol's versions and method paths.

They are defined in ``pubsubd.storage.node_client`` (the storage layer, so forwarders can use
them) and re-exported here, where the proto's comment points.
"""

from __future__ import annotations

from pubsubd.storage.node_client import (
    APPEND,
    DELETE_LEDGER,
    FENCE,
    HEALTH,
    LIST_LEDGERS,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    READ,
    SERVICE,
)

__all__ = [
    "APPEND",
    "DELETE_LEDGER",
    "FENCE",
    "HEALTH",
    "LIST_LEDGERS",
    "MIN_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "READ",
    "SERVICE",
]
