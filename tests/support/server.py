"""Start and stop real ``pubsubd serve`` processes for tests (ephemeral ports, temp dirs)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.process import LoggedProcess

READY = re.compile(r"pubsubd ready grpc=(\S+):(\d+) http=(\S+):(\d+) pulsar=(-?\d+)")


@dataclass
class ServerProcess:
    data_dir: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # extra environment (PUBSUBD_* settings)
    host: str = "127.0.0.1"
    port: int = 0
    http_port: int = 0
    # The Pulsar front: off unless a test asks for it (0: an ephemeral port; never 6650, so
    # servers of parallel tests cannot collide). pulsar_port holds the bound port once started.
    pulsar: bool = False
    pulsar_port: int = -1
    process: LoggedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.with_suffix(".log")

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    def start(self, timeout: float = 30.0, port: int = 0) -> ServerProcess:
        if self.process is None:
            self.process = LoggedProcess(self.log_path)
        env = dict(self.env)
        cmd = [
            sys.executable,
            "-m",
            "pubsubd",
            "serve",
            "--port",
            str(port),
            "--http-port",
            "0",
            "--pulsar-port",
            "0" if self.pulsar else "-1",
            "--data-dir",
            str(self.data_dir),
            *self.args,
        ]
        # PUBSUB_EMULATOR_HOST is the clients' setting, never the server's.
        ready = self.process.launch(
            cmd, READY, env, timeout, "pubsubd", unset=("PUBSUB_EMULATOR_HOST",)
        )
        host, p, _, hp, pp = ready.groups()
        self.host, self.port, self.http_port, self.pulsar_port = host, int(p), int(hp), int(pp)
        return self

    def log(self) -> str:
        return self.process.log() if self.process is not None else ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """Graceful stop (SIGTERM), then SIGKILL if it hangs; returns the exit code."""
        return self.process.stop(timeout) if self.process is not None else None

    def kill(self) -> None:
        """kill -9, as a crash."""
        if self.process is not None:
            self.process.kill()

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` until truthy; fail with a message naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
