"""pubsubd's StreamingPull extension for failover notices (pure).

A stream opened with the request header ``pubsubd-active-notices: 1`` is told, on a failover
subscription, when it becomes or stops being a receiver (one that the server hands messages
to): a response holding only field 1000, a varint (1 = active, 0 = not), which Google's
StreamingPullResponse does not have, so the response parses as an empty one anywhere else.
It is written in order with the stream's messages. The Pulsar front turns it into
ACTIVE_CONSUMER_CHANGE; Google's clients never ask for it.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER = "pubsubd-active-notices"
_TAG = b"\xc0\x3e"  # field 1000, wire type 0 (varint)


@dataclass(frozen=True, slots=True)
class ActiveNotice:
    """A stream's receiver state changed (the data plane queues it with its responses)."""

    active: bool


def encode(active: bool) -> bytes:
    """The serialized StreamingPullResponse carrying the notice."""
    return _TAG + (b"\x01" if active else b"\x00")


def decode(raw: bytes) -> bool | None:
    """The notice a serialized response carries; None for any other response."""
    if len(raw) == 3 and raw[:2] == _TAG:
        return raw[2] == 1
    return None


def wanted(value: str | bytes) -> bool:
    """Whether a ``pubsubd-active-notices`` header value asks for notices."""
    return (value.decode() if isinstance(value, bytes) else value).strip() == "1"
