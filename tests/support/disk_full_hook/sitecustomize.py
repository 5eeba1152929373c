"""Test hook: a full disk for a ``pubsubd serve`` started with this directory on PYTHONPATH.

tests/integration/test_disk_full.py uses it where it cannot mount a small tmpfs (and, to keep
this path tested, beside it). Python imports ``sitecustomize`` at start-up; nothing in pubsubd
imports this. While the file named by ``PUBSUBD_TEST_DISK_FULL`` exists, writes fail the way they
do on a full file system: ``os.write`` raises ENOSPC, SQLite writes raise "database or disk is
full", and ``os.statvfs`` reports no free blocks. Deleting the file is freeing space.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from typing import Any

_FLAG = os.environ.get("PUBSUBD_TEST_DISK_FULL")
_SQL_WRITES = ("INSERT", "REPLACE", "UPDATE", "DELETE")


def _full() -> bool:
    return _FLAG is not None and os.path.exists(_FLAG)


if _FLAG:
    _write = os.write
    _statvfs = os.statvfs
    _connect = sqlite3.connect

    def write(fd: int, data: Any, /) -> int:
        if _full():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _write(fd, data)

    def statvfs(path: Any) -> os.statvfs_result:
        st = _statvfs(path)
        if not _full():
            return st
        no_free_blocks = (st.f_bsize, st.f_frsize, st.f_blocks, 0, 0, st.f_files, st.f_ffree)
        return os.statvfs_result((*no_free_blocks, st.f_favail, st.f_flag, st.f_namemax))

    def _check(sql: str) -> None:
        if _full() and sql.lstrip().upper().startswith(_SQL_WRITES):
            raise sqlite3.OperationalError("database or disk is full")

    class _Connection(sqlite3.Connection):
        def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
            _check(sql)
            return super().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
            _check(sql)
            return super().executemany(sql, parameters)

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", _Connection)
        return _connect(*args, **kwargs)

    os.write = write
    os.statvfs = statvfs
    sqlite3.connect = connect  # type: ignore[assignment]
