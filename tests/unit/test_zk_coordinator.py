"""The asyncio bridge over kazoo (coordination/zk.py) against a real standalone ZooKeeper:
kazoo's errors arrive as ours, compare-and-set conflicts are ``BadVersion``, ephemeral znodes go
with their session, sequence numbers grow, transactions are all or nothing, and every watch and
state callback runs on the event loop's thread."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pubsubd.coordination.ensemble import Ensemble, _free_ports
from pubsubd.coordination.errors import (
    BadVersion,
    CoordinationUnavailable,
    NodeExists,
    NoNode,
    NotEmpty,
)
from pubsubd.coordination.zk import (
    Check,
    Coordinator,
    Create,
    EventType,
    SessionState,
    SetData,
    WatchEvent,
)

pytest_plugins = ["tests.support.zookeeper"]
pytestmark = pytest.mark.unit


@pytest.fixture
async def coordinator(zookeeper: Ensemble, zk_root: str) -> AsyncIterator[Coordinator]:
    c = Coordinator(zookeeper.connect_string, zk_root, session_timeout=4.0)
    await c.start()
    yield c
    await c.stop()


async def _until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_start_creates_the_root_and_data_round_trips(coordinator: Coordinator) -> None:
    assert coordinator.connected and coordinator.session_id
    assert await coordinator.exists(coordinator.root) is not None
    path = f"{coordinator.root}/a/b/c"
    assert await coordinator.create(path, b"\x00one") == path  # makepath
    data, stat = await coordinator.get(path)
    assert (data, stat.version, stat.ephemeral) == (b"\x00one", 0, False)
    assert await coordinator.children(f"{coordinator.root}/a") == ["b"]


async def test_kazoo_errors_arrive_as_ours(coordinator: Coordinator) -> None:
    root = coordinator.root
    with pytest.raises(NoNode) as missing:
        await coordinator.get(f"{root}/missing")
    assert missing.value.path == f"{root}/missing"
    await coordinator.create(f"{root}/x/y")
    with pytest.raises(NodeExists):
        await coordinator.create(f"{root}/x/y")
    with pytest.raises(NoNode):
        await coordinator.create(f"{root}/no/parent", makepath=False)
    with pytest.raises(NotEmpty):
        await coordinator.delete(f"{root}/x")
    await coordinator.delete(f"{root}/x", recursive=True)
    assert await coordinator.exists(f"{root}/x") is None
    await coordinator.delete(f"{root}/x", recursive=True)  # nothing there: fine
    with pytest.raises(NoNode):
        await coordinator.delete(f"{root}/x")


async def test_compare_and_set_conflicts_are_bad_version(coordinator: Coordinator) -> None:
    path = f"{coordinator.root}/ledgers"
    _, created = await coordinator.create_with_stat(path, b"v0")
    assert created.version == 0
    first = await coordinator.set(path, b"v1", version=created.version)  # wins
    assert first.version == 1 and first.mzxid > created.mzxid
    with pytest.raises(BadVersion):  # a writer that read version 0 lost
        await coordinator.set(path, b"stale", version=created.version)
    with pytest.raises(BadVersion):
        await coordinator.delete(path, version=created.version)
    with pytest.raises(BadVersion):  # the blocking twin says the same
        coordinator.blocking.set(path, b"stale", version=created.version)
    assert (await coordinator.get(path))[0] == b"v1"
    assert coordinator.blocking.set(path, b"v2", version=1).version == 2
    coordinator.blocking.delete(path, version=2)
    assert coordinator.blocking.exists(path) is None


async def test_sequence_znodes_increase(coordinator: Coordinator) -> None:
    parent = f"{coordinator.root}/ids"
    paths = [await coordinator.create(f"{parent}/id-", sequence=True) for _ in range(5)]
    paths.append(coordinator.blocking.create(f"{parent}/id-", sequence=True))
    numbers = [int(p.rsplit("-", 1)[1]) for p in paths]
    assert numbers == sorted(numbers) and len(set(numbers)) == 6
    assert all(p.startswith(f"{parent}/id-") for p in paths)


async def test_an_ephemeral_znode_goes_with_its_session(
    zookeeper: Ensemble, coordinator: Coordinator
) -> None:
    owner = Coordinator(zookeeper.connect_string, coordinator.root, session_timeout=4.0)
    await owner.start()
    path = f"{coordinator.root}/owner"
    _, stat = await owner.create_with_stat(path, b"me", ephemeral=True)
    assert stat.ephemeral and stat.ephemeral_owner == owner.session_id
    with pytest.raises(NodeExists):  # a second owner is refused
        await coordinator.create(path, b"other", ephemeral=True)
    seen: list[Any] = []
    coordinator.watch_data(path, lambda value: seen.append(value and value[0]))
    await _until(lambda: seen == [b"me"])
    await owner.stop()
    assert await coordinator.exists(path) is None  # gone as soon as the session closed
    await _until(lambda: seen == [b"me", None])
    assert not owner.session_lost  # closed, not expired


async def test_one_shot_watches_fire_on_the_loop(coordinator: Coordinator) -> None:
    loop_thread = threading.current_thread()
    events: list[tuple[WatchEvent, bool]] = []

    def heard(event: WatchEvent) -> None:
        events.append((event, threading.current_thread() is loop_thread))

    path = f"{coordinator.root}/w"
    assert await coordinator.exists(path, watch=heard) is None
    await coordinator.create(path, b"1")
    await _until(lambda: len(events) == 1)
    await coordinator.get(path, watch=heard)
    await coordinator.get(path, watch=heard)  # armed once, fires once
    await coordinator.set(path, b"2")
    await coordinator.children(path, watch=heard)
    await coordinator.create(f"{path}/child")
    await _until(lambda: len(events) == 3)
    await asyncio.sleep(0.1)
    assert [(e.type, e.path, on_loop) for e, on_loop in events] == [
        (EventType.CREATED, path, True),
        (EventType.CHANGED, path, True),
        (EventType.CHILD, path, True),
    ]


async def test_follows_deliver_current_values_then_changes(coordinator: Coordinator) -> None:
    loop_thread = threading.current_thread()
    data: list[bytes | None] = []
    children: list[list[str] | None] = []
    threads: set[bool] = set()
    path = f"{coordinator.root}/followed"

    def on_data(value: Any) -> None:
        threads.add(threading.current_thread() is loop_thread)
        data.append(None if value is None else value[0])

    def on_children(names: list[str] | None) -> None:
        threads.add(threading.current_thread() is loop_thread)
        children.append(names)

    follow_data = coordinator.watch_data(path, on_data)
    coordinator.watch_children(path, on_children)
    await _until(lambda: data == [None] and children == [None])
    await coordinator.create(path, b"a")
    await _until(lambda: data == [None, b"a"] and children == [None, []])
    await coordinator.create(f"{path}/n2")
    await coordinator.create(f"{path}/n1")
    await coordinator.set(path, b"b")
    await _until(lambda: data[-1] == b"b" and children[-1] == ["n1", "n2"])
    follow_data.cancel()
    await coordinator.set(path, b"c")
    await coordinator.delete(path, recursive=True)
    await _until(lambda: children[-1] is None)
    assert data[-1] == b"b"  # cancelled: heard nothing more
    assert threads == {True}


async def test_a_transaction_is_all_or_nothing(coordinator: Coordinator) -> None:
    root = coordinator.root
    _, stat = await coordinator.create_with_stat(f"{root}/list", b"[]")
    results = await coordinator.commit(
        [
            Check(f"{root}/list", stat.version),
            Create(f"{root}/l1", b"x"),
            SetData(f"{root}/list", b"[1]"),
        ]
    )
    assert results[0] is None and results[1] == f"{root}/l1"
    with pytest.raises(BadVersion) as lost:  # the check is stale now: nothing applies
        await coordinator.commit([Create(f"{root}/l2", b"y"), Check(f"{root}/list", stat.version)])
    assert lost.value.op_index == 1
    assert await coordinator.exists(f"{root}/l2") is None
    assert (await coordinator.get(f"{root}/list"))[0] == b"[1]"
    with pytest.raises(NodeExists):
        coordinator.blocking.commit([Create(f"{root}/l1")])


async def test_state_changes_arrive_on_the_loop(zookeeper: Ensemble, zk_root: str) -> None:
    c = Coordinator(zookeeper.connect_string, zk_root, session_timeout=4.0)
    states: list[SessionState] = []
    loop_thread = threading.current_thread()
    on_loop: set[bool] = set()

    def heard(state: SessionState) -> None:
        on_loop.add(threading.current_thread() is loop_thread)
        states.append(state)

    c.on_state(heard)
    await c.start()
    await c.stop()
    await _until(lambda: states == [SessionState.CONNECTED, SessionState.LOST])
    assert on_loop == {True}
    with pytest.raises(CoordinationUnavailable):  # stopped
        await c.get(c.root)


async def test_no_zookeeper_is_coordination_unavailable() -> None:
    (port,) = _free_ports(1)
    c = Coordinator(f"127.0.0.1:{port}", session_timeout=2.0)
    with pytest.raises(CoordinationUnavailable, match="cannot connect"):
        await c.start(connect_timeout=0.5)
    await c.stop()


async def test_the_lease_holds_for_as_long_as_the_session_lives(
    coordinator: Coordinator,
) -> None:
    """Nothing but the keeper talks to ZooKeeper here: it renews before the lease lapses."""
    loop = asyncio.get_running_loop()
    assert coordinator.lease_holds()
    end = loop.time() + 3 * 4.0 * 0.8
    while loop.time() < end:
        assert coordinator.lease_holds()
        await asyncio.sleep(0.05)
    assert await coordinator.renew_lease()


_STOPPED_CHILD = """
import asyncio, sys
from pubsubd.coordination.errors import CoordinationUnavailable
from pubsubd.coordination.zk import Coordinator

async def main():
    c = Coordinator(sys.argv[1], sys.argv[2], session_timeout=2.0)
    await c.start()
    print("ready", c.lease_holds(), flush=True)
    while c.lease_holds():
        await asyncio.sleep(0.01)
    print("lapsed", c.session_lost, flush=True)
    for _ in range(100):  # a request in flight when the connection drops: ask again
        try:
            renewed = await c.renew_lease()
            break
        except CoordinationUnavailable:
            await asyncio.sleep(0.1)
    print("renewed", renewed, c.session_lost, flush=True)
    await c.stop()

asyncio.run(main())
"""


async def test_a_process_stopped_past_its_session_finds_its_lease_lapsed_on_resuming(
    zookeeper: Ensemble, zk_root: str
) -> None:
    """SIGSTOP past the session timeout, then SIGCONT: the first look at the lease says it
    lapsed, and renewing it says the session is gone. (That kazoo has not reported the loss
    yet at that moment is the race the lease closes; it is printed, not asserted.)"""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _STOPPED_CHILD,
        zookeeper.connect_string,
        zk_root,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line.split() == [b"ready", b"True"]
        child.send_signal(signal.SIGSTOP)
        await asyncio.sleep(5.0)  # the session (2 s) expires meanwhile
        child.send_signal(signal.SIGCONT)
        lapsed = (await asyncio.wait_for(child.stdout.readline(), 10)).split()
        renewed = (await asyncio.wait_for(child.stdout.readline(), 10)).split()
        print("when the lease was found lapsed, session_lost was", lapsed[1:])
        assert lapsed[0] == b"lapsed"
        assert renewed == [b"renewed", b"False", b"True"]
        assert await asyncio.wait_for(child.wait(), 10) == 0
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
