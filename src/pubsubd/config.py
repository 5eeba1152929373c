"""Server settings: one frozen tree built from defaults < environment < command-line flags."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pubsubd.core.internal_token import DEFAULT_GRACE_S
from pubsubd.core.source_growth import GrowthSettings
from pubsubd.core.tls import ServerTls
from pubsubd.core.tokens import TokenSettings, load_static_tokens
from pubsubd.data.subscribe.budget import DEFAULT_MAX_BYTES, DEFAULT_MAX_MESSAGES
from pubsubd.data.subscribe.remote_sources import DEFAULT_FILL_MIN_MESSAGES
from pubsubd.storage.cache_budget import DEFAULT_PROCESS_CACHE_BYTES
from pubsubd.storage.ledgers.reader import DEFAULT_RATE_BYTES as DEFAULT_COPY_FILL_RATE_BYTES
from pubsubd.storage.ledgers.repair import RepairSettings
from pubsubd.storage.ledgers.writer import DEFAULT_LEDGER_BYTES
from pubsubd.storage.log import FsyncPolicy

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8085  # the Google emulator's usual port, so PUBSUB_EMULATOR_HOST stays familiar
DEFAULT_HTTP_PORT = 8086
DEFAULT_PULSAR_PORT = 6650
DEFAULT_DATA_DIR = Path("data")


@dataclass(frozen=True)
class StorageConfig:
    data_dir: Path = DEFAULT_DATA_DIR
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    segment_bytes: int = 64 << 20
    # How often the publishing forwarder flushes the ack journals, then trims every source to
    # what its subscriptions and pins still need (data/publish/forwarder.py).
    trim_interval_s: float = 2.0
    # How often the ack journals are flushed between trim passes: acks newer than this may be
    # redelivered after a crash (at-least-once).
    ack_flush_interval_s: float = 0.05


@dataclass(frozen=True)
class ClusterConfig:
    """Where a clustered server finds ZooKeeper, and how many copies its ledgers get."""

    zookeeper: str  # connect string: host:port[,host:port...]
    root: str = "/pubsubd"  # every znode of the cluster is under it
    replicas: int = 3  # storage nodes per ledger (at most the nodes registered at start-up)
    session_timeout_s: float = 10.0
    # How the server registers as a forwarder (the routing tier): its zone, and its ID
    # (None: hostname-port).
    zone: str = "default"
    forwarder_id: str | None = None
    # ``pubsubd forwarder``: serve only the topics the routers' assignment gives this process
    # (data/ownership.py). False (``pubsubd serve --cluster``): own every topic.
    assigned: bool = False
    # What a ``pubsubd forwarder`` registers to serve: publish message sources (topics),
    # subscriptions, or both (the default). Once some forwarder serves one kind only, the
    # routers place topics and subscriptions apart (control/routing_table.py).
    publishing: bool = True
    subscribing: bool = True
    # The repair auditor (storage/ledgers/auditor.py): pass interval, grace period, copy rate.
    repair: RepairSettings = field(default_factory=RepairSettings)
    # How often a forwarder reports its load to the routers (data/load_report.py).
    load_report_s: float = 5.0
    # A source's ledger rolls after this many bytes (retention deletes whole ledgers).
    ledger_bytes: int = DEFAULT_LEDGER_BYTES
    # A subscribing forwarder's copies of sources owned elsewhere catch up from the storage
    # nodes' closed ledgers (data/subscribe/remote_sources.py): at most this many bytes per
    # second, and only for a gap of at least this many messages (smaller: the owner's Tail).
    copy_fill_rate_bytes: int = DEFAULT_COPY_FILL_RATE_BYTES
    copy_fill_min_messages: int = DEFAULT_FILL_MIN_MESSAGES


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0 = pick a free port
    http_port: int = DEFAULT_HTTP_PORT  # 0 = pick a free port, -1 = no HTTP endpoint
    # The Pulsar binary protocol (pulsar/): 0 = pick a free port, -1 = off.
    pulsar_port: int = DEFAULT_PULSAR_PORT
    storage: StorageConfig = field(default_factory=StorageConfig)
    # How long a graceful stop waits for in-flight RPCs after ending the streams.
    shutdown_grace_s: float = 5.0
    # How often backlog quotas with evict_oldest are enforced.
    quota_check_s: float = 1.0
    # How often expiration_policy, snapshot expiry and message retention are checked.
    expiry_check_s: float = 60.0
    # Tests only: every expiration_policy ttl is divided by this (control/expiry.py).
    test_ttl_divisor: float = 1.0
    # How long PublishDeduplicated remembers a dedup ID (data/publish/dedup.py).
    dedup_window_s: float = 600.0
    # How often SLI monitoring events are published to the internal topic (0 = off;
    # observability/events.py).
    sli_events_s: float = 10.0
    # The SLO file (observability/slo.py; None: the defaults) and the per-topic label bound of
    # the request SLIs on /metrics (observability/sli.py).
    slo_file: Path | None = None
    # How often the SLO monitor samples its tallies and the backlog ages (observability/slo.py).
    slo_sample_s: float = 15.0
    # Tests only: every burn-rate window (and the budget period) is divided by this.
    test_slo_window_divisor: float = 1.0
    metrics_max_topics: int = 100
    metrics_max_subscriptions: int = 100
    request_slis: bool = True  # False: no request SLIs (to measure their cost)
    # Bytes of Publish requests that may wait for storage at once (core/flow_control.py); past
    # it Publish answers RESOURCE_EXHAUSTED. 0 = no bound.
    max_inflight_publish_bytes: int = 128 << 20
    # Outstanding deliveries (delivered, not yet acked) of every subscription of the process.
    max_outstanding_messages: int = DEFAULT_MAX_MESSAGES
    max_outstanding_bytes: int = DEFAULT_MAX_BYTES
    # Payload bytes every log of the process keeps cached (storage/cache_budget.py).
    log_cache_bytes: int = DEFAULT_PROCESS_CACHE_BYTES
    # Probe this server's own endpoint every so many seconds (prober/loop.py; 0 = off).
    prober_interval_s: float = 0.0
    # With authentication on, the token its probes carry (a file, read on every call).
    prober_token_file: Path | None = None
    # TLS on every listener (gRPC, HTTP, Pulsar); None: plaintext (the default, like the
    # emulator). See with_security.
    tls: ServerTls | None = None
    # Bearer-token authentication (core/tokens.py); None: every caller is anonymous.
    tokens: TokenSettings | None = None
    # Authorization with IAM policies on every call (api/grpc/authorization.py; off: anyone who
    # reaches the port may do anything, as with Google's emulator), and the operator's
    # project-level policy file (control/policies.py).
    iam: bool = False
    iam_policy_file: Path | None = None
    # TESTS AND DEVELOPMENT ONLY: believe the x-pubsubd-caller header as the caller's identity.
    trust_caller_header: bool = False
    # Source growth (core/source_growth.py): a busy topic gets more publish message sources,
    # a quiet one fewer active ones. None: off (the default; PUBSUBD_SOURCE_CAPACITY).
    source_growth: GrowthSettings | None = None
    # A forwarder's own calls to other forwarders carry the token in this file
    # (core/internal_token.py); its principal passes IAM.
    internal_token_file: Path | None = None
    # After the file names another subject, the one before stays accepted this long, s.
    internal_token_grace_s: float = DEFAULT_GRACE_S
    # None: one machine (embedded metadata, local disks). Set: metadata in ZooKeeper and every
    # publish message source replicated on storage nodes (storage/ledgers/).
    cluster: ClusterConfig | None = None


def from_env(env: dict[str, str] | None = None) -> ServerConfig:
    """Defaults overridden by PUBSUBD_HOST, PUBSUBD_PORT, PUBSUBD_HTTP_PORT, PUBSUBD_DATA_DIR,
    PUBSUBD_FSYNC, PUBSUBD_SEGMENT_BYTES, PUBSUBD_TRIM_INTERVAL_S, PUBSUBD_ACK_FLUSH_INTERVAL_S,
    PUBSUBD_QUOTA_CHECK_S, PUBSUBD_EXPIRY_CHECK_S, PUBSUBD_DEDUP_WINDOW_S,
    PUBSUBD_SLI_EVENTS_S, PUBSUBD_SLO_FILE, PUBSUBD_SLO_SAMPLE_S, PUBSUBD_METRICS_MAX_TOPICS,
    _SUBSCRIPTIONS, PUBSUBD_PROBER_INTERVAL_S, PUBSUBD_MAX_INFLIGHT_PUBLISH_BYTES,
    PUBSUBD_REQUEST_SLIS, PUBSUBD_MAX_OUTSTANDING_MESSAGES, PUBSUBD_MAX_OUTSTANDING_BYTES,
    PUBSUBD_LOG_CACHE_BYTES, PUBSUBD_IAM, PUBSUBD_IAM_POLICY_FILE, PUBSUBD_TRUST_CALLER_HEADER,
    PUBSUBD_CLUSTER (ZooKeeper connect string), PUBSUBD_ZK_ROOT,
    PUBSUBD_REPLICAS, PUBSUBD_ZK_SESSION_TIMEOUT_S, PUBSUBD_ZONE, PUBSUBD_FORWARDER_ID,
    PUBSUBD_LOAD_REPORT_S (s between a forwarder's load reports) and
    PUBSUBD_REPAIR_INTERVAL_S, _GRACE_S, _RATE_BYTES, PUBSUBD_LEDGER_BYTES,
    PUBSUBD_COPY_FILL_RATE_BYTES, PUBSUBD_COPY_FILL_MIN_MESSAGES, PUBSUBD_SOURCE_CAPACITY
    (messages/s a publish message source takes; unset or 0: no source growth) with
    PUBSUBD_SOURCE_CAPACITY_BYTES, _GROW_AFTER_S, _SHRINK_AFTER_S, _SAMPLE_S
    (PUBSUBD_TEST_TTL_DIVISOR and
    PUBSUBD_TEST_SLO_WINDOW_DIVISOR are for tests only). An interval that is not a positive
    number raises ValueError here, not when its loop first runs."""
    e = os.environ if env is None else env
    cfg = ServerConfig()
    storage = cfg.storage
    if "PUBSUBD_DATA_DIR" in e:
        storage = replace(storage, data_dir=Path(e["PUBSUBD_DATA_DIR"]))
    if "PUBSUBD_FSYNC" in e:
        storage = replace(storage, fsync=FsyncPolicy(e["PUBSUBD_FSYNC"]))
    if "PUBSUBD_SEGMENT_BYTES" in e:
        storage = replace(storage, segment_bytes=int(e["PUBSUBD_SEGMENT_BYTES"]))
    storage = replace(
        storage,
        trim_interval_s=_interval(e, "PUBSUBD_TRIM_INTERVAL_S", storage.trim_interval_s),
        ack_flush_interval_s=_interval(
            e, "PUBSUBD_ACK_FLUSH_INTERVAL_S", storage.ack_flush_interval_s
        ),
    )
    cluster = None
    if e.get("PUBSUBD_CLUSTER"):
        repair = RepairSettings()
        cluster = ClusterConfig(
            e["PUBSUBD_CLUSTER"],
            root=e.get("PUBSUBD_ZK_ROOT", "/pubsubd"),
            replicas=_replicas(e.get("PUBSUBD_REPLICAS", "3")),
            session_timeout_s=float(e.get("PUBSUBD_ZK_SESSION_TIMEOUT_S", "10")),
            zone=e.get("PUBSUBD_ZONE", "default"),
            forwarder_id=e.get("PUBSUBD_FORWARDER_ID") or None,
            load_report_s=_interval(e, "PUBSUBD_LOAD_REPORT_S", 5.0),
            repair=RepairSettings(
                interval_s=_interval(e, "PUBSUBD_REPAIR_INTERVAL_S", repair.interval_s),
                grace_s=float(e.get("PUBSUBD_REPAIR_GRACE_S", repair.grace_s)),
                rate_bytes=int(e.get("PUBSUBD_REPAIR_RATE_BYTES", repair.rate_bytes)),
            ),
            ledger_bytes=_positive(e, "PUBSUBD_LEDGER_BYTES", DEFAULT_LEDGER_BYTES),
            copy_fill_rate_bytes=_positive(
                e, "PUBSUBD_COPY_FILL_RATE_BYTES", DEFAULT_COPY_FILL_RATE_BYTES
            ),
            copy_fill_min_messages=_positive(
                e, "PUBSUBD_COPY_FILL_MIN_MESSAGES", DEFAULT_FILL_MIN_MESSAGES
            ),
        )
    return replace(
        cfg,
        cluster=cluster,
        host=e.get("PUBSUBD_HOST", cfg.host),
        port=int(e.get("PUBSUBD_PORT", cfg.port)),
        http_port=int(e.get("PUBSUBD_HTTP_PORT", cfg.http_port)),
        pulsar_port=int(e.get("PUBSUBD_PULSAR_PORT", cfg.pulsar_port)),
        storage=storage,
        quota_check_s=_interval(e, "PUBSUBD_QUOTA_CHECK_S", cfg.quota_check_s),
        expiry_check_s=float(e.get("PUBSUBD_EXPIRY_CHECK_S", cfg.expiry_check_s)),
        test_ttl_divisor=float(e.get("PUBSUBD_TEST_TTL_DIVISOR", cfg.test_ttl_divisor)),
        dedup_window_s=float(e.get("PUBSUBD_DEDUP_WINDOW_S", cfg.dedup_window_s)),
        sli_events_s=float(e.get("PUBSUBD_SLI_EVENTS_S", cfg.sli_events_s)),
        slo_file=Path(e["PUBSUBD_SLO_FILE"]) if e.get("PUBSUBD_SLO_FILE") else None,
        slo_sample_s=_interval(e, "PUBSUBD_SLO_SAMPLE_S", cfg.slo_sample_s),
        test_slo_window_divisor=_interval(
            e, "PUBSUBD_TEST_SLO_WINDOW_DIVISOR", cfg.test_slo_window_divisor
        ),
        metrics_max_topics=int(e.get("PUBSUBD_METRICS_MAX_TOPICS", cfg.metrics_max_topics)),
        metrics_max_subscriptions=int(
            e.get("PUBSUBD_METRICS_MAX_SUBSCRIPTIONS", cfg.metrics_max_subscriptions)
        ),
        prober_interval_s=float(e.get("PUBSUBD_PROBER_INTERVAL_S", cfg.prober_interval_s)),
        prober_token_file=(
            Path(e["PUBSUBD_PROBER_TOKEN_FILE"])
            if e.get("PUBSUBD_PROBER_TOKEN_FILE")
            else cfg.prober_token_file
        ),
        request_slis=e.get("PUBSUBD_REQUEST_SLIS", "1") not in ("0", "false", "off"),
        max_inflight_publish_bytes=int(
            e.get("PUBSUBD_MAX_INFLIGHT_PUBLISH_BYTES", cfg.max_inflight_publish_bytes)
        ),
        max_outstanding_messages=_positive(
            e, "PUBSUBD_MAX_OUTSTANDING_MESSAGES", cfg.max_outstanding_messages
        ),
        max_outstanding_bytes=_positive(
            e, "PUBSUBD_MAX_OUTSTANDING_BYTES", cfg.max_outstanding_bytes
        ),
        log_cache_bytes=_whole(e, "PUBSUBD_LOG_CACHE_BYTES", cfg.log_cache_bytes),
        iam=_flag(e, "PUBSUBD_IAM"),
        iam_policy_file=(
            Path(e["PUBSUBD_IAM_POLICY_FILE"]) if e.get("PUBSUBD_IAM_POLICY_FILE") else None
        ),
        trust_caller_header=_flag(e, "PUBSUBD_TRUST_CALLER_HEADER"),
        source_growth=source_growth(e),
    )


def source_growth(env: Mapping[str, str]) -> GrowthSettings | None:
    """Source growth's settings from the environment (see :func:`from_env`); None: off."""
    capacity = float(env.get("PUBSUBD_SOURCE_CAPACITY", "0") or "0")
    if capacity == 0:
        return None
    base = GrowthSettings(messages_per_source=1.0)
    try:
        return GrowthSettings(
            messages_per_source=capacity,
            bytes_per_source=float(env.get("PUBSUBD_SOURCE_CAPACITY_BYTES", base.bytes_per_source)),
            grow_after_s=float(env.get("PUBSUBD_SOURCE_GROW_AFTER_S", base.grow_after_s)),
            shrink_after_s=float(env.get("PUBSUBD_SOURCE_SHRINK_AFTER_S", base.shrink_after_s)),
            sample_interval_s=float(env.get("PUBSUBD_SOURCE_SAMPLE_S", base.sample_interval_s)),
        )
    except ValueError as e:
        raise ValueError(f"PUBSUBD_SOURCE_*: {e}") from e


def _flag(env: Mapping[str, str], name: str) -> bool:
    """An on/off variable: 1, true, on, yes (any case) are on; unset or anything else off."""
    return env.get(name, "").strip().lower() in ("1", "true", "on", "yes")


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    """A size from the environment: a whole number (0 allowed)."""
    if name not in env:
        return default
    raw = env[name]
    if not raw.isdigit():
        raise ValueError(f"{name} must be a whole number of bytes, not {raw!r}")
    return int(raw)


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    """A bound from the environment: a positive whole number."""
    if name not in env:
        return default
    raw = env[name]
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name} must be a positive whole number, not {raw!r}")
    return int(raw)


def _interval(env: Mapping[str, str], name: str, default: float) -> float:
    """A loop interval from the environment: a positive number of seconds."""
    if name not in env:
        return default
    value = float(env[name])
    if not value > 0:  # also NaN
        raise ValueError(f"{name} must be a positive number of seconds, not {env[name]!r}")
    return value


def _replicas(value: str) -> int:
    replicas = int(value)
    if not 1 <= replicas <= 15:
        raise ValueError(f"replicas must be between 1 and 15, not {value!r}")
    return replicas


def with_security(
    cfg: ServerConfig,
    *,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    tls_client_ca: Path | None = None,
    auth_secret_file: Path | None = None,
    auth_public_key: Path | None = None,
    auth_tokens_file: Path | None = None,
    auth_audience: str | None = None,
    auth_issuer: str | None = None,
) -> ServerConfig:
    """``cfg`` with TLS (a certificate and its key, optionally a client CA for mutual TLS)
    and authentication (an HS256 secret file, an RS256 public key, a static tokens file: any
    of them turns it on). Every file is read and checked here: ValueError names a bad one."""
    tls = cfg.tls
    if tls_cert is not None or tls_key is not None or tls_client_ca is not None:
        if tls_cert is None or tls_key is None:
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        tls = ServerTls(tls_cert, tls_key, tls_client_ca).check()
    tokens = token_settings(
        auth_secret_file, auth_public_key, auth_tokens_file, auth_audience, auth_issuer
    )
    return replace(cfg, tls=tls, tokens=tokens if tokens is not None else cfg.tokens)


def token_settings(
    auth_secret_file: Path | None = None,
    auth_public_key: Path | None = None,
    auth_tokens_file: Path | None = None,
    auth_audience: str | None = None,
    auth_issuer: str | None = None,
) -> TokenSettings | None:
    """What the ``--auth-*`` flags accept (None: none of them given, authentication off);
    every file is read here: ValueError names a bad one. Shared by ``serve``, ``forwarder``,
    ``frontend`` and ``storage``."""
    if auth_secret_file is not None or auth_public_key is not None or auth_tokens_file is not None:
        try:
            return TokenSettings(
                secret=auth_secret_file.read_bytes().strip() if auth_secret_file else None,
                public_key=auth_public_key.read_bytes() if auth_public_key else None,
                static_tokens=load_static_tokens(auth_tokens_file) if auth_tokens_file else {},
                audience=auth_audience or None,
                issuer=auth_issuer or None,
            )
        except OSError as e:
            raise ValueError(f"authentication: {e}") from None
    if auth_audience or auth_issuer:
        raise ValueError("--auth-audience and --auth-issuer need a secret or a public key")
    return None
