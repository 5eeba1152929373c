"""The catch-up a forwarder makes before serving a subscription it gains (data/ownership.py
``_Rounds``): every caller waits for a round of the work that starts after its call, and
callers that come together share rounds (a ZooKeeper sync per round, not per subscription)."""

from __future__ import annotations

import asyncio

import pytest

from pubsubd.data.ownership import _Rounds

pytestmark = pytest.mark.unit


def test_callers_at_once_share_a_round_and_a_later_caller_gets_a_round_of_its_own() -> None:
    async def scenario() -> None:
        started: list[int] = []
        release = asyncio.Event()

        async def work() -> None:
            started.append(len(started))
            await release.wait()

        rounds = _Rounds(work)
        first = [asyncio.create_task(rounds()) for _ in range(50)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert started == [0]  # one round for the fifty
        # Called while that round runs: it may have read the store before this call, so
        # these wait for the next round, which starts once the first ends.
        later = [asyncio.create_task(rounds()) for _ in range(50)]
        await asyncio.sleep(0)
        assert started == [0] and not any(t.done() for t in first + later)
        release.set()
        await asyncio.gather(*first)
        await asyncio.gather(*later)
        assert started == [0, 1]
        await rounds()  # nothing running: a round of its own
        assert started == [0, 1, 2]

    asyncio.run(scenario())


def test_a_failed_round_fails_its_callers_and_the_next_round_runs() -> None:
    async def scenario() -> None:
        calls = 0

        async def work() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("no answer")

        rounds = _Rounds(work)
        with pytest.raises(RuntimeError):
            await rounds()
        await rounds()
        assert calls == 2

    asyncio.run(scenario())
