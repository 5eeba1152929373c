"""The dedup window of PublishDeduplicated: a message whose dedup ID was stored within the last
``window`` seconds is acknowledged with its original message ID and not stored again.

Persistence (survives kill -9). The dedup ID travels *inside* the stored batch, as the reserved
attribute ``pubsubd.dedup_id`` of its message (``core.validation.DEDUP_ID_ATTRIBUTE``): the ID is
durable exactly when the message is, in the same log entry, so no crash point can leave a stored
message without its ID or an ID without its message. Decoding (``data/decoding.py``) removes the
attribute before anything is delivered (subscriptions, the replay Read), and client publishes may
not set it.

At start-up (before the first trim) the window of every topic that ever used dedup (marker file
``dedup-used`` in the topic's storage directory) is rebuilt by scanning its log from the first
entry younger than the window to the end; only entries whose bytes contain the attribute key are
parsed. While it remembers IDs, the window pins the log (pin ``dedup-window``) at the oldest
remembered position, so retention cannot delete the entries a restart would need even when every
subscription has acked them or the topic has none. The pin moves up as IDs expire (every
``SWEEP_INTERVAL_S``).

Memory: the window (``dedup_window.py``) keeps runs of ``prefix:n`` IDs, such as the Spark
sink's, as one int per run, and other IDs one by one (~210 bytes each with the key).

Concurrent publishes of the same dedup ID: the first stores it, the others wait for its outcome
and answer the same message ID; the same ID twice in one request is stored once.

Caveats: the window is only as durable as the log (with ``--fsync never`` a crash may lose recent
IDs along with their messages); and a window longer than the time retention needs costs disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from pubsubd.core import ids, pb, validation
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.dedup_batches import DedupBatch, MessageBatch, ordering_runs
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.validation import DEDUP_ID_ATTRIBUTE, MAX_DEDUP_ID_BYTES
from pubsubd.data.publish.dedup_window import DedupWindow, as_run
from pubsubd.observability import background
from pubsubd.storage.errors import DamagedEntries
from pubsubd.storage.files import fsync_directory, make_dirs

if TYPE_CHECKING:
    from pubsubd.data.publish.forwarder import PublishingForwarder
    from pubsubd.data.publish.source import TopicSources

log = logging.getLogger(__name__)

DEDUP_PIN = "dedup-window"
MARKER_FILE = "dedup-used"
SWEEP_INTERVAL_S = 5.0
_ATTRIBUTE_BYTES = DEDUP_ID_ATTRIBUTE.encode()
_REBUILD_READ_BYTES = 16 << 20


build_batches = ordering_runs  # [start, stop) per run of one ordering key


def check_dedup_id(i: int, dedup_id: str) -> None:
    if not dedup_id:
        raise InvalidArgument(f"messages[{i}].dedup_id: required")
    if len(dedup_id.encode()) > MAX_DEDUP_ID_BYTES:
        raise InvalidArgument(f"messages[{i}].dedup_id: longer than {MAX_DEDUP_ID_BYTES} bytes")


@dataclass(eq=False, slots=True)
class _Storing:
    """A request's new IDs while they are stored (in order, and as a set), and the future of
    their message IDs."""

    ids: Sequence[str]
    id_set: set[str]
    future: asyncio.Future[list[str]]


class Deduplicator:
    """Dedup windows of every topic, over the publishing forwarder."""

    def __init__(
        self, publishing: PublishingForwarder, window_s: float, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.publishing = publishing
        self.clock = clock
        self.window_us = int(window_s * 1_000_000)
        self.windows: dict[str, DedupWindow] = {}
        # topic -> the requests whose new IDs are being stored
        self._pending: dict[str, list[_Storing]] = {}
        self._task: asyncio.Task[None] | None = None
        self.duplicates = 0

    def status(self) -> dict[str, Any]:
        """For /status: the window, how many IDs it remembers, duplicates seen."""
        return {
            "window_s": self.window_us / 1_000_000,
            "remembered_ids": sum(len(w) for w in self.windows.values()),
            "duplicates": self.duplicates,
        }

    # --- lifecycle ----------------------------------------------------------------------------

    def recover(self, topic_uids: Iterable[str]) -> None:
        """Rebuild the windows of topics that used dedup; call before the first trim."""
        for uid in topic_uids:
            if uid in self.publishing.failed_topics:
                continue  # its storage cannot be opened: it answers DATA_LOSS
            sources = self.publishing.open_topic(uid)
            if not (sources.directory / MARKER_FILE).exists():
                continue
            started = self.clock.monotonic()
            window = DedupWindow(self.window_us)
            self._rebuild(sources, window)
            self.windows[uid] = window
            self._update_pin(uid, sources, window)
            log.info(
                "dedup window of topic %s rebuilt: %d ids in %.3fs",
                uid,
                len(window),
                self.clock.monotonic() - started,
            )

    def start(self) -> None:
        self._task = asyncio.create_task(self._sweep_loop(), name="dedup_sweep")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- publish ------------------------------------------------------------------------------

    async def publish(
        self,
        topic_uid: str,
        messages: Sequence[tuple[str, Any]] | DedupBatch,
        source: int | None = None,
    ) -> tuple[list[str], int]:
        """Store the messages whose dedup ID is not in the window; return the message ID of
        every message (the original one for a duplicate) and how many were duplicates.

        ``messages`` are (dedup ID, message) pairs, already validated (a message is anything
        with ``data``, ``attributes`` and ``ordering_key``, a PubsubMessage or the API's
        DeduplicatedMessage, without the reserved attribute), or a ``DedupBatch``
        (``core/dedup_batches.py``). ``source``: store them in that publish message source
        instead of routing them."""
        batch = messages if not isinstance(messages, Sequence) else MessageBatch(messages)
        dedup_ids = batch.dedup_ids
        n = len(dedup_ids)
        sources = self.publishing.open_topic(topic_uid)
        window = self._window(topic_uid, sources)
        now = self.clock.time_us()
        window.expire(now)
        storing = self._pending.setdefault(topic_uid, [])
        run = as_run(dedup_ids)
        unique = set(dedup_ids)
        if (
            run is not None
            and window.holds_none_of_run(*run)
            and all(s.id_set.isdisjoint(unique) for s in storing)
        ):  # a run of new IDs (the Spark sink's requests): no lookup or loop per message
            stored = await self._store_new(topic_uid, sources, window, batch, range(n), run, source)
            return stored, 0
        found = window.get_many(dedup_ids, now)
        if (
            found.count(None) == n
            and len(unique) == n
            and all(s.id_set.isdisjoint(unique) for s in storing)
        ):  # all new
            stored = await self._store_new(
                topic_uid, sources, window, batch, range(n), None, source
            )
            return stored, 0
        result: list[str | None] = [None] * n
        waits: list[tuple[int, asyncio.Future[list[str]], int]] = []
        first_in_request: dict[str, int] = {}
        same_as: list[tuple[int, int]] = []  # (index, index of the earlier copy in this request)
        new: list[int] = []
        pending = {dedup_id: (s.future, k) for s in storing for k, dedup_id in enumerate(s.ids)}
        for i, dedup_id in enumerate(dedup_ids):
            seen = found[i]
            if seen is not None:
                result[i] = str(seen)
            elif dedup_id in first_in_request:
                same_as.append((i, first_in_request[dedup_id]))
            elif dedup_id in pending:
                fut, k = pending[dedup_id]
                waits.append((i, fut, k))
            else:
                first_in_request[dedup_id] = i
                new.append(i)
        if new:
            stored = await self._store_new(topic_uid, sources, window, batch, new, None, source)
            for i, message_id in zip(new, stored, strict=True):
                result[i] = message_id
        for i, fut, k in waits:
            result[i] = (await asyncio.shield(fut))[k]
        for i, j in same_as:
            result[i] = result[j]
        duplicates = n - len(new)
        self.duplicates += duplicates
        out = [r for r in result if r is not None]
        assert len(out) == n
        return out, duplicates

    async def _store_new(
        self,
        topic_uid: str,
        sources: TopicSources,
        window: DedupWindow,
        batch: DedupBatch,
        new: Sequence[int],
        run: tuple[str, int] | None,
        source: int | None,
    ) -> list[str]:
        """Store the messages at ``new`` (IDs neither in the window nor being stored,
        distinct; ``run``: they are all of the batch and this run of IDs); their message IDs
        in order."""
        dedup_ids = batch.dedup_ids
        new_ids = dedup_ids if len(new) == len(dedup_ids) else [dedup_ids[i] for i in new]
        # One record and future for the request's new IDs: the future's result is their
        # message IDs, in order; a request meeting one of them waits for it.
        mine = _Storing(new_ids, set(new_ids), asyncio.get_running_loop().create_future())
        self._pending[topic_uid].append(mine)
        # The append runs in its own task: a client cancelling its call must not leave a
        # stored message whose ID the window does not know.
        store = asyncio.ensure_future(self._store(topic_uid, window, batch, new, mine, run, source))
        store.add_done_callback(_retrieve)
        await asyncio.shield(store)
        if DEDUP_PIN not in sources.pins:
            self._update_pin(topic_uid, sources, window)
        return mine.future.result()

    async def _store(
        self,
        topic_uid: str,
        window: DedupWindow,
        batch: DedupBatch,
        new: Sequence[int],
        mine: _Storing,
        run: tuple[str, int] | None,
        source: int | None,
    ) -> None:
        future = mine.future
        try:
            message_ids: list[str] = []
            stored = batch.stored(new)
            for payload, start, stop, ordering_key in stored:
                count = stop - start
                stored_in, base = await self.publishing.publish(
                    topic_uid, payload, count, ordering_key, source
                )
                first = ids.position(stored_in, base)
                window.remember(
                    mine.ids[start:stop],
                    first,
                    self.clock.time_us(),
                    run if len(stored) == 1 else None,
                )
                message_ids += map(str, range(first, first + count))
            future.set_result(message_ids)
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: waiters re-raise it, nobody else must log it
            raise
        finally:
            storing = self._pending.get(topic_uid)
            if storing is not None:
                storing.remove(mine)
                if not storing:
                    del self._pending[topic_uid]

    # --- internals ----------------------------------------------------------------------------

    def _window(self, topic_uid: str, sources: TopicSources) -> DedupWindow:
        window = self.windows.get(topic_uid)
        if window is None:
            marker = sources.directory / MARKER_FILE
            if not marker.exists():
                # Durable before the first deduplicated entry, so a restart looks for IDs.
                # (A topic's directories are created by its first write: maybe not yet.)
                make_dirs(sources.directory)
                fd = os.open(marker, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                fsync_directory(sources.directory)
            window = DedupWindow(self.window_us)
            self.windows[topic_uid] = window
        return window

    def _rebuild(self, sources: TopicSources, window: DedupWindow) -> None:
        now = self.clock.time_us()
        for source, log_ in enumerate(sources.logs):
            offset = max(log_.offset_for_time(now - self.window_us), log_.start_offset)
            end = log_.committed_offset
            while offset < end:
                try:
                    entries = log_.read(offset, max_bytes=_REBUILD_READ_BYTES)
                except DamagedEntries as e:  # their dedup IDs are lost with them
                    log.warning("dedup window of topic %s: %s", sources.topic_uid, e)
                    offset = e.damaged.end_offset
                    continue
                if not entries:
                    break
                for entry in entries:
                    offset = entry.next_offset
                    if _ATTRIBUTE_BYTES not in entry.payload:
                        continue
                    request = pb.PublishRequest.FromString(entry.payload)
                    base = ids.position(source, entry.base_offset)
                    found = [m.attributes.get(DEDUP_ID_ATTRIBUTE) for m in request.messages]
                    if all(found):  # a deduplicated batch: remembered as _store did
                        window.remember(found, base, entry.publish_time_us)  # type: ignore[arg-type]
                        continue
                    for j, dedup_id in enumerate(found):
                        if dedup_id:
                            window.remember((dedup_id,), base + j, entry.publish_time_us)

    def _update_pin(self, topic_uid: str, sources: TopicSources, window: DedupWindow) -> None:
        pin = window.pin(len(sources.logs))
        if pin:
            sources.pins[DEDUP_PIN] = pin
        else:
            sources.pins.pop(DEDUP_PIN, None)

    def sweep(self, now_us: int | None = None) -> None:
        """Expire IDs and move the pins up; forget windows of topics whose storage is gone."""
        now = self.clock.time_us() if now_us is None else now_us
        for uid, window in list(self.windows.items()):
            sources = self.publishing.topics.get(uid)
            if sources is None:
                del self.windows[uid]
                continue
            window.expire(now)
            self._update_pin(uid, sources, window)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                self.sweep()
            except Exception as e:
                background.report("dedup window sweep", e)


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()  # the caller may have gone; its error is logged by the API layer


def validate_messages(
    messages: Sequence[tuple[str, Any]], request_size: int, *, now_s: float
) -> None:
    """Google's publish limits for a PublishDeduplicated request (messages without the
    reserved attribute), plus the dedup IDs; ``now_s``: the time delays are checked against."""
    n = len(messages)
    if n == 0:
        raise InvalidArgument("messages: a request must contain at least one message")
    if n > validation.MAX_MESSAGES_PER_PUBLISH:
        raise InvalidArgument(
            f"messages: {n} messages in one request; the maximum is "
            f"{validation.MAX_MESSAGES_PER_PUBLISH}"
        )
    if request_size > validation.MAX_PUBLISH_REQUEST_BYTES:
        raise InvalidArgument(
            f"request_size is too large: {request_size} bytes; the maximum is "
            f"{validation.MAX_PUBLISH_REQUEST_BYTES}"
        )
    for i, (dedup_id, _) in enumerate(messages):
        check_dedup_id(i, dedup_id)
    plain = [m for _, m in messages]
    for start, stop in build_batches(plain):
        # (The checks read only ``messages``: no copy into a PublishRequest.)
        batch = SimpleNamespace(messages=plain[start:stop])
        try:
            validation.publish_request(batch, 0, now_s=now_s)
        except InvalidArgument as e:
            # Name the message by its index in the whole request.
            raise InvalidArgument(_reindex(str(e), start)) from None


def _reindex(text: str, offset: int) -> str:
    return re.sub(r"messages\[(\d+)\]", lambda m: f"messages[{int(m.group(1)) + offset}]", text)
