"""Local ZooKeeper ensembles on loopback, for ``pubsubd cluster up`` and the tests.

ZooKeeper comes from Debian (``apt-get install -y --no-install-recommends zookeeper``: jars in
``/usr/share/java`` and a JRE; never ``zookeeperd``, which adds init scripts). An ensemble of N
nodes (1: standalone, 3: a quorum surviving one loss) runs under one directory::

    DIR/ensemble.json        ports and PIDs (``Ensemble.attach`` reads it: ``cluster down``)
    DIR/node-1/zoo.cfg       the node's configuration (tickTime 500 ms, loopback only)
    DIR/node-1/data/myid     its id; the data directory holds its snapshots and txn logs
    DIR/node-1/zookeeper.log its stdout and stderr (slf4j-simple when installed), appended

Nodes are indexed from 0 in this API (node ``i`` has myid ``i + 1``). They run in their own
session (``setsid``), so they outlive a CLI that started them and ignore its terminal's
signals; every signal is sent by recorded PID after checking that the PID still runs this
node's configuration, never by name. A node is ready when ``srvr`` on its client port answers
``Mode: leader|follower|standalone``.

With ``tls`` (a ``core.tls.ClientTls``: a CA, a certificate and its key) the ensemble speaks
TLS only: the client port is a ``secureClientPort`` (Netty, PEM key and trust stores; client
certificates required and checked against the CA), there is no plaintext client port, and with
several nodes the quorum's own connections are TLS too (``sslQuorum``). Each node's key store
is ``DIR/node-N/keystore.pem`` (the key then the certificate, mode 0600). Clients connect with
kazoo's ``use_ssl`` (``Coordinator(tls=...)``); ``srvr`` is asked over TLS too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pubsubd.core.tls import ClientTls, client_context

JAR_DIR = Path("/usr/share/java")
INSTALL_COMMAND = "apt-get install -y --no-install-recommends zookeeper"
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
JVM_OPTIONS = ("-Xms32m", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
REQUIRED_JARS = ("zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar")
OPTIONAL_JARS = (
    "netty-buffer.jar",
    "netty-codec.jar",
    "netty-common.jar",
    "netty-handler.jar",
    "netty-resolver.jar",
    "netty-transport.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
    "metrics-core.jar",
    "commons-cli.jar",
    "commons-io.jar",
    "snappy-java.jar",
)
# The first one installed is the logging binding: slf4j-simple writes ZooKeeper's log (INFO)
# to the node's log file; slf4j-nop (what SCALE_OUT.md names) would leave it empty.
LOG_BINDINGS = ("slf4j-simple.jar", "slf4j-nop.jar")
STATE_FILE = "ensemble.json"
READY_MODES = frozenset({"leader", "follower", "standalone"})
HOST = "127.0.0.1"
TICK_MS = 500
_POLL_S = 0.05
_START_ATTEMPTS = 3  # fresh ports after a bind conflict (another process took a free port)


class ZooKeeperMissing(RuntimeError):
    """ZooKeeper (or Java) is not installed; the message names the command that installs it."""

    def __init__(self, jar_dir: Path, what: str) -> None:
        super().__init__(
            f"ZooKeeper is not installed ({what} not found in {jar_dir} or on PATH). "
            f"Install it from Debian with: {INSTALL_COMMAND}"
        )


class EnsembleError(RuntimeError):
    """A node did not start, or did not become ready in time; the message has its log tail."""


@dataclass(frozen=True, slots=True)
class ZooKeeperInstall:
    """Where Java and the ZooKeeper jars are."""

    java: str
    classpath: tuple[Path, ...]

    def command(self, config: Path, node_dir: Path) -> list[str]:
        return [
            self.java,
            *JVM_OPTIONS,
            f"-XX:ErrorFile={node_dir / 'hs_err_%p.log'}",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-cp",
            ":".join(str(p) for p in self.classpath),
            MAIN_CLASS,
            str(config),
        ]


def find_zookeeper(jar_dir: Path = JAR_DIR) -> ZooKeeperInstall | None:
    """The local ZooKeeper installation, or None if Java or a required jar is missing."""
    try:
        return require_zookeeper(jar_dir)
    except ZooKeeperMissing:
        return None


def require_zookeeper(jar_dir: Path = JAR_DIR) -> ZooKeeperInstall:
    """The local ZooKeeper installation; raises ``ZooKeeperMissing`` naming the install command."""
    for name in REQUIRED_JARS:
        if not (jar_dir / name).is_file():
            raise ZooKeeperMissing(jar_dir, name)
    binding = next((jar_dir / b for b in LOG_BINDINGS if (jar_dir / b).is_file()), None)
    if binding is None:
        raise ZooKeeperMissing(jar_dir, " or ".join(LOG_BINDINGS))
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperMissing(jar_dir, "java")
    optional = [jar_dir / name for name in OPTIONAL_JARS if (jar_dir / name).is_file()]
    jars = [jar_dir / name for name in REQUIRED_JARS]
    return ZooKeeperInstall(java, (*jars, binding, *optional))


# --- configuration (pure) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodePorts:
    client: int
    peer: int  # followers to the leader
    election: int  # leader election


NETTY = "org.apache.zookeeper.server.NettyServerCnxnFactory"


def render_config(
    data_dir: Path,
    own: NodePorts,
    ensemble: Sequence[NodePorts],
    tls: tuple[Path, Path] | None = None,
) -> str:
    """zoo.cfg of one node; one node alone runs standalone (no ``server.N`` lines). ``tls``:
    (key store, trust store) PEM files: TLS only, client certificates required."""
    if tls is None:
        client = [f"clientPort={own.client}", f"clientPortAddress={HOST}"]
    else:
        keystore, truststore = tls
        stores = [
            f"keyStore.location={keystore}",
            "keyStore.type=PEM",
            f"trustStore.location={truststore}",
            "trustStore.type=PEM",
        ]
        client = [
            f"secureClientPort={own.client}",
            f"secureClientPortAddress={HOST}",
            f"serverCnxnFactory={NETTY}",
            *(f"ssl.{line}" for line in stores),
            "ssl.clientAuth=need",
        ]
        if len(ensemble) > 1:
            client += ["sslQuorum=true", *(f"ssl.quorum.{line}" for line in stores)]
    lines = [
        f"tickTime={TICK_MS}",
        "initLimit=10",
        "syncLimit=5",
        f"dataDir={data_dir}",
        *client,
        "admin.enableServer=false",
        "4lw.commands.whitelist=srvr,ruok,mntr",
        "preAllocSize=4096",  # KiB per transaction log file, not 64 MiB
        "autopurge.purgeInterval=1",  # hours: old snapshots and logs do not pile up
    ]
    if len(ensemble) > 1:
        lines += [
            f"server.{n}={HOST}:{p.peer}:{p.election}" for n, p in enumerate(ensemble, start=1)
        ]
    return "\n".join(lines) + "\n"


def connect_string(ports: Sequence[NodePorts]) -> str:
    """What clients are given: every node's client address."""
    return ",".join(f"{HOST}:{p.client}" for p in ports)


def parse_mode(answer: str) -> str | None:
    """The ``Mode:`` of a ``srvr`` answer (None: not serving, e.g. no quorum)."""
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.removeprefix("Mode:").strip()
    return None


# --- probing and processes -------------------------------------------------------------------


def mode(
    port: int, host: str = HOST, timeout: float = 1.0, tls: ClientTls | None = None
) -> str | None:
    """Ask a node ``srvr``: leader, follower, standalone, or None (down, or not serving).
    ``tls``: over TLS, showing its certificate (a TLS-only ensemble)."""
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
            if tls is not None:
                context = client_context(tls.ca, tls.cert, tls.key)
                sock = stack.enter_context(context.wrap_socket(sock, server_hostname=host))
            sock.sendall(b"srvr")
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    except OSError:  # ssl.SSLError included
        return None
    return parse_mode(b"".join(chunks).decode("utf-8", errors="replace"))


def _free_ports(count: int) -> list[int]:
    """Ports the kernel has free on loopback now (all bound at once, so they differ)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]


def _reaped(pid: int) -> bool | None:
    """Reap ``pid`` if it is our exited child: True if it was (it no longer exists), False if
    it is our running child, None if it is not our child (attached, or already reaped)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return done == pid


def _runs(pid: int, config: Path) -> bool:
    """Whether ``pid`` is alive and still the ZooKeeper node of ``config`` (not a reused PID)."""
    reaped = _reaped(pid)
    if reaped:
        return False
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        args = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat[stat.rfind(")") + 2 :].startswith("Z"):
        return False  # exited, waiting for a parent that is not us to reap it
    if args == [b""]:
        # Just spawned: the kernel shows no command line until the exec is done. Only our
        # own child can be in that state for us.
        return reaped is False
    return MAIN_CLASS.encode() in args and str(config).encode() in args


def _spawn(command: list[str], log: Path) -> int:
    """Start ``command`` in its own session with stdout and stderr appended to ``log``."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawn(command[0], command, dict(os.environ), file_actions=actions, setsid=True)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --- the ensemble -----------------------------------------------------------------------------


class Ensemble:
    """N ZooKeeper nodes on 127.0.0.1 under ``directory`` (``nodes=1``: one standalone node).

    ``start()`` returns once every node is ready; ``stop()`` ends them (SIGTERM, then SIGKILL);
    ``kill(i)`` and ``start_node(i)`` are for fault tests. ``attach(directory)`` picks up an
    ensemble another process started, from its state file. Usable as a context manager.
    """

    def __init__(
        self,
        directory: Path,
        nodes: int = 3,
        *,
        install: ZooKeeperInstall | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"an ensemble has at least one node, got {nodes}")
        if tls is not None and None in (tls.ca, tls.cert, tls.key):
            raise ValueError("a TLS ensemble needs a CA, a certificate and its key")
        self.directory = directory.resolve()
        self.size = nodes
        self.tls = tls
        self._install = install
        self.ports: list[NodePorts] = []
        self._pids: list[int | None] = [None] * nodes

    @classmethod
    def attach(cls, directory: Path, *, install: ZooKeeperInstall | None = None) -> Ensemble:
        """The ensemble recorded in ``directory/ensemble.json`` (raises FileNotFoundError)."""
        state = json.loads((directory / STATE_FILE).read_text())
        nodes = state["nodes"]
        tls = state.get("tls")
        ensemble = cls(
            directory,
            len(nodes),
            install=install,
            tls=ClientTls(Path(tls["ca"]), Path(tls["cert"]), Path(tls["key"])) if tls else None,
        )
        ensemble.ports = [
            NodePorts(n["client_port"], n["peer_port"], n["election_port"]) for n in nodes
        ]
        ensemble._pids = [n["pid"] for n in nodes]
        return ensemble

    # -- what it is ---------------------------------------------------------------------------

    @property
    def connect_string(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,...``: what a ZooKeeper client connects to."""
        if not self.ports:
            raise RuntimeError("the ensemble has not been started")
        return connect_string(self.ports)

    @property
    def pids(self) -> list[int | None]:
        """Each node's PID, None for a node that is not running."""
        return [pid if self.running(i) else None for i, pid in enumerate(self._pids)]

    def node_dir(self, i: int) -> Path:
        return self.directory / f"node-{i + 1}"

    def config_path(self, i: int) -> Path:
        return self.node_dir(i) / "zoo.cfg"

    def log_path(self, i: int) -> Path:
        return self.node_dir(i) / "zookeeper.log"

    def running(self, i: int) -> bool:
        pid = self._pids[i]
        return pid is not None and _runs(pid, self.config_path(i))

    def mode(self, i: int, timeout: float = 1.0) -> str | None:
        """Node ``i``'s answer to ``srvr`` (None: down or not serving)."""
        if not self.ports:
            return None
        return mode(self.ports[i].client, timeout=timeout, tls=self.tls)

    def leader(self) -> int | None:
        """The index of the node that leads (a standalone node leads itself), or None."""
        for i in range(self.size):
            if self.running(i) and self.mode(i) in ("leader", "standalone"):
                return i
        return None

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Ensemble:
        """Configure every node on fresh free ports, start them, wait until all are ready."""
        if any(self.running(i) for i in range(self.size)):
            raise EnsembleError(f"the ensemble in {self.directory} is already running")
        for attempt in range(1, _START_ATTEMPTS + 1):
            ports = _free_ports(3 * self.size)
            self.ports = [NodePorts(*ports[3 * i : 3 * i + 3]) for i in range(self.size)]
            for i in range(self.size):
                self._configure(i)
            for i in range(self.size):
                self._launch(i)
            self._save()
            try:
                self.wait_ready(timeout)
                return self
            except EnsembleError:
                conflict = any(
                    not self.running(i) and "Address already in use" in _tail(self.log_path(i))
                    for i in range(self.size)
                )
                self.stop()
                if not conflict or attempt == _START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def start_node(self, i: int, timeout: float = 30.0) -> None:
        """Start node ``i`` again (same ports and data) and wait until it is ready."""
        if self.running(i):
            raise EnsembleError(f"node {i} of {self.directory} is already running")
        self._launch(i)
        self._save()
        self.wait_ready(timeout, [i])

    def wait_ready(self, timeout: float = 30.0, nodes: Sequence[int] | None = None) -> None:
        """Wait until the given nodes (default: all) answer ``srvr`` with a serving mode."""
        waiting = set(range(self.size) if nodes is None else nodes)
        deadline = time.monotonic() + timeout
        while waiting:
            for i in sorted(waiting):
                if not self.running(i):
                    raise EnsembleError(
                        f"ZooKeeper node {i} exited; {self.log_path(i)}:\n{_tail(self.log_path(i))}"
                    )
                if self.mode(i, timeout=0.5) in READY_MODES:
                    waiting.discard(i)
            if not waiting:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"{self.log_path(i)}:\n{_tail(self.log_path(i))}" for i in waiting)
                raise EnsembleError(
                    f"ZooKeeper nodes {sorted(waiting)} not ready after {timeout}s\n{logs}"
                )
            time.sleep(_POLL_S)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (a crash) and wait until it is gone."""
        self._signal(i, signal.SIGKILL)
        self._wait_gone([i], 10.0)
        self._pids[i] = None
        self._save()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every running node, SIGKILL what is left after ``timeout``; wait for all."""
        running = [i for i in range(self.size) if self.running(i)]
        for i in running:
            self._signal(i, signal.SIGTERM)
        left = self._wait_gone(running, timeout)
        for i in left:
            self._signal(i, signal.SIGKILL)
        if self._wait_gone(left, 10.0):
            raise EnsembleError(f"ZooKeeper nodes {left} survived SIGKILL")
        self._pids = [None] * self.size
        if self.ports:
            self._save()

    def __enter__(self) -> Ensemble:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------

    def _configure(self, i: int) -> None:
        data = self.node_dir(i) / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{i + 1}\n")
        stores = None
        if self.tls is not None:
            assert self.tls.key is not None and self.tls.cert is not None and self.tls.ca
            keystore = self.node_dir(i) / "keystore.pem"
            descriptor = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "wb") as f:
                f.write(self.tls.key.read_bytes() + b"\n" + self.tls.cert.read_bytes())
            stores = (keystore, self.tls.ca)
        self.config_path(i).write_text(render_config(data, self.ports[i], self.ports, stores))

    def _launch(self, i: int) -> None:
        if self._install is None:
            self._install = require_zookeeper()
        command = self._install.command(self.config_path(i), self.node_dir(i))
        self._pids[i] = _spawn(command, self.log_path(i))

    def _signal(self, i: int, signum: signal.Signals) -> None:
        pid = self._pids[i]
        if pid is not None and _runs(pid, self.config_path(i)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _wait_gone(self, nodes: Sequence[int], timeout: float) -> list[int]:
        """Wait until none of ``nodes`` runs; returns those still running at the deadline."""
        deadline = time.monotonic() + timeout
        left = list(nodes)
        while left:
            left = [i for i in left if self.running(i)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        return left

    def _save(self) -> None:
        tls = self.tls
        state = {
            "connect_string": connect_string(self.ports),
            "tls": (
                {"ca": str(tls.ca), "cert": str(tls.cert), "key": str(tls.key)}
                if tls is not None
                else None
            ),
            "nodes": [
                {
                    "id": i + 1,
                    "pid": self._pids[i],
                    "client_port": p.client,
                    "peer_port": p.peer,
                    "election_port": p.election,
                    "log": str(self.log_path(i)),
                }
                for i, p in enumerate(self.ports)
            ],
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / STATE_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2) + "\n")
        temporary.replace(path)


def stop_recorded(directory: Path, timeout: float = 10.0) -> bool:
    """Stop the ensemble recorded under ``directory`` (``cluster down``); False if none is."""
    try:
        ensemble = Ensemble.attach(directory)
    except FileNotFoundError:
        return False
    ensemble.stop(timeout)
    return True
