"""The leading router's watch on the forwarders: a killed forwarder leaves the routing table
within about a second, not when its ZooKeeper session expires (10 s by default).

Every ``interval_s`` the leader asks each registered forwarder's address who serves there
(``api/grpc/liveness.py``). A forwarder found dead ``strikes`` times in a row (connection
refused, or another ZooKeeper session answering at its address: ``core/liveness.py``) has its
registration znode deleted, that version only, so the next pass moves its units; the new owners
take its sources over by the same rule (``storage/ledgers/directory.py``). A timeout proves
nothing and changes nothing: the session's expiry still removes a forwarder whose machine is
gone. A live forwarder removed by mistake registers again within its refresh (3 s), and its
ledgers are fenced by whoever took them over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from pubsubd.control.routing_store import RoutingStore
from pubsubd.coordination.errors import BadVersion, CoordinationError, NoNode
from pubsubd.coordination.zk import Coordinator
from pubsubd.core.liveness import Liveness, Suspicion

log = logging.getLogger(__name__)

DECLARED_DEAD = Counter(
    "pubsubd_router_forwarders_declared_dead_total",
    "Forwarders whose registration the router deleted because their process was gone",
)

Probe = Callable[[str, int], Awaitable[tuple[Liveness, str]]]

INTERVAL_S = 0.5
STRIKES = 2


class ForwarderWatch:
    """Runs while ``leading()``; ``on_dead`` is called after a registration is deleted."""

    def __init__(
        self,
        zk: Coordinator,
        store: RoutingStore,
        probe: Probe,
        leading: Callable[[], bool],
        on_dead: Callable[[], None],
        *,
        interval_s: float = INTERVAL_S,
        strikes: int = STRIKES,
    ) -> None:
        self._zk = zk
        self._store = store
        self._probe = probe
        self._leading = leading
        self._on_dead = on_dead
        self._interval_s = interval_s
        self._suspicion = Suspicion(strikes)
        self._task: asyncio.Task[None] | None = None
        self.declared_dead: list[str] = []

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="forwarder watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            if not self._leading():
                continue
            try:
                await self.check_once()
            except CoordinationError as e:
                log.debug("forwarder watch: %s", e)
            except Exception:
                log.exception("forwarder watch failed (going on)")

    async def check_once(self) -> list[str]:
        """Probe every registered forwarder once; returns the IDs declared dead."""
        entries = await self._store.forwarder_entries()
        self._suspicion.keep_only({f.forwarder_id for f, _, _ in entries})
        verdicts = await asyncio.gather(
            *(self._probe(f.address, stat.ephemeral_owner) for f, _, stat in entries)
        )
        dead = []
        for (forwarder, path, stat), (verdict, why) in zip(entries, verdicts, strict=True):
            if not self._suspicion.observe(forwarder.forwarder_id, verdict):
                continue
            try:
                await self._zk.delete(path, stat.version)
            except (NoNode, BadVersion):
                continue  # it went or registered again meanwhile
            DECLARED_DEAD.inc()
            dead.append(forwarder.forwarder_id)
            log.warning(
                "router: forwarder %s is gone (%s); its registration is removed",
                forwarder.forwarder_id,
                why,
            )
        if dead:
            self.declared_dead.extend(dead)
            self._on_dead()
        return dead
