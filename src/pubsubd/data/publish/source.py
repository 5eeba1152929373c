"""Publish message sources of one topic: the logs of its messages plus every subscription's acks.

A publish message source (ARCHITECTURE.md) is the unit the publishing forwarder owns: an
append-only ``SourceLog`` and, beside it, the ack state (cursor) of every subscription attached to
the topic. A topic has 1-16 sources (topic label ``pubsubd-publish-sources``); sources can be
added at runtime (``grow``) but never removed. Which source a publish goes to is
``data/publish/routing.py``: ordering keys stay in one source for the topic's life.

Entries hold the serialized PublishRequest exactly as the client sent it, so the publish path
never re-encodes messages; readers decode them on their side (``data/decoding.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path

from pubsubd.acks.journal import AckJournal
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.data.publish import routing
from pubsubd.storage.damage import DamagedRange
from pubsubd.storage.log import FsyncPolicy, RemoteLog, RemoteLogs, SourceLog


class TopicSources:
    """The publish message sources of one topic incarnation (identified by its uid)."""

    # One per topic: no per-instance __dict__ (BENCHMARKS.md, "Scale of names").
    __slots__ = (
        "_balancer",
        "_fsync",
        "_listeners",
        "_remote_logs",
        "_remotes",
        "_segment_bytes",
        "active",
        "damage_policy",
        "directory",
        "journals",
        "key_sources",
        "logs",
        "pins",
        "topic_uid",
    )

    def __init__(
        self,
        topic_uid: str,
        directory: Path,
        *,
        fsync: FsyncPolicy,
        segment_bytes: int,
        source_count: int = 1,
        remote_logs: RemoteLogs | None = None,
    ) -> None:
        self.topic_uid = topic_uid
        # In a cluster: each source's ledgers on the storage nodes (storage/ledgers/).
        self._remote_logs = remote_logs
        self._remotes: list[RemoteLog] = []
        self.directory = directory
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        self.logs: list[SourceLog] = []
        # Sources 0 .. key_sources-1 take ordering keys (fixed when the topic was created).
        self.key_sources = 1
        # Sources 0 .. active-1 take unkeyed publishes (0: every source; source growth).
        self.active = 0
        # What subscriptions do at damaged messages (topic label, core/damage_policy.py).
        self.damage_policy = DamagePolicy.STOP
        self._balancer = routing.Balancer()  # spreads unkeyed publishes
        # Commit listeners of every log, so sources added later get them too.
        self._listeners: list[Callable[[int], None]] = []
        # Every source with a directory reopens, whatever the caller believes the count is.
        self._open_logs(max(source_count, sources_on_disk(directory)))
        # subscription uid -> its ack journal (cursors of every source of this topic)
        self.journals: dict[str, AckJournal] = {}
        # What retention, snapshots, named cursors and dedup windows keep: pin owner -> source
        # -> lowest offset to keep (PublishingForwarder.set_pins; core/retention.py).
        self.pins: dict[str, dict[int, int]] = {}

    def _open_logs(self, count: int) -> list[int]:
        added = []
        while len(self.logs) < count:
            i = len(self.logs)
            remote = None
            if self._remote_logs is not None:
                remote = self._remote_logs(self.topic_uid, i)
                self._remotes.append(remote)
            self.logs.append(
                SourceLog.open(
                    self.directory / f"source-{i}",
                    fsync=self._fsync,
                    segment_bytes=self._segment_bytes,
                    remote=remote,
                )
            )
            added.append(i)
        return added

    def grow(self, source_count: int) -> list[int]:
        """Add sources up to ``source_count`` (never removes any); returns the new ones.

        A new source is empty, so every message it will hold is after every subscription's
        sync point: each attached subscription gets a cursor for it at 0. The new logs get
        the existing commit listeners. Pins are left to their owners (snapshots pin a source
        they did not capture at 0; time pins are recomputed by the caller)."""
        added = self._open_logs(source_count)
        for i in added:
            log = self.logs[i]
            for callback in self._listeners:
                log.add_listener(callback)
            for journal in self.journals.values():
                journal.cursor(i, 0)
        return added

    def reopen(self, source: int) -> SourceLog:
        """Open a closed source's log again from its directory (a read-only copy started
        anew, data/subscribe/remote_sources.py), with the commit listeners it had."""
        log = SourceLog.open(
            self.directory / f"source-{source}",
            fsync=self._fsync,
            segment_bytes=self._segment_bytes,
        )
        for callback in self._listeners:
            log.add_listener(callback)
        self.logs[source] = log
        return log

    def add_listener(self, callback: Callable[[int], None]) -> None:
        self._listeners.append(callback)
        for log in self.logs:
            log.add_listener(callback)

    def remove_listener(self, callback: Callable[[int], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)
        for log in self.logs:
            log.remove_listener(callback)

    def route(self, ordering_key: str, count: int) -> int:
        """The source of the next publish of ``count`` messages (data/publish/routing.py)."""
        return routing.route(
            ordering_key, self.key_sources, len(self.logs), self._balancer, count, self.active
        )

    def end_offsets(self) -> dict[int, int]:
        return {i: log.end_offset for i, log in enumerate(self.logs)}

    def trim_point(self, source: int) -> int:
        """Offsets below this are acked by every subscription, pinned by no retention window
        or snapshot, and may be deleted."""
        log = self.logs[source]
        point = log.committed_offset
        for journal in self.journals.values():
            cursor = journal.cursors.get(source)
            if cursor is not None:
                point = min(point, cursor.mark_delete)
        for pin in self.pins.values():
            keep = pin.get(source)
            if keep is not None:
                point = min(point, keep)
        return point

    def trim(self) -> None:
        for i, log in enumerate(self.logs):
            if log.segment_count > 1:  # only whole segments below the active one go
                log.trim(self.trim_point(i))

    def damaged(self) -> list[tuple[int, DamagedRange]]:
        """(source, range) of every damaged range of the topic's logs."""
        return [(i, d) for i, log in enumerate(self.logs) for d in log.damaged_ranges()]

    async def restore_damage(self) -> int:
        """In a cluster: re-read damaged ranges from the storage nodes (see SourceLog)."""
        restored = 0
        for log in self.logs:
            restored += await log.restore_damage()
        return restored

    def recheck_damage(self) -> list[tuple[int, DamagedRange]]:
        """Re-read the damaged ranges; return those readable again (see SourceLog)."""
        return [(i, d) for i, log in enumerate(self.logs) for d in log.recheck_damage()]

    def on_disk(self) -> bool:
        """Whether any log has storage yet (never-published topics have none)."""
        return any(log.on_disk for log in self.logs)

    def release_idle(self) -> None:
        """Close the files of logs unused since the last call (idle topics hold no fds)."""
        for log in self.logs:
            log.release_idle()

    async def close(self) -> None:
        for journal in self.journals.values():
            await journal.close()
        for log in self.logs:
            await log.close()

    async def destroy(self) -> None:
        await self.close()
        for remote in self._remotes:
            await remote.destroy()
        # Deleting gigabytes of segments must not stall the event loop.
        await asyncio.to_thread(shutil.rmtree, self.directory, True)


def sources_on_disk(directory: Path) -> int:
    """1 + the highest ``source-N`` directory of a topic (0 if none): a source with data
    reopens even if the topic's labels were lost (a deleted topic's storage)."""
    try:
        names = [p.name for p in directory.iterdir()]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    found = [int(n[7:]) for n in names if n.startswith("source-") and n[7:].isdigit()]
    return max(found) + 1 if found else 0
