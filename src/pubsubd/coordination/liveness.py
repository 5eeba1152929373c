"""Telling a dead owner of an ephemeral znode before its ZooKeeper session expires.

``this_process`` is what a process writes into the ephemeral znodes it owns (a source's owner
znode: ``storage/ledgers/directory.py``). ``OwnerCheck`` reads such a znode's writer back and
decides, by the rules of ``core/liveness.py``: from this machine's process table when the owner
ran here, else by asking its address who serves there (the ``AddressProbe``, a gRPC call the
composition root passes in: nothing at this layer speaks gRPC).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from pubsubd.core.liveness import Liveness, ProcessIdentity, local_verdict

# (address, the owner's ZooKeeper session) -> the verdict and why.
AddressProbe = Callable[[str, int], Awaitable[tuple[Liveness, str]]]


def _read(path: str) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text().strip()
    return ""


def start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of the process with ``pid`` here, or None when
    there is none."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    # Field 2 (the command) is in parentheses and may hold spaces: count from its end.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def this_process(address: str = "") -> ProcessIdentity:
    pidns = ""
    with contextlib.suppress(OSError):
        pidns = os.readlink("/proc/self/ns/pid")
    return ProcessIdentity(
        host=socket.gethostname(),
        pid=os.getpid(),
        boot=_read("/proc/sys/kernel/random/boot_id"),
        pidns=pidns,
        started=start_time(os.getpid()) or 0,
        address=address,
    )


class OwnerCheck:
    """Decides whether the writer of an ephemeral znode is dead (see ``core/liveness.py``)."""

    def __init__(self, here: ProcessIdentity, probe: AddressProbe | None = None) -> None:
        self.here = here
        self._probe = probe

    async def verdict(self, data: bytes, owner_session: int) -> tuple[Liveness, str]:
        owner = ProcessIdentity.decode(data)
        if owner is None:
            return Liveness.UNKNOWN, "the znode names no process"
        local = local_verdict(owner, self.here, start_time(owner.pid))
        if local is Liveness.DEAD:
            return local, f"process {owner.pid} on {owner.host} is gone"
        if local is Liveness.ALIVE:
            return local, f"process {owner.pid} on {owner.host} runs"
        if owner.address and self._probe is not None:
            return await self._probe(owner.address, owner_session)
        return Liveness.UNKNOWN, f"process {owner.pid} on {owner.host}: no address to ask"
