"""Delayed delivery attributes: when a message may first be delivered (pure).

A publisher delays a message with one of two attributes (any official client can set them):

- ``pubsubd.deliver_at``: an RFC 3339 time, e.g. ``2026-11-21T18:00:00Z``;
- ``pubsubd.deliver_after``: seconds after the publish time, e.g. ``"30"`` or ``"2.5"``.

Each subscription delivers such a message no earlier than that time. The messages stay in the
log; what falls due when is kept on disk by the delay index (storage/delay_index.py, driven per
topic by data/publish/delays.py), so millions of delayed messages cost no memory and survive
restarts.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pubsubd.core.errors import InvalidArgument

DELIVER_AT = "pubsubd.deliver_at"
DELIVER_AFTER = "pubsubd.deliver_after"
# Bytes every stored batch holding a delay attribute contains (a cheap test before parsing).
MARKER = b"pubsubd.deliver_"
# Delays beyond this are almost certainly mistakes (and would pin the log for years).
MAX_DELAY_S = 366 * 24 * 3600


def deliver_at(attributes: Mapping[str, str], publish_time_s: float) -> float | None:
    """The epoch time before which the message must not be delivered, or None."""
    at = attributes.get(DELIVER_AT)
    after = attributes.get(DELIVER_AFTER)
    if at is None and after is None:
        return None
    if at is not None and after is not None:
        raise InvalidArgument(f"attributes: set {DELIVER_AT} or {DELIVER_AFTER}, not both")
    if after is not None:
        try:
            seconds = float(after)
        except ValueError:
            raise InvalidArgument(
                f"attributes[{DELIVER_AFTER!r}]: {after!r} is not a number of seconds"
            ) from None
        if not 0 <= seconds <= MAX_DELAY_S:
            raise InvalidArgument(
                f"attributes[{DELIVER_AFTER!r}]: must be between 0 and {MAX_DELAY_S} seconds"
            )
        return publish_time_s + seconds
    assert at is not None
    try:
        when = dt.datetime.fromisoformat(at.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidArgument(
            f"attributes[{DELIVER_AT!r}]: {at!r} is not an RFC 3339 time"
        ) from None
    if when.tzinfo is None:
        raise InvalidArgument(f"attributes[{DELIVER_AT!r}]: {at!r} needs a time zone (e.g. Z)")
    epoch = when.timestamp()
    if epoch - publish_time_s > MAX_DELAY_S:
        raise InvalidArgument(f"attributes[{DELIVER_AT!r}]: more than a year ahead")
    return epoch


def deliver_at_us(attributes: Mapping[str, str], publish_time_us: int) -> int | None:
    """``deliver_at`` in epoch microseconds (rounded up: never early), or None."""
    at = deliver_at(attributes, publish_time_us / 1e6)
    return None if at is None else max(publish_time_us, math.ceil(at * 1e6))


def due_times(messages: Sequence[Any], publish_time_us: int) -> list[int | None] | None:
    """``deliver_at_us`` of each message of one stored batch (None where a message is not
    delayed), or None when none is. Memoized per attribute value: a batch usually repeats one
    delay. Invalid values (refused at publish) count as not delayed."""
    out: list[int | None] | None = None
    memo: dict[tuple[str | None, str | None], int | None] = {}
    for i, m in enumerate(messages):
        attrs = m.attributes
        if not attrs:
            continue
        at, after = attrs.get(DELIVER_AT), attrs.get(DELIVER_AFTER)
        if at is None and after is None:
            continue
        key = (at, after)
        if key in memo:
            due = memo[key]
        else:
            try:
                due = deliver_at_us(attrs, publish_time_us)
            except InvalidArgument:
                due = None
            memo[key] = due
        if out is None:
            out = [None] * len(messages)
        out[i] = due
    return out
