"""The topics a subscribing forwarder reads from publishing forwarders in other processes.

A publishing forwarder owns its topics' publish message sources: their logs and every
subscription's ack state on them (DESIGN: "publish message source"). A subscribing forwarder
serving a subscription whose topic another process owns reaches that owner over
``pubsubd.internal.v1.Sources`` (proto/pubsubd/internal/v1/sources.proto) and presents it to its
dispatchers as the same ``core.roles.PublishingForwarderApi`` an in-process owner offers:

- **Reads** come from a read-only local copy of every source (a ``PublishingForwarder`` over
  its own directory that is never written to by publishes, never trimmed by acks, and whose
  housekeeping never runs), filled by one ``Tail`` stream per source from the copy's end. The
  planner reads it synchronously, as it reads a log in-process; commits of the copy wake the
  dispatchers; delayed messages are tracked on this side over the copy (its own delay index).
  The owner's trims are followed (whole segments below its retained start go). A copy left
  from an earlier run goes on from its end, unless the owner trimmed past it. A copy no
  subscription served here reads any more is deleted.
- **Ack state** stays with the owner. ``attach`` is answered from :meth:`RemoteSources.prepare`
  (the ``Attach`` call, made before the dispatcher opens); acks, cursor resets and publish
  blocks are queued in order per subscription and sent every ``flush_interval_s`` (at most that
  much is redelivered if this process dies); ``flush_acks`` sends them and waits until the owner
  made them durable. An owner that lost the subscription's ack state (it moved, and the new
  owner has not opened it) answers NOT_FOUND: the subscription is attached again, from its
  sync point, and what was queued is sent again (acks are idempotent).

Which process owns a topic is the router's choice (``owners``: its addresses, best first); a
refused or failed call goes to the next, and a broken ``Tail`` starts again from the copy's end.

**Catching up from the storage nodes.** With a ``LedgerReader`` (a forwarder of a cluster), a
copy that is behind first fills what the source's CLOSED ledgers hold from the storage nodes
(storage/ledgers/catch_up.py decides; storage/ledgers/reader.py reads, CRC-checked, from any
node with a copy, rate-bounded), and only then tails the owner, from the copy's new end: the
owner sends only the open ledger's part and live commits. Before every ``Tail`` (at most once
per ``FILL_CHECK_S`` per source): a copy back from an outage catches up the same way. A read no
node answers stops the fill where it got to, and the owner's ``Tail`` sends the rest.
``status()`` counts what came from where (``filled_from_nodes``, ``filled_from_owner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from pubsubd._gen.pubsubd.internal.v1 import sources_pb2 as s
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.dedup_batches import DedupBatch
from pubsubd.core.errors import NotServedHere, Unavailable
from pubsubd.core.internal_token import INTERNAL_TOKEN
from pubsubd.core.records import CursorState, DamagedRange, Entry, SourceRange
from pubsubd.data import sources_wire as wire
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.observability import metrics
from pubsubd.storage.errors import StorageError
from pubsubd.storage.files import fsync_directory, make_dirs
from pubsubd.storage.framing import decode_frames
from pubsubd.storage.ledgers.catch_up import CatchUp, plan_catch_up
from pubsubd.storage.ledgers.reader import LedgerReader
from pubsubd.storage.log import FsyncPolicy, SourceLog
from pubsubd.storage.node_client import new_channel
from pubsubd.storage.replication import segment_file_name

log = logging.getLogger(__name__)

# Under a forwarder's data directory: the copies of topics other forwarders own.
COPIES_DIR = "copies"
DEFAULT_FLUSH_INTERVAL_S = 0.05
RETRY_S = 0.2  # after a failed call or a broken Tail, before trying again
CALL_TIMEOUT_S = 10.0
# A gap in the closed ledgers smaller than this many messages is left to the owner's Tail.
DEFAULT_FILL_MIN_MESSAGES = 1024
# How often one source's ledger list is read again for a catch-up (its Tail may restart often
# while its owner is away).
FILL_CHECK_S = 2.0

# What a subscription has queued for its topic's owner, in order.
Op = tuple[str, Any]  # ("acks", {source: ranges}) | ("reset", states) | ("block", (why, from))


@dataclass
class FillCounts:
    """What reached the copies, by where it came from."""

    entries: int = 0
    messages: int = 0
    bytes: int = 0

    def add(self, entries: list[Entry], nbytes: int) -> None:
        self.entries += len(entries)
        self.messages += sum(e.count for e in entries)
        self.bytes += nbytes

    def to_json(self) -> dict[str, int]:
        return {"entries": self.entries, "messages": self.messages, "bytes": self.bytes}


@dataclass
class _Subscription:
    topic_uid: str
    uid: str
    start_offsets: dict[int, int]
    cursors: dict[int, CursorState]
    ops: list[Op] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RemoteSources:
    """``PublishingForwarderApi`` for topics owned by other processes (see the module
    docstring). Calls that belong to the owner alone (publishing, topic storage, pins) raise
    ``NotServedHere``."""

    def __init__(
        self,
        directory: Path,
        owners: Callable[[str], Sequence[str]],
        *,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        channel: Callable[[str], grpc.aio.Channel] | None = None,
        ledgers: LedgerReader | None = None,
        fill_min_messages: int = DEFAULT_FILL_MIN_MESSAGES,
    ) -> None:
        self.directory = directory
        self.owners = owners
        self.flush_interval_s = flush_interval_s
        # The read-only copies (and the delay index over them); its housekeeping never starts.
        self.copy = PublishingForwarder(directory, fsync=FsyncPolicy.NEVER)
        self._channel_factory = channel or new_channel  # TLS when the cluster speaks it
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._subscriptions: dict[tuple[str, str], _Subscription] = {}
        self._policies: dict[str, DamagePolicy] = {}
        self._ready: dict[str, asyncio.Event] = {}  # by topic: every source copied up
        self._current: set[tuple[str, int]] = set()  # sources whose copy caught up once
        self._tails: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._dropping: dict[str, asyncio.Task[None]] = {}  # copies being deleted
        self._sender: asyncio.Task[None] | None = None
        self.tail_restarts = 0  # Tail streams started again (a broken stream, a moved topic)
        # The storage nodes, for catch-ups (None: everything comes over Tail).
        self.ledgers = ledgers
        self.fill_min_messages = fill_min_messages
        self._fill_checked: dict[tuple[str, int], float] = {}
        self.from_nodes = FillCounts()
        self.from_owner = FillCounts()
        # The same by followed topic: uid -> (from the nodes, from the owner).
        self._topic_fills: dict[str, tuple[FillCounts, FillCounts]] = {}
        self.fills_failed = 0  # catch-ups from the nodes cut short (the owner sent the rest)

    # --- plumbing -------------------------------------------------------------------------

    def _stub(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._channel_factory(address)
        return channel

    async def _call(self, topic_uid: str, method: str, request: Any, response_type: Any) -> Any:
        """A unary call to the topic's owner, the router's next choice on refusal."""
        request.protocol_version = wire.PROTOCOL_VERSION
        last: BaseException | None = None
        for address in self.owners(topic_uid):
            call = self._stub(address).unary_unary(
                f"/{wire.SERVICE}/{method}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=response_type.FromString,
            )
            try:
                return await call(
                    request, timeout=CALL_TIMEOUT_S, metadata=INTERNAL_TOKEN.metadata()
                )
            except grpc.aio.AioRpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                last = e
        raise Unavailable(f"no publishing forwarder of topic storage {topic_uid} answered: {last}")

    async def close(self) -> None:
        tasks = list(self._tails.values())
        if self._sender is not None:
            tasks.append(self._sender)
        for task in tasks:
            task.cancel()
        for task in [*tasks, *self._dropping.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for sub in list(self._subscriptions.values()):
            with contextlib.suppress(Exception):
                await self._send(sub)
        await self.copy.close()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    # --- following a topic ------------------------------------------------------------------

    async def follow(self, topic_uid: str) -> None:
        """Copy the topic's sources and keep following them; returns once every source's
        copy holds what was committed when its stream started (a broken stream resumes by
        itself)."""
        dropping = self._dropping.get(topic_uid)
        if dropping is not None:
            await asyncio.shield(dropping)
        if topic_uid not in self._ready:
            self._ready[topic_uid] = asyncio.Event()
            self.copy.open_topic(topic_uid)  # copies left from an earlier run, or source 0
            for source in range(self.copy.source_count(topic_uid)):
                self._start_tail(topic_uid, source)
        await self._ready[topic_uid].wait()

    def _start_tail(self, topic_uid: str, source: int) -> None:
        key = (topic_uid, source)
        if key not in self._tails:
            self._tails[key] = asyncio.create_task(
                self._tail(topic_uid, source), name=f"tail-{topic_uid}-{source}"
            )

    def _copy_log(self, topic_uid: str, source: int) -> SourceLog:
        return self.copy.topics[topic_uid].logs[source]

    async def _tail(self, topic_uid: str, source: int) -> None:
        while True:
            try:
                await self._tail_once(topic_uid, source)
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, Unavailable, OSError, ValueError) as e:
                log.info("tail of %s source %d broke (%s); starting again", topic_uid, source, e)
            self.tail_restarts += 1
            await asyncio.sleep(RETRY_S)

    async def _tail_once(self, topic_uid: str, source: int) -> None:
        await self._fill_from_nodes(topic_uid, source)
        for address in self.owners(topic_uid):
            stream = self._stub(address).unary_stream(
                f"/{wire.SERVICE}/Tail",
                request_serializer=s.TailRequest.SerializeToString,
                response_deserializer=s.TailResponse.FromString,
            )(
                s.TailRequest(
                    protocol_version=wire.PROTOCOL_VERSION,
                    topic_uid=topic_uid,
                    source=source,
                    from_offset=self._copy_log(topic_uid, source).end_offset,
                ),
                metadata=INTERNAL_TOKEN.metadata(),
            )
            try:
                async for response in stream:
                    copy = await self._apply(topic_uid, source, response)
                    if copy.end_offset >= response.committed_offset:
                        self._caught_up(topic_uid, source)
                return
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                log.debug("tail of %s at %s: %s", topic_uid, address, e.details())
            finally:
                stream.cancel()
        raise Unavailable(f"no publishing forwarder serves topic storage {topic_uid}")

    async def _fill_from_nodes(self, topic_uid: str, source: int) -> None:
        """Fill the copy with what the source's closed ledgers hold past its end, from the
        storage nodes (see the module docstring); any failure leaves the rest to the owner."""
        if self.ledgers is None:
            return
        key = (topic_uid, source)
        now = asyncio.get_running_loop().time()
        if now - self._fill_checked.get(key, -FILL_CHECK_S) < FILL_CHECK_S:
            return
        self._fill_checked[key] = now
        try:
            listed = await self.ledgers.ledger_list(topic_uid, source)
            copy = self._copy_log(topic_uid, source)
            plan = plan_catch_up(copy.end_offset, copy.on_disk, listed, self.fill_min_messages)
            if plan is not None:
                await self._fill(topic_uid, source, plan)
        except asyncio.CancelledError:
            raise
        except (StorageError, OSError, ValueError, Unavailable) as e:
            self.fills_failed += 1
            log.info("copy of %s source %d: from the owner on (%s)", topic_uid, source, e)
        except Exception as e:  # the metadata store unreachable, a node client's own error
            self.fills_failed += 1
            log.warning("copy of %s source %d: from the owner on (%r)", topic_uid, source, e)

    async def _fill(self, topic_uid: str, source: int, plan: CatchUp) -> None:
        assert self.ledgers is not None
        if plan.restart_at is not None:
            copy = await self._restart_copy(topic_uid, source, plan.restart_at)
        else:
            copy = self._copy_log(topic_uid, source)
        started, before = copy.end_offset, self.from_nodes.messages
        for read in plan.reads:
            while copy.end_offset < read.end:
                entries, nbytes = await self.ledgers.read(read, copy.end_offset)
                bases = await asyncio.gather(
                    *(copy.append(e.payload, e.count, e.publish_time_us) for e in entries)
                )
                if list(bases) != [e.base_offset for e in entries]:
                    raise ValueError(f"the copy of {topic_uid} went out of step at {bases[0]}")
                self.from_nodes.add(entries, nbytes)
                self._fills(topic_uid)[0].add(entries, nbytes)
                metrics.COPY_FILL_BYTES.labels("nodes").inc(nbytes)
        log.info(
            "copy of %s source %d: [%d, %d) filled from the storage nodes (%d messages)",
            topic_uid,
            source,
            started,
            copy.end_offset,
            self.from_nodes.messages - before,
        )

    def _fills(self, topic_uid: str) -> tuple[FillCounts, FillCounts]:
        fills = self._topic_fills.get(topic_uid)
        if fills is None:
            fills = self._topic_fills[topic_uid] = (FillCounts(), FillCounts())
        return fills

    def _caught_up(self, topic_uid: str, source: int) -> None:
        ready = self._ready[topic_uid]
        if ready.is_set():
            return
        self._current.add((topic_uid, source))
        if all((topic_uid, i) in self._current for i in range(self.source_count(topic_uid))):
            ready.set()

    async def _apply(self, topic_uid: str, source: int, response: Any) -> SourceLog:
        policy = DamagePolicy(response.damage_policy or DamagePolicy.STOP.value)
        self._policies[topic_uid] = policy
        sources = self.copy.topics[topic_uid]
        if response.source_count > len(sources.logs):
            for added in self.copy.configure_topic(
                topic_uid, response.source_count, sources.key_sources, policy
            ):
                self._start_tail(topic_uid, added)
        sources.damage_policy = policy
        copy = sources.logs[source]
        base = response.first_offset if response.frames else response.start_offset
        if response.start_offset > copy.end_offset or (
            not copy.on_disk and copy.end_offset != base
        ):
            # A new copy starts at the owner's retained start; one the owner trimmed past
            # (left from an earlier run) is copied anew from there.
            copy = await self._restart_copy(topic_uid, source, base)
        elif response.start_offset > copy.start_offset and copy.segment_count > 1:
            copy.trim(response.start_offset)
        if response.frames:
            decoded, valid_end = decode_frames(response.frames)
            if valid_end != len(response.frames) or not decoded:
                raise ValueError(f"invalid frames from the owner at {response.first_offset}")
            entries = [entry for entry, _, _ in decoded]
            if entries[0].base_offset != copy.end_offset:
                raise ValueError(
                    f"the owner sent {entries[0].base_offset}, the copy ends at {copy.end_offset}"
                )
            bases = await asyncio.gather(
                *(copy.append(e.payload, e.count, e.publish_time_us) for e in entries)
            )
            if list(bases) != [e.base_offset for e in entries]:
                raise ValueError(f"the copy of {topic_uid} went out of step at {bases[0]}")
            self.from_owner.add(entries, len(response.frames))
            self._fills(topic_uid)[1].add(entries, len(response.frames))
            metrics.COPY_FILL_BYTES.labels("owner").inc(len(response.frames))
        return copy

    async def _restart_copy(self, topic_uid: str, source: int, start: int) -> SourceLog:
        sources = self.copy.topics[topic_uid]
        directory = sources.logs[source].directory
        if sources.logs[source].on_disk:
            log.info("copy %s is behind its owner's retained start: copied anew", directory)
        await sources.logs[source].close()
        await asyncio.to_thread(shutil.rmtree, directory, True)
        await asyncio.to_thread(_create, directory, start)
        return sources.reopen(source)

    # --- ack state ----------------------------------------------------------------------------

    async def prepare(
        self, topic_uid: str, subscription_uid: str, start_offsets: Mapping[int, int]
    ) -> dict[int, CursorState]:
        """Attach the subscription's ack state on the owner and follow its topic; afterwards
        ``attach`` answers from what the owner said."""
        response = await self._call(
            topic_uid,
            "Attach",
            s.AttachRequest(
                topic_uid=topic_uid,
                subscription_uid=subscription_uid,
                start_offsets=dict(start_offsets),
            ),
            s.AttachResponse,
        )
        cursors = wire.cursors_from_wire(response.cursors)
        key = (topic_uid, subscription_uid)
        sub = self._subscriptions.get(key)
        if sub is None:
            self._subscriptions[key] = _Subscription(
                topic_uid, subscription_uid, dict(start_offsets), cursors
            )
        else:
            sub.cursors = cursors
        await self.follow(topic_uid)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_loop(), name="remote-acks")
        return cursors

    def attach(
        self, topic_uid: str, subscription_uid: str, start_offsets: Mapping[int, int]
    ) -> dict[int, CursorState]:
        sub = self._subscriptions.get((topic_uid, subscription_uid))
        if sub is None:
            raise Unavailable(f"subscription storage {subscription_uid} is not prepared here")
        return dict(sub.cursors)

    async def detach(self, topic_uid: str, subscription_uid: str) -> None:
        sub = self._subscriptions.pop((topic_uid, subscription_uid), None)
        if sub is not None:
            await self._call(
                topic_uid,
                "Detach",
                s.SubscriptionRequest(topic_uid=topic_uid, subscription_uid=subscription_uid),
                s.Done,
            )

    def _queue(self, topic_uid: str, subscription_uid: str, op: Op) -> None:
        sub = self._subscriptions.get((topic_uid, subscription_uid))
        if sub is None:
            raise Unavailable(f"subscription storage {subscription_uid} is not attached here")
        if op[0] == "acks" and sub.ops and sub.ops[-1][0] == "acks":
            last: dict[int, list[tuple[int, int]]] = sub.ops[-1][1]
            for source, ranges in op[1].items():
                last.setdefault(source, []).extend(ranges)
        else:
            sub.ops.append(op)

    def record_acks(
        self, topic_uid: str, subscription_uid: str, source: int, ranges: list[tuple[int, int]]
    ) -> None:
        self._queue(topic_uid, subscription_uid, ("acks", {source: list(ranges)}))

    def reset_cursors(
        self, topic_uid: str, subscription_uid: str, states: Mapping[int, CursorState]
    ) -> None:
        self._queue(topic_uid, subscription_uid, ("reset", dict(states)))

    def set_publish_block(
        self, topic_uid: str, subscription_uid: str, reason: str | None, from_us: int = 0
    ) -> None:
        self._queue(topic_uid, subscription_uid, ("block", (reason or "", from_us)))

    async def flush_acks(self, topic_uid: str, subscription_uid: str) -> None:
        sub = self._subscriptions.get((topic_uid, subscription_uid))
        if sub is None:
            raise Unavailable(f"subscription storage {subscription_uid} is not attached here")
        await self._send(sub)
        await self._owner_call(
            sub,
            "FlushAcks",
            s.SubscriptionRequest(topic_uid=topic_uid, subscription_uid=subscription_uid),
        )

    def cursor_states(self, topic_uid: str, subscription_uid: str) -> dict[int, CursorState]:
        raise NotServedHere(f"the ack state of {subscription_uid} (its topic's owner has it)")

    def ensure_writable(self) -> None:
        """The owner refuses a durable ack on a full disk (flush_acks raises)."""

    async def _owner_call(self, sub: _Subscription, method: str, request: Any) -> None:
        try:
            await self._call(sub.topic_uid, method, request, s.Done)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            # The owner does not hold the ack state (the topic moved): attach it again there.
            await self._call(
                sub.topic_uid,
                "Attach",
                s.AttachRequest(
                    topic_uid=sub.topic_uid,
                    subscription_uid=sub.uid,
                    start_offsets=sub.start_offsets,
                ),
                s.AttachResponse,
            )
            await self._call(sub.topic_uid, method, request, s.Done)

    async def _send(self, sub: _Subscription) -> None:
        """Send what the subscription queued, in order; what fails stays queued."""
        async with sub.lock:
            while sub.ops:
                # Taken off first: acks recorded meanwhile go into a new batch, not this one.
                op = sub.ops.pop(0)
                try:
                    await self._send_op(sub, op)
                except BaseException:
                    sub.ops.insert(0, op)
                    raise

    async def _send_op(self, sub: _Subscription, op: Op) -> None:
        kind, value = op
        topic, uid = sub.topic_uid, sub.uid
        if kind == "acks":
            await self._owner_call(
                sub,
                "RecordAcks",
                s.RecordAcksRequest(
                    acks=wire.acks_to_wire(value), topic_uid=topic, subscription_uid=uid
                ),
            )
        elif kind == "reset":
            await self._owner_call(
                sub,
                "ResetCursors",
                s.ResetCursorsRequest(
                    cursors=wire.cursors_to_wire(value),
                    topic_uid=topic,
                    subscription_uid=uid,
                ),
            )
        else:
            reason, from_us = value
            await self._owner_call(
                sub,
                "SetPublishBlock",
                s.SetPublishBlockRequest(
                    reason=reason, from_us=from_us, topic_uid=topic, subscription_uid=uid
                ),
            )

    async def _send_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            for sub in list(self._subscriptions.values()):
                if not sub.ops:
                    continue
                try:
                    await self._send(sub)
                except (grpc.aio.AioRpcError, Unavailable) as e:
                    log.info("acks of %s not sent yet: %s", sub.uid, e)

    def forget(self, topic_uid: str, subscription_uid: str) -> None:
        """The subscription is no longer served here (what it queued was sent or given up:
        the owner redelivers it). The copy of its topic stays followed."""
        self._subscriptions.pop((topic_uid, subscription_uid), None)
        if topic_uid in self._ready and not any(t == topic_uid for t, _ in self._subscriptions):
            self._unfollow(topic_uid)

    def _unfollow(self, topic_uid: str) -> None:
        """No subscription served here reads the topic any more: its streams stop and its
        copy is deleted (a later subscription copies it anew)."""
        del self._ready[topic_uid]
        for key in [k for k in self._tails if k[0] == topic_uid]:
            self._tails.pop(key).cancel()
            self._current.discard(key)
        self._policies.pop(topic_uid, None)
        self._topic_fills.pop(topic_uid, None)
        for key in [k for k in self._fill_checked if k[0] == topic_uid]:
            del self._fill_checked[key]
        task = asyncio.get_running_loop().create_task(self._drop(topic_uid))
        self._dropping[topic_uid] = task

    async def _drop(self, topic_uid: str) -> None:
        try:
            await asyncio.sleep(0)  # the cancelled streams end first
            await self.copy.drop_topic(topic_uid)
        finally:
            self._dropping.pop(topic_uid, None)

    def status(self) -> dict[str, object]:
        return {
            "topics": len(self._ready),
            "subscriptions": len(self._subscriptions),
            "queued": sum(len(s.ops) for s in self._subscriptions.values()),
            "tail_restarts": self.tail_restarts,
            "filled_from_nodes": self.from_nodes.to_json(),
            "filled_from_owner": self.from_owner.to_json(),
            "fills_failed": self.fills_failed,
            # Messages each followed topic's copy took from the nodes and from its owner.
            "fills_by_topic": {
                uid: {"nodes": nodes.messages, "owner": owner.messages}
                for uid, (nodes, owner) in self._topic_fills.items()
            },
        }

    def queued(self, topic_uid: str, subscription_uid: str) -> int:
        """Changes of the subscription's ack state not yet sent to the owner."""
        sub = self._subscriptions.get((topic_uid, subscription_uid))
        return len(sub.ops) if sub is not None else 0

    # --- reading: the local copy ---------------------------------------------------------------

    def source_count(self, topic_uid: str) -> int:
        return self.copy.source_count(topic_uid)

    def ranges(self, topic_uid: str) -> list[SourceRange]:
        return self.copy.ranges(topic_uid)

    def end_offsets(self, topic_uid: str) -> dict[int, int]:
        return self.copy.end_offsets(topic_uid)

    def start_offset(self, topic_uid: str, source: int) -> int:
        return self.copy.start_offset(topic_uid, source)

    def committed_offset(self, topic_uid: str, source: int) -> int:
        return self.copy.committed_offset(topic_uid, source)

    def read(
        self, topic_uid: str, source: int, offset: int, max_entries: int, max_bytes: int
    ) -> list[Entry]:
        return self.copy.read(topic_uid, source, offset, max_entries, max_bytes)

    def entry_at(self, topic_uid: str, source: int, offset: int) -> Entry:
        return self.copy.entry_at(topic_uid, source, offset)

    def publish_time_us(self, topic_uid: str, source: int, offset: int) -> int:
        return self.copy.publish_time_us(topic_uid, source, offset)

    def offset_for_time(self, topic_uid: str, source: int, publish_time_us: int) -> int:
        return self.copy.offset_for_time(topic_uid, source, publish_time_us)

    def stored_bytes(self, topic_uid: str, source: int, start: int, stop: int) -> float:
        return self.copy.stored_bytes(topic_uid, source, start, stop)

    def segment_sizes(self, topic_uid: str, source: int) -> list[tuple[int, int]]:
        return self.copy.segment_sizes(topic_uid, source)

    def damage_policy(self, topic_uid: str) -> DamagePolicy:
        return self._policies.get(topic_uid, DamagePolicy.STOP)

    def damaged(self, topic_uid: str) -> list[tuple[int, DamagedRange]]:
        return self.copy.damaged(topic_uid)

    def has_topic(self, topic_uid: str) -> bool:
        return self.copy.has_topic(topic_uid)

    def topic_uids(self, written_only: bool = False) -> list[str]:
        return self.copy.topic_uids(written_only)

    def on_disk(self, topic_uid: str) -> bool:
        return self.copy.has_topic(topic_uid)

    def add_commit_listener(self, topic_uid: str, listener: Callable[[int], None]) -> None:
        self.copy.add_commit_listener(topic_uid, listener)

    def remove_commit_listener(self, topic_uid: str, listener: Callable[[int], None]) -> None:
        self.copy.remove_commit_listener(topic_uid, listener)

    def delay_due(self, topic_uid: str, at_us: int, position: int) -> bool:
        return self.copy.delay_due(topic_uid, at_us, position)

    def watch_due(
        self,
        topic_uid: str,
        key: int,
        listener: Callable[[list[int]], None],
        pending: Callable[[], int],
    ) -> None:
        self.copy.watch_due(topic_uid, key, listener, pending)

    def unwatch_due(self, topic_uid: str, key: int) -> None:
        self.copy.unwatch_due(topic_uid, key)

    # --- the owner's alone ----------------------------------------------------------------------

    def _owners_only(self, what: str) -> NotServedHere:
        return NotServedHere(f"{what} (a publishing forwarder's call)")

    def configure_topic(
        self, topic_uid: str, source_count: int, key_sources: int, damage_policy: DamagePolicy
    ) -> list[int]:
        raise self._owners_only(f"topic storage {topic_uid}")

    async def drop_topic(self, topic_uid: str) -> None:
        raise self._owners_only(f"topic storage {topic_uid}")

    async def publish(
        self,
        topic_uid: str,
        payload: bytes,
        count: int,
        ordering_key: str | None = None,
        source: int | None = None,
    ) -> tuple[int, int]:
        raise self._owners_only(f"topic storage {topic_uid}")

    async def publish_deduplicated(
        self,
        topic_uid: str,
        messages: Sequence[tuple[str, Any]] | DedupBatch,
        source: int | None = None,
    ) -> tuple[list[str], int]:
        raise self._owners_only(f"topic storage {topic_uid}")

    def publish_blocked(self, topic_uid: str) -> str | None:
        raise self._owners_only(f"topic storage {topic_uid}")

    def set_pins(self, topic_uid: str, owner: str, pins: Mapping[int, int] | None) -> None:
        raise self._owners_only(f"topic storage {topic_uid}")

    def pin_owners(self, topic_uid: str) -> list[str]:
        raise self._owners_only(f"topic storage {topic_uid}")


def _create(directory: Path, start: int) -> None:
    make_dirs(directory)
    (directory / segment_file_name(start)).touch()
    fsync_directory(directory.parent)
