"""Killing a Spark daemon's process group (spark/standalone.py ``kill_process_group``): the
whole group while its leader is ours and not reaped; once the leader is gone, its group ID may
lead someone else's group, so only the Spark processes left in it are killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pubsubd.spark.standalone import _group_members, kill_process_group
from tests.support.process import pid_alive

pytestmark = pytest.mark.unit


def _group(script: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A bash leader in its own session with two sleeps: one named like a PySpark worker."""
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(members := [p for p in _group_members(proc.pid) if p != proc.pid]) < 2:
        assert time.monotonic() < deadline, "the group's members did not start"
        time.sleep(0.02)
    return proc, members


SCRIPT = "(exec -a pyspark.daemon sleep 60) & (exec -a other sleep 60) & wait"


def test_a_live_leaders_whole_group_is_killed() -> None:
    proc, members = _group(SCRIPT)
    kill_process_group(proc)
    assert proc.returncode is not None
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in members):
        assert time.monotonic() < deadline, "a member of the group survived"
        time.sleep(0.02)


def test_after_the_leader_is_gone_only_spark_processes_of_its_group_are_killed() -> None:
    proc, members = _group(SCRIPT)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    spark = [p for p in members if b"pyspark" in Path(f"/proc/{p}/cmdline").read_bytes()]
    other = [p for p in members if p not in spark]
    assert len(spark) == 1 and len(other) == 1
    try:
        kill_process_group(proc)
        deadline = time.monotonic() + 10
        while pid_alive(spark[0]):
            assert time.monotonic() < deadline, "the Spark process survived"
            time.sleep(0.02)
        assert pid_alive(other[0])
    finally:
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
