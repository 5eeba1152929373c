"""``python -m bench.cluster``: the replicated storage tier (issue 10) beside the embedded server.

Three deployments run side by side on 127.0.0.1, each in its own temporary directory:

* ``embedded``: ``pubsubd serve --fsync always``, one process (the ``pubsubd`` target of
  ``bench.run``);
* ``cluster-1``: ``pubsubd.cluster.launcher.LocalCluster`` with ZooKeeper (``--zk-nodes``), one
  ``pubsubd storage`` node and ``pubsubd serve --cluster --replicas 1``;
* ``cluster-3``: ZooKeeper, three storage nodes in three zones and ``serve --cluster
  --replicas 3``: every entry goes to three nodes and is acknowledged at a majority (two).
* ``cluster-3-fe`` (only when asked for with ``--deployments``): ``cluster-3`` with a
  ``pubsubd frontend`` in front: the client talks to the frontend, which passes every call to
  the serving process (issue 11's frontend -> forwarder -> storage path).

Phases, all bounded in time:

1. **up**: start every deployment; after ``--settle`` seconds read each process's RSS and its
   CPU over the next ``--settle`` seconds (idle).
2. **warm-up**: ``bench.registry.WARMUP`` on every deployment (not reported).
3. **measurements, interleaved**: for run 1..``--runs``, for each workload, each deployment in
   turn (the order rotating between runs), one fresh ``bench.worker`` process. The workloads are
   ``bench.registry``'s ``publish-raw-100B`` (raw publish throughput; ``publish-raw-100B-c16``,
   the same with 16 requests in flight, shows whether the round trip limits it),
   ``publish-latency-1000`` (the publish acknowledgement alone: 10-message RPCs every 10 ms)
   and ``latency-1000`` (end to end through the official publisher and ``subscribe()`` at
   1000 msg/s). Every
   measurement records the CPU time of the serving process, of every other process of every
   deployment (storage nodes, ZooKeeper: ``watch``), of the client, and of the rest of the
   machine (foreign load), all from ``/proc``.
4. **memory after**: RSS of every process again, then every deployment is stopped.
5. **takeover**, for each ``--session-timeouts`` value T: a fresh ``cluster-3`` whose processes
   run with ``PUBSUBD_ZK_SESSION_TIMEOUT_S=T``, a topic holding ``--takeover-backlog`` messages,
   a prober publishing one message at a time (1 s deadline, a fresh channel after each failure),
   then ``--takeover-rounds`` times: kill -9 of the serving process, started again at once with
   the same arguments (what a supervisor does); measured: kill to the new process's ready line,
   and kill to the prober's first acknowledged publish. The embedded server is measured the same
   way once (no session involved), as the floor.
6. **repair**, for each ``--repair-rates`` value (the auditor's rate limit), ``--repair-runs``
   times: a fresh 4-node cluster (replicas 3), ``--repair-topics`` topics of
   ``--repair-mib-per-topic`` MiB, kill -9 of the storage node holding the most bytes while a
   trickle of publishes goes on; measured: kill to the first copy, to every ledger repaired, and
   the copy rate in MiB/s and ledgers/s (from the auditor's log of each copy). Only when the
   code under test has the repair auditor (``pubsubd/storage/ledgers/auditor.py``).

Results go to ``bench/results/cluster-<UTC time>.json`` and ``.md`` (git ignores them); the
markdown tables are printed. Run it under the benchmark lock, and with ``--rev REV`` to measure
a committed revision (exported with ``git archive`` and put first on every spawned process's
``PYTHONPATH``) while others edit ``src/``::

    flock /tmp/pubsubd-bench.lock .venv/bin/python -m bench.cluster --rev HEAD
    flock /tmp/pubsubd-bench.lock .venv/bin/python -m bench.cluster --quick
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from bench import pb
from bench.orchestration import WORKER_GRACE_S, log, run_worker
from bench.registry import WARMUP, WORKLOADS, Workload
from bench.report import RESULTS_DIR, machine_info
from bench.targets import PUBSUBD_READY, REPO_ROOT, Revision, TargetError, exported
from bench.workloads import (
    CHANNEL_OPTIONS,
    machine_busy_s,
    process_cpu_s,
    process_status,
    raw_publish,
)

# A diagnostic beside publish-raw-100B: the same requests with 16 in flight instead of 4. If a
# deployment gains much more from it than the embedded server does, its limit is the longer round
# trip of each request (replication), not CPU.
PUBLISH_RAW_C16 = Workload(
    "publish-raw-100B-c16",
    "publish_raw",
    "Publish 100 B, raw gRPC (1000-msg requests, 16 in flight)",
    {"size": 100, "count": 10_000_000, "batch": 1000, "concurrency": 16, "time_limit_s": 3.0},
    {"size": 100, "count": 4_000_000, "batch": 1000, "concurrency": 16, "time_limit_s": 1.5},
    targets=("pubsubd",),
)
RAW_WORKLOADS = ("publish-raw-100B", "publish-raw-100B-c16")
WORKLOAD_NAMES = (*RAW_WORKLOADS, "publish-latency-1000", "latency-1000")
DEPLOYMENTS = ("embedded", "cluster-1", "cluster-3")
LABELS = {
    "embedded": "embedded (`serve --fsync always`)",
    "cluster-1": "cluster, 1 storage node (replicas 1)",
    "cluster-3": "cluster, 3 storage nodes (replicas 3, ack 2)",
    "cluster-4": "cluster, 4 storage nodes (replicas 3, ack 2)",
    "cluster-3-fe": "cluster-3 through a frontend",
}
OPTIONAL_DEPLOYMENTS = ("cluster-3-fe",)
SHAPES = {  # storage nodes, zones, replicas
    "cluster-1": (1, 1, 1),
    "cluster-3": (3, 3, 3),
    "cluster-4": (4, 4, 3),  # the repair phase: a node's ledgers get a fourth node to go to
    "cluster-3-fe": (3, 3, 3),
}
SESSION_ENV = "PUBSUBD_ZK_SESSION_TIMEOUT_S"
CREATE_TOPIC = f"/{pb.PUBLISHER}/CreateTopic"
DELETE_TOPIC = f"/{pb.PUBLISHER}/DeleteTopic"
CREATE_SUBSCRIPTION = f"/{pb.SUBSCRIBER}/CreateSubscription"
START_TIMEOUT_S = 120.0
PROBE_DEADLINE_S = 1.0
TAKEOVER_BOUND_S = 90.0  # kill to first acknowledged publish, per round


# --- deployments ------------------------------------------------------------------------------


class Deployment(abc.ABC):
    """One deployment under test: its serving endpoint and every process it runs."""

    def __init__(self, key: str, root: Path) -> None:
        self.key = key
        self.directory = root / key

    @property
    @abc.abstractmethod
    def endpoint(self) -> str: ...

    @property
    @abc.abstractmethod
    def pid(self) -> int | None:
        """The serving process (the one clients talk to)."""

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def processes(self) -> dict[str, int]:
        """Running processes by name (``serve``, ``storage-N``, ``zookeeper-N``)."""

    @abc.abstractmethod
    def kill_serve(self) -> None:
        """kill -9 the serving process and wait until it is gone."""

    @abc.abstractmethod
    def restart_serve(self) -> None:
        """Start the serving process again (same arguments and ports); return once it is
        ready."""

    @abc.abstractmethod
    def stop(self) -> None: ...

    def alive(self) -> bool:
        pid = self.pid
        return pid is not None and process_cpu_s(pid) is not None


class Embedded(Deployment):
    """``pubsubd serve --fsync always``, our own child process."""

    def __init__(self, root: Path) -> None:
        super().__init__("embedded", root)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log_path = self.directory / f"serve-{self.starts}.log"
        with log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "pubsubd", "serve", "--port", str(self.port),
                    "--http-port", "0", "--data-dir", str(self.directory / "data"),
                    "--fsync", "always",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            m = PUBSUBD_READY.search(log_path.read_text(errors="replace"))
            if m:
                self.port = int(m.group(2))
                return
            if self.proc.poll() is not None:
                raise TargetError(f"embedded server exited:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.01)
        self.stop()
        raise TargetError(f"embedded server not ready after {START_TIMEOUT_S:.0f} s")

    def processes(self) -> dict[str, int]:
        pid = self.pid
        return {"serve": pid} if pid is not None else {}

    def kill_serve(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # our own child, by PID
        self.proc.wait(10)

    def restart_serve(self) -> None:
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Cluster(Deployment):
    """A ``LocalCluster``: ZooKeeper, storage nodes and ``serve --cluster``, each started and
    stopped by the launcher by recorded PID."""

    def __init__(self, key: str, root: Path, zk_nodes: int) -> None:
        super().__init__(key, root)
        self.storage_nodes, self.zones, self.replicas = SHAPES[key]
        self.zk_nodes = zk_nodes
        self.cluster: Any = None  # pubsubd.cluster.launcher.LocalCluster, imported late

    @property
    def endpoint(self) -> str:
        return str(self.cluster.grpc)

    @property
    def pid(self) -> int | None:
        pid = self.cluster.process("serve").pid
        return int(pid) if pid is not None else None

    def start(self) -> None:
        # Imported here: with --rev, pubsubd comes from the exported revision (see main).
        from pubsubd.cluster.launcher import LocalCluster

        self.cluster = LocalCluster(self.directory)
        try:
            extra = {"frontends": 1} if self.key.endswith("-fe") else {}
            self.cluster.up(
                zk_nodes=self.zk_nodes,
                storage_nodes=self.storage_nodes,
                zones=self.zones,
                replicas=self.replicas,
                timeout=START_TIMEOUT_S,
                **extra,
            )
        except Exception as e:
            raise TargetError(f"{self.key}: {e}") from e

    def processes(self) -> dict[str, int]:
        if self.cluster is None:
            return {}
        return {p.name: int(p.pid) for p in self.cluster.processes if p.pid is not None}

    def kill_serve(self) -> None:
        self.cluster.kill("serve")

    def restart_serve(self) -> None:
        self.cluster.restart("serve", timeout=START_TIMEOUT_S)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.down()


def make_deployment(key: str, root: Path, zk_nodes: int) -> Deployment:
    return Embedded(root) if key == "embedded" else Cluster(key, root, zk_nodes)


@contextlib.contextmanager
def running(deployments: list[Deployment]) -> Iterator[list[Deployment]]:
    """Start them in order; stop every one that started, whatever happens."""
    started: list[Deployment] = []
    try:
        for d in deployments:
            t0 = time.monotonic()
            started.append(d)
            d.start()
            log(f"started {d.key} in {time.monotonic() - t0:.1f}s: {d.processes()}")
        yield deployments
    finally:
        for d in reversed(started):
            try:
                d.stop()
            except Exception as e:  # go on stopping the others
                log(f"stopping {d.key} failed: {e}")


# --- per-process figures ----------------------------------------------------------------------


def watch_list(deployments: list[Deployment], serving: Deployment) -> dict[str, int]:
    """Every process of every deployment but ``serving``'s serving process (the Meter reads that
    one as the server), named ``deployment/process``."""
    out = {}
    for d in deployments:
        for name, pid in d.processes().items():
            if not (d is serving and name == "serve"):
                out[f"{d.key}/{name}"] = pid
    return out


def rss_mb(deployments: list[Deployment]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for d in deployments:
        for name, pid in d.processes().items():
            with contextlib.suppress(OSError):
                out.setdefault(d.key, {})[name] = process_status(pid)["rss_kb"] / 1024
    return out


def idle_cpu_pct(deployments: list[Deployment], seconds: float) -> dict[str, dict[str, float]]:
    before = {(d.key, n): process_cpu_s(p) for d in deployments for n, p in d.processes().items()}
    time.sleep(seconds)
    out: dict[str, dict[str, float]] = {}
    for d in deployments:
        for name, pid in d.processes().items():
            a, b = before.get((d.key, name)), process_cpu_s(pid)
            if a is not None and b is not None:
                out.setdefault(d.key, {})[name] = 100.0 * (b - a) / seconds
    return out


def foreign_cpu_pct(deployments: list[Deployment], seconds: float = 1.0) -> float:
    """CPU the rest of the machine used over ``seconds`` (all CPUs busy minus our processes and
    this one), in % of one core."""
    pids = [p for d in deployments for p in d.processes().values()]

    def ours() -> float:
        t = os.times()
        return t.user + t.system + sum(process_cpu_s(p) or 0.0 for p in pids)

    m0, o0 = machine_busy_s(), ours()
    time.sleep(seconds)
    return max(0.0, 100.0 * ((machine_busy_s() - m0) - (ours() - o0)) / seconds)


def wait_for_quiet(
    deployments: list[Deployment], limit_pct: float, budget_s: float
) -> dict[str, float]:
    """Before a measurement: wait (at most ``budget_s``) until the foreign load over one second
    is below ``limit_pct``; returns the last sample and the seconds waited."""
    t0 = time.monotonic()
    foreign = foreign_cpu_pct(deployments)
    samples = 1
    while foreign > limit_pct and time.monotonic() - t0 < budget_s:
        foreign = foreign_cpu_pct(deployments)
        samples += 1
    return {"foreign_before_pct": foreign, "waited_s": time.monotonic() - t0, "samples": samples}


# --- the interleaved measurements -------------------------------------------------------------


def measure(
    deployments: list[Deployment],
    workloads: list[Workload],
    runs: int,
    quick: bool,
    warmup: bool,
    max_foreign: float,
    quiet_budget_s: float,
) -> list[dict[str, Any]]:
    if warmup:
        for d in deployments:
            t0 = time.monotonic()
            for kind, params in WARMUP:
                _, error = run_worker(kind, params, d, 120.0)
                if error:
                    log(f"warm-up {kind} on {d.key} failed: {error.strip()[-300:]}")
            log(f"warmed up {d.key} in {time.monotonic() - t0:.1f}s")
    plan = [
        (run, w, d) for run in range(runs) for w in workloads for d in _rotate(deployments, run)
    ]
    out = []
    for i, (run, w, d) in enumerate(plan, 1):
        prefix = f"[{i}/{len(plan)}] run {run + 1}/{runs} {w.name} {d.key}:"
        quiet = wait_for_quiet(deployments, max_foreign, quiet_budget_s) if max_foreign else {}
        record: dict[str, Any] = {
            "workload": w.name,
            "deployment": d.key,
            "run": run,
            "loadavg": os.getloadavg(),
            **quiet,
        }
        if not d.alive():
            log(f"{prefix} SKIPPED, the serving process is not running")
            out.append({**record, "ok": False, "error": "not running"})
            continue
        t0 = time.monotonic()
        result, error = run_worker(
            w.kind,
            w.params(quick),
            d,
            w.bound_s(quick) + WORKER_GRACE_S,
            watch=watch_list(deployments, d),
        )
        wall = time.monotonic() - t0
        if result is None:
            log(f"{prefix} FAILED ({wall:.1f}s): {error.strip().splitlines()[-1:]}")
            out.append({**record, "ok": False, "error": error[-3000:], "wall_s": wall})
            continue
        out.append({**record, "ok": True, "result": result, "wall_s": wall})
        if w.latency:
            head = f"p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms"
        else:
            head = f"{result['msgs_per_s']:,.0f} msg/s"
        waited = ""
        if quiet.get("samples", 1) > 1:
            waited = f", waited {quiet['waited_s']:.0f}s for quiet"
        log(f"{prefix} {head}, foreign {result.get('other_cpu_pct', 0):.0f}%{waited} [{wall:.1f}s]")
    return out


def _rotate(items: list[Deployment], run: int) -> list[Deployment]:
    k = run % len(items) if items else 0
    return items[k:] + items[:k]


# --- takeover ---------------------------------------------------------------------------------


def _admin(endpoint: str, path: str, request: Any) -> None:
    with grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(
            path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=None
        )
        call(request, timeout=30.0)


class Prober(threading.Thread):
    """Publishes one 100 B message at a time to ``endpoint`` (``PROBE_DEADLINE_S`` deadline; a
    fresh channel after each failure, so the client's reconnect backoff never hides the
    server), recording the ``perf_counter`` time of every acknowledgement."""

    def __init__(self, endpoint: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.request = pb.publish_request(topic, 1, 100)
        self.acks: list[float] = []
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        channel = grpc.insecure_channel(self.endpoint, options=CHANNEL_OPTIONS)
        try:
            while not self.stopping.is_set():
                publish = channel.unary_unary(
                    pb.PUBLISH, request_serializer=None, response_deserializer=None
                )
                try:
                    publish(self.request, timeout=PROBE_DEADLINE_S)
                    self.acks.append(time.perf_counter())
                    time.sleep(0.005)
                except grpc.RpcError:
                    self.failures += 1
                    channel.close()
                    channel = grpc.insecure_channel(self.endpoint, options=CHANNEL_OPTIONS)
                    time.sleep(0.01)
        finally:
            channel.close()

    def first_ack_after(self, t: float) -> float | None:
        return next((a for a in self.acks if a > t), None)

    def last_ack_before(self, t: float) -> float | None:
        return next((a for a in reversed(self.acks) if a < t), None)


def takeover(d: Deployment, rounds: int, backlog: int) -> list[dict[str, Any]]:
    """kill -9 of ``d``'s serving process under a trickle of publishes, ``rounds`` times."""
    import asyncio

    tag = os.urandom(4).hex()
    topic = f"projects/bench/topics/takeover-{tag}"
    _admin(d.endpoint, CREATE_TOPIC, pb.Topic(name=topic))
    _admin(
        d.endpoint,
        CREATE_SUBSCRIPTION,
        pb.Subscription(name=f"projects/bench/subscriptions/takeover-{tag}", topic=topic),
    )
    acked = asyncio.run(
        raw_publish(
            d.endpoint,
            topic,
            size=100,
            count=backlog,
            batch=1000,
            concurrency=4,
            deadline=time.perf_counter() + 60.0,
        )
    )
    out = []
    prober = Prober(d.endpoint, topic)
    prober.start()
    try:
        for r in range(rounds):
            time.sleep(1.0)  # the prober is steady
            t_kill = time.perf_counter()
            d.kill_serve()
            t_gone = time.perf_counter()
            d.restart_serve()
            t_ready = time.perf_counter()
            bound = t_kill + TAKEOVER_BOUND_S
            # An answer already on its way when the signal landed can arrive just after t_kill;
            # one after the old process is gone can only come from the new one.
            first = prober.first_ack_after(t_gone)
            while first is None and time.perf_counter() < bound:
                time.sleep(0.005)
                first = prober.first_ack_after(t_gone)
            last = prober.last_ack_before(t_kill)
            row = {
                "round": r,
                "kill_to_gone_s": t_gone - t_kill,
                "kill_to_ready_s": t_ready - t_kill,
                "kill_to_first_publish_s": (first - t_kill) if first is not None else None,
                "ready_to_first_publish_s": (first - t_ready) if first is not None else None,
                "last_ack_before_kill_s": (t_kill - last) if last is not None else None,
                "failed_publishes_so_far": prober.failures,
            }
            out.append(row)
            log(
                f"takeover {d.key} round {r + 1}/{rounds}: ready after "
                f"{row['kill_to_ready_s']:.2f}s, first publish after "
                + (f"{row['kill_to_first_publish_s']:.2f}s" if first is not None else "NEVER")
            )
    finally:
        prober.stopping.set()
        prober.join(10)
    with contextlib.suppress(grpc.RpcError):
        _admin(d.endpoint, DELETE_TOPIC, pb.DeleteTopicRequest(topic=topic))
    for row in out:
        row["backlog_acked"] = acked
    return out


@contextlib.contextmanager
def session_timeout(seconds: float | None) -> Iterator[None]:
    """``PUBSUBD_ZK_SESSION_TIMEOUT_S`` in the environment the launcher's processes inherit."""
    saved = os.environ.get(SESSION_ENV)
    if seconds is not None:
        os.environ[SESSION_ENV] = f"{seconds:g}"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(SESSION_ENV, None)
        else:
            os.environ[SESSION_ENV] = saved


# --- repair -----------------------------------------------------------------------------------

REPAIR_COPY = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+: repair auditor: ledger (\d+) "
    r"\(([^)]*)\): (\S+) copy on (\S+): (\d+) bytes from (\S+) in ([\d.]+) s",
    re.MULTILINE,
)
REPAIR_BOUND_S = 300.0  # kill to every ledger repaired


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Variables the launcher's processes inherit, restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _auditor_status(d: Cluster) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{d.cluster.http}/status", timeout=10) as r:
        return json.loads(r.read())["cluster"]["auditor"]  # type: ignore[no-any-return]


def _du_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def _log_time(stamp: str) -> float:
    """``asctime`` of pubsubd's log (local time, milliseconds) as a Unix time."""
    seconds, _, millis = stamp.partition(",")
    return time.mktime(time.strptime(seconds, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


class Trickle(threading.Thread):
    """A light load that keeps every writer writing: a 100 x 1 KiB Publish to each topic every
    0.5 s (a writer notices a dead node, and rolls its open ledger off it, only when it writes)."""

    def __init__(self, endpoint: str, topics: list[str]) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.requests = [pb.publish_request(t, 100, 1024) for t in topics]
        self.acked = 0
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self.endpoint, options=CHANNEL_OPTIONS) as channel:
            publish = channel.unary_unary(
                pb.PUBLISH, request_serializer=None, response_deserializer=None
            )
            while not self.stopping.wait(0.5):
                for request in self.requests:
                    try:
                        publish(request, timeout=10.0)
                        self.acked += 100
                    except grpc.RpcError:
                        self.failures += 1


def repair(
    root: Path, rate_mib: float, topics: int, mib_per_topic: int, zk_nodes: int
) -> dict[str, Any]:
    """A 4-node cluster (replicas 3) whose auditor looks every second with a 3 s grace period:
    ``topics`` topics with ``mib_per_topic`` MiB of 1 KiB messages each (one unacknowledged
    subscription keeps every ledger), then kill -9 of the storage node holding the most bytes,
    kept down, while a trickle of publishes goes on (``Trickle``). Done when the auditor's pass
    and ``pubsubd cluster status`` both count 0 under-replicated ledgers. Measured from the
    auditor's log (every copy's bytes and seconds) and ``/status``."""
    import asyncio

    env = {
        SESSION_ENV: "4",
        "PUBSUBD_REPAIR_INTERVAL_S": "1",
        "PUBSUBD_REPAIR_GRACE_S": "3",
        "PUBSUBD_REPAIR_RATE_BYTES": str(int(rate_mib * 2**20)),
    }
    d = Cluster("cluster-4", root, zk_nodes)
    with environment(env), running([d]):
        deadline = time.monotonic() + 30
        while _auditor_status(d)["role"] != "auditor" and time.monotonic() < deadline:
            time.sleep(0.1)
        names = []
        for i in range(topics):
            topic = f"projects/bench/topics/repair-{i}"
            _admin(d.endpoint, CREATE_TOPIC, pb.Topic(name=topic))
            _admin(
                d.endpoint,
                CREATE_SUBSCRIPTION,
                pb.Subscription(name=f"projects/bench/subscriptions/repair-{i}", topic=topic),
            )
            names.append(topic)
        count = mib_per_topic * 2**20 // 1024
        t_fill = time.perf_counter()
        acked = 0
        for topic in names:
            acked += asyncio.run(
                raw_publish(
                    d.endpoint,
                    topic,
                    size=1024,
                    count=count,
                    batch=1000,
                    concurrency=4,
                    deadline=time.perf_counter() + 120.0,
                )
            )
        fill_s = time.perf_counter() - t_fill
        storage = {
            name: _du_bytes(d.directory / name) for name in d.processes() if name.startswith("sto")
        }
        victim = max(storage, key=lambda n: storage[n])
        pids = {n: p for n, p in d.processes().items() if n != victim}
        cpu0 = {n: process_cpu_s(p) or 0.0 for n, p in pids.items()}
        log(f"repair at {rate_mib:g} MiB/s: filled {acked:,} x 1 KiB in {fill_s:.1f}s; "
            f"killing {victim} ({storage[victim] / 2**20:.0f} MiB)")  # fmt: skip
        from pubsubd.cluster.status import cluster_status

        trickle = Trickle(d.endpoint, names)
        trickle.start()
        t_kill_wall, t_kill = time.time(), time.perf_counter()
        d.cluster.kill(victim)
        status: dict[str, Any] = {}
        under: Any = None
        t_done = None
        try:
            while time.perf_counter() - t_kill < REPAIR_BOUND_S:
                status = _auditor_status(d)
                last = status.get("last_pass") or {}
                if (
                    status["ledgers_repaired"] > 0
                    and last.get("under_replicated") == 0
                    and last.get("waiting_grace") == 0
                    and last.get("at", 0) > t_kill_wall
                ):
                    under = cluster_status(d.cluster.zk).get("under_replicated")
                    if under == 0:
                        t_done = time.perf_counter()
                        break
                time.sleep(0.2)
        finally:
            trickle.stopping.set()
            trickle.join(10)
        cpu = {
            n: 100.0 * ((process_cpu_s(p) or 0.0) - cpu0[n]) / (time.perf_counter() - t_kill)
            for n, p in pids.items()
        }
        after = cluster_status(d.cluster.zk)
        text = Path(d.cluster.process("serve").log).read_text(errors="replace")
    copies: list[dict[str, Any]] = []
    for m in REPAIR_COPY.finditer(text):
        end = _log_time(m.group(1))
        seconds = float(m.group(8))
        if end >= t_kill_wall:
            copies.append(
                {
                    "ledger": int(m.group(2)),
                    "reason": m.group(4),
                    "target": m.group(5),
                    "bytes": int(m.group(6)),
                    "source": m.group(7),
                    "seconds": seconds,
                    "start_after_kill_s": end - seconds - t_kill_wall,
                    "end_after_kill_s": end - t_kill_wall,
                }
            )
    copied = sum(c["bytes"] for c in copies)
    span = (
        max(c["end_after_kill_s"] for c in copies) - min(c["start_after_kill_s"] for c in copies)
        if copies
        else 0.0
    )
    busy = sum(c["seconds"] for c in copies)
    return {
        "rate_limit_mib_s": rate_mib,
        "settings": env,
        "topics": topics,
        "fill_messages": acked,
        "fill_s": fill_s,
        "storage_bytes": storage,
        "victim": victim,
        "victim_bytes": storage[victim],
        "copies": copies,
        "ledgers_repaired": status.get("ledgers_repaired"),
        "bytes_copied": status.get("bytes_copied"),
        "failures": status.get("failures"),
        # pubsubd cluster status after one more pass: ledgers listing a node not registered
        # (open ones included: the auditor repairs closed ledgers only)
        "trickle_acked": trickle.acked,
        "trickle_failures": trickle.failures,
        "under_replicated_after": after.get("under_replicated"),
        "under_replicated_ledgers_after": after.get("under_replicated_ledgers"),
        "open_ledgers_after": after.get("open_ledgers"),
        "ledgers_after": after.get("ledgers"),
        "kill_to_first_copy_s": min((c["start_after_kill_s"] for c in copies), default=None),
        "kill_to_repaired_s": (t_done - t_kill) if t_done is not None else None,
        "copy_span_s": span,
        "copy_busy_s": busy,
        "mib_per_s_span": copied / 2**20 / span if span else None,
        "mib_per_s_busy": copied / 2**20 / busy if busy else None,
        "ledgers_per_s_span": len(copies) / span if span else None,
        "cpu_pct_kill_to_done": cpu,
    }


# --- reporting --------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _per_process_cpu(result: dict[str, Any], key: str) -> dict[str, float]:
    """CPU % of one core of deployment ``key``'s processes in one measurement."""
    out = {"serve": float(result.get("server_cpu_pct") or 0.0)}
    for name, pct in (result.get("watched_cpu_pct") or {}).items():
        owner, _, proc = name.partition("/")
        if owner == key:
            out[proc] = float(pct)
    return out


def _group(cpu: dict[str, float]) -> dict[str, float]:
    """CPU by role: serve, storage (all nodes), zookeeper (all nodes)."""
    out = {"serve": 0.0, "storage": 0.0, "zookeeper": 0.0}
    for name, pct in cpu.items():
        role = name.rsplit("-", 1)[0] if name != "serve" else "serve"
        out[role] = out.get(role, 0.0) + pct
    return out


def summarise(records: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for w in WORKLOAD_NAMES:
        per: dict[str, Any] = {}
        for key in keys:
            ok = [r for r in records if r["workload"] == w and r["deployment"] == key and r["ok"]]
            if not ok:
                continue
            figures: dict[str, list[float]] = {}
            for r in ok:
                res = r["result"]
                for f in ("msgs_per_s", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"):
                    if f in res:
                        figures.setdefault(f, []).append(float(res[f]))
                for f in ("client_cpu_pct", "other_cpu_pct", "lost", "late_sends"):
                    figures.setdefault(f, []).append(float(res.get(f) or 0.0))
                roles = _group(_per_process_cpu(res, key))
                for role, pct in roles.items():
                    figures.setdefault(f"{role}_cpu_pct", []).append(pct)
                    if res.get("msgs_per_s"):
                        figures.setdefault(f"{role}_us_per_msg", []).append(
                            pct / 100 * 1e6 / res["msgs_per_s"]
                        )
                if res.get("msgs_per_s"):
                    figures.setdefault("client_us_per_msg", []).append(
                        float(res["client_cpu_pct"]) / 100 * 1e6 / res["msgs_per_s"]
                    )
                figures.setdefault("loadavg_1m", []).append(float(r["loadavg"][0]))
            per[key] = {
                "runs": len(ok),
                "complete": all(r["result"].get("complete", True) for r in ok),
                **{
                    f: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
                    for f, v in figures.items()
                },
            }
        # ratios and differences against the embedded server, of the medians and per run
        pairs: dict[str, Any] = {}
        metric = "msgs_per_s" if w.startswith("publish-raw") else "p99_ms"
        for key in keys:
            if key == "embedded" or key not in per or "embedded" not in per:
                continue
            by_run: dict[int, dict[str, float]] = {}
            for r in records:
                if r["workload"] == w and r["ok"] and metric in r["result"]:
                    by_run.setdefault(r["run"], {})[r["deployment"]] = r["result"][metric]
            a, b = per[key][metric]["median"], per["embedded"][metric]["median"]
            runs = [v[key] for v in by_run.values() if key in v and "embedded" in v]
            bases = [v["embedded"] for v in by_run.values() if key in v and "embedded" in v]
            if metric == "msgs_per_s":
                per_run = [x / y for x, y in zip(runs, bases, strict=True) if y]
                pairs[key] = {"ratio_of_medians": a / b, "per_run": per_run}
            else:
                per_run = [x - y for x, y in zip(runs, bases, strict=True)]
                pairs[key] = {"added_p99_ms": a - b, "per_run": per_run}
        summary[w] = {"deployments": per, "vs_embedded": pairs}
    return summary


def _cell(stats: dict[str, Any] | None, fmt: str = "{:,.0f}") -> str:
    if not stats:
        return "-"
    return f"{fmt.format(stats['median'])} ({fmt.format(stats['min'])}-{fmt.format(stats['max'])})"


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    keys = report["settings"]["deployments"]
    lines: list[str] = []
    for w in RAW_WORKLOADS:
        raw = s.get(w, {})
        if not raw.get("deployments"):
            continue
        p = report["settings"]["workloads"][w]
        lines += [
            f"{w}: raw publish throughput, {p['size']} B, {p['batch']}-message requests, "
            f"{p['concurrency']} in flight, {p['time_limit_s']:g} s per run: median msgs/s "
            "(min-max), ÷ embedded (of the medians; per-run pairs); foreign CPU of each run "
            "(% of one core)",
            "",
            "| Deployment | msgs/s | ÷ embedded | per-run ÷ embedded | foreign per run |",
            "|---|---:|---:|---|---|",
        ]
        for key in keys:
            st = raw["deployments"].get(key)
            if not st:
                continue
            vs = raw["vs_embedded"].get(key)
            ratio = f"{vs['ratio_of_medians']:.2f}" if vs else ""
            runs = ", ".join(f"{x:.2f}" for x in vs["per_run"]) if vs else ""
            foreign_runs = ", ".join(f"{x:.0f}" for x in st["other_cpu_pct"]["runs"])
            lines.append(
                f"| {LABELS[key]} | {_cell(st.get('msgs_per_s'))} | {ratio} | {runs} "
                f"| {foreign_runs} |"
            )
        lines += [
            "",
            f"{w}: CPU per message, median µs of CPU time per acknowledged message (serve / "
            "frontend / all storage nodes / ZooKeeper / client), and % of one core (serve / "
            "frontend / storage / ZooKeeper / client / foreign)",
            "",
            "| Deployment | µs/msg serve / frontend / storage / ZK / client | % serve / frontend "
            "/ storage / ZK / client / foreign |",
            "|---|---:|---:|",
        ]
        for key in keys:
            st = raw["deployments"].get(key)
            if not st:
                continue
            us = " / ".join(
                f"{st[f'{r}_us_per_msg']['median']:.1f}" if f"{r}_us_per_msg" in st else "-"
                for r in ("serve", "frontend", "storage", "zookeeper", "client")
            )
            pct = " / ".join(
                f"{st[f'{r}_cpu_pct']['median']:.0f}" if f"{r}_cpu_pct" in st else "-"
                for r in ("serve", "frontend", "storage", "zookeeper", "client", "other")
            )
            lines.append(f"| {LABELS[key]} | {us} | {pct} |")
        lines.append("")
    for w, title in (
        (
            "publish-latency-1000",
            "Publish acknowledgement latency at 1000 msg/s, 100 B, raw Publish RPCs of 10 "
            "messages every 10 ms",
        ),
        (
            "latency-1000",
            "End-to-end latency at 1000 msg/s, 100 B (official publisher → subscribe() callback)",
        ),
    ):
        lat = s.get(w, {})
        if not lat.get("deployments"):
            continue
        lines += [
            f"{title}: median of runs, ms (p99: min-max of runs); added p99 = deployment's p99 "
            "- embedded's (of the medians; per-run pairs)",
            "",
            "| Deployment | p50 | p90 | p99 | p99.9 | max | added p99 | per-run added p99 | lost "
            "| % serve / storage / ZK / client / foreign | foreign per run |",
            "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
        ]
        for key in keys:
            st = lat["deployments"].get(key)
            if not st:
                continue
            vs = lat["vs_embedded"].get(key)
            added = f"{vs['added_p99_ms']:+.2f}" if vs else ""
            runs = ", ".join(f"{x:+.1f}" for x in vs["per_run"]) if vs else ""
            pct = " / ".join(
                f"{st[f'{r}_cpu_pct']['median']:.0f}" if f"{r}_cpu_pct" in st else "-"
                for r in ("serve", "storage", "zookeeper", "client", "other")
            )
            lines.append(
                f"| {LABELS[key]} | {st['p50_ms']['median']:.2f} | {st['p90_ms']['median']:.2f} "
                f"| {_cell(st['p99_ms'], '{:.2f}')} | {st['p999_ms']['median']:.2f} "
                f"| {st['max_ms']['median']:.1f} | {added} | {runs} "
                f"| {max(st['lost']['runs']):.0f} | {pct} "
                f"| {', '.join(f'{x:.0f}' for x in st['other_cpu_pct']['runs'])} |"
            )
        lines.append("")
    memory = report.get("memory", {})
    if memory.get("idle"):
        lines += [
            "Memory: RSS in MB per process, idle (after start-up) → after the measurements; "
            "idle CPU in % of one core",
            "",
            "| Deployment | process | RSS idle | RSS after | idle CPU |",
            "|---|---|---:|---:|---:|",
        ]
        for key in keys:
            idle = memory["idle"].get(key, {})
            after = memory.get("after", {}).get(key, {})
            cpu = memory.get("idle_cpu_pct", {}).get(key, {})
            for name in sorted(idle, key=_process_order):
                a = after.get(name)
                lines.append(
                    f"| {key} | {name} | {idle[name]:.0f} | "
                    + (f"{a:.0f}" if a is not None else "-")
                    + f" | {cpu.get(name, 0.0):.1f} |"
                )
        lines.append("")
    tk = report.get("takeover", [])
    if tk:
        lines += [
            "Takeover after kill -9 of the serving process, restarted at once (seconds; median "
            "(min-max) of rounds)",
            "",
            "| Deployment | ZooKeeper session timeout | rounds | kill → ready line | kill → first "
            "acknowledged publish | ready → first publish |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for t in tk:
            rows = t["rounds"]

            def stat(field: str, rows: list[dict[str, Any]] = rows) -> str:
                v = [r[field] for r in rows if r.get(field) is not None]
                if not v:
                    return "-"
                return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

            timeout = f"{t['session_timeout_s']:g} s" if t["session_timeout_s"] else "-"
            lines.append(
                f"| {LABELS[t['deployment']]} | {timeout} | {len(rows)} | "
                f"{stat('kill_to_ready_s')} | {stat('kill_to_first_publish_s')} | "
                f"{stat('ready_to_first_publish_s')} |"
            )
        lines.append("")
    measured = [m for m in report.get("measurements", []) if m["ok"]]
    if measured:
        foreign = [float(m["result"].get("other_cpu_pct", 0.0)) for m in measured]
        loads = [float(m["loadavg"][0]) for m in measured]
        waits = [float(m.get("waited_s", 0.0)) for m in measured if m.get("samples", 1) > 1]
        lines += [
            "Foreign load: the rest of the machine used a median of "
            f"{statistics.median(foreign):.0f}% of one core during the measured sections "
            f"(max {max(foreign):.0f}%); 1-minute load "
            f"average at their starts {min(loads):.2f}-{max(loads):.2f}; "
            f"{len(waits)} of {len(measured)} measurements first waited for a quieter machine "
            f"({sum(waits):.0f} s in all; each measurement starts with a 1 s sample).",
            "",
        ]
    rep = report.get("repair", {})
    if rep.get("runs"):
        lines += [
            "Repair after kill -9 of the storage node holding the most bytes (kept down) while "
            "100 x 1 KiB are published to each topic every 0.5 s, "
            "4 storage nodes, replicas 3; the auditor looks every 1 s, grace 3 s; ZooKeeper "
            "sessions of 4 s (serve and, from ffc53ba on, the storage nodes). Copy rate = bytes "
            "copied ÷ (last copy's end - first copy's start); busy = ÷ the sum of each copy's own "
            "time; all repaired = the auditor's pass and `pubsubd cluster status` count 0 "
            "under-replicated. One row per run, then the medians per rate limit",
            "",
            "| rate limit | victim holds | ledgers repaired | MiB copied | kill → first copy "
            "| kill → all repaired | copy span | MiB/s (span) | MiB/s (busy) | ledgers/s "
            "| under-replicated after |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rep["runs"]:

            def f(v: Any, fmt: str = "{:.2f}") -> str:
                return fmt.format(v) if v is not None else "-"

            lines.append(
                f"| {r['rate_limit_mib_s']:g} MiB/s | {r['victim_bytes'] / 2**20:.0f} MiB "
                f"| {len(r['copies'])} | {sum(c['bytes'] for c in r['copies']) / 2**20:.0f} "
                f"| {f(r['kill_to_first_copy_s'])} s | {f(r['kill_to_repaired_s'])} s "
                f"| {r['copy_span_s']:.2f} s | {f(r['mib_per_s_span'], '{:.0f}')} "
                f"| {f(r['mib_per_s_busy'], '{:.0f}')} | {f(r['ledgers_per_s_span'])} "
                f"| {r['under_replicated_after']} |"
            )
        for rate in sorted({r["rate_limit_mib_s"] for r in rep["runs"]}):
            same = [r for r in rep["runs"] if r["rate_limit_mib_s"] == rate]

            def med(key: str, fmt: str = "{:.2f}", same: list[dict[str, Any]] = same) -> str:
                values = [r[key] for r in same if r.get(key) is not None]
                return fmt.format(statistics.median(values)) if values else "-"

            lines.append(
                f"| **median, {rate:g} MiB/s** ({len(same)} runs) | | | | "
                f"{med('kill_to_first_copy_s')} s | {med('kill_to_repaired_s')} s "
                f"| {med('copy_span_s')} s | {med('mib_per_s_span', '{:.0f}')} "
                f"| {med('mib_per_s_busy', '{:.0f}')} | {med('ledgers_per_s_span')} | |"
            )
        lines.append("")
    else:
        lines += [f"Repair: {rep.get('note', '-')}", ""]
    return "\n".join(lines)


def _process_order(name: str) -> tuple[int, str]:
    order = {"zookeeper": 0, "storage": 1, "serve": 2}
    return order.get(name.rsplit("-", 1)[0], 3), name


# --- main -------------------------------------------------------------------------------------


def _auditor(src: Path) -> Path:
    return src / "pubsubd" / "storage" / "ledgers" / "auditor.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, help="interleaved runs (default 5, quick 1)")
    parser.add_argument("--quick", action="store_true", help="short workloads, 1 run")
    parser.add_argument("--deployments", default=",".join(DEPLOYMENTS))
    parser.add_argument(
        "--only", default=",".join(WORKLOAD_NAMES), help="workloads of the interleaved phase"
    )
    parser.add_argument("--zk-nodes", type=int, default=1, help="ZooKeeper nodes per cluster")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before idle figures")
    parser.add_argument(
        "--session-timeouts",
        default="4,10",
        help="ZooKeeper session timeouts (s) of the takeover phase; '' skips it",
    )
    parser.add_argument("--takeover-rounds", type=int, help="kill -9 rounds (default 3, quick 1)")
    parser.add_argument("--takeover-backlog", type=int, default=100_000)
    parser.add_argument(
        "--repair-rates",
        default="32,1024",
        help="repair phase: the auditor's rate limits in MiB/s, one fresh 4-node cluster each "
        "(32 is the default; '' skips the phase)",
    )
    parser.add_argument("--repair-runs", type=int, help="per rate (default 3, quick 1)")
    parser.add_argument("--repair-topics", type=int, default=4)
    parser.add_argument("--repair-mib-per-topic", type=int, default=100)
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument(
        "--max-foreign",
        type=float,
        default=30.0,
        help="before each measurement wait until other processes use less than this %% of a "
        "core (0: never wait)",
    )
    parser.add_argument(
        "--quiet-budget", type=float, default=60.0, help="at most this many s of waiting each"
    )
    parser.add_argument(
        "--rev",
        metavar="REV",
        help="run the code of git revision REV (git archive of src/, first on PYTHONPATH) "
        "instead of the working tree",
    )
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 5)
    rounds = args.takeover_rounds or (1 if args.quick else 3)
    repair_runs = args.repair_runs or (1 if args.quick else 3)
    keys = [k.strip() for k in args.deployments.split(",") if k.strip()]
    for k in keys:
        if k not in DEPLOYMENTS + OPTIONAL_DEPLOYMENTS:
            known = ",".join(DEPLOYMENTS + OPTIONAL_DEPLOYMENTS)
            raise SystemExit(f"unknown deployment {k!r}; choose from {known}")
    by_name = {w.name: w for w in (*WORKLOADS, PUBLISH_RAW_C16)}
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    for n in wanted:
        if n not in WORKLOAD_NAMES:
            raise SystemExit(f"unknown workload {n!r}; choose from {','.join(WORKLOAD_NAMES)}")
    workloads = [by_name[n] for n in WORKLOAD_NAMES if n in wanted]
    timeouts = [float(t) for t in args.session_timeouts.split(",") if t.strip()]

    # SIGTERM (a bounded caller giving up) unwinds like Ctrl-C: every deployment is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    info = machine_info()
    started_at = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    report: dict[str, Any] = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": info,
        "settings": {
            "quick": args.quick,
            "runs": runs,
            "deployments": keys,
            "zk_nodes": args.zk_nodes,
            "shapes": {
                k: dict(zip(("storage_nodes", "zones", "replicas"), SHAPES[k], strict=True))
                for k in keys
                if k in SHAPES
            },
            "session_timeout_interleaved": os.environ.get(SESSION_ENV, "default (10)"),
            "workloads": {w.name: {"kind": w.kind, **w.params(args.quick)} for w in workloads},
            "warmup": not args.no_warmup,
            "max_foreign_pct": args.max_foreign,
            "quiet_budget_s": args.quiet_budget,
            "takeover": {
                "session_timeouts_s": timeouts,
                "rounds": rounds,
                "backlog": args.takeover_backlog,
                "probe_deadline_s": PROBE_DEADLINE_S,
            },
            "rev": None,
        },
    }
    try:
        with contextlib.ExitStack() as stack:
            src = REPO_ROOT / "src"
            if args.rev:
                revision: Revision = stack.enter_context(exported(args.rev))
                src = revision.src
                os.environ["PYTHONPATH"] = os.pathsep.join(
                    p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p
                )
                sys.path.insert(0, str(src))
                report["settings"]["rev"] = {"name": revision.name, "commit": revision.commit}
                log(f"running {revision.name} = {revision.commit} from {src}")
            probe = subprocess.run(
                [sys.executable, "-c", "import pubsubd; print(pubsubd.__file__)"],
                capture_output=True,
                text=True,
                check=True,
                cwd=tempfile.gettempdir(),
            )
            found = Path(probe.stdout.strip()).resolve()
            expected = (src / "pubsubd" / "__init__.py").resolve()
            if found != expected:
                raise TargetError(f"spawned processes would import pubsubd from {found}")
            import pubsubd

            if Path(pubsubd.__file__ or "").resolve() != expected:
                raise TargetError(f"this process imported pubsubd from {pubsubd.__file__}")
            report["settings"]["pubsubd_from"] = str(found.parent)
            has_auditor = _auditor(src).exists()
            root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
            stack.callback(shutil.rmtree, root, ignore_errors=True)
            report.update(run_all(args, keys, workloads, runs, rounds, timeouts, root))
            rates = [float(r) for r in args.repair_rates.split(",") if r.strip()]
            if has_auditor and rates:
                report["repair"] = {
                    "runs": [
                        repair(
                            root / f"repair-{rate:g}-{run}",
                            rate,
                            args.repair_topics,
                            args.repair_mib_per_topic,
                            args.zk_nodes,
                        )
                        for rate in rates
                        for run in range(repair_runs)
                    ]
                }
            else:
                report["repair"] = {
                    "note": "not measured: "
                    + (
                        "skipped (--repair-rates '')"
                        if has_auditor
                        else "this revision has no repair auditor "
                        "(pubsubd/storage/ledgers/auditor.py)"
                    )
                }
    except TargetError as e:
        log(f"error: {e}")
        return 2
    info["loadavg_end"] = os.getloadavg()
    report["duration_s"] = round(time.monotonic() - t0, 1)
    report["summary"] = summarise(report.get("measurements", []), keys)
    table = markdown(report)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = RESULTS_DIR / (
        f"cluster-{started_at.strftime('%Y%m%dT%H%M%SZ')}{'-quick' if args.quick else ''}"
    )
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(table + "\n")
    rev = report["settings"]["rev"]
    if rev:
        code = f"revision {rev['commit'][:10]} ({rev['name']})"
    else:
        code = f"working tree at {info['git_commit']}"
        if info["src_uncommitted"]:
            code += f" plus uncommitted {', '.join(info['src_uncommitted'])}"
    print(
        f"## pubsubd cluster benchmark ({'quick, ' if args.quick else ''}{runs} run(s), "
        f"{report['duration_s']:.0f} s)\n"
    )
    print(
        f"{info['nproc']} CPUs ({info['cpu_model']}), {info['ram_gib']} GiB RAM, Python "
        f"{info['python']}, grpcio {info['packages']['grpcio']}; {code}; load average "
        f"{info['loadavg_start'][0]:.2f} → {info['loadavg_end'][0]:.2f}\n"
    )
    print(table)
    failed = [m for m in report.get("measurements", []) if not m["ok"]]
    for m in failed:
        print(f"FAILED {m['workload']} {m['deployment']} run {m['run'] + 1}: {m['error'][-500:]}")
    print(f"raw results: {stem.with_suffix('.json').relative_to(REPO_ROOT)}")
    return 1 if failed else 0


def run_all(
    args: argparse.Namespace,
    keys: list[str],
    workloads: list[Workload],
    runs: int,
    rounds: int,
    timeouts: list[float],
    root: Path,
) -> dict[str, Any]:
    out: dict[str, Any] = {"memory": {}}
    if workloads:
        deployments = [make_deployment(k, root / "session", args.zk_nodes) for k in keys]
        with running(deployments):
            time.sleep(args.settle)
            out["memory"]["idle"] = rss_mb(deployments)
            out["memory"]["idle_cpu_pct"] = idle_cpu_pct(deployments, args.settle)
            out["measurements"] = measure(
                deployments,
                workloads,
                runs,
                args.quick,
                not args.no_warmup,
                args.max_foreign,
                args.quiet_budget,
            )
            out["memory"]["after"] = rss_mb(deployments)
    out["takeover"] = []
    if "embedded" in keys and timeouts:
        d = make_deployment("embedded", root / "takeover-embedded", args.zk_nodes)
        with running([d]):
            rows = takeover(d, rounds, args.takeover_backlog)
        out["takeover"].append(
            {"deployment": "embedded", "session_timeout_s": None, "rounds": rows}
        )
    if "cluster-3" in keys:
        for t in timeouts:
            d = make_deployment("cluster-3", root / f"takeover-{t:g}", args.zk_nodes)
            with session_timeout(t), running([d]):
                rows = takeover(d, rounds, args.takeover_backlog)
            out["takeover"].append(
                {"deployment": "cluster-3", "session_timeout_s": t, "rounds": rows}
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
