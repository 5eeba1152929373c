"""``pubsubd router``: the control plane's router as a process (composition root, issue 11).

Routers run active/standby: each stands in the election under ``Layout.routers``; the leader
keeps the routing table (``control/routing_table.py``) and publishes it in ZooKeeper
(``control/routing_store.py``), the others wait ready to take over. Every router follows the
cluster's metadata (topics and subscriptions, ``storage/zk_metadata.py``), the forwarders'
registrations and the routing constraints through watches, so a change is routed within one
step (``--interval``, default 2 s, the most a change waits; a watch wakes the leader at once).

Each pass also reads the forwarders' load reports (``routing/loads``, written by
``data/load_report.py``) and weighs every topic by its load (``core/load.py``), so a busy topic
takes the room of several idle ones and its forwarder is given fewer of them. With
``--spread-subscriptions`` it also decides from them which subscriptions are busy enough to be
spread over several subscribing forwarders by source, and which are quiet enough to be served
whole again (``core/subscription_spread.py``); ``--spread-all`` spreads every one that may be.
The loads are EWMAs the forwarders compute with the half-life this router publishes in its
summary (``--load-half-life``, ``core/load.py``). The same reports carry each forwarder's share
of the backlog of the subscriptions it serves: ``/status`` shows each subscription's whole
backlog and which forwarder serves which of its sources (``core/backlog_view.py``).

Frontends and forwarders read the published assignment, never the router, so a router that is
killed or restarted stops nothing: the last assignment stays in ZooKeeper and the next leader
starts from it (units keep their owners: the table is seeded with the published routes).

When ready it prints one line for scripts::

    pubsubd router ready router_id=ID zone=Z http=127.0.0.1:P

SIGTERM (or SIGINT) stops it cleanly: its candidate znode is deleted, so a standby leads at once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge

from pubsubd import runtime
from pubsubd._gen.pubsubd.internal.v1 import routing_pb2 as pb
from pubsubd.api.grpc import liveness
from pubsubd.control.assignment import DEFAULT_EPSILON, DEFAULT_HYSTERESIS_S
from pubsubd.control.routing_store import RoutingStore, merge_reports, subscription_totals
from pubsubd.control.routing_table import (
    Constraints,
    Forwarder,
    RoutingTable,
)
from pubsubd.control.routing_views import NamesView
from pubsubd.coordination.election import Election
from pubsubd.coordination.errors import CoordinationError, startup_failure
from pubsubd.coordination.paths import DEFAULT_ROOT
from pubsubd.coordination.zk import Coordinator
from pubsubd.core.backlog_view import WholeBacklog, ranked, whole_backlogs
from pubsubd.core.load import HALF_LIFE_S, Load, valid_half_life, weight
from pubsubd.core.release import version
from pubsubd.core.subscription_spread import (
    SPREAD_BY_LOAD,
    SPREAD_MODES,
    SPREAD_OFF,
    SpreadSettings,
    SubscriptionSpread,
)
from pubsubd.core.tls import ServerTls
from pubsubd.observability import metrics
from pubsubd.observability.http import HttpEndpoint
from pubsubd.router.liveness import ForwarderWatch

log = logging.getLogger(__name__)

LEADER = Gauge("pubsubd_router_leader", "1 while this process is the leading router")
PASSES = Counter("pubsubd_router_passes", "Routing passes made while leading")
MOVES = Counter("pubsubd_router_moves", "Units that changed owner", ["kind", "forced"])
UNITS = Gauge("pubsubd_router_units", "Units placed in the last pass", ["kind"])
CAPACITY = Gauge("pubsubd_router_capacity", "Units a forwarder may own (last pass)", ["kind"])
PASS_SECONDS = Gauge("pubsubd_router_pass_seconds", "Wall time of the last routing pass")
SPREAD = Gauge("pubsubd_router_spread_subscriptions", "Subscriptions spread by source (last pass)")
SPREAD_CHANGES = Counter(
    "pubsubd_router_spread_changes",
    "Subscriptions spread over several forwarders, resized or gathered back to one, by load",
    ["change"],
)


class StartupError(Exception):
    """The router cannot start as configured (the message says why)."""


@dataclass(frozen=True)
class RouterConfig:
    zk: str
    zk_root: str = DEFAULT_ROOT
    router_id: str | None = None
    zone: str = "default"
    host: str = "127.0.0.1"
    http_port: int = -1
    epsilon: float = DEFAULT_EPSILON
    hysteresis_s: float = DEFAULT_HYSTERESIS_S
    interval_s: float = 2.0
    # Place topics whole, their subscriptions with them (control/routing_table.py): what the
    # forwarders serve today.
    colocate: bool = True
    # Spread shared subscriptions over the subscribing forwarders by source (each source of
    # the subscription placed on its own; control/routing_table.py): "off", "load" (the busy
    # ones, core/subscription_spread.py) or "all" (every one that may be).
    spread_subscriptions: str = SPREAD_OFF
    spread: SpreadSettings = field(default_factory=SpreadSettings)  # when to spread, gather
    # The half-life of the load EWMAs the forwarders report (published in the summary).
    load_half_life_s: float = HALF_LIFE_S
    zk_session_timeout_s: float = 10.0
    pid_file: Path | None = None  # written when ready, removed on a clean stop
    tls: ServerTls | None = None  # TLS on its HTTP port (core/tls.py)

    def __post_init__(self) -> None:
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be positive, got {self.epsilon}")
        if not self.interval_s > 0:
            raise ValueError(f"the interval must be positive, got {self.interval_s}")
        valid_half_life(self.load_half_life_s)
        if self.spread_subscriptions not in SPREAD_MODES:
            raise ValueError(f"spread subscriptions: one of {SPREAD_MODES}")
        if not self.zk_session_timeout_s > 0:
            raise ValueError(
                f"the ZooKeeper session timeout must be positive, got {self.zk_session_timeout_s}"
            )


class Router:
    """One router process: metadata follower, election, routing table, HTTP endpoint."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.router_id = config.router_id or f"{socket.gethostname()}-{os.getpid()}"
        self.zk = Coordinator(
            config.zk, config.zk_root, session_timeout=config.zk_session_timeout_s
        )
        self.store = RoutingStore(self.zk)
        self.table = self._new_table()
        # Which subscriptions are busy enough to spread (None: all of them, or none).
        self.spreading = (
            SubscriptionSpread(config.spread)
            if config.spread_subscriptions == SPREAD_BY_LOAD
            else None
        )
        self.election = Election(
            self.zk,
            self.zk.layout.routers,
            json.dumps({"router_id": self.router_id, "pid": os.getpid()}).encode(),
            self._step,
            name="router",
            interval_s=config.interval_s,
            on_leading=self._leading_changed,
        )
        self.names = NamesView(self.zk, self.election.poke)
        # Forwarders killed leave the table at once, not when their session expires.
        self.watch = ForwarderWatch(
            self.zk,
            self.store,
            liveness.probe,
            lambda: self.election.leading,
            self.election.poke,
        )
        self.http = HttpEndpoint(self.status)
        self.http_port = 0
        self.generation = 0
        self.total_moves = 0
        self.last_pass: dict[str, Any] = {}
        self.backlogs: dict[str, WholeBacklog] = {}  # by subscription uid, as of the last pass
        self._turn = 0  # turns as leader lost so far
        self._seeded_turn = -1  # the turn whose table was seeded from the published one
        self._follows: list[Any] = []

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self.zk.start()
            await self.names.start()
        except CoordinationError as e:
            raise StartupError(startup_failure(f"reach ZooKeeper at {self.config.zk}", e)) from e
        layout = self.zk.layout
        self._follows = [
            self.zk.watch_children(layout.forwarders, lambda _: self.election.poke()),
            self.zk.watch_data(layout.routing_constraints, lambda _: self.election.poke()),
        ]
        self.election.start()
        self.watch.start()
        metrics.describe_process("router", self.router_id, self.config.zone, version())
        if self.config.http_port >= 0:
            tls = self.config.tls
            self.http_port = await self.http.start(
                self.config.host, self.config.http_port, ssl=tls.context() if tls else None
            )
        if self.config.pid_file is not None:
            self.config.pid_file.write_text(f"{os.getpid()}\n")
        http = f" http={self.config.host}:{self.http_port}" if self.config.http_port >= 0 else ""
        sys.stdout.write(
            f"pubsubd router ready router_id={self.router_id} zone={self.config.zone}{http}\n"
        )
        sys.stdout.flush()

    async def stop(self) -> None:
        await self.watch.close()
        await self.election.close()
        for follow in self._follows:
            follow.cancel()
        self.names.close()
        await self.http.close()
        await self.zk.stop()
        if self.config.pid_file is not None:
            self.config.pid_file.unlink(missing_ok=True)

    # -- one routing pass (the leader) ---------------------------------------------------------

    def _new_table(self) -> RoutingTable:
        config = self.config
        return RoutingTable(
            epsilon=config.epsilon,
            hysteresis_s=config.hysteresis_s,
            colocate=config.colocate,
            spread_subscriptions=config.spread_subscriptions != SPREAD_OFF,
        )

    def _leading_changed(self, leading: bool) -> None:
        """While it does not (certainly) lead, another router may move units: every turn as
        leader starts again from what is published, never from this one's memory."""
        LEADER.set(1 if leading else 0)
        if not leading:
            self._turn += 1

    async def _seed(self) -> None:
        """Start from the published assignment, so units keep their owners across routers,
        and the units that moved lately their hysteresis window. Done on every turn as leader
        (a router that led before and lost it forgets what it held): a fresh table, so its
        routes are all written out again too."""
        turn = self._turn
        self.table = self._new_table()
        clocks = time.monotonic() - time.time()  # a Unix time + this: the monotonic one
        spread: dict[str, int] = {}
        for unit, (forwarders, moved_at) in (await self.store.assignment(spread)).items():
            if forwarders:
                moved = None if moved_at is None else moved_at + clocks
                self.table.restore(unit, forwarders[0], moved)
        if self.spreading is not None:  # what its predecessor spread stays spread, as wide
            self.spreading = SubscriptionSpread(self.config.spread, spread)
        self._seeded_turn = turn

    async def _step(self) -> None:
        if self._seeded_turn != self._turn:
            await self._seed()
        try:
            await self._route()
        except BaseException:
            # A pass cut short may have changed the table and written part of it: the next
            # one starts again from what is published.
            self._turn += 1
            raise

    async def _route(self) -> None:
        started = time.monotonic()
        check = self.election.check
        forwarders: list[Forwarder] = await self.store.forwarders()
        constraints: Constraints = (await self.store.constraints())[0]
        # Topics weigh by the load their forwarders last reported (core/load.py), and so do
        # subscriptions served apart from their topics.
        found = await self.store.forwarder_reports()
        reports = [report.loads for report in found]
        self.backlogs = whole_backlogs(
            ((r.forwarder_id, r.at_unix_s, r.shares) for r in found),
            {f.forwarder_id for f in forwarders},
        )
        topic_loads, subscription_loads = merge_reports(reports)
        weights = {uid: w for uid, load in topic_loads.items() if (w := weight(load)) > 1}
        subscription_weights = {
            uid: w for uid, load in subscription_loads.items() if (w := weight(load)) > 1
        }
        topics = self.names.routed_topics()
        serving = sum(1 for f in forwarders if f.subscribing and not constraints.drains(f))
        spread_only, spread_widths = self._spread(
            subscription_totals(reports), {t.uid: t.sources for t in topics}, serving
        )
        check()
        done = self.table.update(
            forwarders,
            constraints,
            topics,
            self.names.subscriptions.values(),
            time.monotonic(),
            weights,
            subscription_weights,
            spread_only,
            spread_widths,
        )
        self.generation += 1
        clocks = time.time() - time.monotonic()  # a monotonic time + this: the Unix one

        def moved_at(unit: str) -> float | None:
            moved = self.table.last_moved(unit)
            return None if moved is None else moved + clocks

        written = await self.store.write_shards(
            self.table.shards,
            done.changed_shards,
            self.generation,
            self.router_id,
            check,
            moved_at,
            self.table.spread_units.__contains__,
            self.table.spread_width,
        )
        for move in done.moves:
            if move.source is not None:
                kind = "publishing" if move.unit.startswith("p/") else "subscribing"
                MOVES.labels(kind, str(move.forced).lower()).inc()
        moved = sum(1 for m in done.moves if m.source is not None)
        self.total_moves += moved
        pub, sub = self.table.publishing, self.table.subscribing
        table = self.table
        units = {kind: table.units(kind) for kind in ("publishing", "subscribing")}
        UNITS.labels("publishing").set(units["publishing"])
        UNITS.labels("subscribing").set(units["subscribing"])
        CAPACITY.labels("publishing").set(pub.capacity)
        CAPACITY.labels("subscribing").set(sub.capacity)
        check()
        await self.store.write_summary(
            pb.RoutingSummary(
                generation=self.generation,
                router_id=self.router_id,
                at_unix_s=time.time(),
                publishing_units=units["publishing"],
                subscribing_units=units["subscribing"],
                publishing_capacity=pub.capacity,
                subscribing_capacity=sub.capacity,
                publishing_loads=table.loads("publishing"),
                subscribing_loads=table.loads("subscribing"),
                publishing_weights=table.weighted_loads("publishing"),
                subscribing_weights=table.weighted_loads("subscribing"),
                moves=moved,
                total_moves=self.total_moves,
                load_half_life_s=self.config.load_half_life_s,
            )
        )
        SPREAD.set(len({u.split("/")[1] for u in table.spread_units}))
        PASSES.inc()
        elapsed = time.monotonic() - started
        PASS_SECONDS.set(elapsed)
        self.last_pass = {
            "generation": self.generation,
            "forwarders": len(forwarders),
            "publishing_units": units["publishing"],
            "subscribing_units": units["subscribing"],
            "moves": moved,
            "heavy_topics": len(weights),
            "heavy_subscriptions": len(subscription_weights),
            "spread_subscriptions": len({u.split("/")[1] for u in table.spread_units}),
            "shards_written": written,
            "seconds": round(elapsed, 4),
        }
        if moved or written:
            log.info("router: pass %d: %s", self.generation, self.last_pass)

    def _spread(
        self, totals: dict[str, Load], sources: Mapping[str, int], serving: int
    ) -> tuple[set[str] | None, dict[str, int] | None]:
        """Spreading by load: the subscriptions to spread this pass and over how many
        forwarders each (None: every spreadable one, each source apart, or none, as
        configured). A width is at most the ``serving`` subscribing forwarders (registered,
        not drained) and the topic's ``sources``."""
        if self.spreading is None:
            return None, None
        subscriptions = [s for s in self.names.subscriptions.values() if s.spreadable]
        limits = {s.uid: min(serving, sources.get(s.topic_uid, 1)) for s in subscriptions}
        changes = self.spreading.decide(limits, totals, time.monotonic(), limits)
        for change, uids in (
            ("spread", changes.spread),
            ("gathered", changes.gathered),
            ("resized", changes.resized),
        ):
            SPREAD_CHANGES.labels(change).inc(len(uids))
            for uid in sorted(uids):
                used = self.config.spread.utilization(totals.get(uid, Load()))
                log.info(
                    "router: subscription %s %s, width %d (%.2f of a forwarder's capacity)",
                    uid,
                    change,
                    self.spreading.widths.get(uid, 1),
                    used,
                )
        return self.spreading.spread, dict(self.spreading.widths)

    def status(self) -> dict[str, Any]:
        return {
            "router_id": self.router_id,
            "zone": self.config.zone,
            "role": self.election.role,
            "version": version(),
            "topics": len(self.names.topics),
            "subscriptions": len(self.names.subscriptions),
            "total_moves": self.total_moves,
            "forwarders_declared_dead": len(self.watch.declared_dead),
            "last_pass": self.last_pass,
            "epsilon": self.config.epsilon,
            "hysteresis_s": self.config.hysteresis_s,
            "spread_subscriptions": self.config.spread_subscriptions,
            "spread": sorted({u.split("/")[1] for u in self.table.spread_units}),
            # The width of each spread subscription (how many forwarders it is placed over).
            "spread_widths": {
                u.split("/")[1]: self.table.spread_width(u) for u in self.table.spread_units
            },
            "load_half_life_s": self.config.load_half_life_s,
            "subscription_backlogs": backlog_listing(self.backlogs.values()),
        }


# The subscriptions /status lists at most (every spread one and the largest backlogs first).
STATUS_BACKLOGS = 100


def backlog_listing(
    backlogs: Iterable[WholeBacklog], limit: int = STATUS_BACKLOGS
) -> dict[str, Any]:
    """Whole backlogs as /status shows them: by subscription name, the spread ones and the
    largest first, at most ``limit``; ``left_out`` counts the rest."""
    listed = ranked(backlogs)
    return {
        "subscriptions": {b.subscription: b.as_json() for b in listed[:limit]},
        "left_out": max(0, len(listed) - limit),
    }


async def serve(config: RouterConfig) -> None:
    router = Router(config)
    await runtime.serve_until_signalled("pubsubd router", router.start, router.stop)


def run(config: RouterConfig) -> None:
    runtime.run(lambda: serve(config))
