"""The local copy of a replicated source: brought up to its ledgers before the log opens.

In a cluster the durable copy of a publish message source is its ledgers on the storage nodes;
the forwarder that owns the source reads from a local ``SourceLog`` directory. Every write
reaches that directory only after a quorum of nodes has it, so the local log is always a prefix
of the ledgers' content: after a crash it lacks at most a tail, on a new machine it is empty.
``materialize`` copies what is missing (read from the nodes, appended through ``SourceLog``, so
the local files are ordinary segments) and starts a fresh directory at the ledgers' first
offset. A local log that is *not* a prefix (longer than the ledgers, or ending before they
start) is moved aside, never deleted, and copied anew; damaged entries in a local log that is
one are overwritten with the nodes' copies (``SourceLog.restore_damage``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from pubsubd.storage.errors import CorruptEntry
from pubsubd.storage.files import fsync_directory, make_dirs
from pubsubd.storage.framing import decode_frames
from pubsubd.storage.ledgers.writer import SourceLedgers
from pubsubd.storage.log import FsyncPolicy, SourceLog
from pubsubd.storage.replication import segment_file_name

logger = logging.getLogger(__name__)


async def materialize(directory: Path, ledgers: SourceLedgers) -> int:
    """Make ``directory`` hold exactly the entries of ``ledgers`` (taken over: every ledger
    closed) from their start on; returns the number of entries copied."""
    listed = ledgers.ledgers
    start, end = listed.start_offset, listed.end_offset
    if listed.ledgers:
        start = listed.ledgers[0].first_offset
    assert end is not None, "materialize after take_over"
    if await asyncio.to_thread(directory.is_dir):
        log = SourceLog.open(directory, fsync=FsyncPolicy.NEVER)
        local_start, local_end = log.start_offset, log.end_offset
        if local_end > end or (local_end < start and end > start) or local_end < local_start:
            await log.close()
            aside = directory.with_name(f"{directory.name}.stale-{int(time.time())}")
            await asyncio.to_thread(directory.rename, aside)
            logger.warning(
                "local copy %s [%d, %d) is not a prefix of its ledgers [%d, %d): moved to %s",
                directory,
                local_start,
                local_end,
                start,
                end,
                aside,
            )
        else:
            return await _fill(log, ledgers, end)
    await asyncio.to_thread(_create, directory, start)
    return await _fill(SourceLog.open(directory, fsync=FsyncPolicy.NEVER), ledgers, end)


def _create(directory: Path, start: int) -> None:
    make_dirs(directory)
    (directory / segment_file_name(start)).touch()
    fsync_directory(directory)


async def _fill(log: SourceLog, ledgers: SourceLedgers, end: int) -> int:
    copied = 0
    try:
        # Damage the start-up scan found in the local copy is re-read from the nodes now,
        # before any reader meets it.
        if await log.restore_damage(ledgers):
            log.recheck_damage()
        while log.end_offset < end:
            frames = await ledgers.read_frames(log.end_offset, end)
            decoded, valid_end = decode_frames(frames)
            if valid_end != len(frames) or not decoded:
                raise CorruptEntry(f"storage node sent invalid frames at {log.end_offset}")
            entries = [e for e, _, _ in decoded if e.base_offset < end]
            appends = [log.append(e.payload, e.count, e.publish_time_us) for e in entries]
            bases = await asyncio.gather(*appends)
            if list(bases) != [e.base_offset for e in entries]:
                raise RuntimeError(f"copy of {log.directory} went out of step at {bases[0]}")
            copied += len(entries)
    finally:
        await log.close()
    if copied:
        logger.info(
            "local copy %s: %d entries copied from the storage nodes", log.directory, copied
        )
    return copied
