"""A process's entry in a cluster registry: an ephemeral znode that lives as long as the
process's ZooKeeper session. Storage nodes register at ``Layout.storage_node(node_id)`` (JSON
``{"node_id", "address", "zone", "disks", "healthy_disks", "free_bytes", "protocol_version",
"version"}``), forwarders at ``Layout.forwarder(id)`` (a ``ForwarderInfo`` proto).

Every ``interval_s`` the process checks its entry: it is created again when it is gone (the
session expired and a new one began) and its data is replaced when what it says changed
enough (``changed``: for a storage node, healthy disks, or free bytes by at least
``FREE_BYTES_STEP`` or 1 %, so a filling disk is seen by placement without a write per
append). An entry left by this process's previous incarnation (killed before its session
expired) is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pubsubd.coordination.errors import CoordinationError, NodeExists, NoNode
from pubsubd.coordination.zk import Coordinator, SessionState

log = logging.getLogger(__name__)

REFRESH_S = 3.0
FREE_BYTES_STEP = 64 << 20

T = TypeVar("T")


def storage_info_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether the registry should be told: anything but free bytes differs, or free bytes
    moved by at least FREE_BYTES_STEP or 1 %."""
    if old is None:
        return True
    if {k: v for k, v in old.items() if k != "free_bytes"} != {
        k: v for k, v in new.items() if k != "free_bytes"
    }:
        return True
    before, after = int(old.get("free_bytes", 0)), int(new.get("free_bytes", 0))
    return abs(after - before) >= min(FREE_BYTES_STEP, max(1, before // 100))


def as_json(info: dict[str, Any]) -> bytes:
    return json.dumps(info, sort_keys=True).encode()


class Registration(Generic[T]):
    """Keeps this process's registry entry at ``path`` current: ``info()`` says what it is,
    ``encode`` makes the znode's data, ``changed(published, now)`` whether to rewrite it.
    :meth:`start` registers once (raises if ZooKeeper cannot be reached), then a background
    task follows."""

    def __init__(
        self,
        coordinator: Coordinator,
        path: str,
        info: Callable[[], T],
        encode: Callable[[T], bytes],
        changed: Callable[[T | None, T], bool],
        *,
        interval_s: float = REFRESH_S,
    ) -> None:
        self._zk = coordinator
        self.path = path
        self._info = info
        self._encode = encode
        self._changed = changed
        self._interval_s = interval_s
        self._published: T | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._remove_listener: Callable[[], None] | None = None
        self.refreshes = 0

    async def start(self) -> None:
        await self._register()
        self._remove_listener = self._zk.on_state(self._state_changed)
        self._task = asyncio.create_task(self._follow(), name=f"registration {self.path}")

    async def stop(self) -> None:
        """Stop refreshing and remove the entry (the session's end would remove it too)."""
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(CoordinationError):
            await self._zk.delete(self.path)

    def halt(self) -> None:
        """Stop refreshing at once and leave the entry to the session's end, as a process
        that dies does (stand-ins in tests of what follows a death). Nothing is awaited: a
        refresh in flight is cancelled, not waited for."""
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _state_changed(self, state: SessionState) -> None:
        if state is SessionState.CONNECTED:
            self._wake.set()  # a new session may have lost the ephemeral znode: check now

    async def _register(self) -> None:
        info = self._info()
        data = self._encode(info)
        try:
            await self._zk.create(self.path, data, ephemeral=True)
        except NodeExists:
            stat = await self._zk.exists(self.path)
            if stat is not None and stat.ephemeral_owner != self._zk.session_id:
                # Left by this node's previous process, whose session has not expired yet.
                log.info("replacing the registry entry %s of an earlier session", self.path)
                with contextlib.suppress(NoNode):
                    await self._zk.delete(self.path)
                await self._zk.create(self.path, data, ephemeral=True)
            else:
                await self._zk.set(self.path, data)
        self._published = info
        log.info("registered in ZooKeeper at %s", self.path)

    async def refresh(self) -> None:
        """One check: re-create the entry if it is gone, update it if it changed."""
        stat = await self._zk.exists(self.path)
        if stat is None or stat.ephemeral_owner != self._zk.session_id:
            await self._register()
            self.refreshes += 1
            return
        info = self._info()
        if self._changed(self._published, info):
            await self._zk.set(self.path, self._encode(info))
            self._published = info
            self.refreshes += 1

    async def _follow(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):  # never swallows a cancellation
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.refresh()
            except CoordinationError as e:
                log.warning("registration %s: %s (retrying)", self.path, e)
            except Exception:
                log.exception("registration %s failed (retrying)", self.path)
