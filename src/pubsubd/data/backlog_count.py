"""A subscription's backlog from its ack cursors and its topic's logs: unacked messages, their
stored bytes and the age of the oldest (what backlog quotas are about, ``core/quotas.py``).

Counted where cursors are: by a subscribing forwarder's dispatcher from its planner's cursors
(``Dispatcher.backlog_stats``: every source, or the sources it serves), and by a topic's owner
from the subscription's ack journal (``data/publish/owner_quotas.py``: every source, exact).

Bytes come from the log's index: the unacked range's stored bytes minus those of the acked
ranges above the mark-delete position (a stored batch's bytes are shared evenly by its
messages); past ``MAX_EXACT_ACKED_RANGES`` ranges, the rest is prorated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Protocol

from pubsubd.acks.cursor import Cursor
from pubsubd.core import quotas
from pubsubd.core.records import SourceRange
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange

__all__ = ["MAX_EXACT_ACKED_RANGES", "LogReader", "unacked_backlog"]

# Past this many acked ranges in a source, its unacked bytes are prorated, not summed.
MAX_EXACT_ACKED_RANGES = 256


class LogReader(Protocol):
    """What counting needs of a topic's logs (a publishing forwarder or a copy of it)."""

    def ranges(self, topic_uid: str) -> list[SourceRange]: ...

    def stored_bytes(self, topic_uid: str, source: int, start: int, stop: int) -> float: ...

    def publish_time_us(self, topic_uid: str, source: int, offset: int) -> int: ...


def unacked_backlog(
    logs: LogReader,
    topic_uid: str,
    cursors: Mapping[int, Cursor],
    now_us: int,
    counted: Callable[[int], bool] = lambda _: True,
) -> quotas.Backlog:
    """The backlog of the sources ``counted`` says (every one by default) as ``cursors`` have
    them acked, at ``now_us``."""
    messages = 0
    size = 0.0
    oldest_us = now_us
    for source, span in enumerate(logs.ranges(topic_uid)):
        cursor = cursors.get(source)
        if cursor is None or not counted(source):
            continue
        unacked = cursor.unacked_count(span.end_offset)
        messages += unacked
        if unacked:
            start, end = cursor.mark_delete, span.end_offset
            total = logs.stored_bytes(topic_uid, source, start, end)
            ranges = cursor.acked_ranges()
            if len(ranges) > MAX_EXACT_ACKED_RANGES:  # many gaps: share the bytes evenly
                total = total * unacked / (end - start)
            else:
                for first, stop in ranges:
                    total -= logs.stored_bytes(topic_uid, source, first, stop)
            size += max(total, 0.0)
        first = cursor.next_unacked(cursor.mark_delete)
        if first < span.committed_offset:
            with contextlib.suppress(OffsetOutOfRange, DamagedEntries):
                oldest_us = min(oldest_us, logs.publish_time_us(topic_uid, source, first))
    return quotas.Backlog(messages, int(size), max(0.0, (now_us - oldest_us) / 1e6))
