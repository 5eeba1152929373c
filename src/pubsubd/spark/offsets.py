"""Pure offset arithmetic of the Spark connector: Kafka-style JSON, ranges, admission control.

No Spark, no gRPC, no clock: everything here takes plain values and returns plain values.

Rules:

1. A *position map* is ``{partition: next offset}`` for one topic (partition = the topic's
   publish message source). Ends are exclusive: ``{0: 12}`` means offsets 0..11 of partition 0
   are before it.
2. In Spark's checkpoint and in the ``startingOffsets`` / ``endingOffsets`` options, positions are
   written as Kafka writes them: ``{"<topic>": {"<partition>": offset}}`` with string partition
   keys. In an option, ``-2`` means earliest and ``-1`` latest (Kafka's sentinels).
3. A partition the JSON does not name starts at the earliest retained offset and ends at the
   latest committed one (so partitions added to a topic are read from their start).
4. Admission control splits a row budget across partitions in proportion to their backlog, as
   Kafka's source does, and always lets at least one row through when anything is available.
5. ``minPartitions`` splits large ranges into nearly equal pieces; ranges are never merged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EARLIEST = -2
LATEST = -1

Positions = dict[int, int]


class OffsetSpecError(ValueError):
    """An option value that is not ``earliest``, ``latest`` or Kafka-style offset JSON."""


@dataclass(frozen=True)
class OffsetSpec:
    """A parsed ``startingOffsets`` / ``endingOffsets`` value.

    ``default`` (EARLIEST or LATEST) applies to every partition that ``explicit`` does not name;
    ``explicit`` values may themselves be EARLIEST or LATEST sentinels.
    """

    default: int
    explicit: Mapping[int, int]


@dataclass(frozen=True)
class SourceBounds:
    """Earliest retained and latest committed (exclusive) offset of one partition."""

    earliest: int
    latest: int


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition: what one Spark input partition reads."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def short_topic(topic: str) -> str:
    """``projects/p/topics/t`` -> ``t``; anything else unchanged."""
    return topic.rsplit("/", 1)[-1]


def parse_spec(text: str | None, topic: str, default: int) -> OffsetSpec:
    """Parse an offsets option. JSON keys may be the full topic name or its short id."""
    if text is None or not text.strip():
        return OffsetSpec(default, {})
    value = text.strip()
    if value.lower() == "earliest":
        return OffsetSpec(EARLIEST, {})
    if value.lower() == "latest":
        return OffsetSpec(LATEST, {})
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OffsetSpecError(f"offsets must be earliest, latest or JSON, got {value!r}") from exc
    return OffsetSpec(default, positions_from_json(obj, topic))


def positions_from_json(obj: Any, topic: str) -> Positions:
    """``{"topic": {"0": 12}}`` -> ``{0: 12}``. Other topics in the JSON are ignored."""
    if not isinstance(obj, dict):
        raise OffsetSpecError(f"offset JSON must be an object keyed by topic, got {obj!r}")
    per_topic = obj.get(topic)
    if per_topic is None:
        per_topic = obj.get(short_topic(topic))
    if per_topic is None:
        known = ", ".join(sorted(map(str, obj))) or "none"
        raise OffsetSpecError(f"offset JSON names no entry for topic {topic!r} (has: {known})")
    if not isinstance(per_topic, dict):
        raise OffsetSpecError(f"offsets of {topic!r} must be an object, got {per_topic!r}")
    out: Positions = {}
    for key, off in per_topic.items():
        try:
            partition = int(key)
        except (TypeError, ValueError) as exc:
            raise OffsetSpecError(f"partition key {key!r} is not an integer") from exc
        if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
            raise OffsetSpecError(
                f"offset of partition {key} must be an integer >= -2, got {off!r}"
            )
        out[partition] = off
    return out


def positions_to_json(topic: str, positions: Mapping[int, int]) -> dict[str, dict[str, int]]:
    """``{0: 12}`` -> ``{"topic": {"0": 12}}`` (the checkpoint form; keys sorted numerically)."""
    return {topic: {str(p): int(positions[p]) for p in sorted(positions)}}


def resolve(spec: OffsetSpec, bounds: Mapping[int, SourceBounds]) -> Positions:
    """Concrete positions for every known partition (rule 3 for partitions the spec omits)."""
    out: Positions = {}
    for partition, b in bounds.items():
        value = spec.explicit.get(partition, spec.default)
        if value == EARLIEST:
            out[partition] = b.earliest
        elif value == LATEST:
            out[partition] = b.latest
        else:
            out[partition] = value
    for partition, value in spec.explicit.items():
        if partition not in out and value >= 0:
            out[partition] = value
    return out


def with_new_partitions(
    positions: Mapping[int, int], bounds: Mapping[int, SourceBounds]
) -> Positions:
    """``positions`` plus every partition it lacks, starting at that partition's earliest offset."""
    out = dict(positions)
    for partition, b in bounds.items():
        out.setdefault(partition, b.earliest)
    return out


@dataclass(frozen=True)
class DataLoss:
    """Offsets that were needed but are no longer retained (or a log that went backwards)."""

    partition: int
    wanted: int
    earliest: int
    latest: int

    def describe(self, topic: str) -> str:
        if self.wanted > self.latest:
            return (
                f"partition {self.partition} of {topic}: position {self.wanted} is beyond the "
                f"latest committed offset {self.latest} (was the topic deleted and re-created?)"
            )
        return (
            f"partition {self.partition} of {topic}: offsets {self.wanted}..{self.earliest - 1} "
            f"are no longer retained (earliest retained is {self.earliest}); some data may have "
            "been lost. Set failOnDataLoss=false to skip them."
        )


def find_data_loss(
    positions: Mapping[int, int], bounds: Mapping[int, SourceBounds]
) -> list[DataLoss]:
    """Partitions whose position is below the retained range or beyond the log's end."""
    lost: list[DataLoss] = []
    for partition, pos in sorted(positions.items()):
        b = bounds.get(partition)
        if b is None:
            continue
        if pos < b.earliest or pos > b.latest:
            lost.append(DataLoss(partition, pos, b.earliest, b.latest))
    return lost


def skip_lost(positions: Mapping[int, int], bounds: Mapping[int, SourceBounds]) -> Positions:
    """``failOnDataLoss=false``: move positions below the retained range up to its start,
    and positions beyond the end of a (re-created) log back to its start."""
    out = dict(positions)
    for loss in find_data_loss(positions, bounds):
        out[loss.partition] = loss.earliest
    return out


def admit(
    start: Mapping[int, int],
    latest: Mapping[int, int],
    max_rows: int | None = None,
    max_bytes: int | None = None,
    avg_bytes: Mapping[int, float] | None = None,
) -> Positions:
    """The end of the next micro-batch: ``latest`` capped by a row and/or (estimated) byte budget.

    The budget is split in proportion to each partition's backlog. When every share rounds down to
    zero the partition with the largest backlog still gets one row, so a query always progresses.
    ``avg_bytes`` (per partition, from a sample) turns ``max_bytes`` into a row budget.
    """
    end: Positions = {}
    avail: dict[int, int] = {}
    for partition, head in latest.items():
        pos = start.get(partition, head)
        avail[partition] = max(0, head - pos)
        end[partition] = max(pos, head)
    for partition, pos in start.items():
        end.setdefault(partition, pos)
    total = sum(avail.values())
    if total == 0:
        return {p: start.get(p, e) for p, e in end.items()}
    budget = total
    if max_rows is not None and max_rows > 0:
        budget = min(budget, max_rows)
    if max_bytes is not None and max_bytes > 0:
        weighted = sum(avail[p] * max(1.0, (avg_bytes or {}).get(p, 1.0)) for p in avail)
        per_row = weighted / total
        budget = min(budget, max(1, int(max_bytes / per_row)))
    if budget >= total:
        return end
    shares = {p: min(a, int(budget * a / total)) for p, a in avail.items()}
    if sum(shares.values()) == 0:
        biggest = max(avail, key=lambda p: (avail[p], -p))
        shares[biggest] = 1
    return {p: start.get(p, latest.get(p, 0)) + shares.get(p, 0) for p in end}


def cap(positions: Mapping[int, int], target: Mapping[int, int]) -> Positions:
    """``positions`` never above ``target`` (the availableNow target); partitions absent from the
    target keep their position (they hold nothing to read in this run)."""
    return {p: min(v, target[p]) if p in target else v for p, v in positions.items()}


def ranges(start: Mapping[int, int], end: Mapping[int, int]) -> list[OffsetRange]:
    """One non-empty ``[start, end)`` range per partition, in partition order."""
    out: list[OffsetRange] = []
    for partition in sorted(end):
        lo = start.get(partition, end[partition])
        if end[partition] > lo:
            out.append(OffsetRange(partition, lo, end[partition]))
    return out


# The key under which a micro-batch's end offset records how its ranges were split. Spark replays
# the last planned batch after a driver crash by calling ``partitions(start, end)`` again with the
# ``end`` from its offsets log, but with the *new* driver's options: were the split taken from
# them, a changed minPartitions / maxOffsetsPerPartition would renumber the batch's Spark
# partitions and rows, and the sink's dedup IDs with them. Other code reading offsets ignores the
# key (positions_from_json reads only the topic's entry), so an endOffset stays pasteable into
# startingOffsets.
SPLIT_KEY = "_split"


def split_to_json(min_partitions: int | None, max_per_partition: int | None) -> dict[str, int]:
    return {"minPartitions": min_partitions or 0, "maxOffsetsPerPartition": max_per_partition or 0}


def split_from_json(obj: Any) -> tuple[int | None, int | None] | None:
    """The split recorded in an end offset, or None (an offset from before the key existed)."""
    recorded = obj.get(SPLIT_KEY) if isinstance(obj, dict) else None
    if not isinstance(recorded, dict):
        return None
    values = []
    for name in ("minPartitions", "maxOffsetsPerPartition"):
        value = recorded.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise OffsetSpecError(f"{SPLIT_KEY}.{name} must be an integer >= 0, got {value!r}")
        values.append(value or None)
    return values[0], values[1]


def split(
    parts: list[OffsetRange],
    min_partitions: int | None = None,
    max_per_partition: int | None = None,
) -> list[OffsetRange]:
    """Split ranges so there are at least ``min_partitions`` pieces (larger ranges get more pieces,
    as Kafka's KafkaOffsetRangeCalculator does) and no piece exceeds ``max_per_partition``."""
    total = sum(r.size for r in parts)
    out: list[OffsetRange] = []
    for r in parts:
        pieces = 1
        if min_partitions and min_partitions > len(parts) and total > 0:
            pieces = max(1, math.floor(r.size * min_partitions / total))
        if max_per_partition and max_per_partition > 0:
            pieces = max(pieces, math.ceil(r.size / max_per_partition))
        pieces = min(pieces, r.size) or 1
        step, extra = divmod(r.size, pieces)
        lo = r.start
        for i in range(pieces):
            hi = lo + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.partition, lo, hi))
            lo = hi
    return out
