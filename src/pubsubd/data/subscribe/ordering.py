"""Per-ordering-key delivery order for subscriptions with message ordering enabled.

Pure: no I/O, no clock.

Rules (docs/GOOGLE_API.md §7.6; issue: "one outstanding batch per key"):
1. Messages of one key are handed out in log order. A key is *busy* while any message of it is
   outstanding (leased); while busy, newer messages of the key wait in the key's pending queue.
2. Several messages of a key may go out together in one response (one batch); the next batch
   of the key waits until every message of the previous one is acked.
3. A nack or expiry of a keyed message puts it and every later outstanding message of the key
   back at the front of the key's queue, in order (``fail`` returns them so the caller can end
   their leases); the key stays blocked until those are redelivered.
4. Those later messages *await redelivery* until they are handed out again: an ack that comes
   for one meanwhile carries the ack ID of the delivery the failure ended, and the caller drops
   it (``awaits_redelivery``), or the key's redelivery would skip a message after the failed one.
5. Messages without a key (and subscriptions without ordering) never come here.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class KeyOrdering:
    # key -> positions of the key currently outstanding, ascending
    _outstanding: dict[str, list[int]] = field(default_factory=dict)
    # key -> positions of the key waiting, ascending
    _pending: dict[str, deque[int]] = field(default_factory=dict)
    _key_of: dict[int, str] = field(default_factory=dict)
    # keys that are free and have pending messages, in the order they became so (created on
    # first use, together: one per subscription, most never see an ordering key)
    _ready: deque[str] | None = None
    _ready_set: set[str] | None = None
    # keys waiting out a retry backoff: not ready even when free (created on first use)
    _blocked: set[str] | None = None
    # positions put back because an earlier one of their key failed, until delivered again
    # (rule 4; created on first use)
    _awaiting: set[int] | None = None

    def tracks_positions(self) -> bool:
        """Whether any position has a key here (else ``acked`` has nothing to do)."""
        return bool(self._key_of) or bool(self._awaiting)

    def busy(self, key: str) -> bool:
        return key in self._outstanding or key in self._pending

    def has_pending(self, key: str) -> bool:
        return key in self._pending

    def head(self, key: str) -> int | None:
        """The position of the key's next message waiting to be delivered, if any."""
        pending = self._pending.get(key)
        return pending[0] if pending else None

    def outstanding(self, key: str) -> bool:
        return key in self._outstanding

    def block(self, key: str) -> None:
        """Keep the key from being ready (retry backoff) until ``unblock``."""
        if self._blocked is None:
            self._blocked = set()
        self._blocked.add(key)

    def unblock(self, key: str) -> None:
        if self._blocked is not None:
            self._blocked.discard(key)
        if key not in self._outstanding:
            self._mark_ready(key)

    def key_of(self, pos: int) -> str | None:
        return self._key_of.get(pos)

    def awaits_redelivery(self, pos: int) -> bool:
        """Whether ``pos`` waits to be delivered again behind an earlier failed message of its
        key (rule 4): no ack ID of it is live until then."""
        return self._awaiting is not None and pos in self._awaiting

    def awaits_any(self) -> bool:
        """Whether any position awaits redelivery (rule 4)."""
        return bool(self._awaiting)

    def delivered(self, key: str, pos: int) -> None:
        """``pos`` of ``key`` was handed out (call in log order within a batch)."""
        self._key_of[pos] = key
        if self._awaiting is not None:
            self._awaiting.discard(pos)
        bisect.insort(self._outstanding.setdefault(key, []), pos)

    def hold(self, key: str, pos: int) -> None:
        """A newly read message of a busy key (or of another consumer's key) waits its turn."""
        self._key_of[pos] = key
        self._pending.setdefault(key, deque()).append(pos)
        if key not in self._outstanding:
            self._mark_ready(key)

    def acked(self, pos: int) -> None:
        if self._awaiting is not None:
            self._awaiting.discard(pos)
        key = self._key_of.pop(pos, None)
        if key is None:
            return
        out = self._outstanding.get(key)
        if out is not None:
            i = bisect.bisect_left(out, pos)
            if i < len(out) and out[i] == pos:
                del out[i]
            if not out:
                del self._outstanding[key]
                self._mark_ready(key)
        pending = self._pending.get(key)
        if pending is not None and pos in pending:
            pending.remove(pos)
            if not pending:
                del self._pending[key]

    def fail(self, pos: int) -> list[int]:
        """``pos`` was nacked or expired: return it and every later outstanding position of its
        key (their leases must end); all of them wait at the front of the key's queue."""
        key = self._key_of.get(pos)
        if key is None:
            return [pos]
        out = self._outstanding.get(key, [])
        i = bisect.bisect_left(out, pos)
        back = out[i:]
        if pos not in back:
            back = [pos, *back]
        del out[i:]
        if not out:
            self._outstanding.pop(key, None)
        if len(back) > 1:
            if self._awaiting is None:
                self._awaiting = set()
            self._awaiting.update(p for p in back if p != pos)
        pending = self._pending.setdefault(key, deque())
        for p in reversed(back):
            if p not in pending:
                pending.appendleft(p)
        if key not in self._outstanding:
            self._mark_ready(key)
        return back

    def _is_blocked(self, key: str) -> bool:
        return self._blocked is not None and key in self._blocked

    def _mark_ready(self, key: str) -> None:
        if key not in self._pending or self._is_blocked(key):
            return
        if self._ready is None or self._ready_set is None:
            self._ready = deque()
            self._ready_set = set()
        if key not in self._ready_set:
            self._ready.append(key)
            self._ready_set.add(key)

    def take_ready(
        self, limit: int, accept: Callable[[str], bool] | None = None
    ) -> list[tuple[str, list[int]]]:
        """Whole pending queues of free keys, up to ``limit`` positions in all, oldest key first.
        The caller delivers them (``delivered``) or gives them back (``hold`` at the front is
        done by calling ``give_back``)."""
        out: list[tuple[str, list[int]]] = []
        ready, ready_set = self._ready, self._ready_set
        if ready is None or ready_set is None:
            return out
        skipped: list[str] = []
        n = 0
        while ready and n < limit:
            key = ready.popleft()
            ready_set.discard(key)
            if key in self._outstanding or self._is_blocked(key):
                continue
            if accept is not None and not accept(key):
                skipped.append(key)  # another consumer's key: stays ready for it
                continue
            pending = self._pending.pop(key, None)
            if not pending:
                continue
            batch = []
            while pending and n < limit:
                batch.append(pending.popleft())
                n += 1
            if pending:  # the rest waits for this batch to be acked
                self._pending[key] = pending
            out.append((key, batch))
        for key in reversed(skipped):
            ready.appendleft(key)
            ready_set.add(key)
        return out

    def give_back(self, key: str, positions: list[int]) -> None:
        """Positions taken with ``take_ready`` that could not be delivered now."""
        pending = self._pending.setdefault(key, deque())
        for p in reversed(positions):
            pending.appendleft(p)
        if key not in self._outstanding:
            self._mark_ready(key)

    def forget(self, pos: int) -> None:
        """Drop a position entirely (dead-lettered or acked by a filter)."""
        self.acked(pos)

    def clear(self) -> None:
        self._outstanding.clear()
        self._pending.clear()
        self._key_of.clear()
        self._ready = None
        self._ready_set = None
        self._blocked = None
        self._awaiting = None
