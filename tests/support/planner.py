"""A delivery planner over an in-memory topic, for tests that start no process and no event
loop: its sources are lists of entries, its consumers record what they are given."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pubsubd.core import ids, pb
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.dedup_batches import MessageBatch
from pubsubd.core.records import CursorState, DamagedRange, Entry
from pubsubd.data.decoding import DecodeCache, DecodedEntry
from pubsubd.data.subscribe.consumers import Consumer
from pubsubd.data.subscribe.planner import DeliveryPlanner, Effects
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange

TOPIC = "projects/p/topics/t"
SUB = "projects/p/subscriptions/s"


@dataclass
class MemoryTopic:
    """``planner.SourceReader`` over entries kept in lists, one per source."""

    sources: list[list[Entry]] = field(default_factory=lambda: [[]])
    damaged: dict[int, list[DamagedRange]] = field(default_factory=dict)
    policy: DamagePolicy = DamagePolicy.STOP
    restoring: bool = False  # the damage is being read back from the storage nodes
    cache: DecodeCache = field(default_factory=DecodeCache)
    time_us: int = 1_700_000_000_000_000

    def publish(
        self, *data: bytes, key: str = "", source: int = 0, attributes: dict[str, str] | None = None
    ) -> list[int]:
        """One entry of ``data`` messages; returns their positions."""
        log = self.sources[source]
        base = log[-1].next_offset if log else 0
        request = pb.PublishRequest(
            topic=TOPIC,
            messages=[
                pb.PubsubMessage(data=d, ordering_key=key, attributes=attributes or {})
                for d in data
            ],
        )
        log.append(Entry(base, len(data), self.time_us, request.SerializeToString()))
        return [ids.position(source, base + i) for i in range(len(data))]

    def publish_deduplicated(self, *data: bytes, source: int = 0) -> list[int]:
        """One entry of ``data`` messages stored as PublishDeduplicated stores them (each with
        the reserved dedup attribute: a Pulsar producer's); returns their positions."""
        log = self.sources[source]
        base = log[-1].next_offset if log else 0
        batch = MessageBatch(
            [(f"pulsar/inc/p/{base + i}", pb.PubsubMessage(data=d)) for i, d in enumerate(data)]
        )
        [(payload, _, _, _)] = batch.stored(range(len(data)))
        log.append(Entry(base, len(data), self.time_us, payload))
        return [ids.position(source, base + i) for i in range(len(data))]

    def source_count(self) -> int:
        return len(self.sources)

    def start_offset(self, source: int) -> int:
        log = self.sources[source]
        return log[0].base_offset if log else 0

    def committed_offset(self, source: int) -> int:
        log = self.sources[source]
        return log[-1].next_offset if log else 0

    def _damage_at(self, source: int, offset: int) -> DamagedRange | None:
        for d in self.damaged.get(source, ()):
            if d.first_offset <= offset < d.end_offset:
                return d
        return None

    def read(self, source: int, offset: int, max_entries: int) -> list[Entry]:
        if offset < self.start_offset(source):
            raise OffsetOutOfRange(offset, self.start_offset(source), self.committed_offset(source))
        hit = self._damage_at(source, offset)
        if hit is not None:
            raise DamagedEntries(hit, restoring=self.restoring)
        out: list[Entry] = []
        for entry in self.sources[source]:
            if entry.next_offset <= offset:
                continue
            if self._damage_at(source, entry.base_offset) is not None or len(out) >= max_entries:
                break
            out.append(entry)
        return out

    def entry_at(self, source: int, offset: int) -> Entry:
        hit = self._damage_at(source, offset)
        if hit is not None:
            raise DamagedEntries(hit, restoring=self.restoring)
        for entry in self.sources[source]:
            if entry.base_offset <= offset < entry.next_offset:
                return entry
        raise OffsetOutOfRange(offset, self.start_offset(source), self.committed_offset(source))

    def decoded(self, source: int, entry: Entry) -> DecodedEntry:
        return self.cache.decoded(source, entry)

    def damage_policy(self) -> DamagePolicy:
        return self.policy

    def delay_due(self, at_us: int, position: int) -> bool:
        return at_us <= self.time_us


class Recorder(Consumer):
    """A consumer that keeps what it receives: (ack_id, message_id, delivery_attempt)."""

    def __init__(
        self, *, max_messages: int = 0, max_bytes: int = 0, deadline_s: float = 10.0
    ) -> None:
        super().__init__(deadline_s, max_messages, max_bytes)
        self.received: list[tuple[str, int, int]] = []

    def deliver(self, messages: list[bytes], positions: list[int]) -> None:
        response = pb.PullResponse.FromString(b"".join(messages))
        for m in response.received_messages:
            self.received.append((m.ack_id, int(m.message.message_id), m.delivery_attempt))

    def positions(self) -> list[int]:
        return [p for _, p, _ in self.received]


def subscription(**fields: Any) -> Any:
    return pb.Subscription(name=SUB, topic=TOPIC, ack_deadline_seconds=10, **fields)


def planner(topic: MemoryTopic, sub: Any | None = None, sources: int = 1) -> DeliveryPlanner:
    states = {s: CursorState(0) for s in range(sources)}
    return DeliveryPlanner(sub or subscription(), "incarn01", states, topic)


def run(p: DeliveryPlanner, now: float) -> Effects:
    """Plan and carry out the deliveries (as the shell does); returns the effects."""
    p.plan(now)
    fx = p.effects()
    for d in fx.deliveries:
        if d.consumer.raw:
            d.consumer.deliver_raw(d)
        else:
            d.consumer.deliver(d.received, d.positions)
    return fx


def ack_ids(p: DeliveryPlanner, consumer: Recorder) -> list[tuple[int, int]]:
    return [p.decode(a) for a, _, _ in consumer.received]
