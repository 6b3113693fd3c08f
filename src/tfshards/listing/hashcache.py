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

The cache is one SQLite file (stdlib ``sqlite3``, WAL journal) with one row
per folder: its file names, their stats packed as int64 and their digests.
A re-list stats a folder's files in one C call and, when the packed stats and
names equal the row's, takes every digest without a per-file comparison in
Python (on 200,000 files a per-file lookup cost 2-3 times the walk itself).
Memory stays bounded by the largest folder; writes commit in batches of
:data:`_FLUSH_ROWS` files, so two lists running at once take turns, and a
killed process leaves the last committed state. A damaged
file is removed and rebuilt with a one-line warning on stderr; a cache that
cannot be opened or written at all is skipped with a warning. The cache never
changes what is listed, only whether a file is read.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import Sequence

ENV = "TFSHARDS_HASH_CACHE"  # a file path, or "none" for no cache
OFF = "none"
RACY_NS = 2_000_000_000  # FAT keeps mtime in 2 s steps; ext4, xfs, btrfs in ns
SCHEMA = 1  # PRAGMA user_version: another value means another layout: rebuilt
_FLUSH_ROWS = 20_000  # rows per write transaction: a concurrent list waits ~10 ms
_BUSY_MS = 30_000  # how long a write waits for another process's transaction
STAT_BYTES = 40  # per file: int64 st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns
_SEP = "/"  # joins a folder's file names: no name contains it
_TABLES = """
CREATE TABLE IF NOT EXISTS folders (
    path TEXT PRIMARY KEY, names TEXT NOT NULL, stats BLOB NOT NULL, sha256 BLOB NOT NULL
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
            db.execute("SELECT count(*) FROM (SELECT 1 FROM folders LIMIT 1)").fetchone()
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
    """SHA-256 digests of local files, one row per folder, valid while their stat is unchanged.

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
        self._pending: list[tuple[str, str, bytes, bytes]] = []
        self._pending_files = 0
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
        self._pending, self._pending_files = [], 0

    def lookup(self, folder: str, names: Sequence[str], stats: bytes) -> list[str | None]:
        """The remembered digest (hex) of each of ``names`` in ``folder`` (absolute), or None.

        ``stats`` holds :data:`STAT_BYTES` per name, taken now; a digest is
        returned only where the remembered stat is byte-equal.
        """
        row = self._row(folder)
        if row is None:
            return [None] * len(names)
        known_names, known_stats, digests = row
        hexes = digests.hex()
        if known_stats == stats and known_names == _SEP.join(names):
            self.hits += len(names)
            return [hexes[64 * i : 64 * i + 64] for i in range(len(names))]
        where = {name: i for i, name in enumerate(known_names.split(_SEP))} if known_names else {}
        out: list[str | None] = []
        for j, name in enumerate(names):
            i = where.get(name)
            same = i is not None and (
                known_stats[STAT_BYTES * i : STAT_BYTES * (i + 1)]
                == stats[STAT_BYTES * j : STAT_BYTES * (j + 1)]
            )
            out.append(hexes[64 * i : 64 * i + 64] if same and i is not None else None)
        self.hits += sum(digest is not None for digest in out)
        return out

    def _row(self, folder: str) -> tuple[str, bytes, bytes] | None:
        if self._db is None:
            return None
        try:
            row = self._db.execute(
                "SELECT names, stats, sha256 FROM folders WHERE path = ?", (folder,)
            ).fetchone()
        except sqlite3.Error as exc:
            self._fail(exc)
            return None
        if row is None:
            return None
        names, stats, digests = row
        n = len(names.split(_SEP)) if names else 0
        if len(stats) != STAT_BYTES * n or len(digests) != 32 * n:  # written by something else
            return None
        return names, stats, digests

    def store(self, folder: str, names: Sequence[str], stats: bytes, digests: bytes) -> None:
        """Remember ``folder``'s files: names, stats taken before hashing, 32-byte digests.

        Replaces what was remembered for the folder. Files changed within
        ``racy_ns`` of the listing's start are left out.
        """
        if self._db is None:
            return
        fields = memoryview(stats).cast("q")
        newest = self.started_ns - self.racy_ns
        if names and max(max(fields[3::5]), max(fields[4::5])) > newest:  # C-level max first
            keep = [i for i in range(len(names)) if max(fields[5 * i + 3 : 5 * i + 5]) <= newest]
            names = [names[i] for i in keep]
            stats = b"".join(stats[STAT_BYTES * i : STAT_BYTES * (i + 1)] for i in keep)
            digests = b"".join(digests[32 * i : 32 * i + 32] for i in keep)
        self._pending.append((folder, _SEP.join(names), stats, digests))
        self._pending_files += len(names)
        if self._pending_files >= _FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write what :meth:`store` collected, in one transaction."""
        if self._db is None or not self._pending:
            return
        pending, self._pending, self._pending_files = self._pending, [], 0
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT OR REPLACE INTO folders VALUES (?, ?, ?, ?)", pending)
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._fail(exc)

    def close(self) -> None:
        """Flush and close; the cache cannot be used afterwards."""
        self.flush()
        if self._db is not None:
            self._db.close()
            self._db = None
