"""Start, inspect and stop a local cluster: ZooKeeper, storage nodes, the serving process and
routers.

Layout under the cluster's directory::

    DIR/cluster.json            every process: role, PID, address, zone, log, data dirs
    DIR/zookeeper/              the ensemble (coordination/ensemble.py; ensemble.json)
    DIR/storage-N/disk-K/       storage node N's disks
    DIR/storage-N.log           its log
    DIR/serve/                  the serving process's data (its local copies, ack journals)
    DIR/serve.log
    DIR/forwarder-N/, .log      forwarder N (pubsubd forwarder), instead of the serving
                                process with ``forwarders`` > 0
    DIR/router-N.log, .pid      router N (pubsubd router)
    DIR/frontend-N.log, .pid    frontend N (pubsubd frontend); clients connect to these
    DIR/prober-N.log, .pid      prober N (pubsubd prober), through every frontend
    DIR/auth/                   with ``tokens``: the HS256 secret every process checks tokens
                                with, an admin token (clients, probers), the internal token
                                (forwarders' calls to each other) and, with ``iam``, the
                                project policy file making the admin an admin everywhere
    DIR/zookeeper.credential    with ``zk_auth``: the cluster's ZooKeeper credential (0600),
                                given to every process that talks to ZooKeeper

Every process runs in its own session (it outlives the CLI that started it) and is signalled
only by its recorded PID, after checking that the PID still runs a command naming this
cluster's directory: never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pubsubd.coordination.credentials import DigestCredential, load_credential, write_credential
from pubsubd.coordination.ensemble import Ensemble, require_zookeeper
from pubsubd.core.tls import ClientTls

STATE_FILE = "cluster.json"
STORAGE_READY = re.compile(
    r"pubsubd storage ready grpc=(\S+) node_id=(\S+) zone=(\S+)(?:.*? append=(\S+))?"
)
SERVE_READY = re.compile(r"pubsubd ready grpc=(\S+):(\d+) http=(\S+):(\d+)")
ROUTER_READY = re.compile(r"pubsubd router ready router_id=(\S+) zone=(\S+) http=(\S+)")
FRONTEND_READY = re.compile(
    r"pubsubd frontend ready grpc=(\S+) http=(\S+) frontend_id=(\S+) zone=(\S+)(?: pulsar=(\d+))?"
)
PROBER_READY = re.compile(r"pubsubd prober ready endpoints=(\d+) http=(\S+)")
READY = {
    "prober": PROBER_READY,
    "storage": STORAGE_READY,
    "serve": SERVE_READY,
    "forwarder": SERVE_READY,
    "router": ROUTER_READY,
    "frontend": FRONTEND_READY,
}
ZK_ROOT = "/pubsubd"


class ClusterError(RuntimeError):
    """The cluster could not be started or found."""


@dataclass
class Process:
    role: str  # zookeeper | storage | serve | forwarder | router | frontend | prober
    pid: int | None
    address: str
    zone: str = ""
    log: str = ""
    name: str = ""
    args: list[str] = field(default_factory=list)  # how to start it again
    append_address: str = ""  # a storage node's append port

    def running(self, directory: Path) -> bool:
        return self.pid is not None and _runs(self.pid, str(directory))


def _runs(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and its command line names ``marker`` (not a reused PID)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().decode(errors="replace").rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z" and marker in cmdline


def _start(
    args: list[str], log: Path, ready: re.Pattern[str], timeout: float
) -> tuple[int, re.Match[str]]:
    """Spawn ``args`` logging to ``log`` (appended across restarts) and wait for this start's
    ready line."""
    before = len(ready.findall(log.read_text(errors="replace"))) if log.exists() else 0
    pid = _spawn(args, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = list(ready.finditer(text))
        if len(found) > before:
            return pid, found[-1]
        if not _alive(pid):
            raise ClusterError(f"process {pid} exited before it was ready; {log}:\n{text[-3000:]}")
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    raise ClusterError(f"process {pid} not ready after {timeout:.0f} s; see {log}")


# Processes this process started, kept so they are reaped (and never garbage collected while
# they run, which would warn): PID -> Popen.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def reap() -> None:
    """Collect the children of ours that ended without us waiting for them (stopped by another
    process, e.g. ``pubsubd cluster restart --rolling`` run from a shell)."""
    for pid, child in list(_CHILDREN.items()):
        if child.poll() is not None:
            del _CHILDREN[pid]


def _alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _spawn(args: list[str], log: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


# What ``up(tokens=True)`` writes under DIR/auth (0600): the HS256 secret, the admin's token
# (subject ADMIN), the forwarders' internal token (subject INTERNAL), the IAM policy file.
AUTH_DIR = "auth"
SECRET_FILE, ADMIN_TOKEN_FILE, INTERNAL_TOKEN_FILE = "secret", "admin.token", "internal.token"
POLICY_FILE = "policies.json"
ADMIN = "admin@pubsubd.local"
INTERNAL = "serviceAccount:pubsubd-internal@pubsubd.local"


def write_cluster_auth(directory: Path) -> Path:
    """A fresh secret and the admin's and the forwarders' tokens under ``directory`` (kept if
    there already: a cluster started again keeps its tokens); the directory."""
    import secrets

    from pubsubd.core.tokens import create_token

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret_path = directory / SECRET_FILE
    if not secret_path.exists():
        _write_private(secret_path, secrets.token_hex(32))
    secret = secret_path.read_bytes().strip()
    for name, subject in ((ADMIN_TOKEN_FILE, ADMIN), (INTERNAL_TOKEN_FILE, INTERNAL)):
        if not (directory / name).exists():
            token = create_token(subject, secret=secret, now=time.time())
            _write_private(directory / name, token + "\n")
    policies = {"projects": {"*": {"bindings": [{"role": "roles/pubsub.admin",
                                                 "members": [f"user:{ADMIN}"]}]}}}  # fmt: skip
    _write_private(directory / POLICY_FILE, json.dumps(policies, indent=2) + "\n")
    return directory


def _write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(text)


# What ``up(zk_auth=True)`` writes (0600): user:password, ZooKeeper's digest credential.
ZK_CREDENTIAL_FILE = "zookeeper.credential"


# What ``pubsubd certs dev DIR`` writes, and ``up(tls_dir=DIR)`` passes to the processes.
TLS_FILES = ("ca.pem", "server.pem", "server-key.pem")


class LocalCluster:
    """A cluster recorded in ``directory/cluster.json``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self.processes: list[Process] = []
        self.grpc = ""
        self.http = ""
        self.zk = ""
        # With TLS (``up(tls_dir=...)``): the directory of ``pubsubd certs dev``'s files.
        self.tls_dir: Path | None = None
        # With authentication (``up(tokens=True)``): DIR/auth; ``iam``: IAM on too.
        self.auth_dir: Path | None = None
        self.iam = False
        # With ZooKeeper authentication (``up(zk_auth=True)``): DIR/zookeeper.credential.
        self.zk_auth_file: Path | None = None

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    # -- state -----------------------------------------------------------------------------

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        state = {
            "grpc": self.grpc,
            "http": self.http,
            "zookeeper": self.zk,
            "tls_dir": str(self.tls_dir) if self.tls_dir is not None else None,
            "auth_dir": str(self.auth_dir) if self.auth_dir is not None else None,
            "iam": self.iam,
            "zk_auth_file": str(self.zk_auth_file) if self.zk_auth_file is not None else None,
            "processes": [asdict(p) for p in self.processes],
        }
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(temporary, self.state_path)

    @classmethod
    def load(cls, directory: Path) -> LocalCluster:
        cluster = cls(directory)
        try:
            state = json.loads(cluster.state_path.read_text())
        except FileNotFoundError:
            raise ClusterError(
                f"no cluster in {cluster.directory} ({STATE_FILE} missing)"
            ) from None
        cluster.grpc, cluster.http, cluster.zk = state["grpc"], state["http"], state["zookeeper"]
        cluster.tls_dir = Path(state["tls_dir"]) if state.get("tls_dir") else None
        cluster.auth_dir = Path(state["auth_dir"]) if state.get("auth_dir") else None
        cluster.iam = bool(state.get("iam"))
        cluster.zk_auth_file = Path(state["zk_auth_file"]) if state.get("zk_auth_file") else None
        cluster.processes = [Process(**p) for p in state["processes"]]
        return cluster

    def described(self) -> dict[str, Any]:
        """What ``up --json`` prints."""
        return {
            "grpc": self.grpc,
            "http": self.http,
            "zookeeper": self.zk,
            "frontends": self.frontends,
            "tls_ca": str(self.tls_dir / "ca.pem") if self.tls_dir is not None else None,
            "token": self.admin_token,
            "token_file": str(self.auth_dir / ADMIN_TOKEN_FILE) if self.auth_dir else None,
            "iam": self.iam,
            "zk_auth_file": str(self.zk_auth_file) if self.zk_auth_file is not None else None,
            "processes": [
                {
                    "role": p.role,
                    "name": p.name,
                    "pid": p.pid if p.running(self._marker(p)) else None,
                    "address": p.address,
                    "zone": p.zone,
                    "log": p.log,
                }
                for p in self.processes
            ],
        }

    @property
    def zk_tls(self) -> ClientTls | None:
        """With ``tls_dir``: how the cluster's processes (and its tools) reach ZooKeeper, which
        then speaks TLS only and asks for their certificate (certs dev's server pair)."""
        d = self.tls_dir
        if d is None:
            return None
        return ClientTls(d / "ca.pem", d / "server.pem", d / "server-key.pem")

    @property
    def zk_credential(self) -> DigestCredential | None:
        """With ``zk_auth``: the credential the cluster's processes (and its tools) give
        ZooKeeper, whose znodes only it may read or write."""
        return load_credential(self.zk_auth_file) if self.zk_auth_file is not None else None

    @property
    def admin_token(self) -> str | None:
        """The admin's bearer token (``up(tokens=True)``), None without authentication."""
        if self.auth_dir is None:
            return None
        return (self.auth_dir / ADMIN_TOKEN_FILE).read_text().strip()

    def _marker(self, process: Process) -> Path:
        return self.directory / "zookeeper" if process.role == "zookeeper" else self.directory

    # -- up --------------------------------------------------------------------------------

    def up(
        self,
        *,
        zk_nodes: int = 3,
        storage_nodes: int = 3,
        zones: int = 3,
        disks: int = 1,
        replicas: int = 3,
        routers: int = 0,
        frontends: int = 0,
        forwarders: int = 0,
        probers: int = 0,
        timeout: float = 60.0,
        serve_args: list[str] | None = None,
        forwarder_args: Sequence[Sequence[str]] = (),
        router_args: Sequence[str] = (),
        tls_dir: Path | None = None,
        tokens: bool = False,
        iam: bool = False,
        zk_auth: bool = False,
    ) -> LocalCluster:
        """Start ZooKeeper, the storage nodes, the serving process (or, with ``forwarders``,
        that many forwarders serving the topics the routers assign them), ``routers`` routers
        and ``frontends`` frontends (then clients connect to the frontends: ``grpc`` is the
        first), and ``probers`` probers through every frontend; wait until all are ready.
        ``forwarder_args[i]``: more flags for forwarder i (``--no-publishing``, ...);
        ``router_args``: more flags for every router (``--spread-subscriptions``).
        ``tls_dir``: ``pubsubd certs dev``'s files there, passed to every process (TLS on every
        port; mutual TLS on the storage nodes and ZooKeeper, whose only client port is its
        ``secureClientPort``; the probers trust its CA).
        ``tokens``: authentication on every process clients or forwarders call (serve,
        forwarders, frontends, storage nodes), with a secret and tokens made under DIR/auth
        (:func:`write_cluster_auth`): the probers and clients send the admin's token, the
        forwarders (and serve) the internal one to each other and to the storage nodes;
        ``iam`` (needs ``tokens``): IAM on there too, the admin granted roles/pubsub.admin on
        every project by the policy file.
        ``zk_auth``: a ZooKeeper credential made at DIR/zookeeper.credential (kept if there)
        and given to every process that talks to ZooKeeper (``--zk-auth-file``): the znodes
        they create are that identity's only (ZooKeeper itself needs no configuration).
        Whatever started is stopped again if a later step fails."""
        if forwarders and (not routers or not frontends):
            raise ClusterError("forwarders need at least one router and one frontend")
        if self.state_path.exists():
            existing = LocalCluster.load(self.directory)
            if any(p.running(existing._marker(p)) for p in existing.processes):
                raise ClusterError(f"a cluster is already running in {self.directory}")
        if iam and not tokens:
            raise ClusterError("IAM needs authentication (tokens): the caller it checks")
        require_zookeeper()
        self.directory.mkdir(parents=True, exist_ok=True)
        if tokens:
            self.auth_dir = write_cluster_auth(self.directory / AUTH_DIR)
            self.iam = iam
        if zk_auth:
            self.zk_auth_file = self.directory / ZK_CREDENTIAL_FILE
            write_credential(self.zk_auth_file)
        if tls_dir is not None:
            missing = [f for f in TLS_FILES if not (tls_dir / f).is_file()]
            if missing:
                raise ClusterError(f"{tls_dir} lacks {', '.join(missing)} (pubsubd certs dev)")
            self.tls_dir = tls_dir.resolve()
        try:
            ensemble = Ensemble(self.directory / "zookeeper", zk_nodes, tls=self.zk_tls)
            ensemble.start(timeout)
            self.zk = ensemble.connect_string
            for i, pid in enumerate(ensemble.pids):
                self.processes.append(
                    Process(
                        "zookeeper",
                        pid,
                        f"127.0.0.1:{ensemble.ports[i].client}",
                        log=str(ensemble.log_path(i)),
                        name=f"zookeeper-{i + 1}",
                    )
                )
            self.save()
            for i in range(storage_nodes):
                self.processes.append(self._start_storage(i, zones, disks, timeout))
                self.save()
            if forwarders:
                for i in range(forwarders):
                    extra = [
                        *(serve_args or []),
                        *(forwarder_args[i] if i < len(forwarder_args) else []),
                    ]
                    self.processes.append(self._start_forwarder(i, zones, replicas, extra, timeout))
                    self.save()
            else:
                self.processes.append(self._start_serve(replicas, serve_args or [], timeout))
                self.save()
            for i in range(routers):
                self.processes.append(self._start_router(i, zones, timeout, router_args))
                self.save()
            for i in range(frontends):
                self.processes.append(self._start_frontend(i, zones, timeout))
                self.save()
            if frontends:
                self.grpc = self.frontends[0]
                self.save()
            for i in range(probers):
                self.processes.append(self._start_prober(i, timeout))
                self.save()
        except BaseException:
            self.down()
            raise
        return self

    def _storage_args(self, i: int, zones: int, disks: int, port: int = 0) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "pubsubd",
            "storage",
            "--port",
            str(port),
            "--http-port",
            "-1",
            "--zone",
            f"zone-{i % zones + 1}",
            "--node-id",
            f"storage-{i + 1}",
            "--zk",
            self.zk,
            "--zk-root",
            ZK_ROOT,
        ]
        for k in range(disks):
            args += ["--data-dir", str(self.directory / f"storage-{i + 1}" / f"disk-{k + 1}")]
        # Mutual TLS: only the cluster's processes (showing certs dev's certificate) reach it.
        # With tokens: every call and append connection shows one, of the internal subject.
        auth = (
            [
                *("--auth-secret-file", str(self.auth_dir / SECRET_FILE)),
                *("--internal-token-file", str(self.auth_dir / INTERNAL_TOKEN_FILE)),
            ]
            if self.auth_dir
            else []
        )
        return args + self._tls(client_ca=True, ca=False) + self._zk_auth() + auth

    def _zk_auth(self) -> list[str]:
        """The ZooKeeper credential flag of a process that talks to ZooKeeper (``zk_auth``)."""
        if self.zk_auth_file is None:
            return []
        return ["--zk-auth-file", str(self.zk_auth_file)]

    def _tls(self, *, client_ca: bool = False, ca: bool = True, listen: bool = True) -> list[str]:
        """A process's TLS flags (none without ``tls_dir``): its listeners' certificate, a
        client CA for mutual TLS, the CA its clients of the other processes trust."""
        d = self.tls_dir
        if d is None:
            return []
        args = ["--tls-cert", str(d / "server.pem"), "--tls-key", str(d / "server-key.pem")]
        args = args if listen else []
        if client_ca:
            args += ["--tls-client-ca", str(d / "ca.pem")]
        if ca:
            args += ["--tls-ca", str(d / "ca.pem")]
        # Every process that takes this is a client of ZooKeeper (TLS only, mutual).
        args += ["--zk-tls-ca", str(d / "ca.pem"), "--zk-tls-cert", str(d / "server.pem")]
        return [*args, "--zk-tls-key", str(d / "server-key.pem")]

    def _auth(self, *, internal: bool = False) -> list[str]:
        """The authentication (and IAM) flags of a process clients or forwarders call."""
        d = self.auth_dir
        if d is None:
            return []
        args = ["--auth-secret-file", str(d / SECRET_FILE)]
        if internal:
            args += ["--internal-token-file", str(d / INTERNAL_TOKEN_FILE)]
        if self.iam:
            args += ["--iam", "--iam-policy-file", str(d / POLICY_FILE)]
        return args

    def _start_storage(self, i: int, zones: int, disks: int, timeout: float) -> Process:
        args = self._storage_args(i, zones, disks)
        log = self.directory / f"storage-{i + 1}.log"
        pid, ready = _start(args, log, STORAGE_READY, timeout)
        address, node_id, zone, append = ready.groups()
        # Restarts keep the node's ports, so the addresses registered before stay right.
        args[args.index("--port") + 1] = address.rsplit(":", 1)[1]
        if append:
            args += ["--append-port", append.rsplit(":", 1)[1]]
        return Process("storage", pid, address, zone, str(log), node_id, args, append or "")

    def _start_serve(self, replicas: int, extra: list[str], timeout: float) -> Process:
        args = [
            sys.executable,
            "-m",
            "pubsubd",
            "serve",
            "--port",
            "0",
            "--http-port",
            "0",
            "--data-dir",
            str(self.directory / "serve"),
            "--cluster",
            self.zk,
            "--zk-root",
            ZK_ROOT,
            "--replicas",
            str(replicas),
            "--zone",
            "zone-1",
            *self._tls(),
            *self._zk_auth(),
            *self._auth(internal=True),  # its token: the storage nodes check it
            *extra,
        ]
        log = self.directory / "serve.log"
        pid, ready = _start(args, log, SERVE_READY, timeout)
        host, port, http_host, http_port = ready.groups()
        self.grpc, self.http = f"{host}:{port}", f"{http_host}:{http_port}"
        args[args.index("--port") + 1] = port
        args[args.index("--http-port") + 1] = http_port
        return Process("serve", pid, self.grpc, log=str(log), name="serve", args=args)

    def _start_forwarder(
        self, i: int, zones: int, replicas: int, extra: list[str], timeout: float
    ) -> Process:
        name = f"forwarder-{i + 1}"
        args = [
            sys.executable, "-m", "pubsubd", "forwarder",
            "--port", "0", "--http-port", "0",
            "--data-dir", str(self.directory / name),
            "--cluster", self.zk, "--zk-root", ZK_ROOT,
            "--replicas", str(replicas),
            "--zone", f"zone-{i % min(zones, 2) + 1}",  # two zones: a zone's loss is survivable
            "--forwarder-id", name,
            *self._tls(),
            *self._zk_auth(),
            *self._auth(internal=True),
            *extra,
        ]  # fmt: skip
        log = self.directory / f"{name}.log"
        pid, ready = _start(args, log, SERVE_READY, timeout)
        host, port, http_host, http_port = ready.groups()
        if i == 0:
            self.grpc, self.http = f"{host}:{port}", f"{http_host}:{http_port}"
        args[args.index("--port") + 1] = port
        args[args.index("--http-port") + 1] = http_port
        zone = args[args.index("--zone") + 1]
        return Process("forwarder", pid, f"{host}:{port}", zone, str(log), name, args)

    def _control_args(self, role: str, name: str, zone: str) -> list[str]:
        """A router's or a frontend's command line: ZooKeeper, its ID and zone, any HTTP port,
        and a PID file (which also marks the process as this cluster's)."""
        return [
            sys.executable, "-m", "pubsubd", role,
            "--cluster", self.zk, "--zk-root", ZK_ROOT,
            f"--{role}-id", name, "--zone", zone, "--http-port", "0",
            "--pid-file", str(self.directory / f"{name}.pid"),
            *self._tls(),
            *self._zk_auth(),
        ]  # fmt: skip

    def _start_router(
        self, i: int, zones: int, timeout: float, more: Sequence[str] = ()
    ) -> Process:
        name = f"router-{i + 1}"
        args = [*self._control_args("router", name, f"zone-{i % zones + 1}"), *more]
        log = self.directory / f"{name}.log"
        pid, ready = _start(args, log, ROUTER_READY, timeout)
        _, zone, http = ready.groups()
        args[args.index("--http-port") + 1] = http.rsplit(":", 1)[1]
        return Process("router", pid, http, zone, str(log), name, args)

    def _start_frontend(self, i: int, zones: int, timeout: float) -> Process:
        name = f"frontend-{i + 1}"
        args = [
            *self._control_args("frontend", name, f"zone-{i % zones + 1}"),
            *("--port", "0", "--pulsar-port", "0"),
            *self._auth(),
        ]
        log = self.directory / f"{name}.log"
        pid, ready = _start(args, log, FRONTEND_READY, timeout)
        grpc, http, _, zone, pulsar = ready.groups()
        # Restarts keep the ports, so the address clients were given stays right.
        args[args.index("--port") + 1] = grpc.rsplit(":", 1)[1]
        args[args.index("--http-port") + 1] = http.rsplit(":", 1)[1]
        args[args.index("--pulsar-port") + 1] = pulsar
        return Process("frontend", pid, grpc, zone, str(log), name, args)

    def _start_prober(self, i: int, timeout: float) -> Process:
        name = f"prober-{i + 1}"
        endpoints = [a for e in (self.frontends or [self.grpc]) for a in ("--endpoint", e)]
        args = [
            sys.executable, "-m", "pubsubd", "prober", *endpoints, "--http-port", "0",
            "--pid-file", str(self.directory / f"{name}.pid"),
        ]  # fmt: skip
        if self.tls_dir is not None:
            args += ["--ca-file", str(self.tls_dir / "ca.pem")]
        if self.auth_dir is not None:
            args += ["--token-file", str(self.auth_dir / ADMIN_TOKEN_FILE)]
        log = self.directory / f"{name}.log"
        pid, ready = _start(args, log, PROBER_READY, timeout)
        http = ready.group(2)
        args[args.index("--http-port") + 1] = http.rsplit(":", 1)[1]
        return Process("prober", pid, http, "", str(log), name, args)

    @property
    def frontends(self) -> list[str]:
        """The frontends' gRPC addresses (empty: clients connect to the serving process)."""
        return [p.address for p in self.processes if p.role == "frontend"]

    # -- one process at a time (fault tests, rolling restarts) -------------------------------

    def process(self, name: str) -> Process:
        for p in self.processes:
            if p.name == name:
                return p
        raise ClusterError(f"no process named {name} in {self.directory}")

    def signal(self, name: str, signum: signal.Signals) -> None:
        p = self.process(name)
        if p.pid is not None and p.running(self._marker(p)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signum)

    def kill(self, name: str) -> None:
        """kill -9 one process and wait until it is gone."""
        p = self.process(name)
        self.signal(name, signal.SIGKILL)
        self._wait_gone(p, 10.0)
        p.pid = None
        self.save()

    def restart(self, name: str, timeout: float = 60.0) -> None:
        """Start a stopped process again with the same arguments (and ports)."""
        p = self.process(name)
        if p.pid is not None and p.running(self._marker(p)):
            raise ClusterError(f"{name} is running")
        if p.role == "zookeeper":
            ensemble = Ensemble.attach(self.directory / "zookeeper")
            index = int(name.rsplit("-", 1)[1]) - 1
            ensemble.start_node(index, timeout)
            p.pid = ensemble.pids[index]
        else:
            p.pid, _ = _start(p.args, Path(p.log), READY[p.role], timeout)
        self.save()

    def stop(self, name: str, timeout: float = 20.0) -> None:
        """Stop one process cleanly (SIGTERM; SIGKILL after ``timeout``) and wait until it is
        gone."""
        p = self.process(name)
        self.signal(name, signal.SIGTERM)
        if not self._wait_gone(p, timeout):
            self.signal(name, signal.SIGKILL)
            self._wait_gone(p, 10.0)
        p.pid = None
        self.save()

    def rolling_restart(
        self, timeout: float = 60.0, each: Callable[[str], None] | None = None
    ) -> list[str]:
        """Restart every process one at a time, each after the one before is ready again:
        ZooKeeper's nodes, the storage nodes, the serving process, the routers, then the
        frontends (``each(name)`` after each one is back). Returns the names, in order."""
        order = {
            "zookeeper": 0,
            "storage": 1,
            "serve": 2,
            "forwarder": 2,
            "router": 3,
            "frontend": 4,
            "prober": 5,
        }
        names = [p.name for p in sorted(self.processes, key=lambda p: order.get(p.role, 9))]
        for name in names:
            p = self.process(name)
            if p.pid is not None and p.running(self._marker(p)):
                self.stop(name)
            self.restart(name, timeout)
            if each is not None:
                each(name)
        return names

    # -- down ------------------------------------------------------------------------------

    def down(self, timeout: float = 20.0) -> list[str]:
        """Stop every recorded process (SIGTERM, SIGKILL after ``timeout``); frontends, routers
        and the serving process first, ZooKeeper last. Returns the names of the processes
        stopped."""
        order = {
            "prober": 0,
            "frontend": 0,
            "router": 0,
            "serve": 1,
            "forwarder": 1,
            "storage": 2,
            "zookeeper": 3,
        }
        stopped = []
        for role in sorted(order, key=order.__getitem__):
            group = [p for p in self.processes if p.role == role and p.pid is not None]
            group = [p for p in group if p.running(self._marker(p))]
            for p in group:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)  # type: ignore[arg-type]
            for p in group:
                if not self._wait_gone(p, timeout):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
                    self._wait_gone(p, 10.0)
                stopped.append(p.name)
                p.pid = None
        if (self.directory / "zookeeper" / "ensemble.json").exists():
            Ensemble.attach(self.directory / "zookeeper").stop()
        if self.processes:
            self.save()
        return stopped

    def _wait_gone(self, p: Process, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if p.pid is None or not _alive(p.pid) or not p.running(self._marker(p)):
                if p.pid is not None and p.pid in _CHILDREN:
                    _CHILDREN.pop(p.pid).wait()  # a zombie of ours: reap it
                return True
            time.sleep(0.05)
        return False
