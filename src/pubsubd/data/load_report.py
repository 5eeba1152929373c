"""A forwarder's load report (issue 11): every few seconds, the load of each topic it owns,
written where the leading router reads it (``routing/loads/<forwarder id>``,
``control/routing_store.py``), so the router weighs topics by what they cost (``core/load.py``).

A topic's counters are read from the forwarders in this process: messages and bytes published
(``PublishingForwarder.published``), messages delivered and leases held by its subscriptions'
dispatchers (those served here). ``pubsubd serve --cluster``, which owns every topic, reports
the same way (the topics published to since it started). Every subscription served here is
also reported on its own, by its uid: messages delivered and leases held, so the router weighs
it among the subscribing forwarders (publishing and subscribing forwarders apart) and, summed
over the forwarders that serve it, decides whether it is busy enough to spread
(``core/subscription_spread.py``; a release before this one reported only those served on a
copy). The rates are EWMAs
(``core.load.Rates``); idle topics and subscriptions are left out (they weigh 1). Their
half-life is the leading router's (``pubsubd router --load-half-life``, published in its
summary and read before each report; ``core.load.HALF_LIFE_S`` while none says).

Each report also carries this forwarder's share of the backlog of every subscription served
here that has one or is spread (``SubscriptionDispatcher.backlog_share``), so one place can show
a spread subscription whole (``core/backlog_view.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from pubsubd.coordination.errors import CoordinationError
from pubsubd.core.backlog_view import BacklogShare, bounded
from pubsubd.core.load import Counters, Load, Rates, chosen_half_life
from pubsubd.observability import background

log = logging.getLogger(__name__)

__all__ = ["REPORT_INTERVAL_S", "LoadReporter"]

REPORT_INTERVAL_S = 5.0
# The busiest topics a report lists at most (a report stays well within a ZooKeeper znode).
MAX_TOPICS = 20_000

# (topic loads, when, subscription loads, backlog shares and how many were left out)
Write = Callable[
    [Mapping[str, Load], float, Mapping[str, Load], tuple[Mapping[str, BacklogShare], int]],
    Awaitable[None],
]
SUBSCRIPTION = "s:"  # the Rates key of a subscription reported on its own


class LoadReporter:
    """Samples this forwarder's topics and writes their loads every ``interval_s``."""

    def __init__(
        self,
        *,
        owned: Collection[str],
        published: Mapping[str, list[int]],
        dispatchers: Callable[[], Mapping[str, Any]],
        write: Write,
        interval_s: float = REPORT_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        shares: Callable[[], Mapping[str, BacklogShare]] = dict,
        half_life: Callable[[], Awaitable[float | None]] | None = None,
    ) -> None:
        """``owned``: the topic uids served here (a live view, read at each sample);
        ``published``: uid -> [messages, bytes]; ``dispatchers()``: the subscription
        dispatchers (``topic_uid``, ``delivered``, ``leases``); ``shares()``: the backlog
        shares of the subscriptions served here, by uid; ``half_life()``: the half-life the
        leading router asks for (None or 0: none said)."""
        self.owned = owned
        self.published = published
        self.dispatchers = dispatchers
        self.write = write
        self.interval_s = interval_s
        self.monotonic = monotonic
        self.wall = wall
        self.shares = shares
        self.half_life = half_life
        self.rates = Rates()
        self.reported: tuple[dict[str, Load], dict[str, BacklogShare]] = ({}, {})
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            background.every("load report", self.interval_s, self.report), name="load report"
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def counters(self) -> dict[str, Counters]:
        """Each owned topic's counters now (its subscriptions served here included), and (keyed
        ``s:{uid}``) those of each subscription served here."""
        delivered: dict[str, int] = {}
        outstanding: dict[str, int] = {}
        out = {}
        for dispatcher in self.dispatchers().values():
            uid = dispatcher.topic_uid
            out[SUBSCRIPTION + dispatcher.uid] = Counters(
                dispatcher.delivered, 0, len(dispatcher.leases)
            )
            if uid not in self.owned:
                continue
            delivered[uid] = delivered.get(uid, 0) + dispatcher.delivered
            outstanding[uid] = outstanding.get(uid, 0) + len(dispatcher.leases)
        for uid in self.owned:
            messages, size = self.published.get(uid, (0, 0))
            out[uid] = Counters(messages + delivered.get(uid, 0), size, outstanding.get(uid, 0))
        return out

    async def _follow_half_life(self) -> None:
        """The leading router's half-life, from the next sample on (kept if unreadable)."""
        if self.half_life is None:
            return
        try:
            asked = await self.half_life()
        except CoordinationError as e:
            log.debug("load report: the router's half-life unread (%s); kept", e)
            return
        self.rates.half_life_s = chosen_half_life(asked)

    async def report(self) -> None:
        await self._follow_half_life()
        self.rates.sample(self.monotonic(), self.counters())
        busy = {uid: load for uid, load in self.rates.loads().items() if not load.idle}
        if len(busy) > MAX_TOPICS:
            heaviest = sorted(busy, key=lambda u: busy[u].messages_per_s, reverse=True)
            busy = {uid: busy[uid] for uid in heaviest[:MAX_TOPICS]}
        shares, left_out = bounded(self.shares())
        if not busy and not shares and not any(self.reported):
            return  # nothing to say, and nothing said before
        topics = {k: v for k, v in busy.items() if not k.startswith(SUBSCRIPTION)}
        subscriptions = {
            k[len(SUBSCRIPTION) :]: v for k, v in busy.items() if k.startswith(SUBSCRIPTION)
        }
        await self.write(topics, self.wall(), subscriptions, (shares, left_out))
        self.reported = (busy, shares)
