"""How a pubsubd process runs: on uvloop, until SIGTERM or SIGINT, then stopped cleanly.

Shared by the processes' composition roots (``app.py`` for ``serve``, ``storagenode/main.py``
for ``storage``, ``router/main.py`` for ``router``).

The cyclic garbage collector runs less often than CPython's default (``GC_THRESHOLDS``): a
server allocates a few tracked objects per message (leases, tuples, protobuf wrappers), most
freed by reference counting, and with the default first threshold (700) it ran a young
collection every few hundred messages and a full one (every live object, the subscriptions'
lease and attempt tables, the logs' indexes) every few tens of thousands: a fifth of the
server's CPU in a Pulsar drain (BENCHMARKS.md, session PC2). Cycles are still collected; they
live a little longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

# gc.set_threshold: a young collection every 10,000 net allocations of tracked objects (CPython:
# 700); the older generations' ratios as CPython's.
GC_THRESHOLDS = (10_000, 10, 10)


async def until_signalled(name: str, stop: Callable[[], Awaitable[None]]) -> None:
    """Wait for SIGTERM or SIGINT, then await ``stop()``, logging both ends."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("%s stopping", name)
    await stop()
    log.info("%s stopped", name)


async def serve_until_signalled(
    name: str, start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]
) -> None:
    """``start()`` (stopping what it started if it fails), then :func:`until_signalled`."""
    try:
        await start()
    except BaseException:
        await stop()
        raise
    await until_signalled(name, stop)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main()`` to completion on uvloop (asyncio's own loop where uvloop is missing),
    with the collector's ``GC_THRESHOLDS``."""
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(main())
    else:
        uvloop.run(main())
