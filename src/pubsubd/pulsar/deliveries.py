"""One in-process stream response's deliveries, kept as the planner made them: in columns.

An in-process stream (streams.LocalLeg) hands a Pulsar consumer each response as
:class:`RawDeliveries`: message i is at ``positions[i]``, its lease generation is ``first + i``
(one lease run per response, leases.py), its delivery attempt ``attempts[i]`` (no list: 0), and
``stored[i]`` is a plain entry's data whose publish time is ``stamps[i]``, or a serialized
PubsubMessage (stamp None; no ``stamps`` list: all serialized).

The consumer takes messages from the front (``start``) as the client's permits allow. Runs of
plain messages at consecutive positions with one publish time and one attempt go out as one
Pulsar batch: :meth:`RawDeliveries.run` finds such a run and :meth:`RawDeliveries.refs` names
its deliveries, each with C-level passes over slices instead of a Python step per message
(the consume path's largest per-message cost before; BENCHMARKS.md, PC6).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby
from operator import sub
from typing import Any


class DeliveryRun:
    """``count`` deliveries settled together (a Pulsar batch taken from one response): the
    k-th at ``position + k`` with lease generation ``generation + k``. As a consumer's list of
    a batch's deliveries, without a tuple per message; :meth:`pairs` is that list."""

    __slots__ = ("count", "generation", "position")

    def __init__(self, position: int, generation: int, count: int) -> None:
        self.position = position
        self.generation = generation
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeliveryRun) and (
            (self.position, self.generation, self.count)
            == (other.position, other.generation, other.count)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value, never a key

    def __repr__(self) -> str:
        return f"DeliveryRun({self.position}, {self.generation}, {self.count})"

    def pairs(self) -> list[tuple[int, int]]:
        """(position, generation) of each delivery."""
        p, g, n = self.position, self.generation, self.count
        return list(zip(range(p, p + n), range(g, g + n), strict=True))


def as_runs(refs: Iterable[DeliveryRun | tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(position, generation, count) of each run, a (position, generation) as a run of 1."""
    return [
        (r.position, r.generation, r.count) if isinstance(r, DeliveryRun) else (r[0], r[1], 1)
        for r in refs
    ]


def as_pairs(refs: Iterable[DeliveryRun | tuple[int, int]]) -> list[tuple[int, int]]:
    """(position, generation) of each delivery, runs expanded."""
    out: list[tuple[int, int]] = []
    for r in refs:
        if isinstance(r, DeliveryRun):
            out += r.pairs()
        else:
            out.append(r)
    return out


@dataclass(slots=True)
class RawDeliveries:
    positions: list[int]
    first: int  # the lease generation of positions[0]
    attempts: list[int] | None
    stored: list[Any]
    stamps: list[bytes | None] | None
    start: int = 0  # messages before it are taken

    def __len__(self) -> int:
        """Messages not taken yet."""
        return len(self.positions) - self.start

    def attempt(self, i: int) -> int:
        return 0 if self.attempts is None else self.attempts[i]

    def stamp(self, i: int) -> bytes | None:
        return None if self.stamps is None else self.stamps[i]

    def refs(self, i: int, j: int) -> list[tuple[int, int]]:
        """The deliveries of messages ``i`` to ``j - 1``: (position, generation) each."""
        first = self.first
        return list(zip(self.positions[i:j], range(first + i, first + j), strict=True))

    def run(self, i: int, limit: int) -> int:
        """How many messages from ``i`` (at least 1, at most ``limit``) have message i's publish
        time (``stamps``), its delivery attempt, and positions following message i's."""
        j = i + limit
        stamps, attempts, positions = self.stamps, self.attempts, self.positions
        if stamps is None:
            return 1
        # Most often all of them: checked by C-level counts and one comparison.
        p = positions[i]
        if (
            stamps[i:j].count(stamps[i]) == limit
            and (attempts is None or attempts[i:j].count(attempts[i]) == limit)
            and positions[j - 1] - p == limit - 1
            and positions[i:j] == list(range(p, p + limit))
        ):
            return limit
        k = _lead(stamps[i:j])
        if k > 1 and attempts is not None:
            k = _lead(attempts[i : i + k])
        if k > 1:
            # positions[i + t] - t is positions[i] for each t of a run of consecutive positions
            k = _lead(map(sub, positions[i : i + k], range(k)))
        return k


def _lead(values: Iterable[Any]) -> int:
    """The length of the leading run of equal values (0 if there are none)."""
    for _, group in groupby(values):
        return len(list(group))
    return 0
