"""A subscription's ack journal replicated on the storage nodes (cluster deployments).

Each subscription has its own ledgers (a "cursor ledger" source keyed ``acks-{subscription
uid}``, as Pulsar keeps cursors in ledgers), written by the same ``SourceLedgers`` writer as
messages: every journal flush is one entry ``J`` + the encoded records, every compaction one
entry ``S`` + the encoded snapshot at the start of a new ledger, after which the ledgers wholly
before it are deleted. Entries reach a majority of the nodes before the local files are
written (``AckJournal`` with a ``JournalMirror``), so a forwarder's machine that dies costs at
most the acks of the last flush interval (redelivered), never a message.

At start-up ``restore_journal`` rebuilds the local files from the ledgers: the last snapshot,
then the records after it, exactly as ``AckJournal.open`` reads them. The ledgers are the
truth; local files that say otherwise are replaced.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from pubsubd.acks.journal import (
    JOURNAL_FILENAME,
    SNAPSHOT_FILENAME,
    decode_snapshot,
    encode_journal_header,
    install_file,
)
from pubsubd.core.records import Entry
from pubsubd.storage.errors import CorruptEntry
from pubsubd.storage.files import make_dirs
from pubsubd.storage.framing import decode_frames, encode_entry
from pubsubd.storage.ledgers.writer import SourceLedgers

logger = logging.getLogger(__name__)

RECORDS = b"J"
SNAPSHOT = b"S"


def cursor_source(subscription_uid: str) -> str:
    """The ledger source key of a subscription's ack journal."""
    return f"acks-{subscription_uid}"


class JournalLedgers:
    """``JournalMirror`` over a subscription's cursor ledgers."""

    def __init__(self, ledgers: SourceLedgers) -> None:
        self._ledgers = ledgers

    async def _append(self, payload: bytes) -> int:
        offset = self._ledgers.end_offset
        frame = encode_entry(Entry(offset, 1, 0, payload))
        await self._ledgers.append(offset, frame, offset + 1)
        return offset

    async def append_records(self, data: bytes) -> None:
        await self._append(RECORDS + data)

    async def append_snapshot(self, snapshot: bytes) -> None:
        self._ledgers.roll_next()  # the snapshot starts a ledger: the older ones can go
        offset = await self._append(SNAPSHOT + snapshot)
        await self._ledgers.trim(offset)

    async def close(self) -> None:
        await self._ledgers.close()

    async def destroy(self) -> None:
        await self._ledgers.destroy()


async def read_journal(ledgers: SourceLedgers) -> tuple[bytes | None, list[bytes]]:
    """The last snapshot in the ledgers (None: none yet) and the record batches after it."""
    listed = ledgers.ledgers
    start = listed.ledgers[0].first_offset if listed.ledgers else listed.start_offset
    end = ledgers.end_offset
    snapshot: bytes | None = None
    batches: list[bytes] = []
    offset = start
    while offset < end:
        frames = await ledgers.read_frames(offset, end)
        decoded, valid_end = decode_frames(frames)
        if valid_end != len(frames) or not decoded:
            raise CorruptEntry(f"cursor ledger {ledgers.name}: invalid frames at {offset}")
        for entry, _, _ in decoded:
            if entry.base_offset >= end:
                break
            kind, body = entry.payload[:1], entry.payload[1:]
            if kind == SNAPSHOT:
                snapshot, batches = body, []
            elif kind == RECORDS:
                batches.append(body)
            else:
                raise CorruptEntry(f"cursor ledger {ledgers.name}: unknown entry {kind!r}")
            offset = entry.next_offset
    return snapshot, batches


async def restore_journal(directory: Path, ledgers: SourceLedgers) -> bool:
    """Rebuild the journal files in ``directory`` from ``ledgers`` (taken over); False when
    the ledgers hold nothing (the subscription never flushed: its sync point is in the
    metadata, and whatever local files there are stay)."""
    snapshot, batches = await read_journal(ledgers)
    if snapshot is None and not batches:
        return False
    generation = decode_snapshot(snapshot)[0] if snapshot is not None else 0
    journal = encode_journal_header(generation) + b"".join(batches)
    await asyncio.to_thread(_install, directory, snapshot, journal)
    logger.info(
        "ack journal %s restored from its ledgers: %s, %d record batches",
        directory,
        "a snapshot" if snapshot is not None else "no snapshot",
        len(batches),
    )
    return True


def _install(directory: Path, snapshot: bytes | None, journal: bytes) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    make_dirs(directory)
    if snapshot is not None:
        install_file(directory, SNAPSHOT_FILENAME, snapshot)
    install_file(directory, JOURNAL_FILENAME, journal)
