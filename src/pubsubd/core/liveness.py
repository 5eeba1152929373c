"""Whether the process behind an ephemeral znode is dead, before ZooKeeper says so (pure).

An owner znode (a source's writer) and a forwarder's registration are ephemeral: they go when
their ZooKeeper session expires, the session timeout after a kill -9 (10 s by default). Waiting
that long is only needed when nothing better is known. Two facts are definitive:

* **Same machine, same PID namespace:** no process has the owner's PID, or the one that has it
  started at another time (the PID was reused). Read from ``/proc`` by the caller.
* **Its address:** nothing listens there (connection refused), or whoever answers there holds
  another ZooKeeper session (the process was restarted on the same port). Asked by the caller
  with ``pubsubd.internal.v1.Forwarder/Identify``.

Anything else (a timeout, an unreachable host, a process of an earlier release without
``Identify``) is UNKNOWN: the caller waits for the session to expire, as before. Declaring a
live process dead by mistake costs availability, not data: taking over fences its ledgers on
the storage nodes (SCALE_OUT.md §2), so its later appends are refused.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass
from typing import Any

# The gRPC details of a call whose connection was refused (grpc 1.6x-1.8x wording).
_REFUSED = "connection refused"


class Liveness(enum.Enum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Who wrote an ephemeral znode: enough to recognise the same process later.

    ``boot`` is the kernel's boot ID and ``pidns`` the PID namespace, so a PID is compared only
    where it means the same process; ``started`` is its start time in clock ticks since boot
    (``/proc/PID/stat`` field 22), which tells a reused PID apart; ``address`` is the gRPC
    address it serves (empty before it listens)."""

    host: str
    pid: int
    boot: str = ""
    pidns: str = ""
    started: int = 0
    address: str = ""

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> ProcessIdentity | None:
        """The identity in a znode's data, or None when it holds none (another writer, an
        earlier release's ``{"host", "pid"}`` is still read)."""
        try:
            raw: Any = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("pid"), int):
            return None
        return cls(
            host=str(raw.get("host", "")),
            pid=int(raw["pid"]),
            boot=str(raw.get("boot", "")),
            pidns=str(raw.get("pidns", "")),
            started=int(raw.get("started", 0) or 0),
            address=str(raw.get("address", "")),
        )

    def same_machine(self, other: ProcessIdentity) -> bool:
        """Whether a PID of ``other`` names a process here (same boot, same PID namespace)."""
        return bool(self.boot) and self.boot == other.boot and self.pidns == other.pidns


def local_verdict(owner: ProcessIdentity, here: ProcessIdentity, started: int | None) -> Liveness:
    """From this machine's process table: ``started`` is the start time of the process now
    holding the owner's PID here (None: no such process)."""
    if not here.same_machine(owner):
        return Liveness.UNKNOWN
    if owner.pid == here.pid and owner.started == here.started:
        return Liveness.ALIVE  # this very process
    if started is None:
        return Liveness.DEAD
    if owner.started and started != owner.started:
        return Liveness.DEAD  # the PID now belongs to another process
    return Liveness.ALIVE


def probe_verdict(
    refused_or_details: str | None, answered_session: int | None, owner_session: int
) -> Liveness:
    """From asking the owner's address who is there: ``refused_or_details`` is the error's
    details when the call failed (None when it was answered), ``answered_session`` the
    ZooKeeper session the answering process holds (0 or None: it holds none)."""
    if refused_or_details is not None:
        return Liveness.DEAD if _REFUSED in refused_or_details.lower() else Liveness.UNKNOWN
    if not answered_session:
        return Liveness.UNKNOWN  # starting up or between sessions: it may be the owner
    return Liveness.ALIVE if answered_session == owner_session else Liveness.DEAD


class Suspicion:
    """Consecutive DEAD verdicts per member: a member is declared dead after ``strikes`` in a
    row (one refused connection may be a restart racing the probe); any other verdict clears
    its count."""

    __slots__ = ("_counts", "strikes")

    def __init__(self, strikes: int = 2) -> None:
        if strikes < 1:
            raise ValueError(f"strikes must be at least 1, got {strikes}")
        self.strikes = strikes
        self._counts: dict[str, int] = {}

    def observe(self, member: str, verdict: Liveness) -> bool:
        """Record a verdict; True when ``member`` is now declared dead (its count restarts)."""
        if verdict is not Liveness.DEAD:
            self._counts.pop(member, None)
            return False
        count = self._counts.get(member, 0) + 1
        if count >= self.strikes:
            self._counts.pop(member, None)
            return True
        self._counts[member] = count
        return False

    def keep_only(self, members: set[str]) -> None:
        """Forget members no longer listed."""
        for member in [m for m in self._counts if m not in members]:
            del self._counts[member]
