"""Retention: what a topic's logs must keep, and how Seek rewrites a subscription's ack state.

Google's rules (docs/GOOGLE_API.md §3, §4, §6, §7.9):

* A topic with ``message_retention_duration`` keeps every message younger than it, acked or not,
  and any subscription of the topic may Seek back that far, even to before it existed.
* A subscription with ``retain_acked_messages`` keeps its acked messages younger than its
  ``message_retention_duration`` (default 7 days), so it can Seek back and replay them.
* A snapshot keeps what its captured ack state still needs until it expires.
* Pulsar's retention by size (topic label ``pubsubd-retention-bytes``, control/quotas.py): the
  topic keeps whole segments from the newest back while they total at most that many bytes
  (``size_pin``). With ``message_retention_duration`` set too, a message is kept only while it is
  inside *both* limits, as Pulsar does when both its time and size limits are set: it goes as
  soon as either is exceeded (``topic_pin``). Unacked messages are always kept.
* Unacked messages older than a subscription's ``message_retention_duration`` leave its backlog.

Keeping is done with *pins* (``TopicSources.pins``: pin name -> source -> lowest offset to keep);
``TopicSources.trim_point`` never goes above a pin. This module is pure: it computes pins, cut
points and Seek states from offsets and times; the control plane (control/expiry.py,
control/snapshots.py) installs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pubsubd.core.records import CursorState

US_PER_S = 1_000_000
# Snapshots live at most this long after the oldest unacked message they capture (Google: 7 d).
SNAPSHOT_MAX_AGE_US = 7 * 24 * 3600 * US_PER_S
# A snapshot that would expire sooner than this after creation is refused (FAILED_PRECONDITION).
SNAPSHOT_MIN_LIFETIME_US = 3600 * US_PER_S

# Pin names in TopicSources.pins.
TOPIC_PIN = "topic-retention"


def retain_acked_pin(subscription_uid: str) -> str:
    return f"retain-acked:{subscription_uid}"


def snapshot_pin(snapshot_name: str) -> str:
    return f"snapshot:{snapshot_name}"


class TimedLog(Protocol):
    """The part of ``SourceLog`` retention needs."""

    @property
    def start_offset(self) -> int: ...

    @property
    def committed_offset(self) -> int: ...

    def offset_for_time(self, publish_time_us: int) -> int: ...


class SizedLog(TimedLog, Protocol):
    """``TimedLog`` plus segment sizes, for retention by size."""

    def segment_sizes(self) -> list[tuple[int, int]]: ...


def duration_us(d: Any) -> int:
    """A google.protobuf.Duration in microseconds."""
    return int(d.seconds) * US_PER_S + int(d.nanos) // 1000


def timestamp_us(t: Any) -> int:
    """A google.protobuf.Timestamp in microseconds since the epoch."""
    return int(t.seconds) * US_PER_S + int(t.nanos) // 1000


def time_pin(log: TimedLog, retention_us: int, now_us: int) -> int:
    """Lowest offset still inside a retention window of ``retention_us`` ending now."""
    return log.offset_for_time(now_us - retention_us)


def size_pin(segments: Sequence[tuple[int, int]], limit_bytes: int, end_offset: int) -> int:
    """Lowest offset to keep under a retention size of ``limit_bytes``.

    ``segments`` are a log's (base offset, stored bytes), oldest first, the active one last.
    The pin is the base of the oldest segment that, with every newer one, totals at most
    ``limit_bytes`` (stored bytes, acked and unacked alike, as Pulsar counts a topic's size):
    whole segments only, and the kept total never exceeds the limit. When even the newest
    segment alone is over it, the pin is ``end_offset``: size keeps nothing (the active segment
    is never deleted anyway).
    """
    pin = end_offset
    total = 0
    for base, size in reversed(segments):
        total += size
        if total > limit_bytes:
            break
        pin = base
    return pin


def topic_pin(
    log: SizedLog, now_us: int, *, retention_us: int | None, retention_bytes: int | None
) -> int | None:
    """Lowest offset a topic's own retention keeps (None: no topic retention).

    Time only or size only: that limit. Both: the higher pin, i.e. a message is kept only while
    it is inside both limits (Pulsar: with both set, acked messages are not retained once either
    limit is reached).
    """
    pins: list[int] = []
    if retention_us is not None:
        pins.append(time_pin(log, retention_us, now_us))
    if retention_bytes is not None:
        pins.append(size_pin(log.segment_sizes(), retention_bytes, log.committed_offset))
    return max(pins) if pins else None


def replay_floor(
    log: SizedLog,
    now_us: int,
    *,
    topic_retention_us: int | None,
    retain_acked_us: int | None,
    sync_start: int,
    topic_retention_bytes: int | None = None,
) -> int | None:
    """Lowest offset whose *acked* messages a Seek may make unacked again, or None if acked
    messages are not retained for this subscription.

    Topic retention (time and/or size, ``topic_pin``) reaches back before the subscription
    existed; ``retain_acked_messages`` only to the subscription's sync point (its first
    message). Nothing below the log's start exists.
    """
    floors: list[int] = []
    pin = topic_pin(
        log, now_us, retention_us=topic_retention_us, retention_bytes=topic_retention_bytes
    )
    if pin is not None:
        floors.append(pin)
    if retain_acked_us is not None:
        floors.append(max(time_pin(log, retain_acked_us, now_us), sync_start))
    if not floors:
        return None
    return max(min(floors), log.start_offset)


def seek_state(current: CursorState, target: int, floor: int | None, start: int) -> CursorState:
    """The ack state after Seek to the offset ``target`` (first message at or after the time).

    Offsets below ``target`` become acked. At or above it, a message becomes unacked if it is
    still retained: unacked messages always are; acked ones only at or above ``floor`` (None: no
    acked message is retained). Offsets below ``start`` (the log's start) no longer exist and
    stay acked. The result as a set: ``[0, md') | (acked(current) & [md', floor))``.
    """
    md = max(target, start)
    limit = md if floor is None else max(floor, md)
    if floor is None:
        # Every acked message at or above md stays acked.
        ranges: list[tuple[int, int]] = []
        if current.mark_delete > md:
            ranges.append((md, current.mark_delete))
        ranges.extend((max(s, md), e) for s, e in current.ranges if e > md)
        return _normalized(md, ranges)
    ranges = []
    if current.mark_delete > md:
        ranges.append((md, min(current.mark_delete, limit)))
    ranges.extend((max(s, md), min(e, limit)) for s, e in current.ranges if e > md and s < limit)
    return _normalized(md, [(s, e) for s, e in ranges if s < e])


def _normalized(mark_delete: int, ranges: list[tuple[int, int]]) -> CursorState:
    """Coalesce sorted ranges and fold a range starting at mark_delete into it (cursor rule 2)."""
    merged: list[tuple[int, int]] = []
    for s, e in sorted(ranges):
        if s >= e:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    if merged and merged[0][0] <= mark_delete:
        mark_delete = max(mark_delete, merged.pop(0)[1])
    return CursorState(mark_delete, tuple(merged))


def unacked_expiry_cut(log: TimedLog, retention_us: int, now_us: int, mark_delete: int) -> int:
    """Offsets below the returned cut are unacked messages older than the subscription's
    retention: they leave the backlog. Returns ``mark_delete`` when nothing expired."""
    cut = min(time_pin(log, retention_us, now_us), log.committed_offset)
    return max(cut, mark_delete)


def snapshot_expire_us(oldest_unacked_us: int | None, now_us: int) -> int:
    """When a snapshot expires: 7 days after the oldest unacked message it captures (now when
    it captures none)."""
    base = now_us if oldest_unacked_us is None else min(oldest_unacked_us, now_us)
    return base + SNAPSHOT_MAX_AGE_US
