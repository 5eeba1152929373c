"""In-process roles for tests that start no server: the same wiring ``pubsubd serve`` runs
(``pubsubd.node``), over a metadata store and a clock of the test's choice."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pubsubd import node
from pubsubd.core.clock import SYSTEM_CLOCK, Clock
from pubsubd.node import Node
from pubsubd.storage.log import FsyncPolicy
from pubsubd.storage.metadata import MemoryMetadataStore, MetadataStore


@contextlib.asynccontextmanager
async def running_node(
    data_dir: Path,
    *,
    store: MetadataStore | None = None,
    clock: Clock = SYSTEM_CLOCK,
    housekeeping: bool = False,
    **settings: Any,
) -> AsyncIterator[Node]:
    """A loaded node (``housekeeping``: with its trim and ack-flush loops), closed after."""
    settings.setdefault("fsync", FsyncPolicy.NEVER)
    n = node.build(store or MemoryMetadataStore(), data_dir, clock=clock, **settings)
    if housekeeping:
        n.start()
    else:
        n.load()
    try:
        yield n
    finally:
        await n.close()
