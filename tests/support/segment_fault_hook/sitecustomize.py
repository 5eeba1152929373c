"""Test hook: a failing local disk under a ``pubsubd`` process started with this directory first
on PYTHONPATH (tests/cluster/test_local_copy_retry_crash.py).

Python imports ``sitecustomize`` at start-up; nothing in pubsubd imports this. While the file
named by ``PUBSUBD_TEST_SEGMENT_FAULT`` exists, ``os.write`` to a topic log's segment file
(``*.seg``) raises EIO, the way a failing disk answers; every other file (ack journals, cursors,
metadata) is written as usual, so only the local copy of the topics' logs is broken. Deleting
the file is replacing the disk.
"""

from __future__ import annotations

import errno
import os
from typing import Any

_FLAG = os.environ.get("PUBSUBD_TEST_SEGMENT_FAULT")

if _FLAG:
    _write = os.write

    def _is_segment(fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").endswith(".seg")
        except OSError:
            return False

    def write(fd: int, data: Any, /) -> int:
        if os.path.exists(_FLAG) and _is_segment(fd):  # type: ignore[arg-type]
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return _write(fd, data)

    os.write = write
