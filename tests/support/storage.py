"""What a server's data directory holds, seen from outside: the segment files of its logs."""

from __future__ import annotations

from pathlib import Path

# Every segment file of every topic's publish message sources (data/publish/forwarder.py).
SEGMENTS = "topics/*/source-*/*.seg"


def segments(data_dir: Path) -> list[Path]:
    """Segment files under ``data_dir``, sorted by path."""
    return sorted(data_dir.glob(SEGMENTS))
