"""``pubsubd cluster up|down|status|kill|restart``: a local cluster for tests and trials."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

cluster_app = typer.Typer(
    no_args_is_help=True,
    help="Run a cluster on this machine: ZooKeeper, storage nodes and a serving process.",
)
console = Console() if sys.stdout.isatty() else Console(width=100_000)
err_console = Console(stderr=True)

DataDir = Annotated[
    Path, typer.Option("--data-dir", help="the cluster's directory (state, data, logs)")
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]


def _fail(e: Exception) -> None:
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
    raise typer.Exit(1)


def _print_processes(described: dict[str, Any]) -> None:
    table = Table("role", "name", "pid", "address", "zone", "log")
    for p in described["processes"]:
        table.add_row(p["role"], p["name"], str(p["pid"] or "-"), p["address"], p["zone"], p["log"])
    console.print(table)


@cluster_app.command()
def up(
    data_dir: DataDir,
    zk_nodes: Annotated[int, typer.Option(help="ZooKeeper nodes (1 or 3)")] = 3,
    storage_nodes: Annotated[int, typer.Option(help="storage nodes")] = 3,
    zones: Annotated[int, typer.Option(help="zones the storage nodes are spread over")] = 3,
    disks: Annotated[int, typer.Option(help="data directories (disks) per storage node")] = 1,
    replicas: Annotated[int, typer.Option(help="storage nodes per ledger")] = 3,
    routers: Annotated[int, typer.Option(help="routers (active/standby)")] = 2,
    frontends: Annotated[
        int, typer.Option(help="frontends clients connect to (0: the serving process itself)")
    ] = 2,
    forwarders: Annotated[
        int,
        typer.Option(
            help="forwarders sharing the topics as the routers assign them, over two zones "
            "(0: one serving process owns every topic)"
        ),
    ] = 3,
    publishing_only: Annotated[
        int,
        typer.Option(
            help="of the forwarders, how many own topics only (--no-subscribing): the routers "
            "then place subscriptions apart from their topics"
        ),
    ] = 0,
    subscribing_only: Annotated[
        int,
        typer.Option(
            help="of the forwarders, how many serve subscriptions only (--no-publishing), "
            "reading their topics from copies"
        ),
    ] = 0,
    spread_subscriptions: Annotated[
        bool,
        typer.Option(
            help="the routers spread busy shared subscriptions over the subscribing forwarders "
            "by source (pubsubd router --spread-subscriptions; PUBSUBD_SPREAD_* settings)"
        ),
    ] = False,
    spread_all: Annotated[
        bool,
        typer.Option(
            help="the routers spread every shared subscription, whatever its load "
            "(pubsubd router --spread-all)"
        ),
    ] = False,
    load_half_life: Annotated[
        float | None,
        typer.Option(
            help="s: the half-life of the load EWMAs the forwarders report, given to every "
            "router (pubsubd router --load-half-life; default the router's, 10 s)"
        ),
    ] = None,
    probers: Annotated[
        int, typer.Option(help="probers (pubsubd prober) through every frontend")
    ] = 1,
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            help="TLS on every process's ports with `pubsubd certs dev` files here (made if "
            "missing); clients trust DIR/ca.pem"
        ),
    ] = None,
    tokens: Annotated[
        bool,
        typer.Option(
            "--tokens",
            help="authentication on: a secret and an admin token made under DATA_DIR/auth "
            "(the token printed with --json), forwarders calling each other with their own",
        ),
    ] = False,
    iam: Annotated[
        bool,
        typer.Option("--iam", help="with --tokens: IAM on too, the admin token's subject an admin"),
    ] = False,
    zk_auth: Annotated[
        bool,
        typer.Option(
            "--zk-auth",
            help="ZooKeeper digest authentication: a credential made at "
            "DATA_DIR/zookeeper.credential (0600) and given to every process (--zk-auth-file); "
            "the znodes they create are readable and writable with it only",
        ),
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Start a cluster on loopback and print where clients connect."""
    from pubsubd.cluster.launcher import ClusterError, LocalCluster
    from pubsubd.coordination.ensemble import EnsembleError, ZooKeeperMissing

    if (
        publishing_only + subscribing_only > forwarders
        or min(publishing_only, subscribing_only) < 0
    ):
        _fail(ValueError("--publishing-only and --subscribing-only count among --forwarders"))
        return
    if load_half_life is not None:
        from pubsubd.core.load import valid_half_life

        try:
            valid_half_life(load_half_life)
        except ValueError as e:
            _fail(e)
            return
    roles = [
        ["--no-subscribing"] * (i < publishing_only)
        + ["--no-publishing"] * (i >= forwarders - subscribing_only)
        for i in range(forwarders)
    ]
    if tls_dir is not None and not (tls_dir / "ca.pem").exists():
        from pubsubd.cli.security import write_dev_certs

        write_dev_certs(tls_dir)
    try:
        cluster = LocalCluster(data_dir).up(
            zk_nodes=zk_nodes,
            storage_nodes=storage_nodes,
            zones=zones,
            disks=disks,
            replicas=replicas,
            routers=routers,
            frontends=frontends,
            forwarders=forwarders,
            forwarder_args=roles,
            router_args=[
                *(
                    ["--spread-all"]
                    if spread_all
                    else ["--spread-subscriptions"]
                    if spread_subscriptions
                    else []
                ),
                *(["--load-half-life", str(load_half_life)] if load_half_life is not None else []),
            ],
            probers=probers,
            tls_dir=tls_dir,
            tokens=tokens,
            iam=iam,
            zk_auth=zk_auth,
        )
    except (ClusterError, EnsembleError, ZooKeeperMissing, OSError) as e:
        _fail(e)
        return
    described = cluster.described()
    if as_json:
        sys.stdout.write(json.dumps(described) + "\n")
        return
    _print_processes(described)
    listed: list[str] = described["frontends"]
    host = f"ipv4:{','.join(listed)}" if len(listed) > 1 else described["grpc"]
    if described["tls_ca"]:
        console.print(
            f'clients: TLS to {host}, trusting {described["tls_ca"]} (README, "TLS and '
            'authentication"; PUBSUB_EMULATOR_HOST is plaintext only)'
        )
    else:
        console.print(f"clients: export PUBSUB_EMULATOR_HOST={host}")
    if described["token_file"]:
        console.print(
            f"clients: send the bearer token in {described['token_file']} "
            '(pubsubd --token-file FILE ...; README, "TLS and authentication")'
        )


@cluster_app.command()
def down(data_dir: DataDir, as_json: AsJson = False) -> None:
    """Stop exactly the processes the cluster in DATA_DIR recorded."""
    from pubsubd.cluster.launcher import ClusterError, LocalCluster

    try:
        stopped = LocalCluster.load(data_dir).down()
    except ClusterError as e:
        _fail(e)
        return
    if as_json:
        sys.stdout.write(json.dumps({"stopped": stopped}) + "\n")
    else:
        console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@cluster_app.command()
def status(data_dir: DataDir, as_json: AsJson = False) -> None:
    """Processes, zones, ledgers and the under-replicated count of the cluster in DATA_DIR,
    its forwarders and routers, and each subscription's whole backlog (as routing show)."""
    from pubsubd.cli.routing import print_backlogs
    from pubsubd.cluster.launcher import ClusterError, LocalCluster
    from pubsubd.cluster.status import cluster_status

    try:
        cluster = LocalCluster.load(data_dir)
        described = cluster.described()
        described["storage"] = (
            cluster_status(cluster.zk, tls=cluster.zk_tls, auth=cluster.zk_credential)
            if cluster.zk
            else {}
        )
    except (ClusterError, ValueError) as e:
        _fail(e)
        return
    if as_json:
        sys.stdout.write(json.dumps(described) + "\n")
        return
    _print_processes(described)
    storage = described["storage"]
    if storage.get("error"):
        console.print(f"ZooKeeper: {storage['error']}")
        return
    console.print(
        f"storage nodes: {len(storage['nodes'])}, ledgers: {storage['ledgers']}, "
        f"under-replicated: {storage['under_replicated']}"
    )
    repair = storage.get("repair") or {}
    if repair.get("candidates"):
        console.print(
            f"repair auditor: {repair.get('auditor')}; passes {repair.get('passes', 0)}, "
            f"ledgers repaired {repair.get('ledgers_repaired', 0)}, "
            f"bytes copied {repair.get('bytes_copied', 0)}"
        )
    routing = storage.get("routing") or {}
    router = routing.get("router")
    console.print(
        f"forwarders: {len(routing.get('forwarders', []))}; "
        + (
            "no router has published an assignment"
            if router is None
            else f"router {router['router_id']}: {router['publishing_units']} publishing and "
            f"{router['subscribing_units']} subscribing units, {router['total_moves']} moves"
        )
    )
    if "subscriptions" in routing:  # each subscription's whole backlog, as routing show has it
        print_backlogs(routing["subscriptions"])


@cluster_app.command()
def kill(
    data_dir: DataDir,
    name: Annotated[str, typer.Argument(help="process name, e.g. storage-2 or serve")],
) -> None:
    """kill -9 one process of the cluster (fault trials)."""
    from pubsubd.cluster.launcher import ClusterError, LocalCluster

    try:
        LocalCluster.load(data_dir).kill(name)
    except ClusterError as e:
        _fail(e)


@cluster_app.command()
def restart(
    data_dir: DataDir,
    name: Annotated[
        str | None, typer.Argument(help="process name, e.g. storage-2 or serve")
    ] = None,
    rolling: Annotated[
        bool,
        typer.Option(
            "--rolling", help="restart every process, one at a time, each once the last is ready"
        ),
    ] = False,
) -> None:
    """Start a stopped process of the cluster again with its recorded arguments, or
    (--rolling) restart every process in turn."""
    from pubsubd.cluster.launcher import ClusterError, LocalCluster

    if rolling == (name is not None):
        _fail(ClusterError("name a stopped process, or give --rolling"))
    try:
        cluster = LocalCluster.load(data_dir)
        if name is not None:
            cluster.restart(name)
        else:
            cluster.rolling_restart(each=lambda n: console.print(f"restarted {n}"))
    except ClusterError as e:
        _fail(e)
