"""A throwaway Spark Connect server on loopback, from the installed PySpark (demos and tests).

    with ConnectServer(Path("/tmp/x")) as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()

Runs ``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` (the
server PySpark's jars ship) in the foreground, bound to 127.0.0.1 on an ephemeral port read back
from its log, on ``master`` (``local[2]`` or a standalone cluster's URL). The server's Python
workers run this interpreter (``PYSPARK_PYTHON``), so the data sources and UDFs a client
registers must be importable here; ``stop`` kills the server's process group by its PID.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from pubsubd.spark.standalone import ClusterError, kill_process_group, spark_home

_STARTED = re.compile(r"Spark Connect server started at: (\S+):(\d+)")
_JVM_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


@dataclass
class ConnectServer:
    """One Spark Connect server; ``url`` is ``sc://127.0.0.1:PORT`` once started."""

    work_dir: Path
    master: str = "local[2]"
    conf: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 120.0
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.work_dir / "connect-server.log"

    def __enter__(self) -> ConnectServer:
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

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",  # ephemeral; the log says which
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.extraJavaOptions": _JVM_OPTS,
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            **self.conf,
        }
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master]
        cmd += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
        cmd += ["--name", "pubsubd-connect"]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", sys.executable),
            **self.env,
        )
        env.pop("PUBSUB_EMULATOR_HOST", None)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.work_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its Python workers share its group
            )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            found = _STARTED.search(text)
            if found:
                self.url = f"sc://{found.group(1)}:{found.group(2)}"
                return
            if self.proc.poll() is not None:
                raise ClusterError(f"Spark Connect server exited:\n{text[-4000:]}")
            time.sleep(0.1)
        raise ClusterError(f"Spark Connect server not ready in {self.timeout}s")

    def stop(self) -> None:
        if self.proc is None:
            return
        kill_process_group(self.proc)
