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
per folder: its file names, their stats packed as int64, their digests and a
CRC-32 of all of it. A re-list stats a folder's files in one C call and, when
the packed stats and names equal the row's, takes every digest without a
per-file comparison in Python (on 200,000 files a per-file lookup cost 2-3
times the walk itself). Memory stays bounded by the largest folder; writes
commit in batches of :data:`_FLUSH_ROWS` files, so two lists running at once
take turns, and a killed process leaves the last committed state.

The file is opened, created and rebuilt by :mod:`tfshards.listing.cachefile`:
a file that is not marked as ours is refused and left as it is; ours, when
damaged, is rebuilt with one warning line; a cache that is locked or cannot
be written is skipped with one warning line.

A wrong digest is never handed out twice. A row whose CRC does not match
(its bytes damaged on disk, where SQLite keeps no checksum of its own) is not
used: its files are read again and the row replaced, with one warning line.
Damage SQLite reports while the cache is in use rebuilds it. A digest that was
wrong when stored (a file changed without any change to its stat) is caught by
``tfshards write``, which checks every file's bytes against the listing:
:func:`forget_wrong_digest` then drops the folder's row, so the next list reads
those files again.
The cache never changes what is listed, only whether a file is read.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import zlib
from array import array
from collections.abc import Sequence

from tfshards import cachedir
from tfshards.errors import InputError, StaleListingError
from tfshards.listing import cachefile

ENV = "TFSHARDS_HASH_CACHE"  # a file path, or "none" for no cache
OFF = "none"
RACY_NS = 2_000_000_000  # FAT keeps mtime in 2 s steps; ext4, xfs, btrfs in ns
_FLUSH_ROWS = 20_000  # rows per write transaction: a concurrent list waits ~10 ms
STAT_BYTES = 40  # per file: int64 st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns
_SEP = "/"  # joins a folder's file names: no name contains it
FolderRow = tuple[str, bytes, bytes]  # names joined by _SEP, packed stats, digests
_SELECT = "SELECT names, stats, sha256, crc FROM folders WHERE path = ?"


def default_path() -> str | None:
    """``$TFSHARDS_HASH_CACHE`` (``none``: no cache), else ``<cache dir>/listing-hashes.sqlite``.

    The cache dir is :func:`tfshards.cachedir.root` (where the loader keeps its shard
    copies).
    """
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in ("", OFF) else os.path.expanduser(value)
    return os.path.join(cachedir.root(), "listing-hashes.sqlite")


def row_crc(folder: str, names: str, stats: bytes, digests: bytes) -> int:
    """CRC-32 of a row's content, which SQLite does not check (12 ms for 200,000 files).

    Raises:
        UnicodeEncodeError: a name is not UTF-8 (the file system gave bytes).
    """
    crc = zlib.crc32(f"{folder}\0{names}\0".encode())
    return zlib.crc32(digests, zlib.crc32(stats, crc))


def _checked(folder: str, row: tuple[object, ...]) -> FolderRow | None:
    """The row if its types, sizes and CRC are the ones :meth:`HashCache.store` wrote."""
    names, stats, digests, crc = row
    if not (isinstance(names, str) and isinstance(stats, bytes) and isinstance(digests, bytes)):
        return None
    n = len(names.split(_SEP)) if names else 0
    if len(stats) != STAT_BYTES * n or len(digests) != 32 * n:
        return None
    if crc != row_crc(folder, names, stats, digests):
        return None
    return names, stats, digests


class HashCache:
    """SHA-256 digests of local files, one row per folder, valid while their stat is unchanged.

    Args:
        path: the SQLite file; its folder is created.
        racy_ns: files changed this close to the listing's start are not
            remembered (default :data:`RACY_NS`).

    Raises:
        InputError: ``path`` (or its ``-wal``, ``-shm`` or ``-journal``) holds
            a file tfshards did not make (:mod:`tfshards.listing.cachefile`).
    """

    def __init__(self, path: str, *, racy_ns: int | None = None) -> None:
        racy_ns = RACY_NS if racy_ns is None else racy_ns
        if racy_ns < 0:
            raise ValueError(f"racy_ns must be >= 0, got {racy_ns}")
        self.path = os.path.abspath(os.path.expanduser(path))
        self.racy_ns = racy_ns
        self.started_ns = time.time_ns()
        self.hits = 0
        self._pending: list[tuple[str, str, bytes, bytes, int]] = []
        self._pending_files = 0
        self._bad_row_seen = False
        self._db = cachefile.connect(self.path)

    def _fail(self, exc: OSError | sqlite3.Error) -> None:
        cachefile.warn(f"hash cache {self.path}: {exc}; listing the rest without it")
        if self._db is not None:
            self._db.close()
        self._db = None
        self._pending, self._pending_files = [], 0

    def _damaged(self, why: str) -> None:
        """Rebuild our cache found damaged while in use (one warning); what is pending stays."""
        if self._db is None:
            return
        cachefile.warn(f"hash cache {self.path}: damaged ({why}); rebuilding it")
        try:
            self._db = cachefile.rebuild(self._db, self.path)
        except (OSError, sqlite3.Error) as exc:
            self._fail(exc)

    def lookup(self, folder: str, names: Sequence[str], stats: bytes) -> list[str | None]:
        """The remembered digest (hex) of each of ``names`` in ``folder`` (absolute), or None.

        ``stats`` holds :data:`STAT_BYTES` per name, taken now; a digest is
        returned only where the remembered stat is byte-equal.
        """
        row = self._row(folder)
        if row is None:
            return [None] * len(names)
        known_names, known_stats, digests = row
        if known_stats == stats and known_names == _SEP.join(names):
            self.hits += len(names)
            return digests.hex(" ", 32).split(" ") if names else []  # type: ignore[return-value]
        hexes = digests.hex()
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

    def _row(self, folder: str) -> FolderRow | None:
        if self._db is None:
            return None
        try:
            row = self._db.execute(_SELECT, (folder,)).fetchone()
        except UnicodeEncodeError:  # a folder name that is not UTF-8: never stored
            return None
        except sqlite3.OperationalError as exc:
            self._fail(exc)
            return None
        except sqlite3.DatabaseError as exc:  # malformed where quick_check did not look
            self._damaged(str(exc))
            return None
        if row is None:
            return None
        checked = _checked(folder, row)
        if checked is None and not self._bad_row_seen:  # its files are read and it is replaced
            self._bad_row_seen = True
            cachefile.warn(
                f"hash cache {self.path}: the entry of {folder} fails its CRC "
                "(damaged); reading its files again"
            )
        return checked

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
        joined = _SEP.join(names)
        try:
            crc = row_crc(folder, joined, stats, digests)
        except UnicodeEncodeError:  # SQLite stores text as UTF-8: such a folder is read each time
            return
        self._pending.append((folder, joined, stats, digests, crc))
        self._pending_files += len(names)
        if self._pending_files >= _FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write what :meth:`store` collected, in one transaction."""
        if self._db is None or not self._pending:
            return
        pending, self._pending, self._pending_files = self._pending, [], 0
        for attempt in range(2):
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR REPLACE INTO folders VALUES (?, ?, ?, ?, ?)", pending
                )
                self._db.execute("COMMIT")
                return
            except sqlite3.OperationalError as exc:  # locked, read-only, disk full
                self._fail(exc)
                return
            except sqlite3.DatabaseError as exc:  # malformed: rebuilt, then written once more
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                if attempt:
                    self._fail(exc)
                    return
                self._damaged(str(exc))
                if self._db is None:
                    return

    def close(self) -> None:
        """Flush and close; the cache cannot be used afterwards."""
        self.flush()
        if self._db is not None:
            self._db.close()
            self._db = None


def forget_wrong_digest(cache: str | None, path: str, listed: bytes) -> bool:
    """Drop the cache's entry that gave ``listed`` as the SHA-256 of ``path``, if it did.

    ``tfshards write`` calls this when a local file's bytes do not have the
    digest the listing gives. True means the cache remembers ``listed`` for
    this file under the stat the file has now: the listing took that digest
    from the cache, and the file, as far as its stat tells, has not changed
    since. The remembered digest is wrong (damaged, or the file changed with
    no trace in its stat), so the folder's entry is dropped and the next list
    reads its files again. Only our marked cache is written; a missing,
    foreign, locked or damaged one answers False.

    Args:
        cache: the cache file (:func:`default_path`), or None.
        path: the file, local.
        listed: the 32-byte digest its listing gives.
    """
    if cache is None:
        return False
    folder, name = os.path.split(os.path.abspath(path))
    try:
        if not cachefile.inspect(cache):
            return False
        st = os.stat(path)
    except (OSError, InputError):
        return False
    now = array("q", (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)).tobytes()
    try:
        db = sqlite3.connect(cache, timeout=cachefile.BUSY_MS / 1000, isolation_level=None)
        try:
            row = db.execute(_SELECT, (folder,)).fetchone()
            checked = _checked(folder, row) if row is not None else None
            if checked is None:
                return False
            names, stats, digests = checked
            at = {n: i for i, n in enumerate(names.split(_SEP))}.get(name)
            if at is None or stats[STAT_BYTES * at : STAT_BYTES * (at + 1)] != now:
                return False
            if digests[32 * at : 32 * at + 32] != listed:
                return False
            db.execute("DELETE FROM folders WHERE path = ?", (folder,))
            return True
        finally:
            db.close()
    except (UnicodeEncodeError, sqlite3.Error):
        return False


def stale_listing(rel: str, path: str, listed: bytes, found: str) -> StaleListingError | None:
    """The error for a local file whose listed SHA-256 the hash cache got wrong, or None.

    ``tfshards write`` asks when the bytes of ``path`` (listed as ``rel``)
    hash to ``found`` (hex), not to ``listed``. When the per-user cache
    (:func:`default_path`) gave the listing that digest for the stat the file
    still has, the file is fine and the listing is not: the entry is dropped
    (:func:`forget_wrong_digest`) and the error, never skipped, says to list again.
    """
    cache = default_path()
    if not forget_wrong_digest(cache, path, listed):
        return None
    return StaleListingError(
        f"listed sha256 {listed.hex()} came from the hash cache {cache}, but the file, "
        f"unchanged since (same stat), has sha256 {found}: that entry was wrong and is "
        "dropped; re-run `tfshards list`",
        path=rel,
        cache=cache,
    )
