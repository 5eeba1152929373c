"""Calls released at one instant, each in its own thread: races between processes of a cluster
(two creates of one name, two compare-and-sets from one read), as two clients make them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def at_once(calls: Sequence[Callable[[], Any]], timeout: float = 60.0) -> list[Any]:
    """Run every call in its own thread, all released by one barrier; each outcome is what
    its call returned or the exception it raised (None: it did not finish in ``timeout``)."""
    start = threading.Barrier(len(calls))
    outcomes: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait(timeout=10)
        try:
            outcomes[i] = calls[i]()
        except Exception as e:  # the outcome the caller checks
            outcomes[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return outcomes
