"""A windowed client's window split over a spread stream's legs (frontend/leg_windows.py)."""

from __future__ import annotations

import pytest

from pubsubd.core import pb
from pubsubd.frontend.leg_windows import LegWindows, received_count, settled_count

pytestmark = pytest.mark.unit


def test_the_legs_together_lease_the_window_once() -> None:
    w = LegWindows(3)
    assert not w.active
    w.delivered(0, 5)  # before the client moves its window: not counted
    assert w.outstanding == [0, 0, 0]
    assert sum(w.split(9)) == 9 and w.active
    w.delivered(0, 3)
    w.delivered(2, 3)
    # 6 outstanding, 4 free: each leg keeps room for what it holds, the free part is shared.
    windows = w.split(10)
    assert sum(windows) == 10
    assert all(win >= out for win, out in zip(windows, w.outstanding, strict=True))
    w.settled(0, 3)
    assert w.outstanding == [0, 0, 3]
    w.settled(1, 5)  # more than it had (a lease it never counted): never below 0
    assert w.outstanding == [0, 0, 3]


def test_a_small_window_gives_each_leg_at_least_one_and_rotates_the_rest() -> None:
    w = LegWindows(3)
    assert w.split(1) == [1, 1, 1]  # 0 would mean unlimited: at most legs - 1 over
    firsts = [w.split(4) for _ in range(3)]
    assert all(sum(s) == 4 for s in firsts)
    # The uneven remainder goes round: each leg gets the extra once in three splits.
    assert [max(range(3), key=lambda i, s=s: s[i]) for s in firsts] == [1, 2, 0]


def test_a_full_window_leaves_no_leg_more_than_it_holds() -> None:
    w = LegWindows(2)
    w.split(4)
    w.delivered(0, 4)
    assert w.split(4) == [4, 1]  # nothing free: leg 1 at its floor of 1


def test_counts_of_requests_and_responses() -> None:
    assert settled_count(["a", "b"], [0, 10, 0]) == 4
    response = pb.StreamingPullResponse(
        received_messages=[
            pb.ReceivedMessage(ack_id=f"a{i}", message=pb.PubsubMessage(data=b"x" * 300))
            for i in range(7)
        ]
    )
    response.subscription_properties.message_ordering_enabled = True
    assert received_count(response.SerializeToString()) == 7
    assert received_count(b"") == 0
    assert received_count(b"\xc0\x3e\x01") == 0  # an active notice (field 1000, varint)
