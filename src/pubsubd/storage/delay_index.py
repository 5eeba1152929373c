"""Delay index: delayed messages of every topic by due time, on disk (SQLite B-tree).

A message published with ``pubsubd.deliver_at``/``deliver_after`` (core/delays.py) must not be
delivered before its time, and a topic may hold millions of them. The subscription dispatchers
skip a not-yet-due message when they read it from the log and keep nothing of it in memory; this
index is what brings it back when it falls due. Rows are ``(topic, at_us, position)``, kept in
due-time order so "what falls due next" is one index range scan, and the index never needs more
memory than one page of rows. A row covers a run of consecutive positions due at the same time
(``count``): a batch published with one delay is one row.

The index is derived from the log. ``progress`` records, per topic and source, the offset below
which every entry has been indexed; it is written in the same transaction as the rows, so after a
crash the index is rebuilt from that offset on (the log is the source of truth). The file uses
SQLite's write-ahead log with ``synchronous=NORMAL``: a killed process loses no committed
transaction, and a power loss at worst rolls back the newest ones, which the rebuild covers.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from pubsubd.storage import disk_space
from pubsubd.storage.disk_space import DiskSpace

FILE_NAME = "delays.db"
# (due time in epoch microseconds, first position, number of consecutive positions)
Row = tuple[int, int, int]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS delays (
    topic TEXT NOT NULL,
    at_us INTEGER NOT NULL,
    position INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (topic, at_us, position)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS progress (
    topic TEXT NOT NULL,
    source INTEGER NOT NULL,
    indexed_through INTEGER NOT NULL,
    PRIMARY KEY (topic, source)
) WITHOUT ROWID;
"""


class DelayIndex:
    """The on-disk index of every topic's delayed messages (one SQLite file per data dir)."""

    def __init__(self, path: Path | None, disk: DiskSpace | None = None) -> None:
        self.path = path
        # Writes failing for lack of space raise DiskFull (rolled back; callers retry later).
        self.disk = disk or DiskSpace(Path(".") if path is None else path.parent)
        self._db = sqlite3.connect(":memory:" if path is None else str(path), isolation_level=None)
        if path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    @classmethod
    def open(cls, data_dir: Path, disk: DiskSpace | None = None) -> DelayIndex:
        data_dir.mkdir(parents=True, exist_ok=True)
        return cls(data_dir / FILE_NAME, disk)

    def close(self) -> None:
        self._db.close()

    # --- writes -------------------------------------------------------------------------------

    def add(self, topic: str, rows: Iterable[Row], progress: Mapping[int, int]) -> None:
        """Insert ``(at_us, first position, count)`` rows and record the indexed offsets,
        atomically."""
        with self._transaction():
            self._db.executemany(
                "INSERT OR IGNORE INTO delays (topic, at_us, position, count) VALUES (?, ?, ?, ?)",
                ((topic, at, pos, n) for at, pos, n in rows),
            )
            self._save_progress(topic, progress)

    def save_progress(self, topic: str, progress: Mapping[int, int]) -> None:
        with self._transaction():
            self._save_progress(topic, progress)

    def delete_through(self, topic: str, at_us: int, position: int) -> None:
        """Delete the topic's rows up to and including the one at ``(at_us, position)``."""
        with self._transaction():
            self._db.execute(
                "DELETE FROM delays WHERE topic = ? AND (at_us, position) <= (?, ?)",
                (topic, at_us, position),
            )

    def delete_due(self, topic: str, at_us: int) -> None:
        """Delete the topic's rows due at or before ``at_us``."""
        with self._transaction():
            self._db.execute("DELETE FROM delays WHERE topic = ? AND at_us <= ?", (topic, at_us))

    def drop(self, topic: str) -> None:
        """Forget a topic (deleted): its rows and its progress."""
        with self._transaction():
            self._db.execute("DELETE FROM delays WHERE topic = ?", (topic,))
            self._db.execute("DELETE FROM progress WHERE topic = ?", (topic,))

    # --- reads --------------------------------------------------------------------------------

    def due(self, topic: str, at_us: int, limit: int) -> list[Row]:
        """Up to ``limit`` rows due at or before ``at_us``, earliest first."""
        cur = self._db.execute(
            "SELECT at_us, position, count FROM delays WHERE topic = ? AND at_us <= ? "
            "ORDER BY at_us, position LIMIT ?",
            (topic, at_us, limit),
        )
        return [(int(a), int(p), int(n)) for a, p, n in cur.fetchall()]

    def next_due(self, topic: str) -> int | None:
        """The earliest due time of the topic's rows, or None when it has none."""
        row = self._db.execute(
            "SELECT at_us FROM delays WHERE topic = ? ORDER BY at_us LIMIT 1", (topic,)
        ).fetchone()
        return None if row is None else int(row[0])

    def topics(self) -> set[str]:
        """Every topic with rows or recorded progress (those that ever had delayed messages)."""
        cur = self._db.execute("SELECT topic FROM progress UNION SELECT DISTINCT topic FROM delays")
        return {str(t) for (t,) in cur.fetchall()}

    def count(self, topic: str) -> int:
        """Delayed messages of the topic not yet due (the sum of the rows' runs)."""
        row = self._db.execute(
            "SELECT COALESCE(SUM(count), 0) FROM delays WHERE topic = ?", (topic,)
        ).fetchone()
        return int(row[0])

    def progress(self, topic: str) -> dict[int, int]:
        """Per source, the offset below which every entry is indexed (absent: none is)."""
        cur = self._db.execute(
            "SELECT source, indexed_through FROM progress WHERE topic = ?", (topic,)
        )
        return {int(s): int(o) for s, o in cur.fetchall()}

    # --- helpers ------------------------------------------------------------------------------

    def _save_progress(self, topic: str, progress: Mapping[int, int]) -> None:
        self._db.executemany(
            "INSERT INTO progress (topic, source, indexed_through) VALUES (?, ?, ?) "
            "ON CONFLICT (topic, source) DO UPDATE SET indexed_through = excluded.indexed_through",
            ((topic, s, o) for s, o in progress.items()),
        )

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db, self.disk)


class _Transaction:
    """BEGIN ... COMMIT, rolled back on any failure (a COMMIT failing with SQLITE_FULL
    included, which would otherwise leave the transaction open and every later BEGIN failing)."""

    def __init__(self, db: sqlite3.Connection, disk: DiskSpace) -> None:
        self._db = db
        self._disk = disk

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            with self._disk.guard(disk_space.DELAYS):
                try:
                    self._db.execute("COMMIT")
                except sqlite3.Error:
                    self._rollback()
                    raise
            return
        self._rollback()
        error = self._disk.error(exc, disk_space.DELAYS)
        if error is not None and error is not exc:
            raise error from exc

    def _rollback(self) -> None:
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
