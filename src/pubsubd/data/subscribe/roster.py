"""The consumers of one subscription and who is served next (pure).

Rules:
1. Round-robin: consumers are served in turn, one response each, a waiting Pull before streams
   (it asked for an answer now); a consumer that cannot take anything is skipped.
2. Failover and exclusive: only the active client's streams receive (the streams of one
   client_id are one client, e.g. the Pulsar front's consumers of each partition of a topic);
   a Pull, having no client_id, ranks after every stream: on a failover subscription it
   receives only while no stream is open, on an exclusive one it is refused while one is.
   Exclusive: the first client by client_id. Failover: Pulsar's choice over the streams'
   ranks (core/failover_rank.py; a stream without one ranks at priority 0 by client_id):
   sorted by (priority, name), the first level counts; with every stream reading one source
   (the Pulsar front's consumers of a partitioned topic) each source N has its own active
   client, the one at N mod count among those reading it; otherwise the one the hash ring
   gives the streams' common ring key (a non-partitioned Pulsar topic's name), or, without
   one, the first.
3. Key_Shared: a key's messages go to the client that ranks first for it by rendezvous hash of
   the client IDs, so a key stays with one consumer while the set of consumers stays.
5. A consumer with ``sources`` takes only those publish message sources' messages.
4. What a consumer may take is its own flow control (``Consumer.room``) within the
   subscription's and the consumer's outstanding caps (messages and bytes; a byte cap pauses
   once reached, the message that crosses it still goes).
"""

from __future__ import annotations

import hashlib

from pubsubd.core import failover_rank
from pubsubd.core.errors import FailedPrecondition
from pubsubd.core.failover_rank import FailoverRank
from pubsubd.core.queue_settings import QueueSettings, SubscriptionType
from pubsubd.data.subscribe.consumer import Consumer


class Roster:
    """Consumers by id, in serving order."""

    __slots__ = ("_order", "_rr", "consumers")

    def __init__(self) -> None:
        self.consumers: dict[int, Consumer] = {}
        self._order: list[int] = []  # consumer ids in round-robin order
        self._rr = 0

    def __len__(self) -> int:
        return len(self._order)

    def add(self, consumer: Consumer) -> None:
        self.consumers[consumer.id] = consumer
        if consumer.is_pull:
            self._order.insert(0, consumer.id)  # a waiting Pull is served first
        else:
            self._order.append(consumer.id)

    def remove(self, consumer: Consumer) -> bool:
        """Remove ``consumer``; True if it was there."""
        if self.consumers.pop(consumer.id, None) is None:
            return False
        self._order.remove(consumer.id)
        return True

    def next(self) -> Consumer:
        """The consumer whose turn it is (the roster must not be empty)."""
        if self._rr >= len(self._order):
            self._rr = 0
        consumer = self.consumers[self._order[self._rr]]
        self._rr += 1
        return consumer

    def clear(self) -> None:
        self.consumers.clear()
        self._order.clear()

    def streams(self) -> list[Consumer]:
        return [c for c in self.consumers.values() if c.is_stream and not c.closed]

    def receivers(self, settings: QueueSettings) -> frozenset[int] | None:
        """Failover and exclusive: the ids of the consumers that may receive (rule 2); None
        means every consumer may."""
        if settings.type not in (SubscriptionType.FAILOVER, SubscriptionType.EXCLUSIVE):
            return None
        streams = self.streams()
        if not streams:
            return None
        if settings.type is SubscriptionType.EXCLUSIVE:
            first = min(streams, key=lambda c: (c.client_id, c.id))
        elif all(c.sources is not None and len(c.sources) == 1 and c.client_id for c in streams):
            return _active_per_source(streams)
        else:
            first = _failover_choice(streams)
        return frozenset(c.id for c in self.consumers.values() if same_client(c, first))

    def key_owner(self, key: str) -> Consumer | None:
        """Key_Shared: a stream of the client owning ``key`` (rendezvous hash over client
        IDs; see ``same_client``)."""
        streams = self.streams()
        if not streams:
            return None
        return max(streams, key=lambda c: (_weight(c.client_id, key), c.id))

    def check_stream(self, settings: QueueSettings, client_id: str, name: str) -> list[Consumer]:
        """Admit a StreamingPull client: an exclusive subscription refuses a second client
        (FAILED_PRECONDITION). Returns the waiting Pulls it displaces (an exclusive
        subscription held by a stream refuses Pulls)."""
        if settings.type is not SubscriptionType.EXCLUSIVE:
            return []
        for c in self.consumers.values():
            if c.is_stream and c.client_id != client_id and not c.closed:
                raise FailedPrecondition(
                    f"subscription {name} is exclusive and already has a consumer "
                    f"(client_id {c.client_id})"
                )
        return [c for c in self.consumers.values() if c.is_pull]

    def check_pull(self, settings: QueueSettings, name: str) -> None:
        """Admit a Pull: refused on an exclusive subscription while a stream holds it."""
        if settings.type is not SubscriptionType.EXCLUSIVE:
            return
        streams = self.streams()
        if streams:
            raise held_by_stream(name, streams[0].client_id)


def _rank(consumer: Consumer) -> FailoverRank:
    return consumer.failover_rank or FailoverRank(0, consumer.client_id)


def _ranked(streams: list[Consumer]) -> list[Consumer]:
    """The streams in Pulsar's order (priority, name; then arrival), first level only."""
    ordered = sorted(streams, key=lambda c: (_rank(c).priority, _rank(c).name, c.id))
    return ordered[: failover_rank.first_level([_rank(c) for c in ordered])]


def _failover_choice(streams: list[Consumer]) -> Consumer:
    """A failover subscription's active stream over the whole topic (rule 2)."""
    counted = _ranked(streams)
    keys = {_rank(c).ring_key for c in streams}
    if len(keys) == 1 and (key := next(iter(keys))):
        return counted[failover_rank.ring_choice(tuple(_rank(c).name for c in counted), key)]
    return counted[0]


def _active_per_source(streams: list[Consumer]) -> frozenset[int]:
    """The streams of each source's active client: of the clients reading source N, in
    Pulsar's order, the one at N mod their count (each stream reads exactly one source)."""
    readers: dict[int, list[Consumer]] = {}
    for c in streams:
        for source in c.sources or ():
            readers.setdefault(source, []).append(c)
    chosen: set[tuple[int, str]] = set()
    for source, consumers in readers.items():
        clients: dict[str, Consumer] = {}
        for c in _ranked(consumers):
            clients.setdefault(c.client_id, c)  # one client, however many streams
        order = list(clients)
        chosen.add((source, order[source % len(order)]))
    return frozenset(
        c.id for c in streams if any((s, c.client_id) in chosen for s in c.sources or ())
    )


def same_client(consumer: Consumer, other: Consumer) -> bool:
    """Whether two consumers are one client: the same one, or streams of one non-empty
    client_id."""
    return consumer is other or bool(other.client_id and consumer.client_id == other.client_id)


def held_by_stream(name: str, client_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"subscription {name} is exclusive and held by a StreamingPull consumer "
        f"(client_id {client_id}); Pull is refused while it is connected"
    )


def room(
    consumer: Consumer, settings: QueueSettings, leased: int, outstanding_bytes: int
) -> tuple[int, int]:
    """What ``consumer`` may take now (messages, bytes): its flow control within the caps;
    ``leased``/``outstanding_bytes``: the subscription's outstanding messages and bytes."""
    max_msgs, max_bytes = consumer.room()
    if settings.consumer_max_outstanding_messages:
        max_msgs = min(max_msgs, settings.consumer_max_outstanding_messages - consumer.outstanding)
    if settings.max_outstanding_messages:
        max_msgs = min(max_msgs, settings.max_outstanding_messages - leased)
    # Byte caps: nothing once reached; below one, at least one message (it may cross it).
    if settings.consumer_max_outstanding_bytes:
        left = settings.consumer_max_outstanding_bytes - consumer.outstanding_bytes
        if left <= 0:
            return 0, 0
        max_bytes = min(max_bytes, left)
    if settings.max_outstanding_bytes:
        left = settings.max_outstanding_bytes - outstanding_bytes
        if left <= 0:
            return 0, 0
        max_bytes = min(max_bytes, left)
    return max_msgs, max_bytes


def _weight(client_id: str, key: str) -> bytes:
    return hashlib.blake2b(f"{client_id}\x00{key}".encode(), digest_size=8).digest()
