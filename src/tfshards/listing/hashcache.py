"""Remember local files' SHA-256 by their stat, so listing an unchanged tree reads no file.

Like git's index and DVC's state database: a file's digest is reused while its
``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` is the one recorded
when it was hashed. The stat is taken before the bytes are read, so a file
changed while it is hashed is recorded with its old stat and hashed again next
time. ``ctime`` cannot be set back by a user (``os.utime`` sets it to now), so an
edit that restores size and mtime is still noticed; a file replaced by another
(rename over it, copy, restore from a backup) has another inode.

Racy files (as racy-git): a file whose mtime or ctime is within
:data:`RACY_NS` of the start of the listing is hashed but not remembered, since
a write in the same timestamp tick (1-2 s on some filesystems) would keep
both times.

The cache is one SQLite file (stdlib ``sqlite3``, WAL journal): rows are
read one folder at a time, so memory stays bounded by the largest folder;
writes commit in batches of :data:`_FLUSH_ROWS`, so two lists running at once
take turns, and a killed process leaves the last committed state. A damaged
file is removed and rebuilt with a one-line warning on stderr; a cache that
cannot be opened or written at all is skipped with a warning. The cache never
changes what is listed, only whether a file is read.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from typing import Any

ENV = "TFSHARDS_HASH_CACHE"  # a file path, or "none" for no cache
OFF = "none"
RACY_NS = 2_000_000_000  # FAT keeps mtime in 2 s steps; ext4, xfs, btrfs in ns
SCHEMA = 1  # PRAGMA user_version: another value means another layout: rebuilt
_FLUSH_ROWS = 20_000  # rows per write transaction: a concurrent list waits ~10 ms
_BUSY_MS = 30_000  # how long a write waits for another process's transaction
Stat = tuple[int, int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)
_TABLES = """
CREATE TABLE IF NOT EXISTS dirs (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS files (
    dir INTEGER NOT NULL, name TEXT NOT NULL,
    dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, sha256 BLOB NOT NULL,
    PRIMARY KEY (dir, name)
) WITHOUT ROWID;
"""


def default_path() -> str | None:
    """``$TFSHARDS_HASH_CACHE`` (``none``: no cache), else ``<cache dir>/listing-hashes.sqlite``.

    The cache dir is ``$TFSHARDS_CACHE``, else ``$XDG_CACHE_HOME/tfshards``,
    else ``~/.cache/tfshards`` (where the loader keeps its shard copies).
    """
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in ("", OFF) else value
    base = os.environ.get("TFSHARDS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "tfshards",
    )
    return os.path.join(base, "listing-hashes.sqlite")


def stat_key(st: os.stat_result) -> Stat:
    """The part of a stat a cached digest is valid for."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _set_up(db: sqlite3.Connection) -> None:
    """Create the tables; retry while another process does the same.

    Switching a new file to WAL, or creating its tables, while another process
    does the same can fail with "database is locked" at once, without waiting
    for the busy timeout.
    """
    deadline = time.monotonic() + _BUSY_MS / 1000
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA):
                raise sqlite3.DatabaseError(f"schema {version}, expected {SCHEMA}")
            if version == 0:
                script = f"BEGIN IMMEDIATE; {_TABLES} PRAGMA user_version={SCHEMA}; COMMIT;"
                db.executescript(script)
            db.execute("SELECT count(*) FROM (SELECT 1 FROM files LIMIT 1)").fetchone()
            return
        except sqlite3.OperationalError as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _warn(message: str) -> None:
    print(f"tfshards: warning: {message}", file=sys.stderr, flush=True)


class HashCache:
    """SHA-256 digests of local files by folder and name, valid while their stat is unchanged.

    Args:
        path: the SQLite file; its folder is created.
        racy_ns: files changed this close to the listing's start are not
            remembered (default :data:`RACY_NS`).
    """

    def __init__(self, path: str, *, racy_ns: int | None = None) -> None:
        racy_ns = RACY_NS if racy_ns is None else racy_ns
        if racy_ns < 0:
            raise ValueError(f"racy_ns must be >= 0, got {racy_ns}")
        self.path = os.path.abspath(path)
        self.racy_ns = racy_ns
        self.started_ns = time.time_ns()
        self.hits = 0
        self._pending: list[tuple[str, str, Stat, bytes]] = []
        self._db = self._open()

    def _open(self) -> sqlite3.Connection | None:
        for attempt in range(2):
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                db = sqlite3.connect(self.path, timeout=_BUSY_MS / 1000, isolation_level=None)
            except (OSError, sqlite3.Error) as exc:
                _warn(f"hash cache {self.path}: cannot open ({exc}); listing without it")
                return None
            try:
                _set_up(db)
                return db
            except sqlite3.OperationalError as exc:  # locked, read-only, disk full
                db.close()
                _warn(f"hash cache {self.path}: unusable ({exc}); listing without it")
                return None
            except sqlite3.DatabaseError as exc:  # not a database, malformed, other schema
                db.close()
                if attempt:
                    break
                _warn(f"hash cache {self.path}: damaged ({exc}); rebuilding it")
                for suffix in ("", "-wal", "-shm"):
                    try:
                        os.unlink(self.path + suffix)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        break
        _warn(f"hash cache {self.path}: cannot rebuild; listing without it")
        return None

    def _fail(self, exc: sqlite3.Error) -> None:
        _warn(f"hash cache {self.path}: {exc}; listing the rest without it")
        if self._db is not None:
            self._db.close()
        self._db = None
        self._pending.clear()

    def folder(self, directory: str) -> dict[str, tuple[Stat, bytes]]:
        """``name -> (stat, digest)`` remembered for the files of ``directory`` (absolute)."""
        if self._db is None:
            return {}
        try:
            rows = self._db.execute(
                "SELECT name, dev, ino, size, mtime_ns, ctime_ns, sha256 FROM files "
                "WHERE dir = (SELECT id FROM dirs WHERE path = ?)",
                (directory,),
            ).fetchall()
        except sqlite3.Error as exc:
            self._fail(exc)
            return {}
        return {row[0]: (row[1:6], row[6]) for row in rows}

    def add(self, directory: str, name: str, stat: Stat, digest: bytes) -> None:
        """Remember ``digest`` for ``directory/name`` as stat'ed (before reading) with ``stat``."""
        if self._db is None or max(stat[3], stat[4]) > self.started_ns - self.racy_ns:
            return
        self._pending.append((directory, name, stat, digest))
        if len(self._pending) >= _FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write what :meth:`add` collected, in one transaction."""
        if self._db is None or not self._pending:
            return
        db, pending = self._db, self._pending
        self._pending = []
        try:
            db.execute("BEGIN IMMEDIATE")
            ids: dict[str, Any] = {}
            for directory in {row[0] for row in pending}:
                db.execute("INSERT OR IGNORE INTO dirs (path) VALUES (?)", (directory,))
                ids[directory] = db.execute(
                    "SELECT id FROM dirs WHERE path = ?", (directory,)
                ).fetchone()[0]
            db.executemany(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(ids[d], name, *stat, digest) for d, name, stat, digest in pending],
            )
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._fail(exc)

    def close(self) -> None:
        """Flush and close; the cache cannot be used afterwards."""
        self.flush()
        if self._db is not None:
            self._db.close()
            self._db = None
