"""The files this process holds open, for tests that check a component lets its descriptors go.

Counting every descriptor of the process is not enough to tell: other threads of the test
process (an official client's channel left from an earlier test, pytest-xdist's own channel)
open and close sockets, pipes and event descriptors at any moment. Only descriptors of files
under a directory (a test's temporary directory) are counted."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def open_files(under: Path | str | None = None) -> list[str]:
    """The paths of the files under ``under`` (default: the temporary directory) that this
    process holds open, one per descriptor."""
    prefix = f"{os.path.realpath(under or tempfile.gettempdir())}/"
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith(prefix):
            held.append(target)
    return held
