"""Servers under test: pubsubd, Google's Pub/Sub emulator and the null server, as subprocesses.

Each target is started once per session on 127.0.0.1 with an ephemeral port, logs to a file in
its own temporary directory, and is stopped by its own PID (SIGTERM, then SIGKILL), after which
the directory is removed.
"""

from __future__ import annotations

import abc
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent
EMULATOR_HOME = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator")
EMULATOR_BIN = EMULATOR_HOME / "bin" / "cloud-pubsub-emulator"
PUBSUBD_READY = re.compile(r"pubsubd ready grpc=(\S+):(\d+)")
NULL_READY = re.compile(r"null-server ready grpc=(\S+):(\d+)")
EMULATOR_READY = re.compile(r"Server started, listening on (\d+)")


class TargetError(RuntimeError):
    """A target failed to start."""


class Target(abc.ABC):
    """A server subprocess; subclasses say how to start it and how it reports its port."""

    key = ""  # short name used on the command line and in results
    label = ""  # human-readable name for tables
    start_timeout_s = 30.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir: Path | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "server.log"

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The command line that starts this target."""

    @abc.abstractmethod
    def ready_port(self, log_text: str) -> int | None:
        """The gRPC port once the log says the server is ready, else None."""

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PUBSUB_EMULATOR_HOST", None)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        return env

    def start(self) -> Target:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"bench-{self.key}-"))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=self.workdir,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            port = self.ready_port(self.log())
            if port is not None and _port_open(port):
                self.port = port
                return self
            if self.proc.poll() is not None:
                text = self.log()
                self.stop()
                raise TargetError(f"{self.label} exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        text = self.log()
        self.stop()
        raise TargetError(f"{self.label} not ready after {self.start_timeout_s}s:\n{text}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM our own process, SIGKILL if it lingers, then remove the temp directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


class PubsubdTarget(Target):
    def __init__(self, fsync: str) -> None:
        super().__init__()
        self.fsync = fsync
        self.key = "pubsubd" if fsync == "always" else f"pubsubd-{fsync}"
        self.label = f"pubsubd (fsync={fsync})"

    def command(self) -> list[str]:
        assert self.workdir is not None
        return [
            sys.executable,
            "-m",
            "pubsubd",
            "serve",
            "--port",
            "0",
            "--http-port",
            "0",
            "--data-dir",
            str(self.workdir / "data"),
            "--fsync",
            self.fsync,
        ]

    def ready_port(self, log_text: str) -> int | None:
        m = PUBSUBD_READY.search(log_text)
        return int(m.group(2)) if m else None


class EmulatorTarget(Target):
    """Google's Java emulator (in memory). It cannot pick its own port: we pick a free one."""

    key = "emulator"
    label = "Google emulator"
    start_timeout_s = 90.0

    def __init__(self) -> None:
        super().__init__()
        self._port = 0

    def command(self) -> list[str]:
        self._port = _free_port()
        return [str(EMULATOR_BIN), f"--host={HOST}", f"--port={self._port}"]

    def ready_port(self, log_text: str) -> int | None:
        m = EMULATOR_READY.search(log_text)
        return int(m.group(1)) if m else None

    @staticmethod
    def version() -> str:
        for jar in sorted((EMULATOR_HOME / "lib").glob("cloud-pubsub-emulator-*.jar")):
            m = re.search(r"cloud-pubsub-emulator-(.+?)(-all)?\.jar$", jar.name)
            if m:
                return m.group(1)
        return "unknown"


class NullTarget(Target):
    key = "null"
    label = "null server"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bench.null_server", "--host", HOST, "--port", "0"]

    def ready_port(self, log_text: str) -> int | None:
        m = NULL_READY.search(log_text)
        return int(m.group(2)) if m else None


def make_target(key: str) -> Target:
    if key == "pubsubd":
        return PubsubdTarget("always")
    if key.startswith("pubsubd-"):
        return PubsubdTarget(key.removeprefix("pubsubd-"))
    if key == "emulator":
        return EmulatorTarget()
    if key == "null":
        return NullTarget()
    raise ValueError(f"unknown target {key!r}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False
