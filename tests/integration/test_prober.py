"""``pubsubd prober`` against a real pubsubd in every deployment (issue 12, probers): one round
with ``--once``, a dead endpoint named in the failures, and the long-running process whose
results are SLIs on /metrics and /status."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import LoggedProcess
from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.integration

READY = re.compile(r"pubsubd prober ready endpoints=(\d+) http=(\S+)")


def _once(*endpoints: str, timeout: float = 120) -> tuple[int, list[dict[str, Any]]]:
    args = [a for e in endpoints for a in ("--endpoint", e)]
    done = subprocess.run(
        [sys.executable, "-m", "pubsubd", "prober", *args, "--once", "--json"],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout)


def test_one_round_probes_the_data_and_the_control_plane(shared_server: ServerProcess) -> None:
    for _ in range(2):  # the second round finds the probe's topic and subscription made
        code, results = _once(shared_server.endpoint)
        assert code == 0, results
        assert sorted(r["probe"] for r in results) == ["control_plane", "publish_receive"]
        for r in results:
            assert r["ok"] and r["error"] == "" and 0 < r["latency_s"] < 30, r
            assert r["endpoint"] == shared_server.endpoint


def test_a_failed_probe_names_the_endpoint_and_the_step(shared_server: ServerProcess) -> None:
    dead = "127.0.0.1:1"
    code, results = _once(shared_server.endpoint, dead)
    assert code == 1
    by = {(r["endpoint"], r["probe"]): r for r in results}
    assert all(by[(shared_server.endpoint, p)]["ok"] for p in ("publish_receive", "control_plane"))
    assert by[(dead, "publish_receive")]["error"].startswith("setup: UNAVAILABLE ")
    assert by[(dead, "control_plane")]["error"].startswith("create topic: UNAVAILABLE ")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def _count(metrics: str, probe: str, result: str) -> float:
    pattern = (
        rf'pubsubd_prober_probes_total{{[^}}]*probe="{probe}"[^}}]*result="{result}"[^}}]*}} (\S+)'
    )
    found = re.search(pattern, metrics)
    return float(found.group(1)) if found else 0.0


def test_the_prober_process_exports_its_results(
    shared_server: ServerProcess, tmp_path: Path
) -> None:
    process = LoggedProcess(tmp_path / "prober.log")
    command = [
        sys.executable, "-m", "pubsubd", "prober", "--endpoint", shared_server.endpoint,
        "--interval", "0.5", "--http-port", "0",
    ]  # fmt: skip
    ready = process.launch(command, READY, {}, 60.0, "prober")
    http = ready.group(2)
    try:

        def rounds_done() -> bool:
            metrics = _get(f"http://{http}/metrics")
            return all(
                _count(metrics, p, "success") >= 2 for p in ("publish_receive", "control_plane")
            )

        wait_for(rounds_done, 60, "two successful rounds on /metrics")
        metrics = _get(f"http://{http}/metrics")
        assert _count(metrics, "publish_receive", "failure") == 0
        assert "pubsubd_prober_latency_seconds_bucket" in metrics
        assert "pubsubd_prober_last_success_timestamp_seconds" in metrics
        status = json.loads(_get(f"http://{http}/status"))
        assert status["role"] == "prober" and status["rounds"] >= 2
        assert {p["probe"] for p in status["probes"] if p["ok"]} == {
            "publish_receive",
            "control_plane",
        }
    finally:
        assert process.stop() == 0  # SIGTERM: a clean exit


def test_serve_probes_itself_when_asked(tmp_path: Path) -> None:
    """``serve --prober-interval``: the probes run inside the server against its own endpoint;
    their results show in /status and /metrics and count in the prober objective of /alerts,
    and their requests count in the SLIs."""
    server = ServerProcess(tmp_path / "data", args=["--prober-interval", "0.5"]).start()
    try:

        def status() -> dict[str, Any]:
            url = f"http://127.0.0.1:{server.http_port}/status"
            with urllib.request.urlopen(url, timeout=10) as r:
                return dict(json.load(r))

        wait_for(lambda: (status()["prober"] or {}).get("rounds", 0) >= 2, 60, "two rounds")
        probes = status()["prober"]["probes"]
        assert sorted(p["probe"] for p in probes) == ["control_plane", "publish_receive"]
        assert all(p["ok"] and p["endpoint"] == server.endpoint for p in probes), probes
        url = f"http://127.0.0.1:{server.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            metrics = r.read().decode()
        assert (
            f'pubsubd_prober_probes_total{{endpoint="{server.endpoint}",probe="publish_receive",'
            'result="success"}' in metrics
        )
        assert 'pubsubd_rpc_requests_total{code="OK",method="DeleteSubscription"}' in metrics
        # Each probe result is an event of the prober objective on /alerts.
        url = f"http://127.0.0.1:{server.http_port}/alerts"
        with urllib.request.urlopen(url, timeout=10) as r:
            alerts = json.load(r)
        prober = next(o for o in alerts["objectives"] if o["slo"] == "prober_availability")
        assert prober["scope"] == "global" and prober["total"] >= 4, prober
        assert prober["good"] == prober["total"] and prober["error_budget_remaining"] == 1.0
        assert not prober["firing"] and prober["windows"][0]["long_burn_rate"] == 0
    finally:
        assert server.stop() == 0
