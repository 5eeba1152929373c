"""Publish message sources of one topic: the logs of its messages plus every subscription's acks.

A publish message source (DESIGN.md §1a) is the unit the publishing forwarder owns: an
append-only ``SourceLog`` and, beside it, the ack state (cursor) of every subscription attached to
the topic. A topic has one source today; every API takes the source number so more sources per
topic (spread by throughput, ordering keys pinned to one) fit without changing callers.

Entries hold the serialized PublishRequest exactly as the client sent it, so the publish path
never re-encodes messages; ``decoded`` turns an entry back into PubsubMessages with their message
ID and publish time set, serialized and ready to frame into responses, through a bounded cache
shared by every subscription of the topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsubd.acks.journal import AckJournal
from pubsubd.core import ids, pb
from pubsubd.core.delays import DELIVER_AFTER, DELIVER_AT, deliver_at_us
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.validation import DEDUP_ID_ATTRIBUTE
from pubsubd.storage.framing import Entry
from pubsubd.storage.log import FsyncPolicy, SourceLog

# Decoded entries kept per topic for fan-out to several subscriptions and for redelivery,
# bounded by the stored size of the entries (the decoded form is about twice that).
DECODE_CACHE_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    entry: Entry
    messages: list[bytes]  # serialized PubsubMessage per offset, message_id/publish_time set
    parsed: Any  # the parsed PubsubMessages (repeated field), for attributes and filters
    ordering_key: str  # one per entry: every message of a PublishRequest shares it
    # epoch microseconds before which each message must not be delivered; None if none is delayed
    deliver_at: list[int | None] | None = None


class TopicSources:
    """The publish message sources of one topic incarnation (identified by its uid)."""

    def __init__(
        self,
        topic_uid: str,
        directory: Path,
        *,
        fsync: FsyncPolicy,
        segment_bytes: int,
        source_count: int = 1,
    ) -> None:
        self.topic_uid = topic_uid
        self.directory = directory
        self.logs: list[SourceLog] = [
            SourceLog.open(directory / f"source-{i}", fsync=fsync, segment_bytes=segment_bytes)
            for i in range(source_count)
        ]
        # subscription uid -> its ack journal (cursors of every source of this topic)
        self.journals: dict[str, AckJournal] = {}
        # What retention and snapshots keep: pin name -> source -> lowest offset to keep
        # (filled in by the control plane, see data/retention.py).
        self.pins: dict[str, dict[int, int]] = {}
        self._cache: OrderedDict[tuple[int, int], DecodedEntry] = OrderedDict()
        self._cached_bytes = 0

    def end_offsets(self) -> dict[int, int]:
        return {i: log.end_offset for i, log in enumerate(self.logs)}

    def decoded(self, source: int, entry: Entry) -> DecodedEntry:
        """An entry's messages, serialized with message_id and publish_time set (cached)."""
        key = (source, entry.base_offset)
        cache = self._cache
        decoded = cache.get(key)
        if decoded is not None:
            cache.move_to_end(key)
            return decoded
        request = pb.PublishRequest.FromString(entry.payload)
        seconds, micros = divmod(entry.publish_time_us, 1_000_000)
        base = ids.position(source, entry.base_offset)
        messages = []
        delays: list[int | None] | None = None
        for i, m in enumerate(request.messages):
            m.message_id = str(base + i)
            m.publish_time.seconds = seconds
            m.publish_time.nanos = micros * 1000
            attrs = m.attributes
            if attrs and DEDUP_ID_ATTRIBUTE in attrs:
                del attrs[DEDUP_ID_ATTRIBUTE]  # stored for the dedup window only, never delivered
            messages.append(m.SerializeToString())
            if attrs and (DELIVER_AT in attrs or DELIVER_AFTER in attrs):
                if delays is None:
                    delays = [None] * len(request.messages)
                with contextlib.suppress(InvalidArgument):  # validated at publish
                    delays[i] = deliver_at_us(attrs, entry.publish_time_us)
        ordering_key = request.messages[0].ordering_key if request.messages else ""
        decoded = DecodedEntry(entry, messages, request.messages, ordering_key, delays)
        cache[key] = decoded
        self._cached_bytes += len(entry.payload)
        while self._cached_bytes > DECODE_CACHE_BYTES and len(cache) > 1:
            _, old = cache.popitem(last=False)
            self._cached_bytes -= len(old.entry.payload)
        return decoded

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
        # Deleting gigabytes of segments must not stall the event loop.
        await asyncio.to_thread(shutil.rmtree, self.directory, True)
