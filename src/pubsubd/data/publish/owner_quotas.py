"""A topic's backlog quota evaluated at the topic's owner (a cluster of forwarders).

The owner of a topic (its publishing forwarder, the ledger writer of its sources) holds every
subscription's ack journal over every source: acks from the subscribing forwarders reach it
within their ack flush interval (50 ms). So the whole backlog of a subscription, also of one
spread over several subscribing forwarders by source, is exact here, where each subscribing
forwarder only knows its own sources (and the others' as of its attach: too high).

Here the topic's ``block_publishers`` quota (``core/quotas.py``, from the topic's labels) is
evaluated for every subscription of the topic without a quota of its own (a subscription's own
quota is its dispatcher's: such a subscription is never spread, so its dispatcher sees it
whole), after every commit (before the publish is answered, as in the one-process server),
every ack recorded, every cursor reset and every attach. Its blocks are kept apart from those
the dispatchers send (``set_publish_block`` under ``owner:{subscription uid}``), so neither
clears the other's. The subscribing forwarders of a cluster leave the topic's
``block_publishers`` quota to the owner (``SubscribingForwarder.topic_quotas_at_owner``);
``evict_oldest`` stays with the dispatchers (acking is theirs).

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
    """The topics' block_publishers quotas, evaluated over their subscriptions' journals."""

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
        self.topic_quotas: dict[str, quotas.BacklogQuota] = {}  # block_publishers ones
        self.own_quota: set[str] = set()  # subscription uids with a quota of their own
        self.names: dict[str, str] = {}  # subscription uid -> name
        self._blocking: dict[str, set[str]] = {}  # topic uid -> subscriptions blocking it

    def set_topic_quota(self, topic_uid: str, quota: quotas.BacklogQuota | None) -> None:
        """The topic's quota (None, or an ``evict_oldest`` one: nothing to do here)."""
        if quota is not None and quota.policy is quotas.Policy.BLOCK_PUBLISHERS:
            self.topic_quotas[topic_uid] = quota
        else:
            self.topic_quotas.pop(topic_uid, None)
        self.evaluate(topic_uid)

    def set_subscription(
        self, topic_uid: str, subscription_uid: str, name: str, own_quota: bool
    ) -> None:
        """A subscription of the topic: its name (for the refusal) and whether it has a quota
        of its own (then its dispatcher's)."""
        self.names[subscription_uid] = name
        if own_quota:
            self.own_quota.add(subscription_uid)
        else:
            self.own_quota.discard(subscription_uid)
        self.evaluate(topic_uid, subscription_uid)

    def forget_subscription(self, topic_uid: str, subscription_uid: str) -> None:
        """The subscription was deleted or detached: it blocks nothing any more."""
        self.names.pop(subscription_uid, None)
        self.own_quota.add(subscription_uid)  # counted no more, until set again
        self.evaluate(topic_uid, subscription_uid)
        self.own_quota.discard(subscription_uid)

    def forget(self, topic_uid: str) -> None:
        """The topic went elsewhere or was dropped: its blocks went with it."""
        self.topic_quotas.pop(topic_uid, None)
        self._blocking.pop(topic_uid, None)

    def evaluate(self, topic_uid: str, subscription_uid: str | None = None) -> None:
        """Re-evaluate the topic's quota for one subscription, or for all of them."""
        quota = self.topic_quotas.get(topic_uid)
        blocking = self._blocking.get(topic_uid)
        if quota is None and not blocking:
            return
        journals = self._cursors(topic_uid)
        uids = list(journals) if subscription_uid is None else [subscription_uid]
        if subscription_uid is None and blocking:
            uids.extend(u for u in blocking if u not in journals)
        for uid in uids:
            cursors = journals.get(uid)
            reason: str | None = None
            from_us = 0
            if quota is not None and cursors is not None and uid not in self.own_quota:
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
