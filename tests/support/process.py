"""One subprocess of ours for tests: started with its output appended to a log file, ready when
its ready line appears in the log (the log is appended across restarts: the line of *this*
start counts), stopped with SIGTERM or killed with SIGKILL by its own Popen."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Every LoggedProcess of this test process, in the order of their first start: the conftest's
# safety net kills what a test body started and left running (a test that fails before its own
# cleanup must not leave a server behind, to load the machine and fail a later test with
# ResourceWarning "subprocess ... is still running" when its Popen is collected).
LAUNCHED: list[LoggedProcess] = []


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process not reaped yet, a zombie, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat[stat.rfind(")") + 2 :].startswith("Z")


@dataclass
class LoggedProcess:
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _starts: int = 0

    def launch(
        self,
        command: list[str],
        ready: re.Pattern[str],
        env: dict[str, str],
        timeout: float,
        what: str,
        unset: tuple[str, ...] = (),
    ) -> re.Match[str]:
        """Start ``command`` (our environment without ``unset``, plus ``env``) and wait for
        this start's ready line; its match."""
        full_env = {k: v for k, v in os.environ.items() if k not in unset}
        full_env.update(env)
        if self.proc is None:
            LAUNCHED.append(self)
        with self.log_path.open("ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(command, stdout=log, stderr=log, env=full_env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()
            matches = list(ready.finditer(text))
            if len(matches) > self._starts:
                self._starts = len(matches)
                return matches[-1]
            if self.proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"{what} not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

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
