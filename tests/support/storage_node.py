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

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.process import LoggedProcess

READY = re.compile(
    r"pubsubd storage ready grpc=(\S+) node_id=(\S+) zone=(\S+) disks=(\d+)(?: http=(\S+))?"
    r"(?: append=(\S+))?"
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
    process: LoggedProcess | None = None
    address: str = ""
    http_address: str = ""
    append_address: str = ""  # its append port ("" with --append-port -1)
    port: int = 0

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
        if self.process is None:
            self.process = LoggedProcess(self.log_path)
        ready = self.process.launch(
            self.command(self.port), READY, self.env, timeout, "pubsubd storage"
        )
        address, node_id, _, _, http, append = ready.groups()
        self.address, self.node_id, self.http_address = address, node_id, http or ""
        self.append_address = append or ""
        self.port = int(address.rsplit(":", 1)[1])
        return self

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    def log(self) -> str:
        return self.process.log() if self.process is not None else ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL if it hangs; returns the exit code (None if killed)."""
        return self.process.stop(timeout) if self.process is not None else None

    def kill(self) -> None:
        """kill -9, as a crash."""
        if self.process is not None:
            self.process.kill()

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()
