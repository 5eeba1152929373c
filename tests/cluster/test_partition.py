"""A storage node cut off by nftables inside a network namespace, then healed, under a publish
flood through the official client: publishing goes on at the majority, nothing acknowledged
is lost, nothing unexpected arrives. The scenario runs inside a namespace this test creates
(``partition_scenario.py``) so the rules touch nothing outside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_a_storage_node_cut_off_and_healed_loses_nothing(tmp_path: Path) -> None:
    namespace = f"pubsubd-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        subprocess.run(
            ["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"], check=True
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                namespace,
                sys.executable,
                "-m",
                "tests.cluster.partition_scenario",
                str(tmp_path / "cluster"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env=env,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        counts = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["ip", "netns", "del", namespace], check=False)
    assert counts["acked_during_cut"] >= 3000
    assert counts["lost"] == 0, counts
    assert counts["unexpected"] == 0, counts
