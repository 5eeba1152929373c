"""``pubsubd router`` as real processes over a real ZooKeeper (issue 11, part 2): two routers run
active/standby, the leader places every publish message source and subscription source on the
registered forwarders within the bounded load and publishes the ordered lists; ``pubsubd
routing drain|pin|show`` change and show the constraints; a forwarder that goes away moves only
its own units; kill -9 of the leader hands over to the standby, which keeps every owner."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from pubsubd._gen.pubsubd.internal.v1 import forwarder_pb2 as fpb
from pubsubd.control.routing_store import RoutingStore, encode_forwarder
from pubsubd.control.routing_table import Forwarder, publishing_unit, subscribing_unit
from pubsubd.coordination.ensemble import Ensemble
from pubsubd.coordination.registration import Registration
from pubsubd.coordination.zk import Coordinator
from pubsubd.core import pb
from pubsubd.core.load import Load
from pubsubd.storage.metadata import SubscriptionRecord, TopicRecord
from pubsubd.storage.zk_metadata import ZooKeeperMetadataStore
from tests.support.process import LoggedProcess

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.zookeeper"]

READY = re.compile(r"pubsubd router ready router_id=(\S+) zone=(\S+) http=(\S+)")
EPSILON = 0.25


class RouterProcess:
    def __init__(
        self, root: Path, name: str, zk: str, zk_root: str, extra: tuple[str, ...] = ()
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.process = LoggedProcess(root / f"{name}.log")
        self.command = [
            sys.executable, "-m", "pubsubd", "router", "--cluster", zk, "--zk-root", zk_root,
            "--router-id", name, "--http-port", "0", "--interval", "0.3",
            "--epsilon", str(EPSILON), "--hysteresis", "600", *extra,
        ]  # fmt: skip
        self.http = ""

    def start(self) -> RouterProcess:
        env = {"PUBSUBD_ZK_SESSION_TIMEOUT_S": "2"}
        ready = self.process.launch(self.command, READY, env, 30.0, f"router {self.name}")
        self.http = ready.group(3)
        return self

    def status(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"http://{self.http}/status", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]


def _routing(zk: str, zk_root: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "pubsubd", "routing", *args, "--cluster", zk, "--zk-root", zk_root,
         "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)  # type: ignore[no-any-return]


async def _until(condition: Callable[[], Any], within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not in {within} s: {what}"
        await asyncio.sleep(0.1)


@pytest.fixture
async def sessions(zookeeper: Ensemble, zk_root: str) -> AsyncIterator[list[Coordinator]]:
    """One ZooKeeper session per forwarder (ending one is the forwarder going away), and one
    for the test's own reads and writes (the last)."""
    made = [Coordinator(zookeeper.connect_string, zk_root, session_timeout=4.0) for _ in range(5)]
    for zk in made:
        await zk.start()
    yield made
    for zk in made:
        await zk.stop()


class StandIn:
    """A stand-in forwarder: a registration in its own ZooKeeper session and a gRPC port that
    answers ``Forwarder/Identify`` with that session, as a live forwarder does (the leading
    router asks every forwarder who serves at its address: router/liveness.py)."""

    def __init__(self, zk: Coordinator, forwarder_id: str, zone: str) -> None:
        self.zk = zk
        self.forwarder_id = forwarder_id
        self.zone = zone
        self.server: grpc.aio.Server | None = None
        self.registration: Registration | None = None

    async def start(self) -> StandIn:
        async def identify(request: Any, context: Any) -> Any:
            return fpb.IdentifyResponse(
                protocol_version=2, session_id=self.zk.session_id or 0,
                forwarder_id=self.forwarder_id,
            )  # fmt: skip

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "pubsubd.internal.v1.Forwarder",
                    {
                        "Identify": grpc.unary_unary_rpc_method_handler(
                            identify,
                            request_deserializer=fpb.IdentifyRequest.FromString,
                            response_serializer=fpb.IdentifyResponse.SerializeToString,
                        )
                    },
                )
            ]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self.server = server
        forwarder = Forwarder(self.forwarder_id, f"127.0.0.1:{port}", self.zone, "test")
        entry = Registration(
            self.zk,
            self.zk.layout.forwarder(self.forwarder_id),
            lambda: forwarder,
            encode_forwarder,
            lambda old, new: old != new,
        )
        await entry.start()
        self.registration = entry
        return self

    async def kill(self) -> None:
        """The process dies (its port closes, its registration is no longer kept up); its
        session lives on until it expires."""
        if self.registration is not None:
            self.registration.halt()
            self.registration = None
        if self.server is not None:
            await self.server.stop(None)
            self.server = None


@pytest.fixture
async def stand_ins() -> AsyncIterator[list[StandIn]]:
    made: list[StandIn] = []
    yield made
    for stand_in in made:
        await stand_in.kill()


async def _register(
    zk: Coordinator, forwarder_id: str, zone: str, stand_ins: list[StandIn]
) -> StandIn:
    """Register a stand-in forwarder in ``zk``'s session (it ends with the session)."""
    stand_in = await StandIn(zk, forwarder_id, zone).start()
    stand_ins.append(stand_in)
    return stand_in


def _topic(name: str, sources: int) -> TopicRecord:
    labels = {"pubsubd-publish-sources": str(sources)} if sources > 1 else {}
    body = pb.Topic(name=name, labels=labels).SerializeToString()
    return TopicRecord(name, uuid.uuid4().hex, body)


async def test_routers_assign_within_the_bound_follow_constraints_and_hand_over(
    tmp_path: Path,
    zookeeper: Ensemble,
    zk_root: str,
    sessions: list[Coordinator],
    stand_ins: list[StandIn],
) -> None:
    zk_string = zookeeper.connect_string
    mine = sessions[-1]
    store = RoutingStore(mine)
    for i, zk in enumerate(sessions[:4]):
        await _register(zk, f"f{i}", "z1" if i < 2 else "z2", stand_ins)
    metadata = ZooKeeperMetadataStore(mine)
    topics = [_topic(f"projects/p/topics/t{i}", 1 + i % 3) for i in range(30)]
    for t in topics:
        await asyncio.to_thread(metadata.put_topic, t)
    for i in range(20):
        t = topics[i]
        sub = pb.Subscription(name=f"projects/p/subscriptions/s{i}", topic=t.name)
        record = SubscriptionRecord(sub.name, uuid.uuid4().hex, t.uid, sub.SerializeToString())
        await asyncio.to_thread(metadata.put_subscription, record)
    publishing = sum(1 + i % 3 for i in range(30))
    subscribing = sum(1 + i % 3 for i in range(20))

    routers = [RouterProcess(tmp_path, f"router-{k}", zk_string, zk_root).start() for k in (1, 2)]
    try:

        async def complete() -> dict[str, tuple[str, ...]] | None:
            routes = await store.routes()
            return routes if len(routes) == publishing + subscribing else None

        routes = await _until(complete, 20, "every unit routed")
        roles = sorted(r.status()["role"] for r in routers)
        assert roles == ["leader", "standby"]
        # Topics are placed whole (co-located: a forwarder serves a topic with its
        # subscriptions): the bound holds over topics, and every unit of a topic and of its
        # subscriptions has the topic's route.
        loads: dict[str, int] = {}
        for t in topics:
            route = routes[publishing_unit(t.uid, 0)]
            assert sorted(route) == ["f0", "f1", "f2", "f3"]
            loads[route[0]] = loads.get(route[0], 0) + 1
            sources = [publishing_unit(t.uid, s) for s in range(1 + topics.index(t) % 3)]
            assert all(routes[u] == route for u in sources)
        assert max(loads.values()) <= math.ceil((1 + EPSILON) * len(topics) / 4), loads
        for unit, route in routes.items():
            if unit.startswith("s/"):
                assert sorted(route) == ["f0", "f1", "f2", "f3"]

        # Drain f0 with the CLI: within a pass it owns nothing and is every list's last.
        assert _routing(zk_string, zk_root, "drain", "f0")["drained_forwarders"] == ["f0"]

        async def f0_empty() -> dict[str, tuple[str, ...]] | None:
            routes = await store.routes()
            return routes if all(r[0] != "f0" and r[-1] == "f0" for r in routes.values()) else None

        drained = await _until(f0_empty, 10, "f0 drained")
        moved = {u for u in routes if routes[u][0] != drained[u][0]}
        assert moved == {u for u in routes if routes[u][0] == "f0"}  # only f0's units moved
        shown = _routing(zk_string, zk_root, "show")
        by_id = {f["forwarder_id"]: f for f in shown["forwarders"]}
        assert by_id["f0"]["drained"] and by_id["f0"]["publishing_units"] == 0
        assert by_id["f2"]["zone"] == "z2" and shown["router"]["total_moves"] >= len(
            {u for u in moved if u.startswith("p/") and u.endswith("/0")}  # topics move
        )

        # Pin a topic of three sources to f3.
        pinned = topics[2]
        _routing(zk_string, zk_root, "pin", pinned.name, "f3")

        async def on_f3() -> bool:
            routes = await store.routes()
            return all(routes[publishing_unit(pinned.uid, s)][0] == "f3" for s in range(3))

        await _until(on_f3, 10, "the pinned topic's sources on f3")

        # A forwarder goes away (its session ends): only its units move.
        before = await store.routes()
        await sessions[1].stop()

        async def f1_gone() -> dict[str, tuple[str, ...]] | None:
            # Every unit routed (a read between the router's shard writes may see some
            # missing), none to f1.
            routes = await store.routes()
            complete = routes.keys() == before.keys()
            return routes if complete and all("f1" not in r for r in routes.values()) else None

        after = await _until(f1_gone, 15, "f1's units moved")
        assert {u for u in before if before[u][0] != after[u][0]} == {
            u for u in before if before[u][0] == "f1"
        }

        # kill -9 of the leading router: the standby leads, keeps every owner, routes what
        # is new (a topic created while no router leads).
        leader = next(r for r in routers if r.status()["role"] == "leader")
        assert leader.status()["forwarders_declared_dead"] == 0  # all answered who they are
        standby = next(r for r in routers if r is not leader)
        leader.process.kill()
        added = _topic("projects/p/topics/added", 1)
        await asyncio.to_thread(metadata.put_topic, added)

        async def routed_by_standby() -> dict[str, tuple[str, ...]] | None:
            routes = await store.routes()
            return routes if publishing_unit(added.uid, 0) in routes else None

        handed = await _until(routed_by_standby, 20, "the standby routes the new topic")
        assert standby.status()["role"] == "leader"
        assert all(handed[u][0] == after[u][0] for u in after)  # no owner changed
        assert standby.process.stop() == 0  # SIGTERM: a clean exit
    finally:
        for r in routers:
            r.process.stop()
        metadata.close()


async def test_the_router_weighs_topics_by_their_forwarders_load_reports(
    tmp_path: Path,
    zookeeper: Ensemble,
    zk_root: str,
    sessions: list[Coordinator],
    stand_ins: list[StandIn],
) -> None:
    """A forwarder reports one of its topics at 1,000 messages/s (weight 11, core/load.py):
    the router keeps that topic where it is and moves idle ones away from its forwarder until
    its weight is within the bound; ``routing show`` reports the weights."""
    zk_string = zookeeper.connect_string
    mine = sessions[-1]
    store = RoutingStore(mine)
    for i, zk in enumerate(sessions[:2]):
        await _register(zk, f"f{i}", "z1", stand_ins)
    metadata = ZooKeeperMetadataStore(mine)
    topics = [_topic(f"projects/p/topics/w{i}", 1) for i in range(12)]
    for t in topics:
        await asyncio.to_thread(metadata.put_topic, t)
    router = RouterProcess(tmp_path, "router-w", zk_string, zk_root).start()
    try:

        async def routed() -> dict[str, tuple[str, ...]] | None:
            routes = await store.routes()
            return routes if len(routes) == len(topics) else None

        before = await _until(routed, 20, "every topic routed")
        # The hot topic on the forwarder holding more: at least 6 topics, 10 + 6 > the bound.
        held = {
            f: [t for t in topics if before[publishing_unit(t.uid, 0)][0] == f]
            for f in ("f0", "f1")
        }
        owner = max(held, key=lambda f: len(held[f]))
        hot = held[owner][0]
        reporter = RoutingStore(sessions[int(owner[1:])])  # the owner's own session
        await reporter.write_load(owner, {hot.uid: Load(messages_per_s=1000.0)}, time.time())
        capacity = math.ceil((1 + EPSILON) * (len(topics) + 10) / 2)

        async def weighed() -> Any:
            summary = await store.summary()
            if summary is None or sum(summary.publishing_weights.values()) != len(topics) + 10:
                return None
            return summary

        summary = await _until(weighed, 20, "the hot topic weighed")
        assert summary.publishing_capacity == capacity
        assert dict(summary.publishing_weights)[owner] <= capacity
        after = await store.routes()
        assert after[publishing_unit(hot.uid, 0)][0] == owner  # the busy one stays
        moved = [u for u in after if after[u][0] != before[u][0]]
        assert moved and all(before[u][0] == owner for u in moved)  # idle ones leave it
        shown = {f["forwarder_id"]: f for f in _routing(zk_string, zk_root, "show")["forwarders"]}
        assert shown[owner]["publishing_weight"] == dict(summary.publishing_weights)[owner]
        assert shown[owner]["publishing_units"] == dict(summary.publishing_loads)[owner]
    finally:
        router.process.stop()
        metadata.close()


async def test_a_subscription_busy_over_its_forwarders_spreads_and_gathers_when_quiet(
    tmp_path: Path,
    zookeeper: Ensemble,
    zk_root: str,
    sessions: list[Coordinator],
    stand_ins: list[StandIn],
) -> None:
    """``--spread-subscriptions`` spreads by load (core/subscription_spread.py): two forwarders
    each report 40 msg/s delivered for one subscription, under the 50 msg/s threshold alone
    but over it summed, so after the spread window its sources are placed on their own (marked
    ``Route.spread``) over two forwarders (its width, ``Route.spread_width``) while a quiet
    subscription stays whole; a router started after a kill -9 of the first keeps it spread as
    wide; reported busier it widens to all three forwarders; once the reports go quiet it is
    gathered back to the owner of its first source."""
    zk_string = zookeeper.connect_string
    mine = sessions[-1]
    store = RoutingStore(mine)
    for i, zk in enumerate(sessions[:3]):
        await _register(zk, f"f{i}", "z1", stand_ins)
    metadata = ZooKeeperMetadataStore(mine)
    topic = _topic("projects/p/topics/busy", 6)
    await asyncio.to_thread(metadata.put_topic, topic)
    subs = {}
    for name in ("hot", "cold"):
        sub = pb.Subscription(name=f"projects/p/subscriptions/{name}", topic=topic.name)
        subs[name] = SubscriptionRecord(
            sub.name, uuid.uuid4().hex, topic.uid, sub.SerializeToString()
        )
        await asyncio.to_thread(metadata.put_subscription, subs[name])
    hot, cold = subs["hot"].uid, subs["cold"].uid
    extra = (
        "--spread-subscriptions", "--spread-capacity", "100", "--spread-after", "1",
        "--gather-after", "2",
    )  # fmt: skip

    async def spread_now() -> set[str]:
        return set(await widths_now())

    async def widths_now() -> dict[str, int]:
        spread: dict[str, int] = {}
        await store.assignment(spread)
        return spread

    async def report(loads: dict[str, Load]) -> None:
        for i in (0, 1):  # each forwarder in its own session, as a forwarder writes it
            await RoutingStore(sessions[i]).write_load(f"f{i}", {}, time.time(), loads)

    first = RouterProcess(tmp_path, "router-s1", zk_string, zk_root, extra).start()
    second: RouterProcess | None = None
    try:

        async def whole() -> Any:
            routes = await store.routes()
            units = [subscribing_unit(hot, i) for i in range(6)]
            return all(u in routes for u in units) and not await spread_now() and routes

        before = await _until(whole, 20, "both subscriptions routed whole")
        head = before[subscribing_unit(hot, 0)]
        await report({hot: Load(messages_per_s=40.0), cold: Load(messages_per_s=5.0)})
        started = time.monotonic()
        await _until(lambda: _eq(spread_now(), {hot}), 20, "the busy subscription spread")
        assert time.monotonic() - started >= 1.0  # not before the spread window
        routes = await store.routes()
        assert routes[subscribing_unit(hot, 0)] == head  # its first source stays
        # 80 msg/s needs two forwarders to keep each share under 50: two heads, the other
        # sources following them (source j, head j mod 2).
        assert await widths_now() == {hot: 2}
        assert len({routes[subscribing_unit(hot, i)][0] for i in range(6)}) == 2
        assert all(
            routes[subscribing_unit(hot, j)] == routes[subscribing_unit(hot, j % 2)]
            for j in range(6)
        )
        cold_head = routes[subscribing_unit(cold, 0)]
        assert all(routes[subscribing_unit(cold, i)] == cold_head for i in range(6))
        assert first.status()["spread"] == [hot]
        first.process.kill()  # kill -9: the next router starts from the published marks
        second = RouterProcess(tmp_path, "router-s2", zk_string, zk_root, extra).start()
        await _until(
            lambda: _true(second is not None and second.status()["role"] == "leader"),
            20,
            "the second router leads",
        )
        await asyncio.sleep(1.5)  # a few passes, still busy: nothing changes
        assert second.status()["spread"] == [hot] and await widths_now() == {hot: 2}
        # Busier: 160 msg/s would need four; there are three subscribing forwarders.
        await report({hot: Load(messages_per_s=80.0), cold: Load(messages_per_s=5.0)})
        await _until(lambda: _eq(widths_now(), {hot: 3}), 20, "the busier subscription widened")
        routes = await store.routes()
        assert routes[subscribing_unit(hot, 0)] == head
        assert len({routes[subscribing_unit(hot, i)][0] for i in range(6)}) == 3
        assert second.status()["spread_widths"] == {hot: 3}
        await report({})  # quiet: gathered after the gather window

        async def gathered() -> bool:
            # The marks and the routes are in several shards, written one after another: both
            # must say so (one CI run read the marks gone before every unit had moved back).
            if await spread_now():
                return False
            routes = await store.routes()
            return all(routes[subscribing_unit(hot, i)][0] == head[0] for i in range(6))

        await _until(gathered, 20, "the quiet subscription gathered to its first owner")
    finally:
        first.process.stop()
        if second is not None:
            second.process.stop()
        metadata.close()


async def _eq(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _true(value: bool) -> bool:
    return value


async def test_a_killed_forwarder_leaves_the_table_before_its_session_expires(
    tmp_path: Path, zookeeper: Ensemble, zk_root: str, stand_ins: list[StandIn]
) -> None:
    """A forwarder's port closes (kill -9) while its 60 s ZooKeeper session lives on: the
    leading router finds nothing listening at its address, deletes its registration and moves
    its units, and only its units, long before the session would expire. A forwarder that
    answers with its session stays."""
    made = [Coordinator(zookeeper.connect_string, zk_root, session_timeout=60.0) for _ in range(4)]
    for zk in made:
        await zk.start()
    mine = made[-1]
    store = RoutingStore(mine)
    metadata = ZooKeeperMetadataStore(mine)
    routers: list[RouterProcess] = []
    try:
        forwarders = [await _register(made[i], f"f{i}", "z1", stand_ins) for i in range(3)]
        topics = [_topic(f"projects/p/topics/k{i}", 1) for i in range(12)]
        for t in topics:
            await asyncio.to_thread(metadata.put_topic, t)
        routers = [RouterProcess(tmp_path, "router-1", zookeeper.connect_string, zk_root).start()]

        async def complete() -> dict[str, tuple[str, ...]] | None:
            routes = await store.routes()
            owners = {r[0] for r in routes.values()}
            return routes if len(routes) == len(topics) and len(owners) == 3 else None

        before = await _until(complete, 20, "every topic routed over three forwarders")
        await forwarders[1].kill()
        killed_at = time.monotonic()

        async def f1_gone() -> dict[str, tuple[str, ...]] | None:
            # Every unit routed (a read between the router's shard writes may see some
            # missing), none to f1.
            routes = await store.routes()
            complete = routes.keys() == before.keys()
            return routes if complete and all("f1" not in r for r in routes.values()) else None

        after = await _until(f1_gone, 30, "f1's units moved")
        took = time.monotonic() - killed_at
        print(f"port closed -> f1 out of every route: {took:.2f} s (session: 60 s)")
        assert not made[1].session_lost  # its session was not waited out
        assert await mine.exists(mine.layout.forwarder("f1")) is None
        assert {u for u in before if before[u][0] != after[u][0]} == {
            u for u in before if before[u][0] == "f1"
        }
        assert routers[0].status()["forwarders_declared_dead"] == 1
    finally:
        for r in routers:
            r.process.stop()
        metadata.close()
        for zk in made:
            await zk.stop()


async def test_a_router_that_leads_again_starts_from_what_the_other_published(
    tmp_path: Path,
    zookeeper: Ensemble,
    zk_root: str,
    sessions: list[Coordinator],
    stand_ins: list[StandIn],
) -> None:
    """Router A leads, then is frozen (SIGSTOP) until its 2 s session expires; B leads, moves
    f0's topics away (drain) and keeps them there (undrain, 600 s hysteresis). A wakes, stands
    again behind B and leads once B stops; a forwarder joins, so A rewrites every route: each
    topic B moved stays where B put it, none goes back to f0 as A remembered it."""
    zk_string = zookeeper.connect_string
    mine = sessions[-1]
    store = RoutingStore(mine)
    for i, zk in enumerate(sessions[:3]):
        await _register(zk, f"f{i}", "z1", stand_ins)
    metadata = ZooKeeperMetadataStore(mine)
    topics = [_topic(f"projects/p/topics/r{i}", 1) for i in range(12)]
    for t in topics:
        await asyncio.to_thread(metadata.put_topic, t)
    a = RouterProcess(tmp_path, "router-a", zk_string, zk_root).start()
    b: RouterProcess | None = None
    paused = False
    try:

        async def routed() -> dict[str, tuple[str, ...]] | None:
            routes = await store.routes()
            return routes if len(routes) == len(topics) else None

        await _until(lambda: _true(a.status()["role"] == "leader"), 20, "A leads")
        first = await _until(routed, 20, "every topic routed")
        assert any(r[0] == "f0" for r in first.values())
        b = RouterProcess(tmp_path, "router-b", zk_string, zk_root).start()
        assert a.process.proc is not None
        a.process.proc.send_signal(signal.SIGSTOP)  # frozen: its session expires
        paused = True
        router_b = b
        await _until(lambda: _true(router_b.status()["role"] == "leader"), 30, "B leads")

        _routing(zk_string, zk_root, "drain", "f0")

        async def f0_empty() -> dict[str, tuple[str, ...]] | None:
            routes = await store.routes()
            return routes if all(r[0] != "f0" for r in routes.values()) else None

        drained = await _until(f0_empty, 15, "f0 drained by B")
        moved = {u for u in first if first[u][0] == "f0"}
        _routing(zk_string, zk_root, "undrain", "f0")

        async def passes_after(router: RouterProcess, generation: int) -> bool:
            return int(router.status()["last_pass"].get("generation", 0)) >= generation + 2

        seen = int(b.status()["last_pass"]["generation"])
        await _until(lambda: passes_after(router_b, seen), 15, "B's passes after the undrain")
        by_b = await store.routes()
        assert all(by_b[u][0] == drained[u][0] for u in moved)  # within B's hysteresis

        a.process.proc.send_signal(signal.SIGCONT)
        paused = False
        await _until(lambda: _true(a.status()["role"] == "standby"), 30, "A stands again")
        assert b.process.stop() == 0
        await _until(lambda: _true(a.status()["role"] == "leader"), 30, "A leads again")
        await _register(sessions[3], "f3", "z1", stand_ins)  # every route is rewritten

        async def f3_listed() -> dict[str, tuple[str, ...]] | None:
            routes = await store.routes()
            return routes if any("f3" in r for r in routes.values()) else None

        await _until(f3_listed, 15, "A routes with f3")
        seen = int(a.status()["last_pass"]["generation"])
        await _until(lambda: passes_after(a, seen), 15, "A's passes with f3")
        final = await store.routes()
        assert {u: final[u][0] for u in moved} == {u: by_b[u][0] for u in moved}
    finally:
        if paused and a.process.proc is not None:
            a.process.proc.send_signal(signal.SIGCONT)
        a.process.stop()
        if b is not None:
            b.process.stop()
        metadata.close()
