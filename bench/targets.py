"""Servers under test: pubsubd, Google's Pub/Sub emulator and the null server, as subprocesses.

Each target is started once per session on 127.0.0.1 with an ephemeral port, logs to a file in
its own temporary directory, and is stopped by its own PID (SIGTERM, then SIGKILL), after which
the directory is removed.

``pubsubd-baseline`` is pubsubd as of another git revision (``bench.run --baseline REV``): the
revision's ``src/`` is exported with ``git archive`` into a temporary directory (:func:`exported`)
and put first on the server's ``PYTHONPATH``, ahead of the venv's editable install of this
checkout's ``src/``; the command line is the ``pubsubd`` target's. Before it starts, the target
checks that an interpreter with the same environment imports ``pubsubd`` from the export.
"""

from __future__ import annotations

import abc
import contextlib
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.registry import BASELINE

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


@dataclass(frozen=True)
class Revision:
    """Another revision's source tree, exported for the baseline target."""

    name: str  # as given on the command line ("b0e8685", "HEAD~3", a tag)
    commit: str  # the full hash it resolved to
    root: Path  # the export: holds src/ only

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def short(self) -> str:
        return self.commit[:7]


@contextlib.contextmanager
def exported(rev: str) -> Iterator[Revision]:
    """``git archive`` of ``rev``'s ``src/`` in a temporary directory, removed afterwards."""
    resolved = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    if resolved.returncode != 0:
        raise TargetError(f"--baseline {rev!r} is not a commit of {REPO_ROOT}")
    commit = resolved.stdout.strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "src"],
        capture_output=True,
        cwd=REPO_ROOT,
        check=False,
    )
    if archive.returncode != 0:
        raise TargetError(f"git archive {commit} src failed: {archive.stderr.decode()[-2000:]}")
    root = Path(tempfile.mkdtemp(prefix=f"bench-baseline-{commit[:7]}-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(root, filter="data")
        yield Revision(rev, commit, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class BaselinePubsubdTarget(PubsubdTarget):
    """The ``pubsubd`` target's server (same command line, fsync=always) running the code of
    another revision: its exported ``src/`` comes first on ``PYTHONPATH``."""

    def __init__(self, revision: Revision) -> None:
        super().__init__("always")
        self.revision = revision
        self.key = BASELINE
        self.label = f"pubsubd {revision.short} (fsync=always)"

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = os.pathsep.join((str(self.revision.src), env["PYTHONPATH"]))
        return env

    def imported_from(self) -> Path:
        """Where an interpreter with this target's environment finds ``pubsubd``."""
        probe = subprocess.run(
            [sys.executable, "-c", "import pubsubd; print(pubsubd.__file__)"],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.revision.root,  # like the server's cwd: no package of that name in it
            check=False,
        )
        if probe.returncode != 0:
            raise TargetError(f"{self.label}: importing pubsubd failed:\n{probe.stderr[-2000:]}")
        return Path(probe.stdout.strip()).resolve()

    def start(self) -> Target:
        found = self.imported_from()
        expected = (self.revision.src / "pubsubd" / "__init__.py").resolve()
        if found != expected:
            raise TargetError(f"{self.label} would import pubsubd from {found}, not {expected}")
        return super().start()


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


def make_target(key: str, baseline: Revision | None = None) -> Target:
    if key == "pubsubd":
        return PubsubdTarget("always")
    if key == BASELINE:
        if baseline is None:
            raise ValueError("the pubsubd-baseline target needs a revision (--baseline REV)")
        return BaselinePubsubdTarget(baseline)
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
