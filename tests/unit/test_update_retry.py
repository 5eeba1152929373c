"""retry_update (control/update_retry.py): an update that lost to a concurrent one is applied
again on a caught-up view; one that keeps losing ends in ABORTED; other errors pass at once."""

from __future__ import annotations

import pytest

from pubsubd.control.update_retry import retry_update
from pubsubd.core.errors import Aborted, ConcurrentUpdate, NotFound

pytestmark = pytest.mark.unit


class View:
    def __init__(self, conflicts: int, error: Exception | None = None) -> None:
        self.conflicts = conflicts
        self.error = error
        self.catch_ups = 0
        self.updates = 0

    async def caught_up(self) -> None:
        self.catch_ups += 1

    def update(self) -> str:
        self.updates += 1
        assert self.catch_ups == self.updates  # every attempt on a view caught up first
        if self.error is not None:
            raise self.error
        if self.conflicts:
            self.conflicts -= 1
            raise ConcurrentUpdate("topic", "projects/p/topics/t")
        return "updated"


async def test_an_update_that_lost_is_applied_again_over_the_newer_resource() -> None:
    view = View(conflicts=2)
    assert await retry_update(view.caught_up, view.update) == "updated"
    assert view.updates == 3


async def test_an_update_that_keeps_losing_is_aborted_after_its_attempts() -> None:
    view = View(conflicts=100)
    with pytest.raises(Aborted, match="changed by another request"):
        await retry_update(view.caught_up, view.update, attempts=4)
    assert view.updates == 4


async def test_other_errors_are_not_retried() -> None:
    view = View(conflicts=0, error=NotFound("topic", "projects/p/topics/t"))
    with pytest.raises(NotFound):
        await retry_update(view.caught_up, view.update)
    assert view.updates == 1
