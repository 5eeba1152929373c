"""Producer access modes of one Pulsar topic (pure): who may produce, who waits, who is fenced.

Pulsar 2.8+ (PIP-68) lets a PRODUCER ask for ``producer_access_mode``; the rules are the
broker's (``AbstractTopic.incrementTopicEpochIfNeeded`` and ``handleProducerRemoved``,
apache/pulsar):

- **Shared** (the default): refused with ProducerBusy while an exclusive producer holds the
  topic or one waits for it.
- **Exclusive**: refused with ProducerFenced while another exclusive producer holds the topic or
  waits, or while shared producers are connected; else it holds the topic.
- **WaitForExclusive**: queued (the broker answers PRODUCER_SUCCESS with ``producer_ready``
  false) while any producer is connected; it holds the topic when the holder leaves, the first
  queued first.
- **ExclusiveWithFencing**: every connected producer is closed and every queued one refused with
  ProducerFenced, and it holds the topic.

Each exclusive grant moves the topic's **epoch** on (0 for the first) and answers it as
PRODUCER_SUCCESS ``topic_epoch``; the client sends it back when it reconnects, and an epoch
below the topic's means another producer held the topic in between: ProducerFenced. A
reconnecting producer with an epoch at or above the topic's takes that epoch.

``TopicAccess`` is generic over the key that names a producer (the front's
``(connection, producer_id)`` slot); it decides and says what to do, the connection does it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class AccessMode(IntEnum):
    """``ProducerAccessMode`` of PulsarApi.proto, with its wire values."""

    SHARED = 0
    EXCLUSIVE = 1
    WAIT_FOR_EXCLUSIVE = 2
    EXCLUSIVE_WITH_FENCING = 3


@dataclass(frozen=True, slots=True)
class Granted(Generic[K]):
    """The producer may produce now; ``epoch`` is the topic's (None: no exclusive producer
    ever held it). ``fenced``: producers to close (ExclusiveWithFencing); ``refused``: queued
    producers to refuse with ProducerFenced."""

    epoch: int | None
    fenced: tuple[K, ...] = ()
    refused: tuple[K, ...] = ()


@dataclass(frozen=True, slots=True)
class Queued:
    """WaitForExclusive behind a connected producer: answer ``producer_ready`` false."""


@dataclass(frozen=True, slots=True)
class Refused:
    """Answer the PRODUCER with this ServerError (ProducerBusy or ProducerFenced)."""

    error: str
    message: str


Decision = Granted[K] | Queued | Refused


@dataclass(frozen=True, slots=True)
class Promoted(Generic[K]):
    """A queued producer now holds the topic: answer its PRODUCER with ``producer_ready``."""

    key: K
    epoch: int


@dataclass(frozen=True, slots=True)
class Released(Generic[K]):
    """What a release changes: a queued producer that now holds the topic, and queued ones
    to refuse with ProducerFenced."""

    promoted: Promoted[K] | None
    refused: tuple[K, ...] = ()


@dataclass(slots=True)
class _Waiting(Generic[K]):
    key: K
    name: str
    topic_epoch: int | None


@dataclass(slots=True)
class TopicAccess(Generic[K]):
    """The producers of one topic (a partition is a topic of its own, as in Pulsar)."""

    producers: dict[K, AccessMode] = field(default_factory=dict)  # connected, in order
    holder: K | None = None  # the exclusive producer
    holder_name: str = ""
    waiting: deque[_Waiting[K]] = field(default_factory=deque)
    epoch: int | None = None

    @property
    def idle(self) -> bool:
        """Nothing connected or queued (the epoch alone is worth keeping while the process
        lives: a fenced producer that reconnects later must still be refused)."""
        return not self.producers and not self.waiting

    def request(self, key: K, name: str, mode: AccessMode, topic_epoch: int | None) -> Decision[K]:
        """A PRODUCER of ``name`` in ``mode``; ``topic_epoch``: the epoch the client was given
        before (it is reconnecting), else None. A key already connected is granted again."""
        if key in self.producers:
            return Granted(self.epoch)
        busy = self.holder is not None or bool(self.waiting)
        if mode == AccessMode.SHARED:
            if busy:
                return Refused(
                    "ProducerBusy", f"Topic has an existing exclusive producer: {self.holder_name}"
                )
            self.producers[key] = mode
            return Granted(self.epoch)
        if mode == AccessMode.EXCLUSIVE:
            if busy:
                return Refused(
                    "ProducerFenced",
                    f"Topic has an existing exclusive producer: {self.holder_name}",
                )
            if self.producers:
                return Refused("ProducerFenced", "Topic has existing shared producers")
            return self._grant(key, name, mode, topic_epoch)
        if mode == AccessMode.WAIT_FOR_EXCLUSIVE:
            if self.holder is not None or self.producers:
                self.waiting.append(_Waiting(key, name, topic_epoch))
                return Queued()
            return self._grant(key, name, mode, topic_epoch)
        # EXCLUSIVE_WITH_FENCING
        refused = tuple(w.key for w in self.waiting)
        fenced = tuple(self.producers)
        self.waiting.clear()
        self.producers.clear()
        self.holder, self.holder_name = None, ""
        granted = self._grant(key, name, mode, topic_epoch)
        if isinstance(granted, Refused):
            return granted
        return Granted(granted.epoch, fenced, refused)

    def _grant(
        self, key: K, name: str, mode: AccessMode, topic_epoch: int | None
    ) -> Granted[K] | Refused:
        current = -1 if self.epoch is None else self.epoch
        if topic_epoch is not None and topic_epoch < current:
            return Refused(
                "ProducerFenced",
                f"Topic epoch has already moved. Current epoch: {current}, "
                f"Producer epoch: {topic_epoch}",
            )
        self.epoch = topic_epoch if topic_epoch is not None else current + 1
        self.holder, self.holder_name = key, name
        self.producers[key] = mode
        return Granted(self.epoch)

    def release(self, key: K) -> Released[K]:
        """The producer closed, or its connection ended, or it gave up waiting. When the topic
        is then free (no holder, no producer connected), the first queued producer takes it;
        a queued producer whose epoch was passed meanwhile is refused (ProducerFenced) and the
        next one tried. (Pulsar promotes only when an exclusive holder leaves, so a producer
        queued behind shared producers waits for good there; here it gets the topic once they
        have all left.)"""
        self.waiting = deque(w for w in self.waiting if w.key != key)
        if self.producers.pop(key, None) is not None and key == self.holder:
            self.holder, self.holder_name = None, ""
        refused: list[K] = []
        while self.waiting and self.holder is None and not self.producers:
            nxt = self.waiting.popleft()
            granted = self._grant(nxt.key, nxt.name, AccessMode.WAIT_FOR_EXCLUSIVE, nxt.topic_epoch)
            if isinstance(granted, Granted) and granted.epoch is not None:
                return Released(Promoted(nxt.key, granted.epoch), tuple(refused))
            refused.append(nxt.key)
        return Released(None, tuple(refused))
