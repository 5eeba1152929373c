"""Updates (UpdateTopic, UpdateSubscription, ModifyPushConfig, UpdateSnapshot) read the
resource from this process's view of the metadata, apply the request's fields and write the
result only over the record they read (``expected=``). When another request wrote in between
(in this process or another of a cluster), the write is refused (``ConcurrentUpdate``);
:func:`retry_update` then waits until the view has every change completed before it and
applies the same request again over the newer resource, so two updates of different fields
at the same moment both take effect. Only when the resource keeps changing under it does the
caller get ABORTED (retriable)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from pubsubd.core.errors import ConcurrentUpdate

T = TypeVar("T")

UPDATE_ATTEMPTS = 5


async def retry_update(
    caught_up: Callable[[], Awaitable[None]],
    update: Callable[[], T],
    attempts: int = UPDATE_ATTEMPTS,
) -> T:
    """``update()`` on a view caught up with the store, again while it loses to a
    concurrent update, at most ``attempts`` times (the last ConcurrentUpdate is raised)."""
    for attempt in range(1, attempts + 1):
        await caught_up()
        try:
            return update()
        except ConcurrentUpdate:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")
