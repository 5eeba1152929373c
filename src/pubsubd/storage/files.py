"""Blocking file-system helpers shared by the durable writers (logs, ack journals, dedup markers).

Each call blocks on the disk: call them from start-up code or a worker thread, never on the
event loop's hot path. A new directory entry (a file or directory created, renamed or deleted)
is durable only once its directory is fsynced, so every creation here ends with one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fdatasync(fd: int) -> None:
    """Make ``fd``'s data durable: ``fdatasync`` where the platform has it, else ``fsync``."""
    getattr(os, "fdatasync", os.fsync)(fd)


def fsync_directory(directory: Path) -> None:
    """Make file creations, renames and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, fsyncing the parent of each one created.

    Another process or thread creating the same directory at the same time is not an error."""
    if directory.is_dir():
        return
    make_dirs(directory.parent)
    with contextlib.suppress(FileExistsError):
        directory.mkdir()
    fsync_directory(directory.parent)
