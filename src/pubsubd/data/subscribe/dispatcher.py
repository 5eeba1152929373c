"""Subscription dispatcher: the asyncio shell around one subscription's delivery planner.

One dispatcher per subscription, owned by the subscribing forwarder. Every delivery rule lives in
the pure ``planner.DeliveryPlanner``; the dispatcher feeds it what happens (consumers coming and
going, acks, deadline changes, commits of new messages, delayed messages falling due, time) and
carries out the planner's effects in order: acks are recorded with the publishing forwarder,
ended consumers are told, responses are handed to their consumers, dead letters are published,
and one timer (through the injected ``Clock``) is armed for the planner's next wake-up.

Everything here runs on the event loop and never awaits, except the dead-letter publishes (tasks)
and the exactly-once/Seek flushes its callers await: a pump is synchronous (reads are page-cache
preads), so no two deliveries interleave and no lock is needed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pubsubd.core import ids, quotas
from pubsubd.core.backlog_view import BacklogShare
from pubsubd.core.clock import Clock, Timer
from pubsubd.core.errors import (
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    PubsubError,
    Unavailable,
)
from pubsubd.core.queue_settings import QueueSettings
from pubsubd.core.records import CursorState, DamagedRange
from pubsubd.core.roles import PublishingForwarderApi
from pubsubd.data.backlog_count import unacked_backlog
from pubsubd.data.subscribe.budget import DeliveryBudget
from pubsubd.data.subscribe.consumers import Consumer, PullWaiter, StreamConsumer
from pubsubd.data.subscribe.dead_letter import dead_letter_request
from pubsubd.data.subscribe.leases import LeaseTable
from pubsubd.data.subscribe.planner import DeliveryPlanner, Effects
from pubsubd.data.subscribe.reader import TopicReader
from pubsubd.observability import background, events, metrics, sli
from pubsubd.storage.errors import DamagedEntries, OffsetOutOfRange

log = logging.getLogger(__name__)

# Publishes a dead-letter copy: (dead-letter topic name, serialized PublishRequest).
DeadLetterPublish = Callable[[str, bytes], Awaitable[None]]


def dead_letter_failure_reason(e: BaseException) -> str:
    """``pubsubd_dead_letter_failures``'s reason for a dead-letter copy not published."""
    if isinstance(e, (InvalidArgument, FailedPrecondition)):
        return "refused"  # the dead-letter topic's schema, or a Publish limit
    if isinstance(e, NotFound):
        return "topic_missing"
    if isinstance(e, Unavailable):
        return "unavailable"
    return "error"


class SubscriptionDispatcher:
    # One per subscription, so no per-instance __dict__ (BENCHMARKS.md, "Scale of names").
    __slots__ = (
        "_blocking",
        "_dead_letter_publish",
        "_listener",
        "_pump_scheduled",
        "_tasks",
        "_timer",
        "_timer_at",
        "blocks_at_owner",
        "clock",
        "planner",
        "publishing",
        "reader",
        "topic_quota",
        "topic_uid",
        "uid",
    )

    def __init__(
        self,
        subscription: Any,
        uid: str,
        topic_uid: str,
        publishing: PublishingForwarderApi,
        reader: TopicReader,
        cursors: dict[int, CursorState],
        *,
        clock: Clock,
        dead_letter_publish: DeadLetterPublish,
        topic_quota: quotas.BacklogQuota | None = None,
        budget: DeliveryBudget | None = None,
        served_sources: frozenset[int] | None = None,
        blocks_at_owner: bool = False,
    ) -> None:
        self.uid = uid
        # A cluster: block_publishers quotas are the topic's owner's (over every source,
        # data/publish/owner_quotas.py); this dispatcher sends no block.
        self.blocks_at_owner = blocks_at_owner
        self.topic_uid = topic_uid
        self.publishing = publishing
        self.reader = reader
        self.clock = clock
        self.planner = DeliveryPlanner(
            subscription, uid[:8], cursors, reader, budget, served_sources
        )
        self._dead_letter_publish = dead_letter_publish
        self._tasks: set[asyncio.Task[None]] | None = None  # dead-letter publishes
        self._pump_scheduled = False
        self._timer: Timer | None = None
        self._timer_at: float | None = None
        # The topic's backlog quota (a subscription's own one, in its labels, comes first),
        # and whether this subscription has told the publishing side to block publishers.
        self.topic_quota = topic_quota
        self._blocking = False
        self._listener = self._on_commit
        publishing.add_commit_listener(topic_uid, self._listener)
        publishing.watch_due(topic_uid, id(self), self._on_due, self.planner.pending_redeliveries)

    # --- what others read ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return str(self.planner.subscription.name)

    @property
    def subscription(self) -> Any:
        return self.planner.subscription

    @property
    def settings(self) -> QueueSettings:
        return self.planner.settings

    @property
    def consumers(self) -> dict[int, Consumer]:
        return self.planner.consumers

    @property
    def leases(self) -> LeaseTable:
        return self.planner.leases

    @property
    def incarnation(self) -> str:
        return self.planner.incarnation

    @property
    def generation_floor(self) -> int:
        return self.planner.generation_floor

    @property
    def ack_deadline_s(self) -> int:
        return self.planner.ack_deadline_s

    @property
    def delivered(self) -> int:
        return self.planner.delivered

    @property
    def acked(self) -> int:
        return self.planner.acked

    @property
    def dead_lettered(self) -> int:
        return self.planner.dead_lettered

    @property
    def dead_letter_failures(self) -> int:
        """Dead-letter copies not published so far (each message stays, tried again)."""
        return self.planner.dead_letter_failures

    @property
    def lost(self) -> int:
        return self.planner.lost

    def configure(self, subscription: Any) -> None:
        """The subscription was updated: its settings (labels, filter, policies) apply now."""
        self.planner.configure(subscription)
        self._apply()
        self._update_block()

    def set_topic_quota(self, quota: quotas.BacklogQuota | None) -> None:
        self.topic_quota = quota
        self._update_block()

    @property
    def quota(self) -> quotas.BacklogQuota | None:
        """The backlog quota that applies: the subscription's own, else its topic's."""
        return self.planner.settings.quota or self.topic_quota

    # --- consumers ----------------------------------------------------------------------------

    def admit(self, client_id: str) -> None:
        self.planner.admit(client_id)
        self._apply()

    def admit_pull(self) -> None:
        self.planner.admit_pull()

    def add_consumer(self, consumer: Consumer) -> None:
        self.planner.add_consumer(consumer)
        self.pump()

    def remove_consumer(self, consumer: Consumer) -> None:
        self.planner.remove_consumer(consumer)
        self._apply()

    def revive(self, consumer: Consumer) -> None:
        """A request arrived on ``consumer``'s stream: it reads again if it was stalled."""
        self.planner.revive(consumer)
        self._apply()

    # --- delivery -----------------------------------------------------------------------------

    def _on_commit(self, _committed: int) -> None:
        self.schedule_pump()
        if self._blocking or self.quota is not None:
            self._update_block()  # before the publish that committed is answered

    def refresh_block(self) -> None:
        self._update_block()

    def _update_block(self) -> None:
        """A block_publishers quota: tell the publishing forwarder, as a value, whether (and
        from when, for the age limit) this subscription's backlog blocks publishers."""
        if self.blocks_at_owner:
            return
        quota = self.quota
        reason: str | None = None
        from_us = 0
        if quota is not None and quota.policy is quotas.Policy.BLOCK_PUBLISHERS:
            now_us = self.clock.time_us()
            backlog = self.backlog_stats(now_us)
            over = quotas.exceeded(quota, backlog)
            if over is None and quota.age_s and backlog.messages:
                # Not over yet, but the oldest unacked message will be too old at a known time.
                oldest_us = now_us - int(backlog.oldest_age_s * 1_000_000)
                from_us = oldest_us + quota.age_s * 1_000_000
                over = f"oldest unacked message over {quota.age_s}s old ({quotas.AGE_LABEL})"
            if over is not None:
                reason = (
                    f"backlog quota exceeded: subscription {self.name} has {over}; "
                    "publishing is blocked until it catches up"
                )
        if reason is not None or self._blocking:
            self.publishing.set_publish_block(self.topic_uid, self.uid, reason, from_us)
            self._blocking = reason is not None

    def _on_due(self, positions: list[int]) -> None:
        self.planner.delayed_due(positions)
        self._apply()

    def schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._background, "pump", self.pump)

    def pump_now(self) -> None:
        """:meth:`pump` in the caller's step (a scheduled one still runs, finding less to do);
        a failure is handled as a scheduled pump's."""
        self._background("pump", self.pump)

    def pump(self) -> None:
        """Deliver as much as the consumers can take (the planner decides)."""
        self._pump_scheduled = False
        self.planner.plan(self.clock.monotonic())
        self._apply()

    def _apply(self) -> None:
        """Carry out the planner's effects, in order; then arm the timer."""
        fx = self.planner.effects()
        # Told before the deliveries of the same step: a stream learns it is active, then
        # receives.
        for consumer, active in self.planner.active_changes():
            consumer.notify_active(active)
        if fx:
            self._carry_out(fx)
            if fx.acks and (self._blocking or self.quota is not None):
                self._update_block()  # acks may bring the backlog back under its quota
        planner = self.planner
        budget = planner.budget
        if budget is not None:
            budget.settle(planner, len(planner.leases), planner.outstanding_bytes)
            if planner.budget_limited:
                planner.budget_limited = False
                budget.wait(planner, self.schedule_pump)
        self._arm_timer()

    def _carry_out(self, fx: Effects) -> None:
        for source, ranges in fx.acks.items():
            self.publishing.record_acks(self.topic_uid, self.uid, source, ranges)
        if fx.lost:
            metrics.LOST_MESSAGES.labels(reason="damaged").inc(len(fx.lost))
            log.warning(
                "subscription %s: %d damaged messages skipped (acknowledged as lost), "
                "positions %d..%d",
                self.name,
                len(fx.lost),
                min(fx.lost),
                max(fx.lost),
            )
        for consumer, error in fx.ended:
            _end(consumer, error)
        for delivery in fx.deliveries:
            consumer = delivery.consumer
            if consumer.raw:
                consumer.deliver_raw(delivery)
            else:
                consumer.deliver(delivery.received, delivery.positions)
        for pos, attempts in fx.dead_letters:
            self._start_dead_letter(pos, attempts)
        if fx.pump:
            self.schedule_pump()

    # --- dead letters -------------------------------------------------------------------------

    def _start_dead_letter(self, pos: int, attempts: int) -> None:
        if self._tasks is None:
            self._tasks = set()
        task = asyncio.get_running_loop().create_task(self._forward_dead_letter(pos, attempts))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward_dead_letter(self, pos: int, attempts: int) -> None:
        topic = self.subscription.dead_letter_policy.dead_letter_topic
        planner = self.planner
        try:
            found = planner.locate(pos)
            if found is None:
                planner.dead_letter_failed(pos, self.clock.monotonic())
                return
            decoded, i = found
            payload = dead_letter_request(self.name, decoded.parsed[i], attempts, topic)
            await self._dead_letter_publish(topic, payload)
            planner.dead_letter_done(pos)
        except Exception as e:
            planner.dead_letter_failed(pos, self.clock.monotonic())
            self._dead_letter_failed(topic, e)
        finally:
            self._apply()

    def _dead_letter_failed(self, topic: str, e: Exception) -> None:
        """Count a dead-letter copy not published (the message stays here, tried again later):
        one the dead-letter topic refuses (its schema, a Publish limit) is logged as a warning,
        once and then at 10, 100, ... per subscription; anything unexpected is a background
        error."""
        reason = dead_letter_failure_reason(e)
        metrics.DEAD_LETTER_FAILURES.labels(reason=reason).inc()
        if reason == "error":
            background.report("dead-letter publish", e)
            return
        n = self.planner.dead_letter_failures
        if n == 1 or background.is_power_of_ten(n):
            log.warning(
                "subscription %s: dead-letter copy not published to %s (%s, %d so far; the "
                "message stays in the subscription and is tried again): %s",
                self.name,
                topic,
                reason,
                n,
                e,
            )

    # --- acks and deadlines -------------------------------------------------------------------

    def decode(self, ack_id: str) -> tuple[int, int]:
        # Once per ack ID: the planner's decode without its call layer.
        return ids.decode_ack_id(ack_id, self.planner.incarnation)

    def decode_all(self, ack_ids: list[str]) -> list[tuple[int, int]]:
        """:meth:`decode` of each (raises for the first malformed one)."""
        return ids.decode_ack_ids(ack_ids, self.planner.incarnation)

    def acknowledge(self, positions: list[int], spans: list[tuple[int, int]] | None = None) -> None:
        """Acknowledge ``positions``; ``spans``, if given, are the same positions as (first,
        count) runs of consecutive positions (planner.acknowledge)."""
        events.record_acks(self, positions)  # delivery-latency SLI; O(1) per batch
        sli.record_acks(
            str(self.subscription.topic),
            self.name,
            positions,
            self.publish_time_us,
            self.clock.time_us(),
        )
        self.planner.acknowledge(positions, spans)
        self._apply()

    def publish_time_us(self, pos: int) -> int:
        """Publish time of a message of this subscription's topic (delivery-latency SLI)."""
        return self.reader.publish_time_us(ids.source_of(pos), ids.offset_of(pos))

    def current(self, pos: int, generation: int) -> bool:
        return self.planner.current(pos, generation)

    def modify_deadline(self, positions: list[tuple[int, int]], seconds: int) -> None:
        """Extend leases to now + seconds; 0 is a nack (redeliver, after any retry backoff)."""
        self.planner.modify_deadline(positions, seconds, self.clock.monotonic())
        self._apply()

    def give_back(self, consumer_id: int, positions: list[int]) -> int:
        back = self.planner.give_back(consumer_id, positions)
        self._apply()
        return back

    def give_back_deliveries(self, deliveries: list[tuple[int, int]]) -> int:
        back = self.planner.give_back_deliveries(deliveries)
        self._apply()
        return back

    async def flush_acks(self) -> None:
        """Make this subscription's acks durable now (exactly-once acknowledgements)."""
        await self.publishing.flush_acks(self.topic_uid, self.uid)

    # --- timers -------------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        """One timer for the earliest of: a lease deadline, a backoff ending."""
        at = self.planner.next_wakeup()
        if at is None:
            return
        if self._timer_at is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.call_later(
            max(0.0, at - self.clock.monotonic()), self._background, "lease timer", self._on_timer
        )

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.planner.tick(self.clock.monotonic()):
            self.pump()
        else:
            self._apply()

    def _background(self, task: str, step: Callable[[], None]) -> None:
        """Run a scheduled pump or timer. A failure is reported (observability/background.py)
        and ends every consumer with INTERNAL, so no client waits on a stalled subscription
        without a word (the official clients reconnect and the next pump tries again)."""
        try:
            step()
        except Exception as exc:
            background.report(f"subscription {task}", exc)
            error = InternalError(
                f"delivery of subscription {self.name} failed ({type(exc).__name__}: {exc}); "
                "see the server log"
            )
            for consumer in list(self.consumers.values()):
                if consumer.has_client:
                    self.planner.end_consumer(consumer, error)
            self._timer = None
            self._timer_at = None
            try:
                self._apply()
            except Exception as again:  # the planner itself is broken: nothing left to try
                background.report(f"subscription {task}", again)

    # --- ack state ----------------------------------------------------------------------------

    def reset(self, states: dict[int, CursorState]) -> None:
        """Replace the ack state (Seek): forget leases and redeliveries, read from the new
        mark-delete positions; journaled with the publishing forwarder."""
        self.planner.reset(states)
        self.publishing.reset_cursors(self.topic_uid, self.uid, states)
        self._apply()

    def cursor_states(self) -> dict[int, CursorState]:
        return self.planner.cursor_states()

    def ack_below(self, source: int, cut: int) -> bool:
        """Messages of ``source`` below ``cut`` leave the backlog (retention expiry)."""
        changed = self.planner.ack_below(source, cut)
        self._apply()
        return changed

    # --- damaged messages ---------------------------------------------------------------------

    def skip_damaged(self, damaged: list[tuple[int, DamagedRange]]) -> int:
        lost = self.planner.skip_damaged(damaged)
        self._apply()
        return lost

    def damage_status(self) -> dict[str, Any]:
        """For /status: the damaged ranges holding unacked messages of this subscription
        (delivery stops at them unless the topic's policy skips them)."""
        found = self.planner.damage_status(self.publishing.damaged(self.topic_uid))
        if not found:
            return {}
        policy = self.publishing.damage_policy(self.topic_uid)
        return {"stopped_at_damage": found, "damage_policy": policy.value}

    # --- backlog ------------------------------------------------------------------------------

    def backlog_stats(self, now_us: int, served_only: bool = False) -> quotas.Backlog:
        """Unacked messages, their stored bytes and the age of the oldest (backlog quotas).
        ``served_only``: of the sources served here (what is reported: of a spread
        subscription, this forwarder's share); quotas count every source as known here.

        Counted by ``data/backlog_count.py`` (bytes from the log's index)."""
        return unacked_backlog(
            self.publishing,
            self.topic_uid,
            self.planner.cursors,
            now_us,
            lambda source: self._counted(source, served_only),
        )

    def backlog_share(self, now_us: int) -> BacklogShare | None:
        """This forwarder's share of the subscription's backlog, for its load report
        (``core/backlog_view.py``): the sources served here and their backlog; None for a
        subscription served whole with nothing unacked (nothing to add up)."""
        served = self.planner.served_sources
        if served is None and not self.backlog():
            return None
        topic_sources = len(self.publishing.ranges(self.topic_uid))
        stats = self.backlog_stats(now_us, served_only=True)
        return BacklogShare(
            subscription=self.name,
            sources=tuple(sorted(served)) if served is not None else tuple(range(topic_sources)),
            topic_sources=topic_sources,
            messages=stats.messages,
            bytes=stats.bytes,
            oldest_unacked_age_s=stats.oldest_age_s,
            spread=served is not None,
        )

    def evict_oldest(self, count: int, older_than_us: int | None = None) -> int:
        """Acknowledge the ``count`` oldest unacked messages, and any published before
        ``older_than_us`` (backlog quota ``evict_oldest``); return how many."""
        older_than = None
        if older_than_us is not None:
            cutoff = older_than_us

            def older_than(source: int, offset: int) -> bool:
                try:
                    return self.reader.publish_time_us(source, offset) < cutoff
                except (OffsetOutOfRange, DamagedEntries):
                    return False

        evicted = self.planner.unacked_positions(count, older_than)
        if evicted:
            self.planner.evict(evicted)
            self._apply()
        return len(evicted)

    def _counted(self, source: int, served_only: bool) -> bool:
        served = self.planner.served_sources
        return not served_only or served is None or source in served

    def backlog(self) -> int:
        """Messages not yet acked (delivered or not) in the sources served here: of a spread
        subscription, this forwarder's share (the other sources' ack state is only as of its
        attach), so the shares of its forwarders add up to the whole."""
        total = 0
        for source, span in enumerate(self.publishing.ranges(self.topic_uid)):
            cursor = self.planner.cursors.get(source)
            if cursor is not None and self._counted(source, True):
                total += cursor.unacked_count(span.end_offset)
        return total

    def close(self, error: PubsubError) -> None:
        """Stop: end every stream with ``error``, answer waiting Pulls, forget leases."""
        if self._blocking:
            self.publishing.set_publish_block(self.topic_uid, self.uid, None, 0)
        self.publishing.remove_commit_listener(self.topic_uid, self._listener)
        self.publishing.unwatch_due(self.topic_uid, id(self))
        if self._timer is not None:
            self._timer.cancel()
        for task in self._tasks or ():
            task.cancel()
        self.planner.close(error)
        if self.planner.budget is not None:
            self.planner.budget.leave(self.planner)
        for consumer, ended in self.planner.effects().ended:
            _end(consumer, ended)


def _end(consumer: Consumer, error: PubsubError) -> None:
    """End a consumer with ``error``: a stream's RPC ends with it, a Pull answers it, a pusher
    stops."""
    if isinstance(consumer, PullWaiter):
        consumer.closed = True
        if not consumer.future.done():
            consumer.future.set_exception(error)
            consumer.future.exception()  # retrieved: a Pull gone meanwhile logs nothing
        return
    end = getattr(consumer, "end", None)
    if end is not None:
        end(error)
    elif isinstance(consumer, StreamConsumer):  # pragma: no cover - StreamConsumer has end
        consumer.closed = True
