"""The session lease (coordination/lease.py): what a process may assume about its own
ZooKeeper session from the send times of answered requests."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pubsubd.coordination.lease import SAFETY, SessionLease, lease_clock


def test_no_lease_before_the_first_answer() -> None:
    lease = SessionLease(10.0)
    assert not lease.holds(0.0)
    assert lease.age(5.0) is None


def test_a_lease_holds_for_a_safe_share_of_the_timeout_after_the_send_time() -> None:
    lease = SessionLease(10.0)
    lease.confirmed(100.0)
    assert lease.holds(100.0 + 10.0 * SAFETY - 0.001)
    assert not lease.holds(100.0 + 10.0 * SAFETY)
    assert lease.age(103.0) == 3.0


def test_a_late_answer_to_an_older_request_does_not_shorten_or_stretch_the_lease() -> None:
    lease = SessionLease(10.0)
    lease.confirmed(100.0)
    lease.confirmed(90.0)  # answered after the other, sent before it
    assert lease.confirmed_at == 100.0


def test_a_lost_session_never_holds_again() -> None:
    lease = SessionLease(10.0)
    lease.confirmed(100.0)
    lease.expire()
    lease.confirmed(101.0)  # an answer in the new session proves nothing about the old
    assert not lease.holds(101.0)


def test_the_clock_moves_forward() -> None:
    a = lease_clock()
    assert lease_clock() >= a


@given(
    timeout=st.floats(0.5, 60.0),
    sends=st.lists(st.floats(0.0, 1000.0), min_size=1, max_size=20),
    later=st.floats(0.0, 100.0),
)
def test_a_lease_holds_only_within_the_timeout_of_some_answered_send(
    timeout: float, sends: list[float], later: float
) -> None:
    """The property that makes acknowledgements safe: whenever the lease holds, a request
    answered in the session was sent less than the session timeout ago, so ZooKeeper cannot
    have expired the session yet."""
    lease = SessionLease(timeout)
    for sent in sends:
        lease.confirmed(sent)
    now = max(sends) + later  # asked after every answer arrived
    if lease.holds(now):
        assert any(sent <= now < sent + timeout for sent in sends)
    assert lease.holds(now) == (later < timeout * SAFETY)
