"""Start and stop real ``pubsubd storage`` processes for tests (free ports, temp disks).

    node = StorageNodeProcess(tmp_path / "node", disks=3, zone="zone-a").start()
    client = StorageNodeClient(node.address)   # pubsubd.storage.node_client
    node.kill()                                # kill -9
    node.start()                               # again, on the same port and disks
    node.stop()                                # SIGTERM, waits for a clean exit

Each start waits for the process's ready line (``pubsubd storage ready grpc=... node_id=...``)
and takes the address, node ID and HTTP port from it. A restart reuses the port, so the address
a client (or the registry) holds stays right.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

READY = re.compile(
    r"pubsubd storage ready grpc=(\S+) node_id=(\S+) zone=(\S+) disks=(\d+)(?: http=(\S+))?"
)


@dataclass
class StorageNodeProcess:
    root: Path  # disks are root/disk-1 ... root/disk-M; the log is root/storage.log
    disks: int = 3
    zone: str = "zone-1"
    node_id: str | None = None  # None: the node picks (and keeps) its own
    zk: str | None = None
    zk_root: str | None = None
    http: bool = False
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    http_address: str = ""
    port: int = 0
    _starts: int = 0

    @property
    def data_dirs(self) -> list[Path]:
        return [self.root / f"disk-{k + 1}" for k in range(self.disks)]

    @property
    def log_path(self) -> Path:
        return self.root / "storage.log"

    def command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "pubsubd", "storage", "--port", str(port), "--zone", self.zone]
        cmd += ["--http-port", "0" if self.http else "-1"]
        for d in self.data_dirs:
            cmd += ["--data-dir", str(d)]
        if self.node_id is not None:
            cmd += ["--node-id", self.node_id]
        if self.zk is not None:
            cmd += ["--zk", self.zk]
        if self.zk_root is not None:
            cmd += ["--zk-root", self.zk_root]
        return cmd + self.args

    def start(self, timeout: float = 30.0) -> StorageNodeProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env)
        with self.log_path.open("ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(self.command(self.port), stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()
            matches = READY.findall(text)
            if len(matches) > self._starts:  # the log is appended across restarts
                self._starts = len(matches)
                address, node_id, _, _, http = matches[-1]
                self.address, self.node_id, self.http_address = address, node_id, http
                self.port = int(address.rsplit(":", 1)[1])
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"pubsubd storage exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"pubsubd storage not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL if it hangs; returns the exit code (None if killed)."""
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
