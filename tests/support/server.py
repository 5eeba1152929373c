"""Start and stop real ``pubsubd serve`` processes for tests (ephemeral ports, temp dirs)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

READY = re.compile(r"pubsubd ready grpc=(\S+):(\d+) http=(\S+):(\d+)")


@dataclass
class ServerProcess:
    data_dir: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # extra environment (PUBSUBD_* settings)
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    http_port: int = 0
    log_path: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0, port: int = 0) -> ServerProcess:
        self.log_path = self.data_dir.with_suffix(".log")
        env = dict(os.environ)
        env.pop("PUBSUB_EMULATOR_HOST", None)
        env.update(self.env)
        cmd = [
            sys.executable,
            "-m",
            "pubsubd",
            "serve",
            "--port",
            str(port),
            "--http-port",
            "0",
            "--data-dir",
            str(self.data_dir),
            *self.args,
        ]
        # The process writes to its own copy of the descriptor; ours is closed at once.
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            matches = READY.findall(text)
            # The log is appended across restarts: take the ready line of this start.
            if matches and len(matches) > self._starts:
                self._starts = len(matches)
                host, p, _, hp = matches[-1]
                self.host, self.port, self.http_port = host, int(p), int(hp)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"pubsubd exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"pubsubd not ready after {timeout}s:\n{self.log()}")

    _starts: int = 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """Graceful stop (SIGTERM), then SIGKILL if it hangs; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """kill -9, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` until truthy; fail with a message naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
