"""Leases of one subscription: which delivered messages are outstanding, until when, and for whom.

Pure: no asyncio, no clock reads; ``now`` is always a parameter.

Rules:
1. A delivered position holds exactly one lease; each delivery gets a new generation, which is
   part of the ack ID, so a stale ack ID can be told from the current one.
2. A lease ends by ack (``release``), by nack (``release``, the caller requeues) or by expiry
   (``expired`` returns it once, in deadline order). An extended lease keeps its generation.
3. ``attempts`` counts deliveries per position (1 + nacks + expiries) until the position is
   acked (``forget``); it survives lease ends, so redeliveries count up. A lease given back
   (``give_back``: its consumer never received the message) ends without counting.
5. A lease is *confirmed* once the client changed its deadline (the official clients send a
   receipt deadline change for every message they receive); an unconfirmed expiry suggests the
   consumer never got the message.
4. Expiry uses a heap with lazy deletion: a heap item is live only if its (position, generation,
   deadline) still matches the lease table. Acked leases leave stale items behind until their
   deadline, so the heap is rebuilt from the live leases whenever stale items outnumber them
   (``COMPACT_SLACK``): its size stays proportional to the outstanding messages, not to the
   delivery rate times the ack deadline.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

# The heap is rebuilt when it holds more than twice the live leases plus this many items.
COMPACT_SLACK = 4096


@dataclass(slots=True)
class Lease:
    generation: int
    deadline: float
    consumer: int  # id of the stream or pull that holds it
    size: int  # bytes, for flow control
    confirmed: bool = False  # the client acted on it (deadline change): it did arrive


@dataclass(slots=True)
class LeaseTable:
    _leases: dict[int, Lease] = field(default_factory=dict)
    _heap: list[tuple[float, int, int]] = field(default_factory=list)
    _attempts: dict[int, int] = field(default_factory=dict)
    _next_generation: int = 1

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, pos: int) -> bool:
        return pos in self._leases

    def get(self, pos: int) -> Lease | None:
        return self._leases.get(pos)

    def grant(self, pos: int, now: float, deadline_s: float, consumer: int, size: int) -> Lease:
        """Lease ``pos`` to ``consumer``; return the lease (its generation goes in the ack ID)."""
        gen = self._next_generation
        self._next_generation += 1
        lease = Lease(gen, now + deadline_s, consumer, size)
        self._leases[pos] = lease
        heapq.heappush(self._heap, (lease.deadline, pos, gen))
        self._attempts[pos] = self._attempts.get(pos, 0) + 1
        if len(self._heap) > 2 * len(self._leases) + COMPACT_SLACK:
            self._compact()
        return lease

    def _compact(self) -> None:
        self._heap = [(lease.deadline, p, lease.generation) for p, lease in self._leases.items()]
        heapq.heapify(self._heap)

    @property
    def next_generation(self) -> int:
        """The generation the next grant gets (generations only grow, even across clear)."""
        return self._next_generation

    def attempts(self, pos: int) -> int:
        return self._attempts.get(pos, 0)

    def extend(self, pos: int, now: float, seconds: float) -> Lease | None:
        """Set the deadline of a current lease to now + seconds; None if it is not leased."""
        lease = self._leases.get(pos)
        if lease is None:
            return None
        lease.deadline = now + seconds
        lease.confirmed = True
        heapq.heappush(self._heap, (lease.deadline, pos, lease.generation))
        if len(self._heap) > 2 * len(self._leases) + COMPACT_SLACK:
            self._compact()
        return lease

    def release(self, pos: int) -> Lease | None:
        """End the lease of ``pos`` (ack or nack); return it, or None if it was not leased."""
        return self._leases.pop(pos, None)

    def give_back(self, pos: int, consumer: int) -> Lease | None:
        """``consumer`` never received ``pos`` (its Pull was cancelled, its client vanished
        before the response went out): end the lease and undo its delivery count. Only the
        holder's current lease is given back; return it, or None if ``consumer`` holds none."""
        lease = self._leases.get(pos)
        if lease is None or lease.consumer != consumer:
            return None
        del self._leases[pos]
        left = self._attempts.get(pos, 0) - 1
        if left > 0:
            self._attempts[pos] = left
        else:
            self._attempts.pop(pos, None)
        return lease

    def forget(self, pos: int) -> None:
        """The position is acked: drop its delivery count too."""
        self._leases.pop(pos, None)
        self._attempts.pop(pos, None)

    def expired(self, now: float) -> list[tuple[int, Lease]]:
        """End and return the leases whose deadline is <= now, in deadline order."""
        out: list[tuple[int, Lease]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, pos, gen = heapq.heappop(heap)
            lease = self._leases.get(pos)
            if lease is not None and lease.generation == gen and lease.deadline == deadline:
                del self._leases[pos]
                out.append((pos, lease))
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline that may still be live (heap items may be stale)."""
        heap = self._heap
        while heap:
            deadline, pos, gen = heap[0]
            lease = self._leases.get(pos)
            if lease is not None and lease.generation == gen and lease.deadline == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    def held_by(self, consumer: int) -> list[int]:
        return [p for p, lease in self._leases.items() if lease.consumer == consumer]

    def clear(self) -> None:
        self._leases.clear()
        self._heap.clear()
        self._attempts.clear()
