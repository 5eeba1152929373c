"""Leases of one subscription: which delivered messages are outstanding, until when, and for whom.

Pure: no asyncio, no clock reads; ``now`` is always a parameter.

Rules:
1. A delivered position holds exactly one lease; each delivery gets a new generation, which is
   part of the ack ID, so a stale ack ID can be told from the current one.
2. A lease ends by ack (``forget``), by nack (``release``, the caller requeues) or by expiry
   (``expired`` returns it once, in deadline order). An extended lease keeps its generation.
3. ``attempts`` counts deliveries per position (1 + nacks + expiries) until the position is
   acked (``forget``); it survives lease ends, so redeliveries count up. A lease given back
   (``give_back``: its consumer never received the message) ends without counting. The count
   is kept as the deliveries that ended unacked plus the live lease, so a first delivery that
   is acked never touches a counter.
4. A lease is *confirmed* once the client changed its deadline (the official clients send a
   receipt deadline change for every message they receive); an unconfirmed expiry suggests the
   consumer never got the message.
5. Leases are kept per *grant*, not per message: one grant (a response's messages) makes one
   ``_Hold`` that its positions share: the deadline, the consumer, whether it is confirmed, and
   the grant's generations and sizes (the k-th position's are ``first + k`` and ``sizes[k]``;
   k is ``position - base`` when the positions are consecutive, the usual case, else looked up
   in the hold's index). The table itself is one dict, position -> hold. A grant so costs one
   dict entry per message and one object per response, not a lease object per message (those,
   with the collector's work on them, were a tenth of a Pulsar drain's server CPU). Holds are
   never changed but for the count of positions still in them (``live``): extending a lease
   moves its position to a copy of its hold with the new deadline (copy on write, one copy per
   hold and call), so the rest of its grant keeps theirs. :class:`Lease` is the per-position
   value the single-position calls return.
6. Expiry uses a heap of runs with lazy deletion: one heap item per hold, holding its
   positions, so the heap costs one push per response, not per message. A run's position is
   live only while its hold is the run's (a position never returns to a hold it left), and a
   run whose hold has no live position left is dropped without looking at its positions, so
   ``next_deadline`` costs nothing per message. Ended leases leave stale entries behind until
   their run is popped, so the
   heap is rebuilt from the live leases whenever the runs' entries outnumber twice the live
   leases plus ``COMPACT_SLACK``: its size stays proportional to the outstanding messages, not
   to the delivery rate times the ack deadline. ``expired`` returns leases in (deadline,
   position) order, as one heap item per lease did.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import KeysView, Sequence
from dataclasses import dataclass, field
from itertools import groupby, repeat
from operator import add, sub

# The heap is rebuilt when it holds more than twice the live leases plus this many items.
COMPACT_SLACK = 4096


@dataclass(frozen=True, slots=True)
class Lease:
    """One position's lease, as the single-position calls return it."""

    generation: int
    deadline: float
    consumer: int  # id of the stream or pull that holds it
    size: int  # bytes, for flow control
    confirmed: bool = False  # the client acted on it (deadline change): it did arrive


class _Hold:
    """What the positions of one grant share (or those of one grant that one call extended).
    Never changed once made but for ``live``, the count of positions whose lease it is;
    compared by identity."""

    __slots__ = ("base", "confirmed", "consumer", "deadline", "first", "index", "live", "sizes")

    def __init__(
        self,
        deadline: float,
        consumer: int,
        confirmed: bool,
        first: int,
        sizes: list[int],
        base: int,
        index: dict[int, int] | None,
    ) -> None:
        self.deadline = deadline
        self.consumer = consumer
        self.confirmed = confirmed
        self.first = first  # the generation of the grant's first position
        self.sizes = sizes  # of the grant's positions, in grant order
        self.base = base  # consecutive positions: position base + k is the grant's k-th
        self.index = index  # else: position -> k
        self.live = 0

    def nth(self, pos: int) -> int:
        return pos - self.base if self.index is None else self.index[pos]

    def lease(self, pos: int) -> Lease:
        k = self.nth(pos)
        return Lease(self.first + k, self.deadline, self.consumer, self.sizes[k], self.confirmed)

    def bytes_of(self, positions: Sequence[int]) -> int:
        """The sizes of ``positions`` (all of this hold's grant) added up."""
        if self.index is None:
            ks = map(sub, positions, repeat(self.base))
        else:
            ks = map(self.index.__getitem__, positions)
        return sum(map(self.sizes.__getitem__, ks))

    def extended(self, deadline: float) -> _Hold:
        """A copy with ``deadline``, confirmed, holding no position yet."""
        return _Hold(deadline, self.consumer, True, self.first, self.sizes, self.base, self.index)


class _Run:
    """The positions of one hold, as one heap item (each hold has exactly one run)."""

    __slots__ = ("hold", "positions")

    def __init__(self, positions: Sequence[int], hold: _Hold) -> None:
        self.positions = positions
        self.hold = hold


def _consecutive(positions: list[int]) -> bool:
    """Whether ``positions`` are p, p + 1, ..., in that order."""
    n = len(positions)
    if not n or positions[-1] - positions[0] != n - 1:
        return False
    return positions == list(range(positions[0], positions[0] + n))


@dataclass(slots=True)
class LeaseTable:
    _holds: dict[int, _Hold] = field(default_factory=dict)  # the live leases: position -> hold
    # Deliveries of a position that ended unacked (nack, expiry, replaced), until it is acked.
    _past: dict[int, int] = field(default_factory=dict)
    # (deadline, sequence, run): the sequence orders runs of one deadline, never compared runs
    _heap: list[tuple[float, int, _Run]] = field(default_factory=list)
    _next_generation: int = 1
    _entries: int = 0  # positions held by the heap's runs
    _sequence: int = 0

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, pos: int) -> bool:
        return pos in self._holds

    @property
    def leased(self) -> KeysView[int]:
        """The leased positions (a read-only view for hot loops: ``pos in leased``)."""
        return self._holds.keys()

    def get(self, pos: int) -> Lease | None:
        hold = self._holds.get(pos)
        return None if hold is None else hold.lease(pos)

    def generation(self, pos: int) -> int | None:
        """The generation of ``pos``'s live lease, None if it is not leased."""
        hold = self._holds.get(pos)
        return None if hold is None else hold.first + hold.nth(pos)

    def is_current(self, pos: int, generation: int) -> bool:
        """Whether ``generation`` is the live lease of ``pos`` (an ack ID's delivery)."""
        hold = self._holds.get(pos)
        return hold is not None and hold.first + hold.nth(pos) == generation

    def grant(self, pos: int, now: float, deadline_s: float, consumer: int, size: int) -> Lease:
        """Lease ``pos`` to ``consumer``; return the lease (its generation goes in the ack ID)."""
        self.grant_run([pos], [size], now, deadline_s, consumer)
        return self._holds[pos].lease(pos)

    def grant_run(
        self,
        positions: list[int],
        sizes: list[int],
        now: float,
        deadline_s: float,
        consumer: int,
    ) -> int:
        """Lease each of ``positions`` (distinct) to ``consumer``, with one deadline; the k-th
        gets generation ``first + k`` where ``first`` is returned (as ``grant`` one by one).
        The table keeps ``sizes``: the caller must not change the list afterwards."""
        first = self._next_generation
        count = len(positions)
        if len(sizes) != count:
            raise ValueError(f"{len(sizes)} sizes for {count} positions")
        if not count:
            return first
        self._next_generation = first + count
        holds = self._holds
        if not holds.keys().isdisjoint(positions):  # leased again unacked: that delivery counts
            for pos in positions:
                if pos in holds:
                    holds[pos].live -= 1
                    self._count_past(pos)
        run: Sequence[int]
        if _consecutive(positions):
            run = range(positions[0], positions[0] + count)
            hold = _Hold(now + deadline_s, consumer, False, first, sizes, positions[0], None)
        else:
            run = positions
            index = dict(zip(positions, range(count), strict=True))
            hold = _Hold(now + deadline_s, consumer, False, first, sizes, 0, index)
        # One C-level pass (once per delivered message): no object per message.
        holds.update(zip(run, repeat(hold, count), strict=False))  # lengths checked above
        hold.live = count
        self._push(_Run(run, hold))
        return first

    def _push(self, run: _Run) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (run.hold.deadline, self._sequence, run))
        self._entries += len(run.positions)
        if self._entries > 2 * len(self._holds) + COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        by_hold: dict[_Hold, _Run] = {}  # hold -> its live positions
        for p, hold in self._holds.items():
            run = by_hold.get(hold)
            if run is None:
                run = by_hold[hold] = _Run([], hold)
            run.positions.append(p)  # type: ignore[attr-defined]  # a list, made here
        self._heap = []
        for run in by_hold.values():
            self._sequence += 1
            self._heap.append((run.hold.deadline, self._sequence, run))
        heapq.heapify(self._heap)
        self._entries = len(self._holds)

    @property
    def next_generation(self) -> int:
        """The generation the next grant gets (generations only grow, even across clear)."""
        return self._next_generation

    def attempts(self, pos: int) -> int:
        return self._past.get(pos, 0) + (pos in self._holds)

    def attempts_of_leased(self, positions: list[int]) -> list[int]:
        """:meth:`attempts` of each of ``positions``, all of them leased (as just granted)."""
        if not self._past:  # no delivery ended unacked: each is a first delivery
            return [1] * len(positions)
        return list(map(add, map(self._past.get, positions, repeat(0)), repeat(1)))

    def attempts_of(self, positions: list[int]) -> list[int]:
        """:meth:`attempts` of each of ``positions``."""
        leased = map(self._holds.__contains__, positions)
        return list(map(add, map(self._past.get, positions, repeat(0)), leased))

    def extend(self, pos: int, now: float, seconds: float) -> Lease | None:
        """Set the deadline of a current lease to now + seconds; None if it is not leased."""
        hold = self._holds.get(pos)
        if hold is None:
            return None
        moved = self._holds[pos] = hold.extended(now + seconds)
        hold.live -= 1
        moved.live = 1
        self._push(_Run([pos], moved))
        return moved.lease(pos)

    def extend_all(self, deliveries: list[tuple[int, int]], now: float, seconds: float) -> set[int]:
        """:meth:`extend` each (position, generation) whose lease is that delivery's; return
        the consumers whose leases were extended (one new hold and heap item per hold moved
        from)."""
        holds = self._holds
        deadline = now + seconds
        moved: dict[_Hold, _Run] = {}  # hold moved from -> the run of its copy
        for pos, generation in deliveries:
            hold = holds.get(pos)
            if hold is None:
                continue
            run = moved.get(hold)
            if run is None:
                if hold.first + hold.nth(pos) != generation:
                    continue
                run = moved[hold] = _Run([], hold.extended(deadline))
            elif run.hold.first + run.hold.nth(pos) != generation:
                continue
            holds[pos] = run.hold
            run.positions.append(pos)  # type: ignore[attr-defined]  # a list, made here
        consumers = set()
        for source, run in moved.items():
            source.live -= len(run.positions)
            run.hold.live += len(run.positions)
            self._push(run)
            consumers.add(run.hold.consumer)
        return consumers

    def _count_past(self, pos: int) -> None:
        self._past[pos] = self._past.get(pos, 0) + 1

    def release(self, pos: int) -> Lease | None:
        """End the lease of ``pos`` (nack); return it, or None if it was not leased."""
        hold = self._holds.pop(pos, None)
        if hold is None:
            return None
        hold.live -= 1
        self._count_past(pos)
        return hold.lease(pos)

    def give_back(self, pos: int, consumer: int) -> Lease | None:
        """``consumer`` never received ``pos`` (its Pull was cancelled, its client vanished
        before the response went out): end the lease and undo its delivery count. Only the
        holder's current lease is given back; return it, or None if ``consumer`` holds none."""
        hold = self._holds.get(pos)
        if hold is None or hold.consumer != consumer:
            return None
        del self._holds[pos]
        hold.live -= 1
        return hold.lease(pos)

    def forget_all(self, positions: list[int]) -> dict[int, list[int]]:
        """:meth:`forget` each position (acked); return what the leases that ended held, per
        consumer: ``{consumer: [messages, bytes]}``."""
        # C-level passes (once per acked message); a miss is None.
        absent = repeat(None)
        if self._past:
            deque(map(self._past.pop, positions, absent), maxlen=0)
        ended = list(map(self._holds.pop, positions, absent))
        if not ended:
            return {}
        hold = ended[0]
        if hold is not None and ended.count(hold) == len(ended):  # one grant's: the usual case
            hold.live -= len(ended)
            return {hold.consumer: [len(ended), hold.bytes_of(positions)]}
        returned: dict[int, list[int]] = {}
        i = 0
        for group, same in groupby(ended):  # runs of one hold (a miss: of None)
            n = len(list(same))
            if group is not None:
                group.live -= n
                size = group.bytes_of(positions[i : i + n])
                counts = returned.get(group.consumer)
                if counts is None:
                    returned[group.consumer] = [n, size]
                else:
                    counts[0] += n
                    counts[1] += size
            i += n
        return returned

    def forget(self, pos: int) -> None:
        """The position is acked: drop its delivery count too."""
        hold = self._holds.pop(pos, None)
        if hold is not None:
            hold.live -= 1
        self._past.pop(pos, None)

    def expired(self, now: float) -> list[tuple[int, Lease]]:
        """End and return the leases whose deadline is <= now, in deadline order (then by
        position)."""
        out: list[tuple[int, Lease]] = []
        heap, holds = self._heap, self._holds
        while heap and heap[0][0] <= now:
            _, _, run = heapq.heappop(heap)
            self._entries -= len(run.positions)
            hold = run.hold
            if not hold.live:
                continue
            for pos in run.positions:
                if holds.get(pos) is hold:
                    del holds[pos]
                    self._count_past(pos)
                    out.append((pos, hold.lease(pos)))
            hold.live = 0
        if len(out) > 1:
            out.sort(key=lambda item: (item[1].deadline, item[0]))
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live lease: the first run whose hold still has one."""
        heap = self._heap
        while heap:
            deadline, _, run = heap[0]
            if run.hold.live:
                return deadline
            heapq.heappop(heap)
            self._entries -= len(run.positions)
        return None

    def held_by(self, consumer: int) -> list[int]:
        return [p for p, hold in self._holds.items() if hold.consumer == consumer]

    def clear(self) -> None:
        self._holds.clear()
        self._heap.clear()
        self._past.clear()
        self._entries = 0
