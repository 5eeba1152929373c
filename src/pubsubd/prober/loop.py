"""The probing loop: the probes of ``probes.py`` through every endpoint, every interval, with
their SLIs on /metrics; run by the prober process (``main.py``) and inside ``pubsubd serve
--prober-interval`` (``app.py``), which probes its own endpoint.

Each result feeds ``pubsubd_prober_probes_total{probe, endpoint, result}``,
``pubsubd_prober_latency_seconds{probe, endpoint}`` (a histogram of successful probes, fixed
buckets) and ``pubsubd_prober_last_success_timestamp_seconds``; ``ProbeLoop.status`` keeps every
probe's last result, and a failure names the step that failed. Each result is also tallied
for the process's SLO monitor (``sli.record_probe``): inside ``pubsubd serve`` that is the
``prober_availability`` objective of its ``/alerts``; elsewhere nothing watches it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from pubsubd.core.client_security import ClientSecurity
from pubsubd.observability import sli
from pubsubd.observability.sli import PROBE_FAILURE, PROBE_SUCCESS, PROBES_METRIC
from pubsubd.prober.probes import (
    CONTROL_PLANE,
    PUBLISH_RECEIVE,
    Clients,
    ProbeResult,
    control_plane,
    publish_receive,
)

log = logging.getLogger(__name__)

PROBES = Counter(PROBES_METRIC, "Probes run, by result", ["probe", "endpoint", "result"])
LATENCY = Histogram(
    "pubsubd_prober_latency_seconds",
    "Latency of successful probes",
    ["probe", "endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
LAST_SUCCESS = Gauge(
    "pubsubd_prober_last_success_timestamp_seconds",
    "When a probe last succeeded (Unix seconds)",
    ["probe", "endpoint"],
)


@dataclass(frozen=True)
class ProberConfig:
    endpoints: tuple[str, ...]
    project: str = "pubsubd-prober"
    interval_s: float = 10.0
    host: str = "127.0.0.1"
    http_port: int = -1
    probes: tuple[str, ...] = field(default=(PUBLISH_RECEIVE, CONTROL_PLANE))
    pid_file: Path | None = None  # written when ready, removed on a clean stop
    # TLS (a CA file) and a bearer token for every endpoint (core/client_security.py).
    security: ClientSecurity = field(default_factory=ClientSecurity)

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("at least one --endpoint is required")
        if not self.interval_s > 0:
            raise ValueError(f"the interval must be positive, got {self.interval_s}")
        unknown = set(self.probes) - {PUBLISH_RECEIVE, CONTROL_PLANE}
        if unknown:
            raise ValueError(f"unknown probes: {', '.join(sorted(unknown))}")


def probe_round(config: ProberConfig, clients: dict[str, Clients]) -> list[ProbeResult]:
    """Every probe through every endpoint, once (blocking)."""
    results = []
    for endpoint in config.endpoints:
        if PUBLISH_RECEIVE in config.probes:
            results.append(publish_receive(clients[endpoint], config.project))
        if CONTROL_PLANE in config.probes:
            results.append(control_plane(clients[endpoint], config.project))
    for r in results:
        PROBES.labels(r.probe, r.endpoint, PROBE_SUCCESS if r.ok else PROBE_FAILURE).inc()
        sli.record_probe(r.ok)  # the process's prober availability objective, if it has one
        if r.ok:
            LATENCY.labels(r.probe, r.endpoint).observe(r.latency_s)
            LAST_SUCCESS.labels(r.probe, r.endpoint).set(r.at_unix_s)
        else:
            log.warning("probe %s through %s failed: %s", r.probe, r.endpoint, r.error)
    return results


def run_once(config: ProberConfig) -> list[ProbeResult]:
    clients = {e: Clients(e, config.security) for e in config.endpoints}
    try:
        return probe_round(config, clients)
    finally:
        for c in clients.values():
            c.close()


class ProbeLoop:
    """A round every interval, in a thread (the official client blocks); the last results."""

    def __init__(self, config: ProberConfig) -> None:
        self.config = config
        self.clients = {e: Clients(e, config.security) for e in config.endpoints}
        self.last: dict[tuple[str, str], ProbeResult] = {}
        self.rounds = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="prober")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for c in self.clients.values():
            await asyncio.to_thread(c.close)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                results = await asyncio.to_thread(probe_round, self.config, self.clients)
            except Exception:
                log.exception("a probe round failed")
            else:
                for r in results:
                    self.last[(r.probe, r.endpoint)] = r
                self.rounds += 1
            await asyncio.sleep(max(0.0, self.config.interval_s - (loop.time() - started)))

    def status(self) -> dict[str, Any]:
        return {
            "endpoints": list(self.config.endpoints),
            "interval_s": self.config.interval_s,
            "rounds": self.rounds,
            "probes": [r.as_dict() for _, r in sorted(self.last.items())],
        }
