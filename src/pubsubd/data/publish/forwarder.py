"""Publishing forwarder: persists published batches and the ack state of every subscription.

It owns the publish message sources of the topics the router assigns to it: their logs, every
subscription's ack journal on them, the topics' delay trackers and dedup windows. Everything
else reaches it through ``core.roles.PublishingForwarderApi``, with plain values only (publish a
batch, read a range, attach a subscription and record its acks, pins, commit notifications);
in ``pubsubd serve`` the calls are in-process, and a network transport can sit behind the same
methods. A publish is acknowledged only after the log says the entry is durable (group commit,
fsync per policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pubsubd.acks.cursor import Cursor
from pubsubd.acks.journal import AckJournal
from pubsubd.acks.replicated import JournalLedgers, cursor_source
from pubsubd.core import pb
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.dedup_batches import DedupBatch
from pubsubd.core.delays import MARKER
from pubsubd.core.errors import (
    DataLoss,
    DiskFull,
    InternalError,
    InvalidArgument,
    NotServedHere,
    SubscriptionNotFound,
    Unavailable,
)
from pubsubd.core.quotas import BacklogQuota
from pubsubd.core.records import CursorState, SourceRange
from pubsubd.data.publish.dedup import Deduplicator
from pubsubd.data.publish.delays import DelayTracker, DueListener
from pubsubd.data.publish.owner_quotas import OwnerQuotas
from pubsubd.data.publish.source import TopicSources
from pubsubd.observability import background
from pubsubd.storage import disk_space
from pubsubd.storage.damage import DamagedRange
from pubsubd.storage.delay_index import FILE_NAME as DELAY_INDEX_FILE
from pubsubd.storage.delay_index import DelayIndex
from pubsubd.storage.disk_space import DiskSpace
from pubsubd.storage.errors import ReplicationFailed, StorageError
from pubsubd.storage.framing import Entry
from pubsubd.storage.ledgers.writer import SourceLedgers
from pubsubd.storage.log import FsyncPolicy, RemoteLogs, SourceLog

log = logging.getLogger(__name__)

# On-disk layout under the data directory.
TOPICS_DIR = "topics"  # topics/{topic uid}/source-{n}/  segments of each source
SUBSCRIPTIONS_DIR = "subscriptions"  # subscriptions/{subscription uid}/  ack journal
DEFAULT_DEDUP_WINDOW_S = 600.0  # how long PublishDeduplicated remembers a dedup ID
# Defaults of the settings storage.trim_interval_s (how often ack journals are flushed and
# fully acked segments deleted) and storage.ack_flush_interval_s (config.py).
DEFAULT_TRIM_INTERVAL_S = 2.0
DEFAULT_ACK_FLUSH_INTERVAL_S = 0.05


class PublishingForwarder:
    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        segment_bytes: int = 64 << 20,
        disk: DiskSpace | None = None,
        trim_interval_s: float = DEFAULT_TRIM_INTERVAL_S,
        ack_flush_interval_s: float = DEFAULT_ACK_FLUSH_INTERVAL_S,
        dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S,
        clock: Clock = SYSTEM_CLOCK,
        remote_logs: RemoteLogs | None = None,
        admits: Callable[[str], bool] | None = None,
        owner_quotas: bool = False,
    ) -> None:
        """``owner_quotas``: evaluate the block_publishers backlog quotas of the topics owned
        here, over every subscription's journal (a cluster of forwarders:
        ``data/publish/owner_quotas.py``); without it the dispatchers do (``pubsubd serve``)."""
        self.data_dir = data_dir
        # In a cluster of forwarders: the topics (by uid) this one owns now. Opening another
        # one would take its sources over from their owner: refused (NotServedHere).
        self.admits = admits
        # In a cluster: where each source's durable copy lives (storage/ledgers/); None keeps
        # every source on this machine's disk only.
        self.remote_logs = remote_logs
        self.clock = clock
        # Disk-full episodes of the data directory (storage/disk_space.py): every write failing
        # for lack of space is answered RESOURCE_EXHAUSTED and reported there, once per episode.
        self.disk = disk or DiskSpace(data_dir)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.trim_interval_s = trim_interval_s
        self.ack_flush_interval_s = ack_flush_interval_s
        # Completed trim passes (/status "trim_passes"): tests wait for the next pass with it.
        self.trim_passes = 0
        self.topics: dict[str, TopicSources] = {}
        # Topics whose storage could not be opened (an unreadable directory or segment file):
        # uid -> why. They answer DATA_LOSS; every other topic serves.
        self.failed_topics: dict[str, str] = {}
        # Delayed messages of every topic, by due time, on disk; one tracker per open topic.
        self.delay_index: DelayIndex | None = None
        self.delays: dict[str, DelayTracker] = {}
        # Topics that had delayed messages in an earlier run (their trackers open with them).
        self._delay_topics: set[str] | None = None
        # Topics with storage on disk (published to): the only ones housekeeping must visit.
        # Every append goes through publish(), which adds to it.
        self.stored: set[str] = set()
        # Messages and bytes published per topic uid while held here (its load report).
        self.published: dict[str, list[int]] = {}
        self._dirty_journals: set[AckJournal] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_publish_us = 0
        # Who waits for a topic's delayed messages: topic uid -> watcher key -> listener
        # (installed in the topic's tracker when it has one, and when it gets one).
        self._due_watchers: dict[str, dict[int, DueListener]] = {}
        # block_publishers backlog quotas exceeded: topic uid -> subscription uid -> (why,
        # from when in epoch microseconds: an age limit is known in advance)
        self._publish_blocks: dict[str, dict[str, tuple[str, int]]] = {}
        # PublishDeduplicated's windows, per topic (data/publish/dedup.py)
        self.dedup = Deduplicator(self, dedup_window_s, clock)
        self.owner_quotas = (
            OwnerQuotas(self, self._journal_cursors, self.set_publish_block, clock.time_us)
            if owner_quotas
            else None
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Rebuild the dedup windows (their pins before the first trim), start housekeeping."""
        self.dedup.recover(list(self.topics))
        self.dedup.start()
        self._tasks = [
            asyncio.create_task(self._trim_loop(), name="trim_loop"),
            asyncio.create_task(self._ack_flush_loop(), name="ack_flush_loop"),
        ]

    async def close(self) -> None:
        await self.dedup.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self._flush_acks()
        for tracker in self.delays.values():
            tracker.close()
        self.delays.clear()
        for sources in self.topics.values():
            await sources.close()
        self.topics.clear()
        if self.delay_index is not None:
            self.delay_index.close()
            self.delay_index = None

    # --- topics and subscriptions -------------------------------------------------------------

    def open_topic(self, topic_uid: str, source_count: int = 1) -> TopicSources:
        """The topic's sources, opened on first use with at least ``source_count`` sources
        (and every source present on disk); ``configure_topic`` adds sources later."""
        sources = self.topics.get(topic_uid)
        if sources is None:
            if self.admits is not None and not self.admits(topic_uid):
                raise NotServedHere(f"topic storage {topic_uid}")
            failed = self.failed_topics.get(topic_uid)
            if failed is not None:
                raise DataLoss(failed)
            directory = self.data_dir / TOPICS_DIR / topic_uid
            try:
                sources = TopicSources(
                    topic_uid,
                    directory,
                    fsync=self.fsync,
                    segment_bytes=self.segment_bytes,
                    source_count=source_count,
                    remote_logs=self.remote_logs,
                )
            except (OSError, StorageError) as e:
                # Damaged entries never get here (the log records them and opens); this is a
                # topic whose files cannot be read at all. It alone is out of service.
                why = f"the storage of topic {topic_uid} in {directory} cannot be opened: {e}"
                log.error("%s; the topic answers DATA_LOSS until it is repaired", why)
                self.failed_topics[topic_uid] = why
                raise DataLoss(why) from e
            self.topics[topic_uid] = sources
            if sources.on_disk():
                self.stored.add(topic_uid)
            if topic_uid in self._topics_with_delays():
                self.delay_tracker(topic_uid)
        return sources

    def _topics_with_delays(self) -> set[str]:
        if self._delay_topics is None:
            exists = (self.data_dir / DELAY_INDEX_FILE).exists()
            self._delay_topics = self._delay_index().topics() if exists else set()
        return self._delay_topics

    def delay_tracker(self, topic_uid: str, first_delay: bool = False) -> DelayTracker:
        """The tracker of a topic's delayed messages. Created only for topics that have some
        (at their first delayed publish, at open if they had some before, or when a dispatcher
        meets one): topics without delayed messages pay nothing.

        ``first_delay``: called by a delayed publish to a topic with no tracker, so its log
        holds no delayed message yet unless the index knows the topic (see DelayTracker)."""
        tracker = self.delays.get(topic_uid)
        if tracker is None:
            sources = self.open_topic(topic_uid)
            if topic_uid in self.delays:  # opening it opened its tracker
                return self.delays[topic_uid]
            first_delay = first_delay and topic_uid not in self._topics_with_delays()
            tracker = DelayTracker(sources, self._delay_index(), first_delay, self.clock)
            self.delays[topic_uid] = tracker
            for key, listener in self._due_watchers.get(topic_uid, {}).items():
                tracker.add_listener(key, listener)
        return tracker

    def _delay_index(self) -> DelayIndex:
        if self.delay_index is None:
            self.delay_index = DelayIndex.open(self.data_dir, self.disk)
        return self.delay_index

    def configure_topic(
        self,
        topic_uid: str,
        source_count: int,
        key_sources: int,
        damage_policy: DamagePolicy = DamagePolicy.STOP,
        active: int = 0,
    ) -> list[int]:
        """Open a topic with at least ``source_count`` sources (adding the missing ones at
        runtime), fix which of them take ordering keys, how many take unkeyed publishes
        (``active``, 0: all) and what delivery does at damaged messages; returns the sources
        added."""
        sources = self.open_topic(topic_uid, source_count)
        sources.key_sources = key_sources
        sources.active = active
        sources.damage_policy = damage_policy
        return self._grow(topic_uid, sources, source_count)

    def _grow(self, topic_uid: str, sources: TopicSources, source_count: int) -> list[int]:
        added = sources.grow(source_count)
        if added:
            for journal in sources.journals.values():
                self._dirty_journals.add(journal)  # their new cursors, journaled soon
            tracker = self.delays.get(topic_uid)
            if tracker is not None:
                tracker.watch_sources()
            log.info("topic %s: publish message sources %s added", topic_uid, added)
        return added

    def remove_unreferenced(self, keep: set[str]) -> None:
        """Delete storage of topic incarnations nothing refers to any more (start-up cleanup)."""
        root = self.data_dir / TOPICS_DIR
        if not root.is_dir():
            return
        for path in root.iterdir():
            if path.name not in keep and path.name not in self.topics:
                log.info("removing storage of deleted topic %s", path.name)
                shutil.rmtree(path, ignore_errors=True)

    async def drop_topic(self, topic_uid: str) -> None:
        """Delete a topic's storage (its last subscription is gone and the topic is deleted)."""
        sources = self.topics.pop(topic_uid, None)
        self.stored.discard(topic_uid)
        self.published.pop(topic_uid, None)
        tracker = self.delays.pop(topic_uid, None)
        if tracker is not None:
            tracker.close()
        if topic_uid in self._topics_with_delays() or tracker is not None:
            self._delay_index().drop(topic_uid)
            self._topics_with_delays().discard(topic_uid)
        if sources is not None:
            await sources.destroy()

    async def release_topic(self, topic_uid: str) -> list[str]:
        """Let a topic go to another forwarder (a cluster moved it): its logs and its
        subscriptions' ack journals are flushed and closed, its ledgers released; the files
        stay as a local copy. Returns the uids of the subscriptions whose journals closed."""
        sources = self.topics.pop(topic_uid, None)
        self.stored.discard(topic_uid)
        self.published.pop(topic_uid, None)
        self.dedup.windows.pop(topic_uid, None)
        self._publish_blocks.pop(topic_uid, None)
        if self.owner_quotas is not None:
            self.owner_quotas.forget(topic_uid)
        tracker = self.delays.pop(topic_uid, None)
        if tracker is not None:
            # On a full disk the next owner indexes the log again from the recorded progress.
            with contextlib.suppress(DiskFull):
                tracker.flush_progress()
            tracker.close()
        if sources is None:
            return []
        for journal in sources.journals.values():
            self._dirty_journals.discard(journal)
        await sources.close()
        return list(sources.journals)

    def end_offsets(self, topic_uid: str) -> dict[int, int]:
        return self.open_topic(topic_uid).end_offsets()

    def attach(
        self, topic_uid: str, sub_uid: str, start_offsets: Mapping[int, int]
    ) -> dict[int, CursorState]:
        """Open (or recover) the ack journal of a subscription, starting at its sync point;
        returns its ack state."""
        journal = self._attach(topic_uid, sub_uid, start_offsets)
        if self.owner_quotas is not None:
            self.owner_quotas.evaluate(topic_uid, sub_uid)
        return {s: c.snapshot() for s, c in journal.cursors.items()}

    def _attach(self, topic_uid: str, sub_uid: str, start_offsets: Mapping[int, int]) -> AckJournal:
        sources = self.open_topic(topic_uid)
        journal = sources.journals.get(sub_uid)
        if journal is None:
            # A source the sync point does not name was added after the subscription was
            # created: everything in it is after the sync point.
            initial = {s: start_offsets.get(s, 0) for s in range(len(sources.logs))}
            initial.update(start_offsets)
            mirror = None
            if self.remote_logs is not None:  # a cluster: the journal is on the storage nodes
                ledgers = self.remote_logs(cursor_source(sub_uid), 0)
                assert isinstance(ledgers, SourceLedgers)
                mirror = JournalLedgers(ledgers)
            journal = AckJournal.open(
                self.data_dir / SUBSCRIPTIONS_DIR / sub_uid, initial=initial, mirror=mirror
            )
            sources.journals[sub_uid] = journal
            # A cursor means its source existed (a deleted topic's storage has no labels, and
            # a source never written to has no directory): open it, so logs cover every cursor.
            self._grow(topic_uid, sources, max(journal.cursors, default=-1) + 1)
        return journal

    async def detach(self, topic_uid: str, sub_uid: str) -> None:
        """Forget a subscription's ack state (subscription deleted)."""
        sources = self.topics.get(topic_uid)
        if sources is None:
            return
        journal = sources.journals.pop(sub_uid, None)
        if self.owner_quotas is not None:
            self.owner_quotas.evaluate(topic_uid, sub_uid)  # it blocks nothing any more
        if journal is not None:
            self._dirty_journals.discard(journal)
            await journal.close()
            journal.delete()
            if journal.mirror is not None:
                await journal.mirror.destroy()

    # --- data path ----------------------------------------------------------------------------

    async def publish(
        self,
        topic_uid: str,
        payload: bytes,
        count: int,
        ordering_key: str | None = None,
        source: int | None = None,
    ) -> tuple[int, int]:
        """Persist one batch; return (source, base offset) once it is durable.

        ``ordering_key`` is the batch's (every message of a PublishRequest has the same one);
        None: read it from ``payload`` when the topic has several sources. ``source``: store
        the batch there instead of routing it (INVALID_ARGUMENT if there is no such source)."""
        sources = self.open_topic(topic_uid)
        if source is not None:
            if not 0 <= source < len(sources.logs):
                raise InvalidArgument(
                    f"source: {source} is not a source of this topic "
                    f"(it has sources 0..{len(sources.logs) - 1})"
                )
        elif len(sources.logs) <= 1:
            source = 0
        else:
            if ordering_key is None:
                request = pb.PublishRequest.FromString(payload)
                ordering_key = request.messages[0].ordering_key if request.messages else ""
            source = sources.route(ordering_key, count)
        if MARKER in payload and topic_uid not in self.delays:
            # Indexes this batch when it commits, and nothing committed before it.
            self.delay_tracker(topic_uid, first_delay=True)
        self.stored.add(topic_uid)  # its log creates its files on this first write
        now_us = self.clock.time_us()
        # Publish times never go backwards within the process, so time lookups can bisect.
        now_us = max(now_us, self._last_publish_us)
        self._last_publish_us = now_us
        try:
            base = await sources.logs[source].append(payload, count, now_us)
        except StorageError as e:
            full = self.disk.error(e, disk_space.LOG)
            if full is not None:
                raise full from e
            if isinstance(e.__cause__, (ReplicationFailed, Unavailable)):
                # Storage nodes or ZooKeeper out of reach, or this writer fenced or its
                # session gone: the client retries, here later or at another server.
                raise Unavailable(f"storage unavailable: {e.__cause__}") from e
            log.exception("append to topic %s failed", topic_uid)
            raise InternalError(f"storage write failed: {e}") from e
        if self.disk.full:
            self.disk.succeeded()
        counts = self.published.get(topic_uid)
        if counts is None:
            counts = self.published[topic_uid] = [0, 0]
        counts[0] += count
        counts[1] += len(payload)
        if self.owner_quotas is not None:  # before the publish is answered
            self.owner_quotas.evaluate(topic_uid)
        return source, base

    async def publish_deduplicated(
        self,
        topic_uid: str,
        messages: Sequence[tuple[str, Any]] | DedupBatch,
        source: int | None = None,
    ) -> tuple[list[str], int]:
        """Publish what the topic's dedup window does not know (data/publish/dedup.py)."""
        return await self.dedup.publish(topic_uid, messages, source)

    def publish_blocked(self, topic_uid: str) -> str | None:
        blocks = self._publish_blocks.get(topic_uid)
        if not blocks:
            return None
        now_us = self.clock.time_us()
        for reason, from_us in blocks.values():
            if now_us >= from_us:
                return reason
        return None

    def set_publish_block(
        self, topic_uid: str, subscription_uid: str, reason: str | None, from_us: int = 0
    ) -> None:
        if reason is None:
            blocks = self._publish_blocks.get(topic_uid)
            if blocks is not None:
                blocks.pop(subscription_uid, None)
                if not blocks:
                    del self._publish_blocks[topic_uid]
        else:
            self._publish_blocks.setdefault(topic_uid, {})[subscription_uid] = (reason, from_us)

    # --- reading ------------------------------------------------------------------------------

    def _log(self, topic_uid: str, source: int) -> SourceLog:
        return self.open_topic(topic_uid).logs[source]

    def source_count(self, topic_uid: str) -> int:
        return len(self.open_topic(topic_uid).logs)

    def ranges(self, topic_uid: str) -> list[SourceRange]:
        return [
            SourceRange(log_.start_offset, log_.committed_offset, log_.end_offset)
            for log_ in self.open_topic(topic_uid).logs
        ]

    def start_offset(self, topic_uid: str, source: int) -> int:
        return self._log(topic_uid, source).start_offset

    def committed_offset(self, topic_uid: str, source: int) -> int:
        return self._log(topic_uid, source).committed_offset

    def read(
        self, topic_uid: str, source: int, offset: int, max_entries: int, max_bytes: int
    ) -> list[Entry]:
        return self._log(topic_uid, source).read(
            offset, max_entries=max_entries, max_bytes=max_bytes
        )

    def entry_at(self, topic_uid: str, source: int, offset: int) -> Entry:
        return self._log(topic_uid, source).entry_at(offset)

    def publish_time_us(self, topic_uid: str, source: int, offset: int) -> int:
        return self._log(topic_uid, source).publish_time_us(offset)

    def offset_for_time(self, topic_uid: str, source: int, publish_time_us: int) -> int:
        return self._log(topic_uid, source).offset_for_time(publish_time_us)

    def stored_bytes(self, topic_uid: str, source: int, start: int, stop: int) -> float:
        return self._log(topic_uid, source).stored_bytes(start, stop)

    def segment_sizes(self, topic_uid: str, source: int) -> list[tuple[int, int]]:
        return self._log(topic_uid, source).segment_sizes()

    def damage_policy(self, topic_uid: str) -> DamagePolicy:
        return self.open_topic(topic_uid).damage_policy

    def on_disk(self, topic_uid: str) -> bool:
        """Whether the topic was ever written to (housekeeping skips the others)."""
        return topic_uid in self.stored

    # --- delayed delivery ---------------------------------------------------------------------

    def delay_due(self, topic_uid: str, at_us: int, position: int) -> bool:
        return self.delay_tracker(topic_uid).is_due(at_us, position)

    def watch_due(
        self,
        topic_uid: str,
        key: int,
        listener: Callable[[list[int]], None],
        pending: Callable[[], int],
    ) -> None:
        """Hand delayed positions to ``listener`` as they fall due; only topics with delayed
        messages have a tracker, so watching one without costs nothing until its first."""
        due = DueListener(listener, pending)
        self._due_watchers.setdefault(topic_uid, {})[key] = due
        tracker = self.delays.get(topic_uid)
        if tracker is not None:
            tracker.add_listener(key, due)

    def unwatch_due(self, topic_uid: str, key: int) -> None:
        watchers = self._due_watchers.get(topic_uid)
        if watchers is not None:
            watchers.pop(key, None)
            if not watchers:
                del self._due_watchers[topic_uid]
        tracker = self.delays.get(topic_uid)
        if tracker is not None:
            tracker.remove_listener(key)

    # --- ack state ----------------------------------------------------------------------------

    def _journal(self, topic_uid: str, sub_uid: str) -> AckJournal:
        sources = self.topics.get(topic_uid)
        journal = sources.journals.get(sub_uid) if sources is not None else None
        if journal is None:
            raise SubscriptionNotFound(f"(storage {sub_uid} of topic storage {topic_uid})")
        return journal

    def record_acks(
        self, topic_uid: str, sub_uid: str, source: int, ranges: list[tuple[int, int]]
    ) -> None:
        """Mark ranges acked in a subscription's cursor; journaled on the next flush."""
        journal = self._journal(topic_uid, sub_uid)
        cursor = journal.cursor(source, 0)
        new: list[tuple[int, int]] = []
        for start, end in ranges:
            new.extend(cursor.ack_range(start, end))
        if new:
            journal.record(source, new)
            self._dirty_journals.add(journal)
            if self.owner_quotas is not None:
                self.owner_quotas.evaluate(topic_uid, sub_uid)

    def reset_cursors(
        self, topic_uid: str, sub_uid: str, states: Mapping[int, CursorState]
    ) -> None:
        journal = self._journal(topic_uid, sub_uid)
        for source, state in states.items():
            journal.reset(source, state)
        self._dirty_journals.add(journal)
        if self.owner_quotas is not None:
            self.owner_quotas.evaluate(topic_uid, sub_uid)

    def _journal_cursors(self, topic_uid: str) -> dict[str, Mapping[int, Cursor]]:
        """Every attached subscription's cursors of the topic, by subscription uid."""
        sources = self.topics.get(topic_uid)
        if sources is None:
            return {}
        return {uid: journal.cursors for uid, journal in sources.journals.items()}

    def set_topic_quota(self, topic_uid: str, quota: BacklogQuota | None) -> None:
        """The topic's backlog quota, evaluated here with ``owner_quotas`` (else ignored)."""
        if self.owner_quotas is not None:
            self.owner_quotas.set_topic_quota(topic_uid, quota)

    def set_subscription_quota(
        self,
        topic_uid: str,
        sub_uid: str,
        name: str,
        own: BacklogQuota | None = None,
        has_own: bool = False,
        gone: bool = False,
    ) -> None:
        """A subscription of a topic owned here: its name and its own backlog quota, when it
        has one (``has_own``; ``own`` None then: labels that do not parse); ``gone``: deleted
        or detached."""
        if self.owner_quotas is None:
            return
        if gone:
            self.owner_quotas.forget_subscription(topic_uid, sub_uid)
        else:
            self.owner_quotas.set_subscription(topic_uid, sub_uid, name, own, has_own)

    def count_subscription(
        self, topic_uid: str, sub_uid: str, start_offsets: Mapping[int, int]
    ) -> None:
        """With ``owner_quotas``: open the ack journal of a subscription of a topic owned here
        now (what its subscribing forwarder's ``attach`` would do), so that its backlog counts
        against its quota at once: on its creation, and when the topic is gained from another
        forwarder (its journal restored from its cursor ledgers), not only once the
        subscribing forwarder serving it attaches again (it does so on its next ack). A topic
        that cannot be opened (DATA_LOSS) counts nothing, as before."""
        if self.owner_quotas is None:
            return
        try:
            self.attach(topic_uid, sub_uid, start_offsets)
        except (DataLoss, NotServedHere) as e:
            log.debug("subscription storage %s not counted here: %s", sub_uid, e)

    def cursor_states(self, topic_uid: str, sub_uid: str) -> dict[int, CursorState]:
        journal = self._journal(topic_uid, sub_uid)
        return {s: c.snapshot() for s, c in journal.cursors.items()}

    async def flush_acks(self, topic_uid: str, sub_uid: str) -> None:
        """Make a subscription's recorded acks durable now (exactly-once acknowledgements,
        Seek). A full disk raises DiskFull; the acks stay recorded (in the cursors) and the
        background flush retries until they are durable."""
        await self._flush_journal(self._journal(topic_uid, sub_uid))

    def ensure_writable(self) -> None:
        refusal = self.disk.refusal(disk_space.ACKS)
        if refusal is not None:
            raise refusal

    async def _flush_journal(self, journal: AckJournal) -> None:
        self._dirty_journals.discard(journal)
        try:
            await journal.flush(sync=self.fsync is not FsyncPolicy.NEVER)
        except OSError as e:
            full = self.disk.error(e, disk_space.ACKS)
            if full is not None:
                self._dirty_journals.add(journal)
                raise full from e
            raise
        self.disk.succeeded()

    # --- retention ----------------------------------------------------------------------------

    def set_pins(self, topic_uid: str, owner: str, pins: Mapping[int, int] | None) -> None:
        sources = self.topics.get(topic_uid)
        if sources is None:
            if pins is None:
                return
            sources = self.open_topic(topic_uid)
        if pins is None:
            sources.pins.pop(owner, None)
        else:
            sources.pins[owner] = dict(pins)

    def pin_owners(self, topic_uid: str) -> list[str]:
        sources = self.topics.get(topic_uid)
        return list(sources.pins) if sources is not None else []

    def has_topic(self, topic_uid: str) -> bool:
        return topic_uid in self.topics

    def topic_uids(self, written_only: bool = False) -> list[str]:
        if written_only:
            return [u for u in self.stored if u in self.topics]
        return list(self.topics)

    # --- notifications ------------------------------------------------------------------------

    def add_commit_listener(self, topic_uid: str, callback: Callable[[int], None]) -> None:
        """Call ``callback`` after each commit of every source, including sources added later."""
        self.open_topic(topic_uid).add_listener(callback)

    def remove_commit_listener(self, topic_uid: str, callback: Callable[[int], None]) -> None:
        sources = self.topics.get(topic_uid)
        if sources is not None:
            sources.remove_listener(callback)

    def damaged(self, topic_uid: str) -> list[tuple[int, DamagedRange]]:
        """(source, range) of every damaged range of a topic's logs (storage/damage.py)."""
        sources = self.topics.get(topic_uid)
        return sources.damaged() if sources is not None else []

    def damage_report(self) -> dict[str, list[tuple[int, DamagedRange]]]:
        """Damaged ranges of every open topic that has some, by topic uid."""
        report = {}
        for uid in self.stored:
            sources = self.topics.get(uid)
            found = sources.damaged() if sources is not None else []
            if found:
                report[uid] = found
        return report

    def stats(self) -> dict[str, Any]:
        return {
            uid: [log_.stats() for log_ in sources.logs] for uid, sources in self.topics.items()
        }

    # --- background ---------------------------------------------------------------------------

    async def _flush_acks(self) -> None:
        dirty, self._dirty_journals = self._dirty_journals, set()
        for journal in dirty:
            try:
                await journal.flush(sync=self.fsync is not FsyncPolicy.NEVER)
            except OSError as e:
                # Retried every flush until it works (the journal heals itself by compaction).
                self._dirty_journals.add(journal)
                if self.disk.error(e, disk_space.ACKS) is None:
                    background.report("ack journal flush", e)
            else:
                self.disk.succeeded()

    async def _ack_flush_loop(self) -> None:
        await background.every("ack journal flush", self.ack_flush_interval_s, self._flush_acks)

    async def _trim_loop(self) -> None:
        await background.every("trim", self.trim_interval_s, self._trim_pass)

    async def _trim_pass(self) -> None:
        """Flush acks, then per topic: delay progress, trim, idle files, damage recheck."""
        self.disk.check()  # a disk-full episode ends here if space came back meanwhile
        # Acks must be durable before the messages they cover are deleted.
        await self._flush_acks()
        for uid in list(self.stored):
            sources = self.topics.get(uid)
            if sources is None:
                continue
            try:
                tracker = self.delays.get(uid)
                if tracker is not None:
                    tracker.flush_progress()
            except DiskFull:
                pass  # recorded by the delay index; trimming (which frees space) goes on
            try:
                sources.trim()
                sources.release_idle()
                if self.remote_logs is not None and sources.damaged():
                    await sources.restore_damage()  # from the storage nodes' copies
                sources.recheck_damage()  # restored bytes: readers at the damage go on
            except Exception as e:  # one topic's failure must not stop the others' trim
                background.report("trim", e)
        self.trim_passes += 1
