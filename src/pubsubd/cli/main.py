"""The ``pubsubd`` command: run the server, and manage topics and subscriptions from a shell.

Client commands talk to a running server through the official Google client (gRPC), at
``--endpoint`` or ``PUBSUB_EMULATOR_HOST`` (default 127.0.0.1:8085), in project ``--project`` or
``PUBSUB_PROJECT_ID`` (default ``local``); ``cursors`` commands call pubsubd's replay API
(``pubsubd.v1.Replay``) on the same endpoint. Every command prints a human-readable table, or
JSON with ``--json``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pubsubd import config as config_mod
from pubsubd.cli.cluster import cluster_app
from pubsubd.cli.routing import routing_app
from pubsubd.cli.security import certs_app, tokens_app
from pubsubd.cli.server_security import (
    NO_FLAGS,
    InternalTokenGrace,
    NodeInternalTokenFile,
    SecurityFlags,
    internal_tls,
    security_options,
    server_tls,
    zookeeper_tls_options,
)
from pubsubd.cli.slo import alerts, slo_app
from pubsubd.core.internal_token import DEFAULT_GRACE_S
from pubsubd.core.load import HALF_LIFE_S
from pubsubd.core.subscription_spread import (
    SPREAD_ALL,
    SPREAD_BY_LOAD,
    SPREAD_OFF,
    SpreadSettings,
)
from pubsubd.storage.log import FsyncPolicy

app = typer.Typer(no_args_is_help=True, add_completion=False, help="pubsubd: pub/sub and queues.")
topics_app = typer.Typer(no_args_is_help=True, help="Create, list and delete topics.")
subs_app = typer.Typer(no_args_is_help=True, help="Create, list and delete subscriptions.")
cursors_app = typer.Typer(
    no_args_is_help=True, help="List and delete the replay API's named cursors (they pin data)."
)
app.add_typer(topics_app, name="topics")
app.add_typer(subs_app, name="subscriptions")
app.add_typer(cursors_app, name="cursors")
app.add_typer(cluster_app, name="cluster")
app.add_typer(routing_app, name="routing")
app.add_typer(slo_app, name="slo")
app.add_typer(certs_app, name="certs")
app.add_typer(tokens_app, name="tokens")
app.command("alerts")(alerts)


@app.callback()
def _client_security(
    ca_file: Annotated[
        Path | None,
        typer.Option(
            envvar="PUBSUBD_CA_FILE",
            help="client commands: speak TLS to the server, trusting this CA (PEM)",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="PUBSUBD_TOKEN", help="client commands: send this bearer token (authentication)"
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="PUBSUBD_TOKEN_FILE", help="client commands: send the bearer token in this file"
        ),
    ] = None,
) -> None:
    """pubsubd: pub/sub and queues. Client commands reach the server with --ca-file (TLS)
    and --token / --token-file (authentication), given before the command."""
    from pubsubd.core.client_security import ClientSecurity

    global _SECURITY
    try:
        _SECURITY = ClientSecurity(ca_file, token, token_file)
    except ValueError as e:
        _fail(e)


# Piped output is not cut to 80 columns: names must stay whole for grep and scripts.
console = Console() if sys.stdout.isatty() else Console(width=100_000)
err_console = Console(stderr=True)
# How client commands reach the server (TLS, a token): set by the global options.
_SECURITY: Any = None

Endpoint = Annotated[
    str,
    typer.Option(envvar="PUBSUB_EMULATOR_HOST", help="host:port of the pubsubd gRPC endpoint"),
]
Project = Annotated[str, typer.Option(envvar="PUBSUB_PROJECT_ID", help="project ID")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
ClusterOption = Annotated[
    str, typer.Option("--cluster", envvar="PUBSUBD_CLUSTER", help="ZooKeeper connect string")
]
ZkSessionOption = Annotated[
    float, typer.Option(envvar="PUBSUBD_ZK_SESSION_TIMEOUT_S", help="ZooKeeper session, s")
]


@app.command()
@zookeeper_tls_options
@security_options(internal_token=True)
def serve(
    port: Annotated[int | None, typer.Option(help="gRPC port (0 = any free port)")] = None,
    http_port: Annotated[
        int | None, typer.Option(help="HTTP port for /healthz and /metrics (0 = any, -1 = off)")
    ] = None,
    host: Annotated[str | None, typer.Option(help="address to bind")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="where storage lives")] = None,
    fsync: Annotated[
        FsyncPolicy | None,
        typer.Option(help="always: fsync before each publish ack (default); interval; never"),
    ] = None,
    log_level: Annotated[str, typer.Option(envvar="PUBSUBD_LOG_LEVEL")] = "INFO",
    cluster: Annotated[
        str | None,
        typer.Option(
            help="ZooKeeper connect string: metadata in ZooKeeper, messages on storage nodes"
        ),
    ] = None,
    pulsar_port: Annotated[
        int | None,
        typer.Option(help="Pulsar binary protocol port (default 6650; 0 = any, -1 = off)"),
    ] = None,
    zk_root: Annotated[str | None, typer.Option(help="the cluster's ZooKeeper root")] = None,
    replicas: Annotated[
        int | None, typer.Option(help="storage nodes per ledger (cluster; default 3)")
    ] = None,
    zone: Annotated[
        str | None, typer.Option(help="this server's zone as a forwarder (cluster)")
    ] = None,
    slo: Annotated[
        Path | None,
        typer.Option(help="SLO file for /alerts and the SLIs (TOML or JSON; `pubsubd slo show`)"),
    ] = None,
    prober_interval: Annotated[
        float | None,
        typer.Option(help="probe this server's own endpoint every N seconds (0 = off, default)"),
    ] = None,
    prober_token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="PUBSUBD_PROBER_TOKEN_FILE",
            help="with authentication on: the bearer token the in-server prober sends (a file)",
        ),
    ] = None,
    security: SecurityFlags = NO_FLAGS,
) -> None:
    """Run every role of the service in one process: with embedded storage, or (--cluster)
    over ZooKeeper and storage nodes. TLS and authentication are off unless --tls-* and
    --auth-* say otherwise (README, "TLS and authentication")."""
    from pubsubd import app as server_app
    from pubsubd.observability.logging import setup
    from pubsubd.observability.slo import SloFileError, load_slo

    setup(log_level)
    cfg = _server_config(port, http_port, host, data_dir, fsync, cluster, zk_root, replicas, zone)
    if slo is not None:
        cfg = replace(cfg, slo_file=slo)
    if prober_interval is not None:
        cfg = replace(cfg, prober_interval_s=prober_interval)
    if prober_token_file is not None:
        cfg = replace(cfg, prober_token_file=prober_token_file)
    if pulsar_port is not None:
        cfg = replace(cfg, pulsar_port=pulsar_port)
    try:
        cfg = security.apply(cfg)
        if cfg.tokens is not None and cfg.prober_interval_s > 0 and cfg.prober_token_file is None:
            raise ValueError(
                "--prober-interval with authentication needs --prober-token-file "
                "(the token its probes carry)"
            )
        if cfg.prober_token_file is not None:
            from pubsubd.core.client_security import ClientSecurity

            ClientSecurity(token_file=cfg.prober_token_file)  # a missing file fails here
    except ValueError as e:
        _fail(e)
    try:
        load_slo(cfg.slo_file)  # a bad file stops here, with its error, before anything starts
    except SloFileError as e:
        _fail(e)
    server_app.run(cfg)


def _server_config(
    port: int | None,
    http_port: int | None,
    host: str | None,
    data_dir: Path | None,
    fsync: FsyncPolicy | None,
    cluster: str | None,
    zk_root: str | None,
    replicas: int | None,
    zone: str | None,
    *,
    assigned: bool = False,
    forwarder_id: str | None = None,
    publishing: bool = True,
    subscribing: bool = True,
) -> config_mod.ServerConfig:
    """``serve``'s and ``forwarder``'s flags over the environment (config.py)."""
    cfg = config_mod.from_env()
    storage = cfg.storage
    if data_dir is not None:
        storage = replace(storage, data_dir=data_dir)
    if fsync is not None:
        storage = replace(storage, fsync=fsync)
    cfg = replace(
        cfg,
        host=host if host is not None else cfg.host,
        port=port if port is not None else cfg.port,
        http_port=http_port if http_port is not None else cfg.http_port,
        storage=storage,
    )
    if cluster is not None:  # the flag over PUBSUBD_CLUSTER, with the other PUBSUBD_ settings
        cfg = replace(
            cfg, cluster=config_mod.from_env({**os.environ, "PUBSUBD_CLUSTER": cluster}).cluster
        )
    if cfg.cluster is not None:
        base = cfg.cluster
        cfg = replace(
            cfg,
            cluster=replace(
                base,
                root=zk_root if zk_root is not None else base.root,
                replicas=replicas if replicas is not None else base.replicas,
                zone=zone if zone is not None else base.zone,
                assigned=assigned,
                forwarder_id=forwarder_id if forwarder_id is not None else base.forwarder_id,
                publishing=publishing,
                subscribing=subscribing,
            ),
        )
    return cfg


@app.command()
@zookeeper_tls_options
@security_options(internal_token=True)
def forwarder(
    cluster: Annotated[
        str, typer.Option(envvar="PUBSUBD_CLUSTER", help="ZooKeeper connect string")
    ],
    port: Annotated[int | None, typer.Option(help="gRPC port (0 = any free port)")] = None,
    http_port: Annotated[
        int | None, typer.Option(help="HTTP port for /healthz and /metrics (0 = any, -1 = off)")
    ] = None,
    host: Annotated[str | None, typer.Option(help="address to bind")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="where the local copies live")] = None,
    log_level: Annotated[str, typer.Option(envvar="PUBSUBD_LOG_LEVEL")] = "INFO",
    zk_root: Annotated[str | None, typer.Option(help="the cluster's ZooKeeper root")] = None,
    replicas: Annotated[
        int | None, typer.Option(help="storage nodes per ledger (default 3)")
    ] = None,
    zone: Annotated[str | None, typer.Option(help="this forwarder's zone")] = None,
    forwarder_id: Annotated[
        str | None,
        typer.Option(envvar="PUBSUBD_FORWARDER_ID", help="default: hostname-port"),
    ] = None,
    publishing: Annotated[
        bool, typer.Option(help="own publish message sources (topics) the routers assign")
    ] = True,
    subscribing: Annotated[
        bool, typer.Option(help="serve subscriptions the routers assign")
    ] = True,
    security: SecurityFlags = NO_FLAGS,
) -> None:
    """A forwarder of a cluster: serves the topics and subscriptions the routers' assignment
    gives it, taking them over and handing them on as the assignment moves; calls for others
    answer UNAVAILABLE (frontends route them). Both kinds by default, where a subscription goes
    with its topic; with ``--no-publishing`` or ``--no-subscribing`` somewhere, the routers
    place subscriptions apart from their topics, read over the network."""
    if not (publishing or subscribing):
        raise typer.BadParameter("a forwarder serves publishing, subscribing or both")
    from pubsubd import app as server_app
    from pubsubd.observability.logging import setup

    setup(log_level)
    cfg = _server_config(
        port,
        http_port,
        host,
        data_dir,
        None,
        cluster,
        zk_root,
        replicas,
        zone,
        assigned=True,
        forwarder_id=forwarder_id,
        publishing=publishing,
        subscribing=subscribing,
    )
    # No Pulsar front on a forwarder: its LOOKUP would have to name the topic's owner, which
    # is not built (README, "Not built yet"); several forwarders on a host would collide on 6650.
    cfg = replace(cfg, pulsar_port=-1)
    try:
        cfg = security.apply(cfg, forwarder=True)
    except ValueError as e:
        _fail(e)
    server_app.run(cfg)


@app.command()
@zookeeper_tls_options
@security_options(tls_ca=False, iam=False)
def storage(
    data_dir: Annotated[
        list[Path],
        typer.Option(help="a data directory (one per disk; repeat it: M disks, majority writes)"),
    ],
    port: Annotated[int, typer.Option(help="gRPC port (0 = any free port)")] = 0,
    zone: Annotated[str, typer.Option(help="the node's failure domain")] = "default",
    node_id: Annotated[
        str | None,
        typer.Option(help="default: the ID kept in the first data dir, else hostname-port"),
    ] = None,
    zk: Annotated[
        str | None, typer.Option(help="ZooKeeper connect string: register in the cluster")
    ] = None,
    zk_root: Annotated[str, typer.Option(help="the cluster's ZooKeeper root")] = "/pubsubd",
    zk_session_timeout: Annotated[
        float,
        typer.Option(
            envvar="PUBSUBD_ZK_SESSION_TIMEOUT_S",
            help="ZooKeeper session timeout, s: how long a vanished node stays registered",
        ),
    ] = 10.0,
    http_port: Annotated[
        int, typer.Option(help="HTTP port for /healthz, /metrics, /status (0 = any, -1 = off)")
    ] = -1,
    append_port: Annotated[
        int,
        typer.Option(
            help="TCP port of the append port, the writers' fast path (0 = any, -1 = off: "
            "appends over gRPC only)"
        ),
    ] = 0,
    log_level: Annotated[str, typer.Option(envvar="PUBSUBD_LOG_LEVEL")] = "INFO",
    internal_token_file: NodeInternalTokenFile = None,
    internal_token_grace: InternalTokenGrace = None,
    security: SecurityFlags = NO_FLAGS,
) -> None:
    """Run a storage node: ledgers on its data directories, served to the cluster over gRPC
    (with --tls-*: TLS on its gRPC, append and HTTP ports; --tls-client-ca: mutual TLS; with
    --auth-*: every call and append connection needs a valid bearer token of the subject of
    --internal-token-file, the token the writers send)."""
    from pubsubd.observability.logging import setup
    from pubsubd.storagenode.main import StartupError, StorageNodeConfig, run

    setup(log_level)
    try:
        f = security
        tls = server_tls(f.tls_cert, f.tls_key, f.tls_client_ca)
        tokens = config_mod.token_settings(
            f.auth_secret_file,
            f.auth_public_key,
            f.auth_tokens_file,
            f.auth_audience,
            f.auth_issuer,
        )
    except ValueError as e:
        _fail(e)
    config = StorageNodeConfig(
        tls=tls,
        tokens=tokens,
        internal_token_file=internal_token_file,
        internal_token_grace_s=(
            internal_token_grace if internal_token_grace is not None else DEFAULT_GRACE_S
        ),
        data_dirs=data_dir,
        port=port,
        http_port=http_port,
        zone=zone,
        node_id=node_id,
        zk=zk,
        zk_root=zk_root,
        zk_session_timeout_s=zk_session_timeout,
        append_port=append_port,
    )
    try:
        run(config)
    except (StartupError, ValueError) as e:
        _fail(e)


_SPREAD_DEFAULTS = SpreadSettings()


@app.command()
@zookeeper_tls_options
@security_options(auth=False, iam=False)
def router(
    cluster: ClusterOption,
    zk_root: Annotated[str, typer.Option(help="the cluster's ZooKeeper root")] = "/pubsubd",
    router_id: Annotated[str | None, typer.Option(help="default: hostname-pid")] = None,
    zone: Annotated[str, typer.Option(help="the router's zone")] = "default",
    http_port: Annotated[
        int, typer.Option(help="HTTP port for /healthz, /metrics, /status (0 = any, -1 = off)")
    ] = -1,
    epsilon: Annotated[
        float, typer.Option(help="bounded loads: a forwarder owns at most (1+eps) x the mean")
    ] = 0.25,
    hysteresis: Annotated[
        float, typer.Option(help="s a unit stays put after a move before loads move it again")
    ] = 60.0,
    interval: Annotated[float, typer.Option(help="s between routing passes at most")] = 2.0,
    spread_subscriptions: Annotated[
        bool,
        typer.Option(
            help="spread a busy shared subscription over the subscribing forwarders by source "
            "(each source placed on its own; topics are placed whole), and gather it back to "
            "one forwarder once quiet"
        ),
    ] = False,
    spread_all: Annotated[
        bool,
        typer.Option(
            help="spread every subscription that may be, whatever its load (implies "
            "--spread-subscriptions)"
        ),
    ] = False,
    spread_capacity: Annotated[
        float,
        typer.Option(
            envvar="PUBSUBD_SPREAD_CAPACITY",
            help="messages/s one subscribing forwarder delivers (spreading by load)",
        ),
    ] = _SPREAD_DEFAULTS.messages_per_forwarder,
    spread_share: Annotated[
        float,
        typer.Option(
            envvar="PUBSUBD_SPREAD_SHARE",
            help="spread a subscription over this share of one forwarder's capacity",
        ),
    ] = _SPREAD_DEFAULTS.spread_share,
    spread_after: Annotated[
        float,
        typer.Option(
            envvar="PUBSUBD_SPREAD_AFTER_S", help="s a subscription is busy before it spreads"
        ),
    ] = _SPREAD_DEFAULTS.spread_after_s,
    gather_after: Annotated[
        float,
        typer.Option(
            envvar="PUBSUBD_GATHER_AFTER_S",
            help="s a spread subscription is under the gather ratio of the spread share "
            "before it is gathered back to one forwarder",
        ),
    ] = _SPREAD_DEFAULTS.gather_after_s,
    gather_ratio: Annotated[
        float,
        typer.Option(
            envvar="PUBSUBD_GATHER_RATIO",
            help="a spread subscription is quiet under this ratio of the spread share "
            "(0 < ratio < 1)",
        ),
    ] = _SPREAD_DEFAULTS.gather_ratio,
    load_half_life: Annotated[
        float,
        typer.Option(
            envvar="PUBSUBD_LOAD_HALF_LIFE_S",
            help="s for a change of a topic's or subscription's load to be half counted (the "
            "half-life of the load EWMAs the forwarders report; longer: bursts weigh less)",
        ),
    ] = HALF_LIFE_S,
    zk_session_timeout: ZkSessionOption = 10.0,
    pid_file: Annotated[Path | None, typer.Option(help="write the PID here when ready")] = None,
    log_level: Annotated[str, typer.Option(envvar="PUBSUBD_LOG_LEVEL")] = "INFO",
    security: SecurityFlags = NO_FLAGS,
) -> None:
    """Run a router: active/standby, it assigns publish message sources and subscriptions to
    forwarders (bounded-load consistent hashing) and publishes the lists in ZooKeeper."""
    from pubsubd.observability.logging import setup
    from pubsubd.router.main import RouterConfig, StartupError, run

    setup(log_level)
    try:
        f = security
        internal_tls(f.tls_ca, f.tls_cert, f.tls_key)
        config = RouterConfig(
            tls=server_tls(f.tls_cert, f.tls_key, f.tls_client_ca),
            zk=cluster,
            zk_root=zk_root,
            router_id=router_id,
            zone=zone,
            http_port=http_port,
            epsilon=epsilon,
            hysteresis_s=hysteresis,
            interval_s=interval,
            spread_subscriptions=(
                SPREAD_ALL if spread_all else SPREAD_BY_LOAD if spread_subscriptions else SPREAD_OFF
            ),
            spread=SpreadSettings(
                messages_per_forwarder=spread_capacity,
                spread_share=spread_share,
                spread_after_s=spread_after,
                gather_after_s=gather_after,
                gather_ratio=gather_ratio,
            ),
            load_half_life_s=load_half_life,
            zk_session_timeout_s=zk_session_timeout,
            pid_file=pid_file,
        )
        run(config)
    except (StartupError, ValueError) as e:
        _fail(e)


@app.command()
@zookeeper_tls_options
@security_options()
def frontend(
    cluster: ClusterOption,
    port: Annotated[int, typer.Option(help="gRPC port clients connect to (0 = any)")] = 8085,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    zk_root: Annotated[str, typer.Option(help="the cluster's ZooKeeper root")] = "/pubsubd",
    frontend_id: Annotated[str | None, typer.Option(help="default: hostname-port")] = None,
    zone: Annotated[str, typer.Option(help="the frontend's zone")] = "default",
    http_port: Annotated[
        int, typer.Option(help="HTTP port for /healthz, /metrics, /status (0 = any, -1 = off)")
    ] = -1,
    pulsar_port: Annotated[
        int,
        typer.Option(
            help="the Pulsar binary protocol, proxied like every gRPC call (0 = any, -1 = off)"
        ),
    ] = -1,
    zk_session_timeout: ZkSessionOption = 10.0,
    pid_file: Annotated[Path | None, typer.Option(help="write the PID here when ready")] = None,
    log_level: Annotated[str, typer.Option(envvar="PUBSUBD_LOG_LEVEL")] = "INFO",
    security: SecurityFlags = NO_FLAGS,
) -> None:
    """Run a frontend: a stateless proxy that sends each client call to the forwarder the
    routers assigned its topic or subscription to. With --auth-* it checks every call's token
    itself (as ``serve``) and passes it on to the forwarder."""
    from pubsubd.frontend.main import FrontendConfig, StartupError, run
    from pubsubd.observability.logging import setup

    setup(log_level)
    try:
        cfg = security.apply(config_mod.from_env())
        tls = server_tls(security.tls_cert, security.tls_key, security.tls_client_ca)
    except ValueError as e:
        _fail(e)
    try:
        run(
            FrontendConfig(
                tls=tls,
                tokens=cfg.tokens,
                zk=cluster,
                zk_root=zk_root,
                frontend_id=frontend_id,
                zone=zone,
                host=host,
                port=port,
                http_port=http_port,
                pulsar_port=pulsar_port,
                zk_session_timeout_s=zk_session_timeout,
                pid_file=pid_file,
                iam=cfg.iam,
                iam_policy_file=cfg.iam_policy_file,
                trust_caller_header=cfg.trust_caller_header,
            )
        )
    except StartupError as e:
        _fail(e)


@app.command()
def prober(
    endpoint: Annotated[
        list[str],
        typer.Option(help="host:port of a frontend or serving process (repeat for each)"),
    ],
    project: Annotated[str, typer.Option(help="project of the probes' topics")] = (
        "pubsubd-prober"
    ),
    interval: Annotated[float, typer.Option(help="s between probe rounds")] = 10.0,
    probe: Annotated[
        list[str] | None,
        typer.Option(help="publish_receive or control_plane (repeat; default: both)"),
    ] = None,
    http_port: Annotated[
        int, typer.Option(help="HTTP port for /healthz, /metrics, /status (0 = any, -1 = off)")
    ] = 0,
    once: Annotated[bool, typer.Option(help="one round, print it, exit 1 if a probe failed")] = (
        False
    ),
    as_json: Annotated[bool, typer.Option("--json", help="--once: print JSON")] = False,
    pid_file: Annotated[Path | None, typer.Option(help="write the PID here when ready")] = None,
    log_level: Annotated[str, typer.Option(envvar="PUBSUBD_LOG_LEVEL")] = "INFO",
    ca_file: Annotated[
        Path | None,
        typer.Option(envvar="PUBSUBD_CA_FILE", help="speak TLS to the endpoints, trusting this CA"),
    ] = None,
    token: Annotated[
        str | None, typer.Option(envvar="PUBSUBD_TOKEN", help="send this bearer token")
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="PUBSUBD_TOKEN_FILE", help="send the bearer token in this file (read each call)"
        ),
    ] = None,
) -> None:
    """Probe the service as clients use it: publish and receive a message, and create, get,
    update and delete a topic and a subscription, through every endpoint; the results are
    SLIs on /metrics, the last ones on /status."""
    from pubsubd.core.client_security import ClientSecurity
    from pubsubd.observability.logging import setup
    from pubsubd.prober.main import ProberConfig, run, run_once
    from pubsubd.prober.probes import CONTROL_PLANE, PUBLISH_RECEIVE

    setup(log_level)
    try:
        config = ProberConfig(
            endpoints=tuple(endpoint),
            project=project,
            interval_s=interval,
            http_port=http_port,
            probes=tuple(probe) if probe else (PUBLISH_RECEIVE, CONTROL_PLANE),
            pid_file=pid_file,
            security=ClientSecurity(ca_file, token, token_file),
        )
    except ValueError as e:
        _fail(e)
    if not once:
        run(config)
        return
    results = run_once(config)
    if as_json:
        sys.stdout.write(json.dumps([r.as_dict() for r in results], indent=2) + "\n")
    else:
        table = Table("probe", "endpoint", "result", "latency ms", "error")
        for r in results:
            table.add_row(
                r.probe,
                r.endpoint,
                "ok" if r.ok else "FAILED",
                f"{r.latency_s * 1000:.1f}",
                r.error,
            )
        console.print(table)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


# --- client commands -------------------------------------------------------------------------


def _clients(endpoint: str) -> tuple[Any, Any]:
    from google.pubsub_v1 import PublisherClient, SubscriberClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    # Plain-text gRPC to a local server, as the official clients do with PUBSUB_EMULATOR_HOST,
    # unless --ca-file (TLS) and --token / --token-file say otherwise.
    options = [("grpc.max_receive_message_length", -1)]
    security = _security()
    return (
        PublisherClient(
            transport=PublisherGrpcTransport(channel=security.channel(endpoint, options))
        ),
        SubscriberClient(
            transport=SubscriberGrpcTransport(channel=security.channel(endpoint, options))
        ),
    )


def _security() -> Any:
    """The global options' ClientSecurity (the environment's when no callback ran)."""
    from pubsubd.core.client_security import ClientSecurity

    return _SECURITY if _SECURITY is not None else ClientSecurity.from_env()


def _name(project: str, kind: str, name: str) -> str:
    return name if name.startswith("projects/") else f"projects/{project}/{kind}/{name}"


def _fail(e: Exception) -> None:
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
    raise typer.Exit(1)


def _emit(rows: list[dict[str, Any]], columns: list[str], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, default=str) + "\n")
        return
    table = Table(*columns)
    for r in rows:
        table.add_row(*(str(r.get(c, "")) for c in columns))
    console.print(table)


def _api_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    from google.api_core import exceptions

    try:
        return fn(*args, **kwargs)
    except exceptions.GoogleAPICallError as e:
        _fail(e)


@topics_app.command("create")
def topics_create(
    name: str,
    retention: Annotated[
        int, typer.Option(help="message retention in seconds (600-2678400; 0 = none)")
    ] = 0,
    backlog_quota_messages: Annotated[
        int, typer.Option(help="backlog quota per subscription, in messages (0 = none)")
    ] = 0,
    backlog_quota_bytes: Annotated[int, typer.Option(help="backlog quota in bytes")] = 0,
    backlog_quota_age: Annotated[int, typer.Option(help="backlog quota: oldest age, s")] = 0,
    backlog_policy: Annotated[
        str, typer.Option(help="block_publishers or evict_oldest")
    ] = "block_publishers",
    retention_bytes: Annotated[
        int,
        typer.Option(help="keep the newest segments, acked or not, up to this size (0 = none)"),
    ] = 0,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    """Create a topic, optionally with retention and a backlog quota (stored as labels)."""
    pub, _ = _clients(endpoint)
    labels = _quota_labels(
        backlog_quota_messages, backlog_quota_bytes, backlog_quota_age, backlog_policy
    )
    if retention_bytes:
        labels["pubsubd-retention-bytes"] = str(retention_bytes)
    request: dict[str, Any] = {"name": _name(project, "topics", name), "labels": labels}
    if retention:
        request["message_retention_duration"] = {"seconds": retention}
    t = _api_call(pub.create_topic, request=request)
    _emit([{"name": t.name, "labels": dict(t.labels)}], ["name", "labels"], as_json)


def _quota_labels(messages: int, size: int, age: int, policy: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    if messages:
        labels["pubsubd-backlog-quota-messages"] = str(messages)
    if size:
        labels["pubsubd-backlog-quota-bytes"] = str(size)
    if age:
        labels["pubsubd-backlog-quota-age-seconds"] = str(age)
    if labels:
        labels["pubsubd-backlog-policy"] = policy
    return labels


@topics_app.command("list")
def topics_list(
    endpoint: Endpoint = "127.0.0.1:8085", project: Project = "local", as_json: AsJson = False
) -> None:
    pub, _ = _clients(endpoint)
    topics = _api_call(pub.list_topics, project=f"projects/{project}")
    _emit([{"name": t.name} for t in topics], ["name"], as_json)


@topics_app.command("delete")
def topics_delete(
    name: str,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    pub, _ = _clients(endpoint)
    full = _name(project, "topics", name)
    _api_call(pub.delete_topic, topic=full)
    _emit([{"deleted": full}], ["deleted"], as_json)


DAMAGE_COLUMNS = ["topic", "source", "first_offset", "end_offset", "file", "bytes", "reason"]


def _damage_rows(ranges: Any) -> list[dict[str, Any]]:
    return [
        {
            "topic": d.topic or f"(deleted: {d.topic_storage})",
            "source": d.source,
            "first_offset": d.first_offset,
            "end_offset": d.end_offset,
            "file": d.file,
            "bytes": f"{d.byte_start}..{d.byte_stop}",
            "reason": d.reason,
            "found": d.found,
        }
        for d in ranges
    ]


@topics_app.command("damaged")
def topics_damaged(
    topic: Annotated[str, typer.Argument(help="topic (default: every topic)")] = "",
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    """Damaged stored messages: bytes that fail their checks, by topic, source and offsets."""
    from pubsubd._gen.pubsubd.v1 import admin_pb2

    full = _name(project, "topics", topic) if topic else ""
    resp = _replay_call(
        endpoint,
        "ListDamagedRanges",
        admin_pb2.ListDamagedRangesRequest(topic=full),
        admin_pb2.ListDamagedRangesResponse,
        service="Admin",
    )
    _emit(_damage_rows(resp.ranges), DAMAGE_COLUMNS, as_json)


@topics_app.command("skip-damaged")
def topics_skip_damaged(
    topic: str,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    """Skip the topic's damaged messages: every subscription acknowledges them as lost and
    goes on delivering (for good: restore the segment file instead to keep them)."""
    from pubsubd._gen.pubsubd.v1 import admin_pb2

    full = _name(project, "topics", topic)
    resp = _replay_call(
        endpoint,
        "SkipDamagedRanges",
        admin_pb2.SkipDamagedRangesRequest(topic=full),
        admin_pb2.SkipDamagedRangesResponse,
        service="Admin",
    )
    if as_json:
        _emit(
            [{"skipped": _damage_rows(resp.skipped), "messages_lost": resp.messages_lost}],
            ["skipped", "messages_lost"],
            True,
        )
    else:
        _emit(_damage_rows(resp.skipped), DAMAGE_COLUMNS, False)
        console.print(f"{resp.messages_lost} messages acknowledged as lost")


@subs_app.command("create")
def subscriptions_create(
    name: str,
    topic: Annotated[str, typer.Option(help="topic to subscribe to")],
    ack_deadline: Annotated[int, typer.Option(help="ack deadline in seconds (10-600)")] = 10,
    type_: Annotated[
        str, typer.Option("--type", help="shared, exclusive, failover or key_shared")
    ] = "shared",
    filter_: Annotated[str, typer.Option("--filter", help="Google filter on attributes")] = "",
    ordering: Annotated[bool, typer.Option(help="deliver each ordering key in order")] = False,
    exactly_once: Annotated[bool, typer.Option(help="exactly-once delivery")] = False,
    dead_letter_topic: Annotated[str, typer.Option(help="topic for undeliverable messages")] = "",
    max_delivery_attempts: Annotated[int, typer.Option(help="before dead-lettering (5-100)")] = 5,
    min_backoff: Annotated[float, typer.Option(help="retry policy minimum backoff, s")] = 0,
    max_backoff: Annotated[float, typer.Option(help="retry policy maximum backoff, s")] = 0,
    nack_delay: Annotated[int, typer.Option(help="wait before redelivering a nack, s")] = 0,
    max_outstanding: Annotated[
        int, typer.Option(help="cap on delivered, unacked messages (0 = none)")
    ] = 0,
    retain_acked: Annotated[bool, typer.Option(help="keep acked messages for Seek")] = False,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    """Create a subscription; queue settings (--type, --nack-delay, --max-outstanding) are
    stored as pubsubd-* labels, everything else is a google.pubsub.v1 field."""
    _, sub = _clients(endpoint)
    labels: dict[str, str] = {}
    if type_ != "shared":
        labels["pubsubd-subscription-type"] = type_
    if nack_delay:
        labels["pubsubd-nack-delay-seconds"] = str(nack_delay)
    if max_outstanding:
        labels["pubsubd-max-outstanding-messages"] = str(max_outstanding)
    request: dict[str, Any] = {
        "name": _name(project, "subscriptions", name),
        "topic": _name(project, "topics", topic),
        "ack_deadline_seconds": ack_deadline,
        "labels": labels,
        "filter": filter_,
        "enable_message_ordering": ordering,
        "enable_exactly_once_delivery": exactly_once,
        "retain_acked_messages": retain_acked,
    }
    if dead_letter_topic:
        request["dead_letter_policy"] = {
            "dead_letter_topic": _name(project, "topics", dead_letter_topic),
            "max_delivery_attempts": max_delivery_attempts,
        }
    if min_backoff or max_backoff:
        request["retry_policy"] = {
            "minimum_backoff": {"seconds": int(min_backoff)},
            "maximum_backoff": {"seconds": int(max_backoff or 600)},
        }
    s = _api_call(sub.create_subscription, request=request)
    _emit(
        [{"name": s.name, "topic": s.topic, "ack_deadline_seconds": s.ack_deadline_seconds}],
        ["name", "topic", "ack_deadline_seconds"],
        as_json,
    )


@subs_app.command("list")
def subscriptions_list(
    endpoint: Endpoint = "127.0.0.1:8085", project: Project = "local", as_json: AsJson = False
) -> None:
    _, sub = _clients(endpoint)
    subs = _api_call(sub.list_subscriptions, project=f"projects/{project}")
    _emit([{"name": s.name, "topic": s.topic} for s in subs], ["name", "topic"], as_json)


@subs_app.command("delete")
def subscriptions_delete(
    name: str,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    _, sub = _clients(endpoint)
    full = _name(project, "subscriptions", name)
    _api_call(sub.delete_subscription, subscription=full)
    _emit([{"deleted": full}], ["deleted"], as_json)


def _replay_call(
    endpoint: str, method: str, request: Any, response_type: Any, service: str = "Replay"
) -> Any:
    """One pubsubd.v1 call (Replay or Admin); a failure is printed with its status code."""
    import grpc

    with _security().channel(endpoint) as channel:
        call = channel.unary_unary(
            f"/pubsubd.v1.{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        try:
            return call(request, timeout=30)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            details = e.details() if hasattr(e, "details") else str(e)
            _fail(RuntimeError(f"{code.name}: {details}"))


@cursors_app.command("list")
def cursors_list(
    topic: str,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    """The topic's named cursors, by name: positions per source and last commit time."""
    from datetime import UTC

    from pubsubd._gen.pubsubd.v1 import replay_pb2

    full = _name(project, "topics", topic)
    resp = _replay_call(
        endpoint,
        "ListCursors",
        replay_pb2.ListCursorsRequest(topic=full),
        replay_pb2.ListCursorsResponse,
    )
    rows = [
        {
            "name": c.name,
            "offsets": {str(k): v for k, v in sorted(c.offsets.items())},
            "commit_time": (
                c.commit_time.ToDatetime(tzinfo=UTC).isoformat()
                if c.HasField("commit_time")
                else ""
            ),
        }
        for c in resp.cursors
    ]
    _emit(rows, ["name", "offsets", "commit_time"], as_json)


@cursors_app.command("delete")
def cursors_delete(
    topic: str,
    name: str,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    """Delete a named cursor: retention may then trim the data it held."""
    from pubsubd._gen.pubsubd.v1 import replay_pb2

    full = _name(project, "topics", topic)
    _replay_call(
        endpoint,
        "DeleteCursor",
        replay_pb2.DeleteCursorRequest(topic=full, name=name),
        replay_pb2.DeleteCursorResponse,
    )
    _emit([{"topic": full, "deleted": name}], ["topic", "deleted"], as_json)


@app.command()
def publish(
    topic: str,
    message: Annotated[list[str], typer.Argument(help="message data (one message each)")],
    attribute: Annotated[
        list[str] | None, typer.Option("--attribute", "-a", help="key=value, repeatable")
    ] = None,
    ordering_key: Annotated[str, typer.Option(help="ordering key")] = "",
    deliver_after: Annotated[
        float, typer.Option(help="deliver no earlier than this many seconds from now")
    ] = 0,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    """Publish one message per argument; prints the message IDs."""
    attrs: dict[str, str] = {}
    for a in attribute or []:
        key, sep, value = a.partition("=")
        if not sep:
            _fail(ValueError(f"--attribute {a!r}: expected key=value"))
        attrs[key] = value
    if deliver_after:
        attrs["pubsubd.deliver_after"] = f"{deliver_after:g}"
    pub, _ = _clients(endpoint)
    messages = [
        {"data": m.encode(), "attributes": attrs, "ordering_key": ordering_key} for m in message
    ]
    resp = _api_call(
        pub.publish, request={"topic": _name(project, "topics", topic), "messages": messages}
    )
    _emit([{"message_id": i} for i in resp.message_ids], ["message_id"], as_json)


@app.command()
def pull(
    subscription: str,
    max_messages: Annotated[int, typer.Option(help="at most this many messages")] = 10,
    ack: Annotated[bool, typer.Option("--ack", help="acknowledge what was pulled")] = False,
    wait: Annotated[bool, typer.Option(help="wait for messages if there are none")] = False,
    endpoint: Endpoint = "127.0.0.1:8085",
    project: Project = "local",
    as_json: AsJson = False,
) -> None:
    """Pull messages once; with --ack they are acknowledged, otherwise redelivered later."""
    _, sub = _clients(endpoint)
    name = _name(project, "subscriptions", subscription)
    resp = _api_call(
        sub.pull,
        request={
            "subscription": name,
            "max_messages": max_messages,
            "return_immediately": not wait,
        },
        timeout=30,
    )
    rows = [
        {
            "message_id": r.message.message_id,
            "data": r.message.data.decode("utf-8", "replace"),
            "attributes": dict(r.message.attributes),
            "ordering_key": r.message.ordering_key,
            "publish_time": r.message.publish_time.isoformat(),
            "ack_id": r.ack_id,
        }
        for r in resp.received_messages
    ]
    if ack and rows:
        _api_call(sub.acknowledge, subscription=name, ack_ids=[r["ack_id"] for r in rows])
    _emit(rows, ["message_id", "data", "attributes", "publish_time"], as_json)


@app.command("sli-report")
def sli_report(
    out: Annotated[Path, typer.Option(help="output directory (Parquet + report.html)")],
    slo: Annotated[
        Path | None, typer.Option(help="SLO targets, TOML or JSON (defaults in pubsubd.spark.sli)")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="only events from this time on (ISO-8601 or epoch ms)")
    ] = None,
    endpoint: Endpoint = "127.0.0.1:8085",
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="a streaming query (checkpointed under OUT) refreshing the tables and the "
            "report at each micro-batch, until SIGTERM/Ctrl-C",
        ),
    ] = False,
    interval: Annotated[
        str, typer.Option(help="--follow: micro-batch trigger interval (Spark duration)")
    ] = "10 seconds",
    max_batches: Annotated[
        int | None, typer.Option(min=1, help="--follow: stop after N micro-batches with events")
    ] = None,
    available_now: Annotated[
        bool,
        typer.Option("--available-now", help="--follow: process what is published now, then stop"),
    ] = False,
) -> None:
    """Spark job over the server's SLI events: per-minute percentiles, error rates, backlog,
    SLO verdicts, Parquet and an HTML report. Needs pubsubd[spark]. Exit code 2 if an SLO fails."""
    if (max_batches is not None or available_now) and not follow:
        _fail(ValueError("--max-batches and --available-now need --follow"))
    try:
        from pubsubd.spark import sli
    except ImportError as e:
        _fail(e)
    if follow:
        progress = sli.follow_main(endpoint, out, slo, since, available_now, interval, max_batches)
        console.print(
            f"{progress.batches} micro-batches, {progress.events} new events", highlight=False
        )
        if progress.last is None:
            console.print("no new events: tables and report unchanged", highlight=False)
            return
        result = progress.last
    else:
        result = sli.main(endpoint, out, slo, since)
    failed = [c for c in result.checks if c.status == "FAIL"]
    for c in result.checks:
        console.print(
            f"[{'red' if c.status == 'FAIL' else 'green'}]{c.status}[/] {c.slo} {c.scope}: "
            f"{c.actual:.4g} (target {c.target:g})",
            highlight=False,
        )
    console.print(f"report: {result.report}", highlight=False)
    if failed:
        raise typer.Exit(2)


def main() -> None:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    app()


if __name__ == "__main__":
    main()
