"""The interfaces roles meet through (typing only): what each forwarder offers the others.

The frontends (``api/``), the control plane (``control/``) and the other forwarder reach a
forwarder only through these Protocols, handed out by the router by address
(``control/router.py``), and only with the plain values of ``core/records.py``: no log, ack
journal, cache or dispatcher object crosses. In ``pubsubd serve`` the implementations are the
in-process forwarders (``data/publish/forwarder.py``, ``data/subscribe/forwarder.py``); a
network transport implementing the same Protocols puts them in other processes.

Errors: calls raise ``core.errors`` domain errors; reads also raise ``OffsetOutOfRange`` (below
the retained range) and ``DamagedEntries`` (inside a damaged range) from ``storage.errors``,
exceptions carrying plain values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from pubsubd.core.active_notices import ActiveNotice
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.dedup_batches import DedupBatch
from pubsubd.core.errors import PubsubError
from pubsubd.core.failover_rank import FailoverRank
from pubsubd.core.quotas import Backlog, BacklogQuota
from pubsubd.core.records import CursorState, DamagedRange, Entry, SourceRange

CommitListener = Callable[[int], None]  # called with a source's committed offset
DueListener = Callable[[list[int]], None]  # called with delayed positions that fell due


class PublishingForwarderApi(Protocol):
    """A publishing forwarder: owns the publish message sources of its topics (their logs and
    every subscription's ack state on them, DESIGN: "publish message source")."""

    # --- topics ---------------------------------------------------------------------------

    def configure_topic(
        self, topic_uid: str, source_count: int, key_sources: int, damage_policy: DamagePolicy
    ) -> list[int]:
        """Open (or reconcile) a topic's storage; returns the sources added."""
        ...

    async def drop_topic(self, topic_uid: str) -> None:
        """Delete a topic's storage (nothing refers to it any more)."""
        ...

    def has_topic(self, topic_uid: str) -> bool:
        """Whether the topic's storage is open here (not dropped, not failed to open)."""
        ...

    def topic_uids(self, written_only: bool = False) -> list[str]:
        """The topics whose storage is open here (``written_only``: ever published to)."""
        ...

    def on_disk(self, topic_uid: str) -> bool:
        """Whether the topic was ever written to (it has storage on disk)."""
        ...

    def ranges(self, topic_uid: str) -> list[SourceRange]:
        """Per source: retained start, committed and end offsets."""
        ...

    def end_offsets(self, topic_uid: str) -> dict[int, int]:
        """Per source, the next offset to be assigned (a new subscription's sync point)."""
        ...

    # --- publishing -----------------------------------------------------------------------

    async def publish(
        self,
        topic_uid: str,
        payload: bytes,
        count: int,
        ordering_key: str | None = None,
        source: int | None = None,
    ) -> tuple[int, int]:
        """Persist one batch (a serialized PublishRequest of ``count`` messages); returns
        (source, base offset) once durable. ``source``: store it there instead of routing it
        (an existing source)."""
        ...

    async def publish_deduplicated(
        self,
        topic_uid: str,
        messages: Sequence[tuple[str, Any]] | DedupBatch,
        source: int | None = None,
    ) -> tuple[list[str], int]:
        """Persist the messages whose dedup ID the topic's window does not know; returns
        every message ID (the original one for a duplicate) and the duplicates count."""
        ...

    def publish_blocked(self, topic_uid: str) -> str | None:
        """Why publishing to the topic is refused now (a block_publishers backlog quota), or
        None. The subscribing side sets it (:meth:`set_publish_block`)."""
        ...

    def set_publish_block(
        self, topic_uid: str, subscription_uid: str, reason: str | None, from_us: int = 0
    ) -> None:
        """A subscription is over a block_publishers quota (``reason``; from epoch
        microseconds ``from_us`` on, for an age limit not reached yet), or back under it."""
        ...

    # --- reading --------------------------------------------------------------------------

    def source_count(self, topic_uid: str) -> int: ...

    def start_offset(self, topic_uid: str, source: int) -> int: ...

    def committed_offset(self, topic_uid: str, source: int) -> int: ...

    def read(
        self, topic_uid: str, source: int, offset: int, max_entries: int, max_bytes: int
    ) -> list[Entry]:
        """Committed entries from the one holding ``offset`` on, within the limits."""
        ...

    def entry_at(self, topic_uid: str, source: int, offset: int) -> Entry: ...

    def publish_time_us(self, topic_uid: str, source: int, offset: int) -> int:
        """Publish time of the entry holding ``offset`` (from the index, no read)."""
        ...

    def offset_for_time(self, topic_uid: str, source: int, publish_time_us: int) -> int:
        """First offset published at or after ``publish_time_us``."""
        ...

    def stored_bytes(self, topic_uid: str, source: int, start: int, stop: int) -> float:
        """Stored bytes of offsets ``[start, stop)`` (backlog byte quotas)."""
        ...

    def segment_sizes(self, topic_uid: str, source: int) -> list[tuple[int, int]]:
        """(base offset, bytes) per segment, oldest first (retention by size)."""
        ...

    def damage_policy(self, topic_uid: str) -> DamagePolicy: ...

    def damaged(self, topic_uid: str) -> list[tuple[int, DamagedRange]]:
        """(source, range) of every damaged range of the topic's logs."""
        ...

    def add_commit_listener(self, topic_uid: str, listener: CommitListener) -> None: ...

    def remove_commit_listener(self, topic_uid: str, listener: CommitListener) -> None: ...

    # --- delayed delivery -----------------------------------------------------------------

    def delay_due(self, topic_uid: str, at_us: int, position: int) -> bool:
        """Whether a message delayed until ``at_us`` may be delivered now."""
        ...

    def watch_due(
        self, topic_uid: str, key: int, listener: DueListener, pending: Callable[[], int]
    ) -> None:
        """Hand delayed positions to ``listener`` as they fall due (``pending``: how many the
        watcher holds undelivered, so the tracker pauses under pressure)."""
        ...

    def unwatch_due(self, topic_uid: str, key: int) -> None: ...

    # --- subscriptions' ack state ---------------------------------------------------------

    def attach(
        self, topic_uid: str, subscription_uid: str, start_offsets: Mapping[int, int]
    ) -> dict[int, CursorState]:
        """Open (or recover) a subscription's ack state, starting at its sync point."""
        ...

    async def detach(self, topic_uid: str, subscription_uid: str) -> None:
        """Forget a subscription's ack state (deleted or detached)."""
        ...

    def record_acks(
        self, topic_uid: str, subscription_uid: str, source: int, ranges: list[tuple[int, int]]
    ) -> None:
        """Newly acked ranges of one source; journaled on the next flush."""
        ...

    def reset_cursors(
        self, topic_uid: str, subscription_uid: str, states: Mapping[int, CursorState]
    ) -> None:
        """Replace the ack state (Seek); journaled on the next flush."""
        ...

    async def flush_acks(self, topic_uid: str, subscription_uid: str) -> None:
        """Make the subscription's recorded acks durable now (exactly-once acks, Seek)."""
        ...

    def ensure_writable(self) -> None:
        """Raise DiskFull while the data directory is known to be full (an exactly-once ack is
        refused before it changes anything, so the client's retry works once space returns)."""
        ...

    def cursor_states(self, topic_uid: str, subscription_uid: str) -> dict[int, CursorState]: ...

    # --- retention ------------------------------------------------------------------------

    def set_pins(self, topic_uid: str, owner: str, pins: Mapping[int, int] | None) -> None:
        """What ``owner`` (a snapshot, a named cursor, retention) keeps: per source, the lowest
        offset not to delete; None removes the owner's pin."""
        ...

    def pin_owners(self, topic_uid: str) -> list[str]: ...


class PulledResponse(Protocol):
    """One Pull's answer: framed ReceivedMessages (``core/wire.py``)."""

    messages: list[bytes]

    def give_back(self) -> int:
        """The response never reached the client: its messages are delivered again at once,
        without counting a delivery attempt."""
        ...


class StreamHandle(Protocol):
    """One StreamingPull as the frontend holds it."""

    @property
    def id(self) -> int: ...

    @property
    def outstanding(self) -> int: ...

    @property
    def incarnation(self) -> str:
        """The subscription incarnation the stream's deliveries belong to."""
        ...

    async def next_response(
        self,
    ) -> (
        tuple[list[bytes], list[int]]
        | tuple[list[bytes], list[int], int, list[int] | None, list[bytes | None] | None]
        | ActiveNotice
        | BaseException
    ):
        """The next response to write (or failover notice), or the error that ends the
        stream. A raw stream's responses are (stored messages, positions, the first lease
        generation, delivery attempts or None, each message's form: ``planner.Delivery``):
        unframed, no ack IDs built."""
        ...

    def end(self, error: BaseException) -> None: ...

    def set_ack_deadline(self, seconds: int) -> None: ...

    def set_max_messages(self, count: int) -> None:
        """The stream's max_outstanding_messages changed (a later request set it)."""
        ...

    def take_ready(
        self,
    ) -> list[
        tuple[list[bytes], list[int]]
        | tuple[list[bytes], list[int], int, list[int] | None, list[bytes | None] | None]
        | ActiveNotice
        | BaseException
    ]:
        """Deliver now what the stream's window allows and take the responses queued for it,
        up to the first notice or error (those stay for ``next_response``, in order)."""
        ...

    def alive(self) -> None:
        """A request arrived: the client reads this stream."""
        ...

    def close(self) -> None:
        """The stream is over (responses never written are given back)."""
        ...


class SubscribingForwarderApi(Protocol):
    """A subscribing forwarder: serves the subscriptions the router assigns to it (Pull,
    StreamingPull, push, acks, leases), reading their topics from publishing forwarders."""

    # --- subscriptions (the control plane reconciles them) ---------------------------------

    def open(
        self,
        name: str,
        subscription: Any,
        uid: str,
        topic_uid: str,
        start_offsets: dict[int, int],
        topic_quota: BacklogQuota | None = None,
    ) -> None:
        """Serve a subscription (``subscription``: its google.pubsub.v1.Subscription) from its
        sync point; ``topic_quota``: its topic's backlog quota, if any."""
        ...

    def configure(self, name: str, subscription: Any) -> None:
        """The subscription changed: its settings, filter, policies and push config apply."""
        ...

    def set_topic_quota(self, topic_uid: str, quota: BacklogQuota | None) -> None: ...

    def topic_changed(self, topic_uid: str) -> None:
        """The topic's storage settings changed: deliver again (e.g. a new damage policy)."""
        ...

    def close_subscription(self, name: str, error: PubsubError) -> None:
        """Stop serving a subscription; its consumers end with ``error``."""
        ...

    def mark_unavailable(self, name: str, why: str) -> None:
        """The subscription's topic storage cannot be opened: its calls answer DATA_LOSS."""
        ...

    def serves(self, name: str) -> bool: ...

    def subscription_names(self) -> list[str]: ...

    # --- data -----------------------------------------------------------------------------

    async def pull(self, name: str, max_messages: int, wait_s: float) -> PulledResponse: ...

    def open_stream(
        self,
        name: str,
        ack_deadline_s: int,
        max_messages: int,
        max_bytes: int,
        client_id: str = "",
        sources: frozenset[int] | None = None,
        active_notices: bool = False,
        failover_rank: FailoverRank | None = None,
        raw: bool = False,
    ) -> StreamHandle:
        """A StreamingPull consumer; ``sources``: it takes messages of these publish message
        sources only (None: of every source); ``active_notices``: it is told when it becomes
        or stops being a failover subscription's receiver (core/active_notices.py);
        ``failover_rank``: how it ranks on a failover subscription (core/failover_rank.py);
        ``raw``: its responses unframed (an in-process caller's, ``StreamHandle``)."""
        ...

    def acknowledge(self, name: str, ack_ids: list[str]) -> None: ...

    def acknowledge_runs(
        self, name: str, incarnation: str, runs: list[tuple[int, int, int]]
    ) -> None:
        """``acknowledge`` of the ack IDs of ``incarnation`` that runs name: (position,
        generation, count) is ``count`` deliveries, the k-th at position + k with generation
        + k (a response's lease run, leases.py)."""
        ...

    def modify_ack_deadline(self, name: str, ack_ids: list[str], seconds: int) -> None: ...

    def modify_deadline_deliveries(
        self, name: str, incarnation: str, deliveries: list[tuple[int, int]], seconds: int
    ) -> None:
        """``modify_ack_deadline`` of the ack IDs (position, generation) of ``incarnation``
        name."""
        ...

    def give_back(self, name: str, ack_ids: list[str]) -> int:
        """A frontend could not hand these deliveries to its client: they go to other
        consumers at once, without counting an attempt. Returns how many went back."""
        ...

    def give_back_deliveries(
        self, name: str, incarnation: str, deliveries: list[tuple[int, int]]
    ) -> int:
        """``give_back`` of the ack IDs (position, generation) of ``incarnation`` name."""
        ...

    async def acknowledge_checked(self, name: str, ack_ids: list[str]) -> None:
        """Acknowledge; under exactly-once, durable before returning, stale IDs reported."""
        ...

    async def modify_ack_deadline_checked(
        self, name: str, ack_ids: list[str], seconds: int
    ) -> None: ...

    # --- ack state (Seek, snapshots, retention expiry) --------------------------------------

    def cursor_states(self, name: str) -> dict[int, CursorState]: ...

    async def reset(self, name: str, states: dict[int, CursorState]) -> None:
        """Replace the ack state (Seek); durable before returning."""
        ...

    def ack_below(self, name: str, source: int, cut: int) -> bool:
        """Messages of ``source`` below ``cut`` leave the backlog (retention expiry)."""
        ...

    def skip_damaged(self, topic_uid: str, damaged: list[tuple[int, DamagedRange]]) -> int: ...

    # --- state ----------------------------------------------------------------------------

    def in_use(self, name: str) -> bool:
        """Whether a consumer (stream, Pull, pusher) is attached (expiration_policy)."""
        ...

    def backlog_stats(self, name: str, now_us: int) -> Backlog: ...

    def status(self, name: str) -> dict[str, Any]: ...

    def enforce_eviction(self) -> int:
        """evict_oldest backlog quotas: ack the oldest messages of over-quota subscriptions."""
        ...

    def refresh_blocks(self) -> None:
        """Re-evaluate block_publishers quotas (their age limits move with time)."""
        ...
