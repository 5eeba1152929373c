"""Majority bookkeeping for replicated writes: which replica acked what, what is committed.

Pure logic, no I/O. Writes are numbered with increasing sequence numbers ``1, 2, ...``;
a replica acknowledging ``upto_seq`` has durably applied every write up to and including
that number. A write is committed once a majority of the replicas acknowledged it.
"""

from __future__ import annotations


def majority(replicas: int) -> int:
    """Smallest number of replicas that forms a majority of ``replicas``."""
    return replicas // 2 + 1


class QuorumTracker:
    """Tracks per-replica acknowledgements and the highest majority-acked sequence."""

    __slots__ = ("_acked", "_majority")

    def __init__(self, replicas: int) -> None:
        if replicas < 1 or replicas % 2 == 0:
            raise ValueError(f"the number of replicas must be odd and >= 1, got {replicas}")
        self._acked = [0] * replicas
        self._majority = majority(replicas)

    @property
    def replicas(self) -> int:
        """Number of replicas tracked."""
        return len(self._acked)

    @property
    def majority(self) -> int:
        """Number of acknowledgements needed to commit."""
        return self._majority

    def ack(self, replica_index: int, upto_seq: int) -> None:
        """Record that replica ``replica_index`` applied every write up to ``upto_seq``."""
        if not 0 <= replica_index < len(self._acked):
            raise IndexError(f"replica index {replica_index} out of range")
        if upto_seq > self._acked[replica_index]:
            self._acked[replica_index] = upto_seq

    def acked(self, replica_index: int) -> int:
        """Highest sequence acknowledged by one replica (0 if none)."""
        return self._acked[replica_index]

    def committed(self) -> int:
        """Highest sequence acknowledged by a majority of the replicas (0 if none)."""
        return sorted(self._acked, reverse=True)[self._majority - 1]
