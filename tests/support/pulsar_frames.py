"""The MESSAGE frames a Pulsar front's consumer wrote, read back with our frame codec (unit
tests of the front capture what a consumer writes as a list of byte strings)."""

from __future__ import annotations

from pubsubd.pulsar import frames
from pubsubd.pulsar.api import BaseCommand, MessageMetadata


def written_messages(written: list[bytes]) -> list[tuple[int, int, int, int]]:
    """(ledger, entry, messages in it, redelivery count) of each MESSAGE in ``written``, which
    is then emptied."""
    out = []
    for frame in frames.FrameDecoder().feed(b"".join(written)):
        cmd = BaseCommand()
        cmd.ParseFromString(frame.command)
        meta = MessageMetadata()
        meta.ParseFromString(frame.metadata or b"")
        n = meta.num_messages_in_batch if meta.HasField("num_messages_in_batch") else 1
        mid = cmd.message.message_id
        out.append((mid.ledgerId, mid.entryId, n, cmd.message.redelivery_count))
    written.clear()
    return out
