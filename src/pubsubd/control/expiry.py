"""Background upkeep: expiration_policy, snapshot expiry, message retention.

* **expiration_policy** (docs/GOOGLE_API.md §4, §7.10): a subscription with no activity for its
  ``ttl`` is deleted. Unset policy: 31 days; a policy with no ttl: never. Activity is any use
  of the subscription by name (Pull, StreamingPull open, Acknowledge, ModifyAckDeadline, admin
  calls, Seek, CreateSnapshot: ``Catalog.subscription`` records it) and any open consumer
  (a stream or a waiting Pull) at check time. The clock restarts when the server starts.
* **Snapshots** past their ``expire_time`` are deleted (their pins go with them).
* **Retention**: unacked messages older than a subscription's ``message_retention_duration``
  leave its backlog; the time-based pins of topic retention and ``retain_acked_messages`` move
  forward (every ``PIN_REFRESH_S``).

``PUBSUBD_EXPIRY_CHECK_S`` sets how often expiry is checked (default 60 s).
``PUBSUBD_TEST_TTL_DIVISOR`` is for tests only: every expiration-policy ttl is divided by it
(86400 turns the 1-day minimum into 1 s). Never set it in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from pubsubd.control.catalog import Catalog
from pubsubd.control.router import Routes
from pubsubd.control.snapshots import Snapshots
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.core.errors import DiskFull
from pubsubd.core.validation import duration_s
from pubsubd.observability import background

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 31 * 24 * 3600.0  # expiration_policy unset
DEFAULT_CHECK_INTERVAL_S = 60.0
PIN_REFRESH_S = 2.0  # as often as the trim loop runs


def effective_ttl_s(subscription: Any) -> float | None:
    """The inactivity after which a subscription expires; None: never."""
    if not subscription.HasField("expiration_policy"):
        return DEFAULT_TTL_S
    policy = subscription.expiration_policy
    if not policy.HasField("ttl"):
        return None
    ttl = duration_s(policy.ttl)
    return ttl if ttl > 0 else None


def is_expired(ttl_s: float | None, last_active: float, now: float, in_use: bool) -> bool:
    """Whether a subscription idle since ``last_active`` (same clock as ``now``) has expired."""
    if ttl_s is None or in_use:
        return False
    return now - last_active >= ttl_s


class Maintenance:
    """Runs the periodic checks above on the event loop."""

    def __init__(
        self,
        catalog: Catalog,
        snapshots: Snapshots,
        routes: Routes,
        *,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        ttl_divisor: float = 1.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.catalog = catalog
        self.snapshots = snapshots
        self.routes = routes
        self.check_interval_s = check_interval_s
        self.ttl_divisor = ttl_divisor if ttl_divisor > 0 else 1.0
        self.clock = clock
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._loop(self.check_interval_s, self.check), name="expiry"),
            asyncio.create_task(self._loop(PIN_REFRESH_S, self._refresh), name="retention_pins"),
        ]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def _loop(self, interval: float, step: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                result = step()
                if asyncio.iscoroutine(result):
                    await result
            except DiskFull:
                pass  # counted and logged once per episode (storage/disk_space.py)
            except Exception as e:
                background.report(f"maintenance {getattr(step, '__name__', step)}", e)

    def _refresh(self) -> None:
        self.snapshots.refresh_pins(stored_only=True)

    async def check(self) -> list[str]:
        """One pass: expired snapshots, old unacked messages, expired subscriptions (returned)."""
        snapshots = self.snapshots
        snapshots.delete_expired(self.clock.time_us())
        snapshots.expire_unacked()
        expired = self.expired_subscriptions()
        for name in expired:
            if name not in self.catalog.subscriptions:
                continue
            log.info("subscription %s expired (expiration_policy)", name)
            try:
                await self.catalog.delete_subscription(name)
            except DiskFull:
                pass  # counted and logged once per episode; retried at the next check
            except Exception:
                log.exception("deleting expired subscription %s failed", name)
        return expired

    def expired_subscriptions(self) -> list[str]:
        now = self.clock.monotonic()
        activity = self.catalog.activity
        out = []
        for name, entry in self.catalog.subscriptions.items():
            ttl = effective_ttl_s(entry.subscription)
            if ttl is None or not self.routes.serves_subscription(entry.record.uid):
                continue  # never expires, or another forwarder's to judge
            in_use = self.routes.subscribing(entry.record.uid).in_use(name)
            if in_use:
                activity[name] = now
            last = activity.setdefault(name, now)  # first seen: the clock starts now
            if is_expired(ttl / self.ttl_divisor, last, now, in_use):
                out.append(name)
        return out
