"""Crash test: kill -9 a process appending with fsync ALWAYS; every acked entry survives."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pubsubd
from pubsubd.storage.log import FsyncPolicy, SourceLog

pytestmark = pytest.mark.crash

ROUNDS = 3  # kill -9 this many writer processes in a row on the same log
ACKS_BEFORE_KILL = 300  # acknowledged appends to see before killing a writer
SEGMENT_BYTES = 4096  # small, so the writers roll segments while being killed

_WRITER = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from pubsubd.storage.log import FsyncPolicy, SourceLog

    def payload(i):
        return (b"message-%d-" % i) * (1 + i % 7)

    async def main(directory, first, segment_bytes):
        log = SourceLog.open(Path(directory), fsync=FsyncPolicy.ALWAYS, segment_bytes=segment_bytes)
        counter = iter(range(first, 1 << 62))

        async def worker():
            while True:
                i = next(counter)
                offset = await log.append(payload(i), 1 + i % 3, time.time_ns() // 1000)
                sys.stdout.write(f"{offset} {i}\\n")
                sys.stdout.flush()

        await asyncio.gather(*(worker() for _ in range(8)))

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    """
)


def _payload(i: int) -> bytes:
    return (b"message-%d-" % i) * (1 + i % 7)


def _run_and_kill(directory: Path, first: int) -> dict[int, int]:
    """Start a writer, kill -9 it after enough acks; return {acked offset: message index}."""
    env = dict(os.environ, PYTHONPATH=str(Path(pubsubd.__file__).parents[1]))
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(directory), str(first), str(SEGMENT_BYTES)],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    acked: dict[int, int] = {}
    try:
        for line in proc.stdout:
            offset, index = map(int, line.split())
            acked[offset] = index
            if len(acked) >= ACKS_BEFORE_KILL:
                break
        os.kill(proc.pid, signal.SIGKILL)
        for line in proc.stdout:  # acks printed before the kill landed
            if line.endswith(b"\n"):
                offset, index = map(int, line.split())
                acked[offset] = index
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(acked) >= ACKS_BEFORE_KILL
    return acked


async def test_acknowledged_appends_survive_kill_9(tmp_path: Path) -> None:
    acked: dict[int, int] = {}
    for round_ in range(ROUNDS):
        acked.update(_run_and_kill(tmp_path, first=round_ * 1_000_000))

    log = SourceLog.open(tmp_path, fsync=FsyncPolicy.ALWAYS, segment_bytes=SEGMENT_BYTES)
    assert log.stats()["segments"] > 1
    for offset, index in acked.items():
        entry = log.entry_at(offset)
        assert entry.base_offset == offset
        assert entry.count == 1 + index % 3
        assert entry.payload == _payload(index)
    end = log.end_offset
    assert end >= max(acked) + 1
    assert await log.append(b"after the crash", 1, 0) == end
    await log.close()

    log = SourceLog.open(tmp_path, segment_bytes=SEGMENT_BYTES)
    assert log.entry_at(end).payload == b"after the crash"
    await log.close()


async def test_concurrent_appends_still_succeed_after_reopen(tmp_path: Path) -> None:
    acked = _run_and_kill(tmp_path, first=0)
    log = SourceLog.open(tmp_path, segment_bytes=SEGMENT_BYTES)
    start = log.end_offset
    offsets = await asyncio.gather(*(log.append(b"x%d" % i, 1, 0) for i in range(50)))
    assert offsets == list(range(start, start + 50))
    assert all(log.entry_at(o).base_offset == o for o in acked)
    await log.close()
