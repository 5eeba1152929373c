"""The routing tier's records in ZooKeeper (issue 11): forwarders' registrations, routing
constraints, the assignment's shards and the leading router's summary.

Every record is a protobuf of ``proto/pubsubd/internal/v1/routing.proto`` carrying the protocol
version of the process that wrote it. A record of a newer version is still read (fields are
only ever added; unknown ones are skipped by protobuf), so a canary of the next release and the
fleet read each other's records. Layout (``coordination/paths.py``)::

    routing/forwarders/<id>      ephemeral, one per forwarder process (ForwarderInfo)
    routing/loads/<id>           ephemeral, each forwarder's load per topic (LoadReport)
    routing/constraints          drains and pins (RoutingConstraints), compare-and-set
    routing/routers/candidate-N  the routers' election
    routing/assignment/<bucket>  one AssignmentShard per bucket of units (256 at most)
    routing/summary              the leading router's last pass (RoutingSummary)

A shard holds the units whose ``paths.bucket`` it is named by: a million units make shards of
a few thousand routes, well within ZooKeeper's 1 MB per znode.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from pubsubd._gen.pubsubd.internal.v1 import routing_pb2 as pb
from pubsubd.control.routing_table import Constraints, Forwarder
from pubsubd.coordination.errors import BadVersion, NodeExists, NoNode
from pubsubd.coordination.paths import bucket, unescape
from pubsubd.coordination.zk import Coordinator, ZnodeStat
from pubsubd.core.backlog_view import BacklogShare
from pubsubd.core.load import Load

log = logging.getLogger(__name__)

# 1: the first routing records.
PROTOCOL_VERSION = 1

__all__ = [
    "PROTOCOL_VERSION",
    "ForwarderReport",
    "RoutingStore",
    "decode_constraints",
    "decode_forwarder_report",
    "decode_shard",
    "encode_constraints",
    "encode_load_report",
    "encode_shard",
    "merge_reports",
    "spread_subscriptions",
    "subscription_totals",
]


def encode_forwarder(forwarder: Forwarder) -> bytes:
    info = pb.ForwarderInfo(
        protocol_version=PROTOCOL_VERSION,
        forwarder_id=forwarder.forwarder_id,
        address=forwarder.address,
        zone=forwarder.zone,
        version=forwarder.version,
        publishing=forwarder.publishing,
        subscribing=forwarder.subscribing,
    )
    return bytes(info.SerializeToString())


def decode_forwarder(data: bytes) -> Forwarder:
    info = pb.ForwarderInfo.FromString(data)
    return Forwarder(
        info.forwarder_id,
        info.address,
        info.zone,
        info.version,
        info.publishing,
        info.subscribing,
    )


@dataclass(frozen=True, slots=True)
class ForwarderReport:
    """One forwarder's last load report, decoded."""

    forwarder_id: str
    at_unix_s: float
    topics: dict[str, Load]
    subscriptions: dict[str, Load]
    # Subscription uid -> this forwarder's share of its backlog (a release before this one
    # reports none), and how many it left out (core/backlog_view.py).
    shares: dict[str, BacklogShare] = field(default_factory=dict)
    shares_left_out: int = 0

    @property
    def loads(self) -> tuple[dict[str, Load], dict[str, Load]]:
        return self.topics, self.subscriptions


def encode_load_report(
    forwarder_id: str,
    topics: Mapping[str, Load],
    at: float,
    subscriptions: Mapping[str, Load],
    shares: tuple[Mapping[str, BacklogShare], int] = ({}, 0),
) -> bytes:
    """One forwarder's LoadReport: its loads, and its backlog shares with how many it left
    out."""
    report = pb.LoadReport(
        protocol_version=PROTOCOL_VERSION,
        forwarder_id=forwarder_id,
        at_unix_s=at,
        backlogs_left_out=shares[1],
    )
    for into, loads in ((report.topics, topics), (report.subscriptions, subscriptions)):
        for uid, load in loads.items():
            entry = into[uid]
            entry.messages_per_s = load.messages_per_s
            entry.bytes_per_s = load.bytes_per_s
            entry.outstanding_messages = load.outstanding
    for uid, share in shares[0].items():
        report.backlogs[uid].CopyFrom(
            pb.BacklogShare(
                subscription=share.subscription,
                sources=share.sources,
                topic_sources=share.topic_sources,
                messages=share.messages,
                bytes=share.bytes,
                oldest_unacked_age_s=share.oldest_unacked_age_s,
                spread=share.spread,
            )
        )
    return bytes(report.SerializeToString())


def decode_load_report(data: bytes) -> tuple[dict[str, Load], dict[str, Load]]:
    """(topic loads, subscription loads) of one forwarder's LoadReport; DecodeError if the
    bytes are not one."""
    return decode_forwarder_report(data).loads


def decode_forwarder_report(data: bytes) -> ForwarderReport:
    """One forwarder's LoadReport; DecodeError if the bytes are not one."""
    report = pb.LoadReport.FromString(data)
    return ForwarderReport(
        report.forwarder_id,
        report.at_unix_s,
        {uid: _load(entry) for uid, entry in report.topics.items()},
        {uid: _load(entry) for uid, entry in report.subscriptions.items()},
        {uid: _share(entry) for uid, entry in report.backlogs.items()},
        report.backlogs_left_out,
    )


def _share(entry: pb.BacklogShare) -> BacklogShare:
    return BacklogShare(
        subscription=entry.subscription,
        sources=tuple(entry.sources),
        topic_sources=entry.topic_sources,
        messages=entry.messages,
        bytes=entry.bytes,
        oldest_unacked_age_s=entry.oldest_unacked_age_s,
        spread=entry.spread,
    )


def merge_reports(
    reports: Iterable[tuple[Mapping[str, Load], Mapping[str, Load]]],
) -> tuple[dict[str, Load], dict[str, Load]]:
    """(topic loads, subscription loads) of many forwarders' reports; a uid two of them report
    (it is moving) has the larger of each figure."""
    topics: dict[str, Load] = {}
    subscriptions: dict[str, Load] = {}
    for found_topics, found_subscriptions in reports:
        for found, into in ((found_topics, topics), (found_subscriptions, subscriptions)):
            for uid, load in found.items():
                seen = into.get(uid)
                into[uid] = load if seen is None else seen.larger(load)
    return topics, subscriptions


def subscription_totals(
    reports: Iterable[tuple[Mapping[str, Load], Mapping[str, Load]]],
) -> dict[str, Load]:
    """Each subscription's load summed over the forwarders that report it (a spread one is
    served by several; what spreading decides by, ``core/subscription_spread.py``)."""
    out: dict[str, Load] = {}
    for _, subscriptions in reports:
        for uid, load in subscriptions.items():
            seen = out.get(uid)
            out[uid] = load if seen is None else seen.plus(load)
    return out


def _load(entry: pb.Load) -> Load:
    return Load(entry.messages_per_s, entry.bytes_per_s, entry.outstanding_messages)


def encode_constraints(constraints: Constraints) -> bytes:
    msg = pb.RoutingConstraints(
        protocol_version=PROTOCOL_VERSION,
        drained_forwarders=sorted(constraints.drained),
        drained_zones=sorted(constraints.drained_zones),
        pinned_topics=dict(constraints.pinned_topics),
    )
    return bytes(msg.SerializeToString())


def encode_shard(
    routes: Mapping[str, tuple[str, ...]],
    generation: int,
    router_id: str,
    moved_at: Callable[[str], float | None],
    spread: Callable[[str], bool] = lambda _: False,
    spread_width: Callable[[str], int] = lambda _: 0,
) -> bytes:
    shard = pb.AssignmentShard(
        protocol_version=PROTOCOL_VERSION, generation=generation, router_id=router_id
    )
    for unit, route in sorted(routes.items()):
        moved = moved_at(unit)
        shard.routes.append(
            pb.Route(
                unit=unit,
                forwarders=route,
                moved_at_unix_s=moved if moved else 0.0,
                spread=spread(unit),
                spread_width=spread_width(unit),
            )
        )
    return bytes(shard.SerializeToString())


def decode_shard(data: bytes) -> dict[str, tuple[tuple[str, ...], float | None]]:
    """unit -> (its ordered forwarders, when it last moved or None)."""
    return {
        r.unit: (tuple(r.forwarders), r.moved_at_unix_s or None)
        for r in pb.AssignmentShard.FromString(data).routes
    }


def spread_subscriptions(data: bytes) -> dict[str, int]:
    """The uids of the subscriptions a shard has spread units of (``Route.spread``), with
    their widths (``Route.spread_width``; 0: every source apart, or not published)."""
    return {
        r.unit.split("/")[1]: r.spread_width
        for r in pb.AssignmentShard.FromString(data).routes
        if r.spread and r.unit.startswith("s/")
    }


def decode_constraints(data: bytes) -> Constraints:
    if not data:
        return Constraints()
    msg = pb.RoutingConstraints.FromString(data)
    return Constraints(
        frozenset(msg.drained_forwarders),
        frozenset(msg.drained_zones),
        dict(msg.pinned_topics),
    )


class RoutingStore:
    """Reads and writes the routing records of one cluster."""

    def __init__(self, zk: Coordinator) -> None:
        self._zk = zk
        self._layout = zk.layout

    # -- forwarders ------------------------------------------------------------------------

    async def forwarder_entries(self) -> list[tuple[Forwarder, str, ZnodeStat]]:
        """The registered forwarders with their registration znode's path and stat (whose
        ``ephemeral_owner`` is the forwarder's ZooKeeper session)."""
        try:
            names = sorted(await self._zk.children(self._layout.forwarders))
        except NoNode:
            return []
        paths = [f"{self._layout.forwarders}/{n}" for n in names]
        out = []
        for path, got in zip(paths, await self._zk.get_many(paths), strict=True):
            if got is None:
                continue
            try:
                out.append((decode_forwarder(got[0]), path, got[1]))
            except Exception as e:
                log.warning("forwarder registration %s unreadable: %s", path, e)
        return out

    async def forwarders(self) -> list[Forwarder]:
        """The registered forwarders, by ID."""
        try:
            names = await self._zk.children(self._layout.forwarders)
        except NoNode:
            return []
        paths = [f"{self._layout.forwarders}/{n}" for n in sorted(names)]
        out = []
        for name, got in zip(sorted(names), await self._zk.get_many(paths), strict=True):
            if got is None:
                continue  # gone between the two reads
            try:
                out.append(decode_forwarder(got[0]))
            except Exception as e:  # a record we cannot read must not stop routing
                log.warning("forwarder registration %s unreadable: %s", unescape(name), e)
        return out

    # -- constraints -----------------------------------------------------------------------

    async def constraints(self) -> tuple[Constraints, int]:
        """The constraints and their znode version (-1: none written yet)."""
        try:
            data, stat = await self._zk.get(self._layout.routing_constraints)
        except NoNode:
            return Constraints(), -1
        return decode_constraints(data), stat.version

    async def change_constraints(self, change: Callable[[Constraints], Constraints]) -> Constraints:
        """Apply ``change`` by compare-and-set, again on a conflict; returns the result."""
        path = self._layout.routing_constraints
        while True:
            current, version = await self.constraints()
            wanted = change(current)
            data = encode_constraints(wanted)
            try:
                if version < 0:
                    await self._zk.create(path, data)
                else:
                    await self._zk.set(path, data, version)
            except (BadVersion, NodeExists):
                continue  # someone else changed them meanwhile
            return wanted

    # -- the assignment --------------------------------------------------------------------

    async def write_shards(
        self,
        shards: Mapping[str, Mapping[str, tuple[str, ...]]],
        changed: frozenset[str],
        generation: int,
        router_id: str,
        check: Callable[[], None],
        moved_at: Callable[[str], float | None] = lambda _: None,
        spread: Callable[[str], bool] = lambda _: False,
        spread_width: Callable[[str], int] = lambda _: 0,
    ) -> int:
        """Write the ``changed`` shards (an empty one is deleted); ``check()`` before each
        write (it raises when this router stopped leading). ``moved_at(unit)``: when it last
        changed owner, Unix seconds (None: not since placed); ``spread(unit)``: whether it is
        a spread subscription's unit, ``spread_width(unit)`` that subscription's width.
        Returns the shards written."""
        written = 0
        for shard in sorted(changed):
            check()
            path = self._layout.routing_shard(shard)
            routes = shards.get(shard)
            if not routes:
                with contextlib.suppress(NoNode):
                    await self._zk.delete(path)
                written += 1
                continue
            data = encode_shard(routes, generation, router_id, moved_at, spread, spread_width)
            try:
                await self._zk.set(path, data)
            except NoNode:
                await self._zk.create(path, data)
            written += 1
        return written

    async def routes(self) -> dict[str, tuple[str, ...]]:
        """Every unit's ordered list of forwarders, as the leading router last wrote them."""
        return {unit: route for unit, (route, _) in (await self.assignment()).items()}

    async def current_routes(self, units: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The routes of ``units`` as ZooKeeper has them now: after a sync, so every write
        completed before the call is seen; only their shards are read (a unit not routed:
        absent)."""
        wanted = set(units)
        await self._zk.sync(self._layout.routing_shards)
        paths = [self._layout.routing_shard(b) for b in sorted({bucket(u) for u in wanted})]
        out: dict[str, tuple[str, ...]] = {}
        for got in await self._zk.get_many(paths):
            if got is not None:
                out.update((u, r) for u, (r, _) in decode_shard(got[0]).items() if u in wanted)
        return out

    async def assignment(
        self, spread: dict[str, int] | None = None
    ) -> dict[str, tuple[tuple[str, ...], float | None]]:
        """Every unit's ordered list and when it last moved (Unix seconds; None: not since
        placed), as the leading router last wrote them; ``spread`` gets the uids of the
        subscriptions spread there and their widths (0: not published)."""
        try:
            names = await self._zk.children(self._layout.routing_shards)
        except NoNode:
            return {}
        out: dict[str, tuple[tuple[str, ...], float | None]] = {}
        paths = [self._layout.routing_shard(n) for n in sorted(names)]
        for got in await self._zk.get_many(paths):
            if got is not None:
                out.update(decode_shard(got[0]))
                if spread is not None:
                    spread.update(spread_subscriptions(got[0]))
        return out

    # -- load reports --------------------------------------------------------------------

    async def write_load(
        self,
        forwarder_id: str,
        topics: Mapping[str, Load],
        at: float,
        subscriptions: Mapping[str, Load] | None = None,
        shares: tuple[Mapping[str, BacklogShare], int] = ({}, 0),
    ) -> None:
        """This forwarder's load per topic and per subscription it serves, and its shares of
        their backlogs with how many it left out (ephemeral: gone with its session, and made
        again by the next report after a new one)."""
        data = encode_load_report(forwarder_id, topics, at, subscriptions or {}, shares)
        path = self._layout.forwarder_load(forwarder_id)
        try:
            await self._zk.set(path, data)
        except NoNode:
            with contextlib.suppress(NodeExists):  # made meanwhile: the next report sets it
                await self._zk.create(path, data, ephemeral=True)

    async def topic_loads(self) -> dict[str, Load]:
        """Every topic's load as the forwarders last reported it; a topic two of them report
        (it is moving) has the larger of each figure."""
        return (await self.loads())[0]

    async def reports(self) -> list[tuple[dict[str, Load], dict[str, Load]]]:
        """Each forwarder's last report: (topic loads, subscription loads)."""
        return [report.loads for report in await self.forwarder_reports()]

    async def forwarder_reports(self) -> list[ForwarderReport]:
        """Each forwarder's last report, whole."""
        try:
            names = sorted(await self._zk.children(self._layout.forwarder_loads))
        except NoNode:
            return []
        out = []
        paths = [f"{self._layout.forwarder_loads}/{n}" for n in names]
        for name, got in zip(names, await self._zk.get_many(paths), strict=True):
            if got is None:
                continue
            try:
                out.append(decode_forwarder_report(got[0]))
            except DecodeError as e:  # a report we cannot read must not stop routing
                log.warning("load report %s unreadable: %s", unescape(name), e)
        return out

    async def loads(self) -> tuple[dict[str, Load], dict[str, Load]]:
        """(topic loads, subscription loads) as the forwarders last reported them; one two of
        them report (it is moving) has the larger of each figure."""
        return merge_reports(await self.reports())

    async def write_summary(self, summary: pb.RoutingSummary) -> None:
        summary.protocol_version = PROTOCOL_VERSION
        data = summary.SerializeToString()
        try:
            await self._zk.set(self._layout.routing_summary, data)
        except NoNode:
            await self._zk.create(self._layout.routing_summary, data)

    async def load_half_life(self) -> float | None:
        """The half-life of the load EWMAs the leading router asks for (None: it says none,
        or no router has published a summary yet)."""
        try:
            summary = await self.summary()
        except DecodeError:
            return None
        return (summary.load_half_life_s or None) if summary is not None else None

    async def summary(self) -> pb.RoutingSummary | None:
        try:
            data, _ = await self._zk.get(self._layout.routing_summary)
        except NoNode:
            return None
        summary: pb.RoutingSummary = pb.RoutingSummary.FromString(data)
        return summary
