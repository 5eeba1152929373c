"""Exceptions of background work: caught, counted, and logged once per kind.

Delivery pumps, lease timers, flush and trim loops run with nobody awaiting them: an exception
there would vanish (a callback's is logged by asyncio once per call, a task's only when it is
garbage collected) and could leave a stream waiting forever. Every such place reports here: the
first failure of each (task, exception type) is logged with its traceback, later ones only at
powers of ten, and all are counted in ``pubsubd_background_errors_total{task}``. The caller
then makes sure no consumer is left without an answer (the dispatcher ends its streams).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import ParamSpec

from pubsubd.observability import metrics

log = logging.getLogger(__name__)

P = ParamSpec("P")

_seen: dict[tuple[str, str], int] = {}


def report(task: str, exc: BaseException) -> None:
    """Count and (the first time, then at 10, 100, ...) log a failure of background ``task``."""
    metrics.BACKGROUND_ERRORS.labels(task=task).inc()
    key = (task, type(exc).__name__)
    n = _seen.get(key, 0) + 1
    _seen[key] = n
    if n == 1:
        log.error(
            "background %s failed (later %s failures are counted in "
            "pubsubd_background_errors_total, and logged at 10, 100, ...)",
            task,
            type(exc).__name__,
            exc_info=exc,
        )
    elif is_power_of_ten(n):
        log.error("background %s has failed %d times with %s: %s", task, n, key[1], exc)


def failures(task: str) -> int:
    """Failures of ``task`` reported so far (every exception type)."""
    return sum(n for (t, _), n in _seen.items() if t == task)


def guarded(task: str, fn: Callable[P, None]) -> Callable[P, None]:
    """``fn`` for ``loop.call_soon``/``call_later``: exceptions are reported, not raised."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            report(task, exc)

    return run


async def every(
    task: str, interval_s: float, step: Callable[[], Awaitable[object] | object]
) -> None:
    """Run ``step`` every ``interval_s`` until cancelled; a failing step is reported (and the
    next one runs as planned), so one bad pass never ends the loop."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            result = step()
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            report(task, exc)


def is_power_of_ten(n: int) -> bool:
    """1, 10, 100, ...: when a repeated failure is logged again."""
    while n % 10 == 0:
        n //= 10
    return n == 1
