"""A topic's backlog quota evaluated at the topic's owner (a cluster of forwarders).

The owner of a topic (its publishing forwarder, the ledger writer of its sources) holds every
subscription's ack journal over every source: acks from the subscribing forwarders reach it
within their ack flush interval (50 ms). So the whole backlog of a subscription, also of one
spread over several subscribing forwarders by source, is exact here, where each subscribing
forwarder only knows its own sources (and the others' as of its attach: too high).

Here every ``block_publishers`` quota of the topic's subscriptions (``core/quotas.py``: a
subscription's own, from its labels, else the topic's) is evaluated after every commit (before
the publish is answered, as in the one-process server), every ack recorded, every cursor reset,
attach and detach. Its blocks are kept apart from any a dispatcher sends (``set_publish_block``
under ``owner:{subscription uid}``), so neither clears the other's. The subscribing forwarders
of a cluster leave ``block_publishers`` quotas to the owner
(``SubscribingForwarder.block_quotas_at_owner``). ``evict_oldest`` stays with the dispatchers:
evicting is acking, and the dispatcher holds what an ack changes (leases, redeliveries, key
queues, its cursor mirror); the owner's journal only follows it (an ack made here would reach
no planner: evicted messages delivered all the same, the mirror and the journal apart). So a
subscription under such a quota is served whole (never spread, control/routing_views.py),
where its dispatcher's count is exact.

Staleness: an ack counts here once its forwarder sent it (the ack flush, 50 ms), so a cluster
may refuse a publish up to that long after the one-process server would accept it again;
publishes count at once (the commit is here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pubsubd.acks.cursor import Cursor
from pubsubd.core import quotas
from pubsubd.data.backlog_count import LogReader, unacked_backlog

__all__ = ["OWNER_BLOCK_PREFIX", "OwnerQuotas"]

# The key of a block set here, beside the dispatchers' (keyed by subscription uid).
OWNER_BLOCK_PREFIX = "owner:"

# Sets or clears one block: (topic uid, key, reason or None, from when in epoch µs).
SetBlock = Callable[[str, str, "str | None", int], None]


class OwnerQuotas:
    """The block_publishers backlog quotas of the topics owned here, evaluated over their
    subscriptions' journals."""

    def __init__(
        self,
        logs: LogReader,
        cursors: Callable[[str], Mapping[str, Mapping[int, Cursor]]],
        set_block: SetBlock,
        now_us: Callable[[], int],
    ) -> None:
        """``cursors(topic uid)``: every subscription's cursors by source, by subscription
        uid (the attached journals)."""
        self._logs = logs
        self._cursors = cursors
        self._set_block = set_block
        self._now_us = now_us
        self.topic_quotas: dict[str, quotas.BacklogQuota] = {}  # by topic uid
        # A subscription's own quota, by uid (None: labels that do not parse, nothing here).
        self.own_quotas: dict[str, quotas.BacklogQuota | None] = {}
        self.names: dict[str, str] = {}  # subscription uid -> name
        self._own_by_topic: dict[str, set[str]] = {}  # topic uid -> subscriptions with one
        self._blocking: dict[str, set[str]] = {}  # topic uid -> subscriptions blocking it

    def set_topic_quota(self, topic_uid: str, quota: quotas.BacklogQuota | None) -> None:
        """The topic's quota, for its subscriptions without one of their own."""
        if quota is not None:
            self.topic_quotas[topic_uid] = quota
        else:
            self.topic_quotas.pop(topic_uid, None)
        self.evaluate(topic_uid)

    def set_subscription(
        self,
        topic_uid: str,
        subscription_uid: str,
        name: str,
        own: quotas.BacklogQuota | None,
        has_own: bool,
    ) -> None:
        """A subscription of the topic: its name (for the refusal) and its own quota, when
        it has one (``has_own``; ``own`` None then: its labels do not parse)."""
        self.names[subscription_uid] = name
        with_own = self._own_by_topic.setdefault(topic_uid, set())
        if has_own:
            self.own_quotas[subscription_uid] = own
            with_own.add(subscription_uid)
        else:
            self.own_quotas.pop(subscription_uid, None)
            with_own.discard(subscription_uid)
        if not with_own:
            del self._own_by_topic[topic_uid]
        self.evaluate(topic_uid, subscription_uid)

    def forget_subscription(self, topic_uid: str, subscription_uid: str) -> None:
        """The subscription was deleted or detached: it blocks nothing any more."""
        self.names.pop(subscription_uid, None)
        self.own_quotas.pop(subscription_uid, None)
        with_own = self._own_by_topic.get(topic_uid)
        if with_own is not None:
            with_own.discard(subscription_uid)
            if not with_own:
                del self._own_by_topic[topic_uid]
        held = self._blocking.get(topic_uid)
        if held is not None and subscription_uid in held:
            held.discard(subscription_uid)
            if not held:
                del self._blocking[topic_uid]
            self._set_block(topic_uid, OWNER_BLOCK_PREFIX + subscription_uid, None, 0)

    def forget(self, topic_uid: str) -> None:
        """The topic went elsewhere or was dropped: its blocks went with it (what is known of
        its subscriptions stays: a later gain replays the topic's records)."""
        self.topic_quotas.pop(topic_uid, None)
        self._blocking.pop(topic_uid, None)

    def quota_of(self, topic_uid: str, subscription_uid: str) -> quotas.BacklogQuota | None:
        """The block_publishers quota that applies to the subscription, if any: its own,
        else its topic's."""
        if subscription_uid in self.own_quotas:
            quota = self.own_quotas[subscription_uid]
        else:
            quota = self.topic_quotas.get(topic_uid)
        if quota is None or quota.policy is not quotas.Policy.BLOCK_PUBLISHERS:
            return None
        return quota

    def evaluate(self, topic_uid: str, subscription_uid: str | None = None) -> None:
        """Re-evaluate one subscription of the topic, or all of them."""
        blocking = self._blocking.get(topic_uid)
        if (
            topic_uid not in self.topic_quotas
            and topic_uid not in self._own_by_topic
            and not blocking
        ):
            return  # nothing to count (every commit of every topic comes here)
        journals = self._cursors(topic_uid)
        uids = list(journals) if subscription_uid is None else [subscription_uid]
        if subscription_uid is None and blocking:
            uids.extend(u for u in blocking if u not in journals)
        for uid in uids:
            cursors = journals.get(uid)
            quota = self.quota_of(topic_uid, uid)
            reason: str | None = None
            from_us = 0
            if quota is not None and cursors is not None:
                reason, from_us = self._over(quota, topic_uid, uid, cursors)
            held = self._blocking.setdefault(topic_uid, set())
            if reason is not None:
                held.add(uid)
                self._set_block(topic_uid, OWNER_BLOCK_PREFIX + uid, reason, from_us)
            elif uid in held:
                held.discard(uid)
                self._set_block(topic_uid, OWNER_BLOCK_PREFIX + uid, None, 0)
            if not held:
                self._blocking.pop(topic_uid, None)

    def _over(
        self,
        quota: quotas.BacklogQuota,
        topic_uid: str,
        subscription_uid: str,
        cursors: Mapping[int, Cursor],
    ) -> tuple[str | None, int]:
        """Why the subscription blocks publishers, and from when (as the dispatcher does)."""
        now_us = self._now_us()
        backlog = unacked_backlog(self._logs, topic_uid, cursors, now_us)
        over = quotas.exceeded(quota, backlog)
        from_us = 0
        if over is None and quota.age_s and backlog.messages:
            oldest_us = now_us - int(backlog.oldest_age_s * 1_000_000)
            from_us = oldest_us + quota.age_s * 1_000_000
            over = f"oldest unacked message over {quota.age_s}s old ({quotas.AGE_LABEL})"
        if over is None:
            return None, 0
        return (
            f"backlog quota exceeded: subscription "
            f"{self.names.get(subscription_uid, subscription_uid)} has {over}; "
            "publishing is blocked until it catches up",
            from_us,
        )
