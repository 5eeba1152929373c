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
4. Expiry uses a heap of *runs* with lazy deletion: one heap item per grant or extension call,
   holding every position it leased or extended with one deadline (a response's messages are
   granted together), so the heap costs one push per response, not per message. A run's
   position is live only if its (generation, deadline) still matches the lease table; the run
   remembers how far its dead prefix goes, so each position is looked at about once by
   ``next_deadline``. Ended leases leave stale entries behind until their run is popped, so the
   heap is rebuilt from the live leases whenever the runs' entries outnumber twice the live
   leases plus ``COMPACT_SLACK``: its size stays proportional to the outstanding messages, not
   to the delivery rate times the ack deadline. ``expired`` returns leases in (deadline,
   position) order, as one heap item per lease did.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat

# The heap is rebuilt when it holds more than twice the live leases plus this many items.
COMPACT_SLACK = 4096


@dataclass(slots=True)
class Lease:
    generation: int
    deadline: float
    consumer: int  # id of the stream or pull that holds it
    size: int  # bytes, for flow control
    confirmed: bool = False  # the client acted on it (deadline change): it did arrive


class _Run:
    """Positions leased or extended by one call, with one deadline; ``generations[k]`` is the
    generation of ``positions[k]``'s lease when the run was made. ``dead`` counts the leading
    positions known to be stale (they never become live again: see ``next_deadline``)."""

    __slots__ = ("dead", "generations", "positions")

    def __init__(self, positions: list[int], generations: list[int] | range) -> None:
        self.positions = positions
        self.generations = generations
        self.dead = 0


@dataclass(slots=True)
class LeaseTable:
    _leases: dict[int, Lease] = field(default_factory=dict)
    # (deadline, sequence, run): the sequence orders runs of one deadline, never compared runs
    _heap: list[tuple[float, int, _Run]] = field(default_factory=list)
    _attempts: dict[int, int] = field(default_factory=dict)
    _next_generation: int = 1
    _entries: int = 0  # positions held by the heap's runs
    _sequence: int = 0

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, pos: int) -> bool:
        return pos in self._leases

    @property
    def leased(self) -> Mapping[int, Lease]:
        """Position -> its lease (read-only view for hot loops: ``pos in leased``)."""
        return self._leases

    def get(self, pos: int) -> Lease | None:
        return self._leases.get(pos)

    def grant(self, pos: int, now: float, deadline_s: float, consumer: int, size: int) -> Lease:
        """Lease ``pos`` to ``consumer``; return the lease (its generation goes in the ack ID)."""
        self.grant_run([pos], [size], now, deadline_s, consumer)
        return self._leases[pos]

    def grant_run(
        self,
        positions: list[int],
        sizes: list[int],
        now: float,
        deadline_s: float,
        consumer: int,
    ) -> int:
        """Lease each of ``positions`` (distinct) to ``consumer``, with one deadline; the k-th
        gets generation ``first + k`` where ``first`` is returned (as ``grant`` one by one)."""
        first = self._next_generation
        count = len(positions)
        if len(sizes) != count:
            raise ValueError(f"{len(sizes)} sizes for {count} positions")
        self._next_generation = first + count
        deadline = now + deadline_s
        attempts = self._attempts
        # Built by map and update (once per delivered message: kept lean).
        self._leases.update(
            zip(
                positions,
                map(
                    Lease,
                    range(first, first + count),
                    repeat(deadline, count),
                    repeat(consumer, count),
                    sizes,
                ),
                strict=False,  # lengths checked above
            )
        )
        if attempts.keys().isdisjoint(positions):  # first deliveries: the common case
            attempts.update(dict.fromkeys(positions, 1))
        else:
            get = attempts.get
            for pos in positions:
                attempts[pos] = get(pos, 0) + 1
        self._push(deadline, _Run(positions, range(first, first + count)))
        return first

    def _push(self, deadline: float, run: _Run) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (deadline, self._sequence, run))
        self._entries += len(run.positions)
        if self._entries > 2 * len(self._leases) + COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        by_deadline: dict[float, tuple[list[int], list[int]]] = {}
        for p, lease in self._leases.items():
            group = by_deadline.get(lease.deadline)
            if group is None:
                group = by_deadline[lease.deadline] = ([], [])
            group[0].append(p)
            group[1].append(lease.generation)
        self._heap = []
        for deadline, (positions, generations) in by_deadline.items():
            self._sequence += 1
            self._heap.append((deadline, self._sequence, _Run(positions, generations)))
        heapq.heapify(self._heap)
        self._entries = len(self._leases)

    @property
    def next_generation(self) -> int:
        """The generation the next grant gets (generations only grow, even across clear)."""
        return self._next_generation

    def attempts(self, pos: int) -> int:
        return self._attempts.get(pos, 0)

    def attempts_of(self, positions: list[int]) -> list[int]:
        """:meth:`attempts` of each of ``positions``."""
        return list(map(self._attempts.get, positions, repeat(0, len(positions))))

    def extend(self, pos: int, now: float, seconds: float) -> Lease | None:
        """Set the deadline of a current lease to now + seconds; None if it is not leased."""
        lease = self._leases.get(pos)
        if lease is None:
            return None
        lease.deadline = now + seconds
        lease.confirmed = True
        self._push(lease.deadline, _Run([pos], [lease.generation]))
        return lease

    def extend_all(
        self, deliveries: list[tuple[int, int]], now: float, seconds: float
    ) -> list[Lease]:
        """:meth:`extend` each (position, generation) whose lease is that delivery's; return
        the leases extended (one heap item for all of them)."""
        leases = self._leases
        deadline = now + seconds
        positions: list[int] = []
        generations: list[int] = []
        out: list[Lease] = []
        for pos, generation in deliveries:
            lease = leases.get(pos)
            if lease is not None and lease.generation == generation:
                lease.deadline = deadline
                lease.confirmed = True
                positions.append(pos)
                generations.append(generation)
                out.append(lease)
        if positions:
            self._push(deadline, _Run(positions, generations))
        return out

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

    def forget_all(self, positions: list[int]) -> list[Lease]:
        """:meth:`forget` each position (acked); return the leases that ended."""
        # C-level passes (once per acked message): a Lease is never false, a miss is None.
        absent = repeat(None)
        deque(map(self._attempts.pop, positions, absent), maxlen=0)
        return list(filter(None, map(self._leases.pop, positions, absent)))

    def forget(self, pos: int) -> None:
        """The position is acked: drop its delivery count too."""
        self._leases.pop(pos, None)
        self._attempts.pop(pos, None)

    def expired(self, now: float) -> list[tuple[int, Lease]]:
        """End and return the leases whose deadline is <= now, in deadline order (then by
        position)."""
        out: list[tuple[int, Lease]] = []
        heap, leases = self._heap, self._leases
        while heap and heap[0][0] <= now:
            deadline, _, run = heapq.heappop(heap)
            self._entries -= len(run.positions)
            generations = run.generations
            positions = run.positions
            for k in range(run.dead, len(positions)):
                pos = positions[k]
                lease = leases.get(pos)
                if (
                    lease is not None
                    and lease.generation == generations[k]
                    and lease.deadline == deadline
                ):
                    del leases[pos]
                    out.append((pos, lease))
        if len(out) > 1:
            out.sort(key=lambda item: (item[1].deadline, item[0]))
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live lease. A run's dead prefix only grows: a stale
        entry's lease was ended or re-granted (new generation) or its deadline changed, and a
        lease whose deadline is changed again gets a new run, so the entry is never needed."""
        heap, leases = self._heap, self._leases
        while heap:
            deadline, _, run = heap[0]
            positions, generations = run.positions, run.generations
            k, n = run.dead, len(positions)
            while k < n:
                lease = leases.get(positions[k])
                if (
                    lease is not None
                    and lease.generation == generations[k]
                    and lease.deadline == deadline
                ):
                    run.dead = k
                    return deadline
                k += 1
            heapq.heappop(heap)
            self._entries -= n
        return None

    def held_by(self, consumer: int) -> list[int]:
        return [p for p, lease in self._leases.items() if lease.consumer == consumer]

    def clear(self) -> None:
        self._leases.clear()
        self._heap.clear()
        self._attempts.clear()
        self._entries = 0
