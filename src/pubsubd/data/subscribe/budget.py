"""The process-wide bound on outstanding deliveries (pure): messages delivered and not yet
acked, nacked or expired, and their bytes, summed over every subscription a subscribing
forwarder serves.

Each subscription's own caps (its consumers' flow control, ``pubsubd-max-outstanding-*``
labels) bound one subscription; this bounds them all, so a thousand subscriptions with slow
consumers cannot hold a lease table each without limit (a lease costs ~340 bytes, besides the
responses still being written). At the bound, planners deliver nothing more (streams stay open,
paused, as under their own flow control) until acks, nacks or expiries free room; then every
subscription that found the budget full is woken.

A planner charges what it delivers during a plan (``taken``), and its dispatcher reports the
subscription's actual outstanding messages and bytes after every change (``settle``), which
corrects for what ended meanwhile. The bound is approximate by at most one batch per plan: a
plan may cross it by one message, as a byte cap is crossed by the message that reaches it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

DEFAULT_MAX_MESSAGES = 500_000
DEFAULT_MAX_BYTES = 512 << 20


class DeliveryBudget:
    """Outstanding deliveries of every subscription of one subscribing forwarder."""

    __slots__ = (
        "_shares",
        "_waiting",
        "bytes",
        "max_bytes",
        "max_messages",
        "messages",
        "paused",
        "peak_bytes",
        "peak_messages",
    )

    def __init__(
        self, max_messages: int = DEFAULT_MAX_MESSAGES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError(
                f"the outstanding delivery bounds must be positive, got {max_messages} "
                f"messages and {max_bytes} bytes"
            )
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.messages = 0
        self.bytes = 0
        self.peak_messages = 0
        self.peak_bytes = 0
        self.paused = 0  # plans that stopped at the bound
        self._shares: dict[Hashable, tuple[int, int]] = {}
        self._waiting: dict[Hashable, Callable[[], None]] = {}

    @property
    def full(self) -> bool:
        return self.messages >= self.max_messages or self.bytes >= self.max_bytes

    def room(self) -> tuple[int, int]:
        """Messages and bytes that may still be delivered (0, 0 at the bound)."""
        if self.full:
            return 0, 0
        return self.max_messages - self.messages, self.max_bytes - self.bytes

    def taken(self, holder: Hashable, messages: int, size: int) -> None:
        """``holder`` just delivered ``messages`` of ``size`` bytes."""
        held, held_bytes = self._shares.get(holder, (0, 0))
        self._set(holder, held + messages, held_bytes + size)

    def settle(self, holder: Hashable, messages: int, size: int) -> None:
        """``holder`` has ``messages`` of ``size`` bytes outstanding now; wakes the waiting
        subscriptions if that made room."""
        was_full = self.full
        self._set(holder, messages, size)
        if was_full and not self.full and self._waiting:
            self._wake()

    def wait(self, holder: Hashable, wake: Callable[[], None]) -> None:
        """``holder`` stopped at the bound: call ``wake`` once there is room again."""
        self.paused += 1
        self._waiting[holder] = wake
        if not self.full:
            self._wake()

    def leave(self, holder: Hashable) -> None:
        """``holder`` is gone (its subscription closed): its share is free."""
        self._waiting.pop(holder, None)
        self.settle(holder, 0, 0)
        self._shares.pop(holder, None)

    def _set(self, holder: Hashable, messages: int, size: int) -> None:
        held, held_bytes = self._shares.get(holder, (0, 0))
        if messages or size:
            self._shares[holder] = (messages, size)
        else:  # nothing outstanding: keep no reference to an idle (or closed) subscription
            self._shares.pop(holder, None)
        self.messages += messages - held
        self.bytes += size - held_bytes
        self.peak_messages = max(self.peak_messages, self.messages)
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for wake in waiting.values():
            wake()

    def status(self) -> dict[str, int]:
        return {
            "max_messages": self.max_messages,
            "max_bytes": self.max_bytes,
            "messages": self.messages,
            "bytes": self.bytes,
            "peak_messages": self.peak_messages,
            "peak_bytes": self.peak_bytes,
            "paused": self.paused,
        }
