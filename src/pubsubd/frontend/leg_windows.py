"""A windowed client's message window split over a spread stream's legs (pure).

A client that moves its stream's ``max_outstanding_messages`` on later requests (a pubsubd
extension the Pulsar front uses: the window is what its consumer holds plus its unused
permits, ``pulsar/consumers.py``) means the window for the whole stream. A spread
subscription's frontend (``spread_proxy.py``) sends each leg a window of its own: what that
leg has outstanding with the client plus a share of what the window leaves free, so the legs
together lease at most the window (each at least 1, which Google's semantics would read as
unlimited at 0: at most ``legs - 1`` over). A leg's outstanding count grows with the
messages it delivers to the client and shrinks with the client's acks and nacks (deadline 0)
sent to it; a lease the forwarder lets expire is not seen, so the count can only be too high
(a leg then takes less, never more). The remainder of an uneven split goes round the legs.

Counting starts with the first move: what a leg delivered before it (the Pulsar front's first
window is 1, so at most one message a leg) is not counted. A client that never moves its
window (Google's clients send it once, in the first request) is not counted at all: every
leg gets that first request's window, up to legs x it in all.
"""

from __future__ import annotations

from collections.abc import Sequence


class LegWindows:
    """Outstanding messages per leg, and the split of a window over the legs."""

    __slots__ = ("_turn", "active", "outstanding")

    def __init__(self, legs: int) -> None:
        self.outstanding = [0] * legs
        self.active = False  # the client moved its window: count and split from now on
        self._turn = 0

    def delivered(self, leg: int, count: int) -> None:
        if self.active:
            self.outstanding[leg] += count

    def settled(self, leg: int, count: int) -> None:
        """Acks and nacks of ``count`` messages went to ``leg``."""
        if self.active:
            self.outstanding[leg] = max(0, self.outstanding[leg] - count)

    def split(self, window: int) -> list[int]:
        """Each leg's window for the client's ``window`` (> 0); from now on it is counted."""
        self.active = True
        legs = len(self.outstanding)
        free = max(0, window - sum(self.outstanding))
        base, extra = divmod(free, legs)
        start = self._turn % legs
        self._turn += 1
        return [
            max(1, out + base + ((i - start) % legs < extra))
            for i, out in enumerate(self.outstanding)
        ]


def settled_count(ack_ids: Sequence[str], deadline_seconds: Sequence[int]) -> int:
    """Messages a request's part settles: its acks and its deadline changes to 0 (nacks)."""
    return len(ack_ids) + sum(1 for seconds in deadline_seconds if seconds == 0)


def received_count(response: bytes) -> int:
    """The ReceivedMessages of a serialized StreamingPullResponse (field 1), counted by
    walking its top-level fields without parsing them."""
    count, at, end = 0, 0, len(response)
    while at < end:
        key, at = _varint(response, at)
        wire_type = key & 7
        if wire_type == 2:
            length, at = _varint(response, at)
            at += length
            if key >> 3 == 1:
                count += 1
        elif wire_type == 0:
            _, at = _varint(response, at)
        elif wire_type == 5:
            at += 4
        elif wire_type == 1:
            at += 8
        else:
            break  # not a response this proxy passes on
    return count


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
