"""A throwaway Spark standalone cluster on loopback, from the installed PySpark (demos and tests).

    with StandaloneCluster(Path("/tmp/x"), workers=2) as cluster:
        SparkSession.builder.master(cluster.master_url).config(...)...

Starts ``spark-class org.apache.spark.deploy.master.Master`` and one
``org.apache.spark.deploy.worker.Worker`` per worker (one core each, small memory), every one bound
to 127.0.0.1 on ephemeral ports (the master's REST submission port, 6066 by default, is off), with
logs and work directories under ``work_dir``. Each daemon is its own process group, so the
executor JVMs a worker launches, and their Python workers, belong to the worker's group: ``stop``
kills each group by its leader's PID, and nothing else. ``executor_pids`` finds a worker's
executor JVMs (its child processes) for fault-injection tests.

Not a way to run production Spark: real clusters come from a Spark distribution or Kubernetes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"
_JVM_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss1m"


class ClusterError(RuntimeError):
    """A daemon exited or did not come up in time; the message ends with its log."""


def spark_home() -> Path:
    """The installed PySpark package, which holds ``bin/spark-class`` and the jars."""
    import pyspark

    return Path(pyspark.__file__).parent


def _processes_with(field: int, value: int) -> list[int]:
    """The processes whose ``field`` of /proc/PID/stat after the command name (0 state, 1 the
    parent's PID, 2 the process group) is ``value`` (Linux only)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and ')', so split after the last ')'
        if int(stat.rsplit(")", 1)[1].split()[field]) == value:
            found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid``."""
    return _processes_with(1, pid)


# What a Spark process has on its command line: the JVMs' main classes, PySpark's workers.
SPARK_MARKS = (b"org.apache.spark", b"pyspark")


def _group_members(pgid: int) -> list[int]:
    """The processes whose process group is ``pgid``."""
    return _processes_with(2, pgid)


def _is_spark(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(mark in cmdline for mark in SPARK_MARKS)


def kill_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group ``proc`` leads, and reap ``proc``. While ``proc`` is not reaped
    its PID, the group's ID, cannot be reused, so the whole group goes. Once it is gone, another
    process may lead a new group with that ID (a test's server started in its own session, say:
    a likely cause of one dying unexplained in CI), so then only the Spark processes left in
    the group are killed."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    else:
        for pid in _group_members(proc.pid):
            if _is_spark(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


@dataclass
class Daemon:
    """One master or worker JVM (the leader of its own process group)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL this daemon alone (its executors notice and exit by themselves)."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)

    def kill_group(self) -> None:
        """SIGKILL the daemon's process group: the daemon, its executors and their workers."""
        kill_process_group(self.proc)


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each."""

    work_dir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    daemon_memory: str = "256m"
    timeout: float = 90.0
    master: Daemon | None = None
    worker_daemons: list[Daemon] = field(default_factory=list)
    master_url: str = ""
    _started: int = 0

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _env(self, opts_var: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_LOG_DIR=str(self.work_dir / "logs"),
            SPARK_CONF_DIR=str(self.work_dir / "conf"),
        )
        env[opts_var] = f"{_JVM_OPTS} -Dspark.master.rest.enabled=false"
        return env

    def _spawn(self, name: str, cls: str, args: list[str], opts_var: str) -> Daemon:
        log = self.work_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "conf").mkdir(exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), cls, *args],
                env=self._env(opts_var),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its executors and Python workers join its group
            )
        return Daemon(name, proc, log)

    def _wait(self, daemon: Daemon, ready: str | re.Pattern[str]) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            text = daemon.text()
            if isinstance(ready, re.Pattern):
                found = ready.search(text)
                if found:
                    return found.group(1)
            elif ready in text:
                return ready
            if not daemon.alive():
                raise ClusterError(f"Spark {daemon.name} exited:\n{text[-4000:]}")
            time.sleep(0.1)
        raise ClusterError(f"Spark {daemon.name} not ready in {self.timeout}s:\n{daemon.text()}")

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.master = self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            "SPARK_MASTER_OPTS",
        )
        self.master_url = self._wait(self.master, _MASTER_URL)
        started = [self.start_worker(wait=False) for _ in range(self.workers)]
        for worker in started:
            self._wait(worker, _REGISTERED)

    def start_worker(self, wait: bool = True) -> Daemon:
        """One more worker (also to replace a killed one); registered when it returns."""
        self._started += 1
        name = f"worker-{self._started}"
        work = self.work_dir / name
        work.mkdir(parents=True, exist_ok=True)
        args = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
        args += ["--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work)]
        worker = self._spawn(
            name,
            "org.apache.spark.deploy.worker.Worker",
            [*args, self.master_url],
            "SPARK_WORKER_OPTS",
        )
        self.worker_daemons.append(worker)
        if wait:
            self._wait(worker, _REGISTERED)
        return worker

    def live_workers(self) -> list[Daemon]:
        return [w for w in self.worker_daemons if w.alive()]

    def executor_pids(self, worker: Daemon) -> list[int]:
        """The executor JVMs ``worker`` runs now (its child processes)."""
        return children(worker.pid) if worker.alive() else []

    def stop(self) -> None:
        """Kill every worker's group (executors and Python workers too), then the master."""
        for worker in self.worker_daemons:
            worker.kill_group()
        if self.master is not None:
            self.master.kill_group()
