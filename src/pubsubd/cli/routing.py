"""``pubsubd routing show|drain|undrain|pin|unpin``: the routing tier's constraints and
assignment, read and changed in the cluster's ZooKeeper (issue 11).

Constraints change by compare-and-set (``control/routing_store.py``); the leading router
applies them within a step. ``show`` prints the forwarders (zone, version, drained, units
owned), the constraints, the leading router's last pass, and each subscription's whole backlog
with which forwarder serves which of its sources (from the forwarders' load reports, a few
seconds old).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from pubsubd.cli.server_security import zookeeper_tls_options

routing_app = typer.Typer(
    no_args_is_help=True,
    help="Drain forwarders or zones, pin topics, and show who owns what (a cluster).",
)
console = Console() if sys.stdout.isatty() else Console(width=100_000)
err_console = Console(stderr=True)

T = TypeVar("T")

Cluster = Annotated[
    str,
    typer.Option("--cluster", envvar="PUBSUBD_CLUSTER", help="ZooKeeper connect string"),
]
ZkRoot = Annotated[str, typer.Option(help="the cluster's ZooKeeper root")]
Project = Annotated[str, typer.Option(envvar="PUBSUB_PROJECT_ID", help="project ID")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]


@routing_app.callback()
@zookeeper_tls_options
def _zookeeper_tls() -> None:
    """Drain forwarders or zones, pin topics, and show who owns what (a cluster). A ZooKeeper
    speaking TLS: --zk-tls-ca (and --zk-tls-cert, --zk-tls-key) before the command; its
    credential: --zk-auth-file."""


def _fail(message: str) -> None:
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(1)


def _with_store(cluster: str, root: str, action: Callable[[Any], Awaitable[T]]) -> T:
    from pubsubd.control.routing_store import RoutingStore
    from pubsubd.coordination.errors import CoordinationError, startup_failure
    from pubsubd.coordination.zk import Coordinator

    async def run() -> T:
        zk = Coordinator(cluster, root)
        await zk.start(connect_timeout=10.0)
        try:
            return await action(RoutingStore(zk))
        finally:
            await zk.stop()

    try:
        return asyncio.run(run())
    except (CoordinationError, TimeoutError) as e:
        _fail(startup_failure(f"reach ZooKeeper at {cluster} ({root})", e))
        raise AssertionError("unreachable") from None


def _topic(project: str, name: str) -> str:
    return name if name.startswith("projects/") else f"projects/{project}/topics/{name}"


async def _describe(store: Any) -> dict[str, Any]:
    from pubsubd.control.cluster_view import describe_routing

    return await describe_routing(store)


@routing_app.command()
def show(cluster: Cluster, zk_root: ZkRoot = "/pubsubd", as_json: AsJson = False) -> None:
    """The forwarders, the constraints, the leading router's last pass, and the whole backlog
    of every subscription that has one or is spread (which forwarder serves which sources)."""
    described = _with_store(cluster, zk_root, _describe)
    if as_json:
        sys.stdout.write(json.dumps(described) + "\n")
        return
    table = Table(
        "forwarder", "address", "zone", "version", "drained", "pub units", "pub weight", "sub units"
    )
    for f in described["forwarders"]:
        table.add_row(
            f["forwarder_id"],
            f["address"],
            f["zone"],
            f["version"],
            "yes" if f["drained"] else "",
            str(f["publishing_units"]),
            str(f["publishing_weight"]),
            str(f["subscribing_units"]),
        )
    console.print(table)
    c = described["constraints"]
    console.print(f"drained zones: {', '.join(c['drained_zones']) or '-'}")
    for topic, forwarder in c["pinned_topics"].items():
        console.print(f"pinned: {topic} -> {forwarder}")
    router = described["router"]
    if router is None:
        console.print("no router has published an assignment yet")
    else:
        console.print(
            f"router {router.get('router_id', '?')}: pass {router.get('generation', 0)}, "
            f"{router.get('moves', 0)} moves in it, {router.get('total_moves', 0)} in all"
        )
    print_backlogs(described["subscriptions"])


def print_backlogs(subscriptions: list[dict[str, Any]]) -> None:
    """Each subscription's whole backlog, and each forwarder's share of it."""
    if not subscriptions:
        console.print("no subscription has a backlog or is spread")
        return
    table = Table("subscription", "backlog", "bytes", "oldest (s)", "forwarder: sources (backlog)")
    for s in subscriptions:
        shares = "; ".join(
            f"{forwarder}: {_sources(share['sources'])} ({share['backlog_messages']})"
            for forwarder, share in s["forwarders"].items()
        )
        if not s["complete"]:
            shares += f" [missing {s['missing_sources']}, twice {s['doubled_sources']}]"
        table.add_row(
            s["subscription"],
            str(s["backlog_messages"]),
            str(s["backlog_bytes"]),
            str(s["oldest_unacked_age_s"]),
            shares,
        )
    console.print(table)


def _sources(sources: list[int]) -> str:
    """``0-3,6`` for [0, 1, 2, 3, 6]."""
    runs: list[str] = []
    for source in sources:
        if runs and source == int(runs[-1].rsplit("-", 1)[-1]) + 1:
            runs[-1] = f"{runs[-1].split('-')[0]}-{source}"
        else:
            runs.append(str(source))
    return ",".join(runs) or "-"


def _change(cluster: str, root: str, change: Callable[[Any], Any], as_json: bool) -> None:
    async def apply(store: Any) -> Any:
        return await store.change_constraints(change)

    result = _with_store(cluster, root, apply)
    out = {
        "drained_forwarders": sorted(result.drained),
        "drained_zones": sorted(result.drained_zones),
        "pinned_topics": dict(sorted(result.pinned_topics.items())),
    }
    if as_json:
        sys.stdout.write(json.dumps(out) + "\n")
    else:
        console.print(out)


def _drain(
    cluster: str, forwarder: str | None, zone: str | None, zk_root: str, as_json: bool, on: bool
) -> None:
    if (forwarder is None) == (zone is None):
        _fail("name a FORWARDER or a --zone")
    if zone is not None:
        _change(
            cluster, zk_root, lambda c: c.drain_zone(zone) if on else c.undrain_zone(zone), as_json
        )
    else:
        _change(
            cluster, zk_root, lambda c: c.drain(forwarder) if on else c.undrain(forwarder), as_json
        )


Forwarder = Annotated[str | None, typer.Argument(help="the forwarder's ID")]


@routing_app.command()
def drain(
    cluster: Cluster,
    forwarder: Forwarder = None,
    zone: Annotated[str | None, typer.Option(help="drain every forwarder of this zone")] = None,
    zk_root: ZkRoot = "/pubsubd",
    as_json: AsJson = False,
) -> None:
    """Move everything off a forwarder (or a zone): it owns nothing, stays a last fallback."""
    _drain(cluster, forwarder, zone, zk_root, as_json, on=True)


@routing_app.command()
def undrain(
    cluster: Cluster,
    forwarder: Forwarder = None,
    zone: Annotated[str | None, typer.Option(help="the zone to undrain")] = None,
    zk_root: ZkRoot = "/pubsubd",
    as_json: AsJson = False,
) -> None:
    """Let a drained forwarder (or zone) own units again."""
    _drain(cluster, forwarder, zone, zk_root, as_json, on=False)


@routing_app.command()
def pin(
    cluster: Cluster,
    topic: Annotated[str, typer.Argument(help="the topic (short or full name)")],
    forwarder: Annotated[str, typer.Argument(help="the forwarder's ID")],
    project: Project = "local",
    zk_root: ZkRoot = "/pubsubd",
    as_json: AsJson = False,
) -> None:
    """Keep a topic's publish message sources on one forwarder (while it is up, not drained)."""
    name = _topic(project, topic)
    _change(cluster, zk_root, lambda c: c.pin(name, forwarder), as_json)


@routing_app.command()
def unpin(
    cluster: Cluster,
    topic: Annotated[str, typer.Argument(help="the topic (short or full name)")],
    project: Project = "local",
    zk_root: ZkRoot = "/pubsubd",
    as_json: AsJson = False,
) -> None:
    """Let the router place a pinned topic again."""
    name = _topic(project, topic)
    _change(cluster, zk_root, lambda c: c.unpin(name), as_json)
