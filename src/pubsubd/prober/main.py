"""``pubsubd prober``: the probes of ``probes.py`` through every endpoint given (a frontend per
zone, or a serving process), every ``--interval`` seconds, as a process (composition root; the
loop itself is ``loop.py``).

Each result feeds the SLIs on ``/metrics``: ``pubsubd_prober_probes_total{probe, endpoint,
result}``, ``pubsubd_prober_latency_seconds{probe, endpoint}`` (a histogram of successful
probes, fixed buckets) and ``pubsubd_prober_last_success_timestamp_seconds``. ``/status``
shows every probe's last result, and a failure names the step that failed. ``--once`` runs one
round, prints the results and exits 1 if any failed (for scripts and cron).

When ready it prints one line for scripts::

    pubsubd prober ready endpoints=N http=127.0.0.1:P
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pubsubd import runtime
from pubsubd.observability.http import HttpEndpoint
from pubsubd.prober.loop import ProbeLoop, ProberConfig, probe_round, run_once

__all__ = ["Prober", "ProberConfig", "probe_round", "run", "run_once", "serve"]


class Prober:
    """The prober process: the probing loop and the HTTP endpoint."""

    def __init__(self, config: ProberConfig) -> None:
        self.config = config
        self.loop = ProbeLoop(config)
        self.http = HttpEndpoint(self.status)
        self.http_port = 0

    async def start(self) -> None:
        if self.config.http_port >= 0:
            self.http_port = await self.http.start(self.config.host, self.config.http_port)
        self.loop.start()
        if self.config.pid_file is not None:
            self.config.pid_file.write_text(f"{os.getpid()}\n")
        http = f" http={self.config.host}:{self.http_port}" if self.config.http_port >= 0 else ""
        sys.stdout.write(f"pubsubd prober ready endpoints={len(self.config.endpoints)}{http}\n")
        sys.stdout.flush()

    async def stop(self) -> None:
        await self.loop.stop()
        await self.http.close()
        if self.config.pid_file is not None:
            self.config.pid_file.unlink(missing_ok=True)

    def status(self) -> dict[str, Any]:
        return {"role": "prober", **self.loop.status()}


async def serve(config: ProberConfig) -> None:
    prober = Prober(config)
    await runtime.serve_until_signalled("pubsubd prober", prober.start, prober.stop)


def run(config: ProberConfig) -> None:
    runtime.run(lambda: serve(config))
