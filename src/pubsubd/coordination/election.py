"""One leader among processes, elected through ZooKeeper (the repair auditor, the router).

Every candidate creates an ephemeral sequential znode ``{parent}/candidate-N``; the lowest
leads, each other watches the one just before its own and looks again when it goes (no herd).
The leader acts only while its session is connected and is the one its candidate was made in:
a suspended connection pauses it before its next change (:meth:`Election.check` raises
:class:`LeadershipLost`), a lost session ends its turn (its candidate is gone with the
session) and it stands again. Closing deletes the candidate, so the next one takes over at once
instead of after the session timeout.

While leading, the election calls ``step()`` every ``interval_s`` seconds, or sooner after
:meth:`Election.poke` (something changed); ``step`` calls :meth:`Election.check` before each
change it makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from pubsubd.coordination.errors import CoordinationError
from pubsubd.coordination.zk import Coordinator, SessionState, WatchEvent

logger = logging.getLogger(__name__)

CANDIDATE_PREFIX = "candidate-"

__all__ = ["CANDIDATE_PREFIX", "Election", "LeadershipLost", "candidates"]


class LeadershipLost(Exception):
    """This process is no longer (certainly) the leader: stop changing anything."""


def _sequence(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def candidates(children: list[str]) -> list[str]:
    """The candidate znodes among ``children``, in election order (the leader first)."""
    return sorted((c for c in children if c.startswith(CANDIDATE_PREFIX)), key=_sequence)


class Election:
    """Stands for election under ``parent`` and runs ``step`` while leading."""

    def __init__(
        self,
        zk: Coordinator,
        parent: str,
        identity: bytes,
        step: Callable[[], Awaitable[None]],
        *,
        name: str,
        interval_s: float,
        on_leading: Callable[[bool], None] | None = None,
    ) -> None:
        self._zk = zk
        self._parent = parent
        self._identity = identity
        self._step = step
        self.name = name
        self.interval_s = interval_s
        self._on_leading = on_leading
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._poked: asyncio.Event | None = None
        self._remove_listener: Callable[[], None] | None = None
        self._candidate: str | None = None
        self._session: int | None = None
        self._leading = False
        self.role = "starting"  # starting, standby, leader, stopped

    @property
    def leading(self) -> bool:
        return self._leading

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._poked = asyncio.Event()
        self._remove_listener = self._zk.on_state(self._state_changed)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def close(self) -> None:
        if self._remove_listener is not None:
            self._remove_listener()
        if self._task is not None:
            # Cancelled again until it ends: on Python 3.11 a wait_for whose awaited event is
            # set as the cancellation arrives returns normally and the cancellation is lost,
            # and a leader would go on leading (seen as a router that never stopped).
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                self._task.result()
        self._set_leading(False)
        if self._candidate is not None and self._zk.connected:
            with contextlib.suppress(CoordinationError, TimeoutError):
                await self._zk.delete(self._candidate)  # the next one takes over at once
        self._candidate = None
        self.role = "stopped"

    def poke(self) -> None:
        """Something changed: the leader's next step comes now, not after the interval."""
        if self._poked is not None:
            self._poked.set()

    def check(self) -> None:
        """Raise :class:`LeadershipLost` unless this process certainly leads."""
        if not self._leading or not self._zk.connected or self._zk.session_id != self._session:
            raise LeadershipLost()

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            if self._on_leading is not None:
                self._on_leading(leading)

    def _state_changed(self, state: SessionState) -> None:
        if state is not SessionState.CONNECTED:
            self._set_leading(False)  # pause before the next change
        if self._wake is not None:
            self._wake.set()

    def _watch_fired(self, _event: WatchEvent) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                await self._stand()
            except asyncio.CancelledError:
                raise
            except (CoordinationError, TimeoutError) as e:
                logger.info("%s: election interrupted: %s", self.name, e)
            except Exception:
                logger.exception("%s: election failed", self.name)
            self._set_leading(False)
            self.role = "standby"
            await asyncio.sleep(1.0)

    async def _stand(self) -> None:
        """Stand once (one candidate znode, in one session) and lead when it is the lowest;
        returns when that session is gone."""
        await self._zk.wait_connected(within=max(30.0, 3 * self._zk.session_timeout))
        await self._zk.ensure_path(self._parent)
        session = self._zk.session_id
        path = self._candidate
        if path is None or self._session != session or await self._zk.exists(path) is None:
            # One candidate per session: a second one of ours would wait for the first.
            path = await self._zk.create(
                f"{self._parent}/{CANDIDATE_PREFIX}", self._identity, ephemeral=True, sequence=True
            )
        self._candidate, self._session = path, session
        mine = path.rsplit("/", 1)[1]
        self.role = "standby"
        assert self._wake is not None
        while self._zk.session_id == session:
            if not self._zk.connected:
                self._wake.clear()
                await self._wait(self._wake, 5.0)
                continue
            self._wake.clear()
            names = candidates(await self._zk.children(self._parent))
            if mine not in names:
                return  # the session that made it expired: stand again
            i = names.index(mine)
            if i == 0:
                await self._lead(session)
                continue
            previous = f"{self._parent}/{names[i - 1]}"
            if await self._zk.exists(previous, watch=self._watch_fired) is None:
                continue
            await self._wait(self._wake, 30.0)

    @staticmethod
    async def _wait(event: asyncio.Event, within: float) -> None:
        # asyncio.timeout, not wait_for: it never swallows a cancellation (see close()).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await event.wait()

    async def _lead(self, session: int | None) -> None:
        logger.info("%s: this process leads (%s)", self.name, self._candidate)
        self.role = "leader"
        assert self._wake is not None and self._poked is not None
        try:
            while self._zk.session_id == session:
                if not self._zk.connected:
                    self._wake.clear()
                    await self._wait(self._wake, 5.0)
                    continue
                self._set_leading(True)
                self._poked.clear()
                try:
                    await self._step()
                except LeadershipLost:
                    logger.info("%s: step stopped, ZooKeeper connection lost", self.name)
                except Exception:  # the step reports its own failures; never stop leading
                    logger.exception("%s: step failed", self.name)
                await self._wait(self._poked, self.interval_s)
        finally:
            self._set_leading(False)
            self.role = "standby"
