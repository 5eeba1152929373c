"""What a process may assume about its own ZooKeeper session, from its own clock (pure).

An owner that answers a client on the strength of an ephemeral znode must know that the
znode still exists *when it answers*. kazoo reports a lost session only once it hears so from
a server, and a process stopped (SIGSTOP, a VM pause, a long GC) for longer than the session
timeout resumes with work in flight before kazoo has said anything: meanwhile another
process may have taken the source over, and its ledgers, fences included, may have been
trimmed and deleted, so nothing on the storage nodes refuses the zombie any more.

ZooKeeper expires a session only after ``timeout`` without hearing from it, so a request
*sent* at ``t`` and answered in the session proves the session alive until ``t + timeout``
(the server heard from it no earlier than ``t``). The lease keeps the latest such ``t`` and
holds until ``t + timeout * SAFETY``; the factor leaves room for clocks running at slightly
different rates. Times come from a clock that keeps counting while the process is stopped
(``CLOCK_BOOTTIME`` on Linux, which also counts a suspended machine; ``CLOCK_MONOTONIC``
elsewhere).

The timeout is the one the process asked for. A server only ever raises a requested timeout
below its ``minSessionTimeout`` (2 ticks) and lowers one above its ``maxSessionTimeout`` (20
ticks, 40 s at the default tick): ask for no more than that, as every pubsubd process does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

SAFETY = 0.8

_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def lease_clock() -> float:
    """Seconds on a clock that counts the time the process is stopped."""
    return time.clock_gettime(_CLOCK)


@dataclass(slots=True)
class SessionLease:
    """The latest proof that the session was alive, and what it is worth."""

    timeout_s: float
    confirmed_at: float | None = None  # the send time of the latest request answered
    lost: bool = False  # the session expired once: nothing it held can be trusted again

    @property
    def term_s(self) -> float:
        return self.timeout_s * SAFETY

    def confirmed(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` (``lease_clock``) was answered in the session."""
        if self.confirmed_at is None or sent_at > self.confirmed_at:
            self.confirmed_at = sent_at

    def expire(self) -> None:
        self.lost = True

    def holds(self, now: float) -> bool:
        """True while the session is certainly alive."""
        return (
            not self.lost
            and self.confirmed_at is not None
            and now < self.confirmed_at + self.term_s
        )

    def age(self, now: float) -> float | None:
        """Seconds since the latest proof was sent (None before the first)."""
        return None if self.confirmed_at is None else now - self.confirmed_at
