"""One contract for the ledger directory (storage/ledgers/writer.py ``LedgerDirectory``), run
against the in-memory twin the writer's unit tests use (tests/support/ledger_fakes.py) and the
ZooKeeper implementation (storage/ledgers/directory.py): ledger lists change only by
compare-and-set, ledger IDs never repeat, ownership is exclusive with growing epochs and ends
with the owner's session, removing a source forgets its list."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pubsubd.api.grpc import liveness
from pubsubd.coordination.ensemble import Ensemble
from pubsubd.coordination.liveness import OwnerCheck, start_time, this_process
from pubsubd.coordination.zk import Coordinator
from pubsubd.core.liveness import ProcessIdentity
from pubsubd.storage.errors import ListConflict, LostOwnership
from pubsubd.storage.ledgers.directory import ZooKeeperLedgerDirectory
from pubsubd.storage.ledgers.meta import LedgerList, LedgerMeta
from tests.support.ledger_fakes import DirectoryState, FakeDirectory

pytest_plugins = ["tests.support.zookeeper"]


@dataclass
class Sessions:
    """Two processes' views of one directory, and a way to end the first one's session."""

    first: Any
    second: Any
    end_first: Callable[[], Any]


@pytest.fixture(params=["memory", "zookeeper"])
async def sessions(request: pytest.FixtureRequest, zk_root: str) -> AsyncIterator[Sessions]:
    if request.param == "memory":
        state = DirectoryState()
        first, second = FakeDirectory(state, "a"), FakeDirectory(state, "b")

        async def expire() -> None:
            first.expire()

        yield Sessions(first, second, expire)
        return
    ensemble: Ensemble = request.getfixturevalue("zookeeper")
    coordinators = [
        Coordinator(ensemble.connect_string, zk_root, session_timeout=4.0) for _ in range(2)
    ]
    for c in coordinators:
        await c.start()
    directories = [ZooKeeperLedgerDirectory(c) for c in coordinators]
    for d in directories:
        await d.start()

    async def close_first() -> None:
        await directories[0].close()
        await coordinators[0].stop()  # the session ends: its ephemeral znodes go

    try:
        yield Sessions(directories[0], directories[1], close_first)
    finally:
        for d in directories:
            await d.close()
        for c in coordinators:
            await c.stop()


def _ledger(ledger_id: int, first: int) -> LedgerMeta:
    return LedgerMeta(ledger_id, first, ("n1", "n2", "n3"), 2)


async def test_a_new_source_has_an_empty_list(sessions: Sessions) -> None:
    listed = await sessions.first.read("t1", 0)
    assert listed.ledgers == () and listed.end_offset == 0


async def test_lists_change_only_by_compare_and_set(sessions: Sessions) -> None:
    empty = await sessions.first.read("t1", 0)
    written = await sessions.first.write("t1", 0, empty.appended(_ledger(1, 0)))
    assert (await sessions.second.read("t1", 0)).ledgers == written.ledgers
    with pytest.raises(ListConflict):  # written from a stale version
        await sessions.second.write("t1", 0, empty.appended(_ledger(2, 0)))
    closed = written.replaced_last(written.ledgers[0].closed(10))
    again = await sessions.second.write("t1", 0, closed)
    with pytest.raises(ListConflict):
        await sessions.first.write("t1", 0, closed)  # same content, stale version
    assert again.version > written.version
    assert (await sessions.first.read("t1", 0)) == again


async def test_ledger_ids_never_repeat(sessions: Sessions) -> None:
    ids = [await sessions.first.new_ledger_id() for _ in range(5)]
    ids += [await sessions.second.new_ledger_id() for _ in range(5)]
    assert len(set(ids)) == 10 and ids[:5] == sorted(ids[:5])


async def test_ownership_is_exclusive_and_ends_with_the_session(sessions: Sessions) -> None:
    epoch = await sessions.first.acquire("t1", 0)
    assert await sessions.first.acquire("t1", 0) == epoch  # its own: the same epoch
    # Another process waits for the owner's session to end (bounded), then takes over with a
    # higher epoch, the fence the storage nodes enforce.
    await sessions.end_first()
    taken = await sessions.second.acquire("t1", 0)
    assert taken > epoch
    assert await sessions.second.acquire("t1", 1) > taken  # another source, a newer epoch


async def test_a_released_source_can_be_taken_at_once(sessions: Sessions) -> None:
    epoch = await sessions.first.acquire("t2", 0)
    await sessions.first.release("t2", 0)
    assert await sessions.second.acquire("t2", 0) > epoch


async def test_removing_a_source_forgets_its_list(sessions: Sessions) -> None:
    empty = await sessions.first.read("t3", 0)
    await sessions.first.write("t3", 0, empty.appended(_ledger(7, 0)))
    await sessions.first.remove("t3", 0)
    assert (await sessions.second.read("t3", 0)) == LedgerList()


async def test_zookeeper_waits_for_a_live_owner_then_refuses(
    zookeeper: Ensemble, zk_root: str
) -> None:
    """A second process does not take a source whose owner is alive: after waiting out a
    session timeout it answers LostOwnership naming the owner."""
    coordinators = [
        Coordinator(zookeeper.connect_string, zk_root, session_timeout=1.0) for _ in range(2)
    ]
    for c in coordinators:
        await c.start()
    try:
        first, second = (ZooKeeperLedgerDirectory(c) for c in coordinators)
        await first.acquire("t4", 0)
        with pytest.raises(LostOwnership) as refused:
            await second.acquire("t4", 0)
        assert json.loads(first.identity)["pid"] > 0 and "owned by" in str(refused.value)
    finally:
        for c in coordinators:
            await c.stop()


@pytest.fixture
async def two_sessions(zookeeper: Ensemble, zk_root: str) -> AsyncIterator[list[Coordinator]]:
    """Two live sessions with a 30 s timeout: anything taken over within seconds was not
    waited out."""
    coordinators = [
        Coordinator(zookeeper.connect_string, zk_root, session_timeout=30.0) for _ in range(2)
    ]
    for c in coordinators:
        await c.start()
    try:
        yield coordinators
    finally:
        for c in coordinators:
            await c.stop()


async def test_an_owner_whose_process_is_gone_is_taken_over_at_once(
    two_sessions: list[Coordinator],
) -> None:
    """The owner znode names a process of this machine that then exits while its session
    lives on (as after a kill -9): the next owner deletes it and takes over, with a higher
    epoch, without waiting 30 s for the session to expire. While the process runs, it waits."""
    child = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        started = start_time(child.pid)
        assert started is not None
        owner = dataclasses.replace(this_process(), pid=child.pid, started=started)
        first = ZooKeeperLedgerDirectory(two_sessions[0], OwnerCheck(owner))
        second = ZooKeeperLedgerDirectory(two_sessions[1])
        epoch = await first.acquire("t5", 0)
        with pytest.raises(TimeoutError):  # the owner's process runs: wait for it
            await asyncio.wait_for(second.acquire("t5", 0), 1.5)
        assert second.taken_from_dead == 0
    finally:
        child.kill()
        await child.wait()
    taken = await asyncio.wait_for(second.acquire("t5", 0), 5.0)
    assert taken > epoch and second.taken_from_dead == 1
    assert not two_sessions[0].session_lost  # its session still lives: not waited out


async def test_an_owner_elsewhere_is_asked_at_its_address(two_sessions: list[Coordinator]) -> None:
    """An owner of another machine is asked at the address its znode names: nothing listens
    there (connection refused), so it is dead. One that names no address is waited for."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens
    elsewhere = ProcessIdentity("other-host", 4242, boot="another-boot", address=address)
    probe = OwnerCheck(this_process(), liveness.probe)
    first = ZooKeeperLedgerDirectory(two_sessions[0], OwnerCheck(elsewhere))
    second = ZooKeeperLedgerDirectory(two_sessions[1], probe)
    epoch = await first.acquire("t6", 0)
    assert await asyncio.wait_for(second.acquire("t6", 0), 5.0) > epoch
    assert second.taken_from_dead == 1

    silent = dataclasses.replace(elsewhere, address="")
    first = ZooKeeperLedgerDirectory(two_sessions[0], OwnerCheck(silent))
    await first.acquire("t7", 0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(second.acquire("t7", 0), 1.5)
