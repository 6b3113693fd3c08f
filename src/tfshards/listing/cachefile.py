"""The hash cache's SQLite file: known by its mark, created whole, rebuilt in place when damaged.

Only a file this module made is ever written, rebuilt or replaced: it carries
:data:`APPLICATION_ID` in its header (``PRAGMA application_id``, bytes 68-71).
The header is read with a plain ``open`` before SQLite touches the file, so a
path that holds something else (a text file, another application's database)
is refused with one :class:`~tfshards.errors.InputError` line and left
byte-identical: SQLite itself would switch it to WAL, rewrite its header and
roll a stray journal into it. SQLite's side files (``PATH-wal``, ``PATH-shm``,
``PATH-journal``) are checked the same way, since opening ``PATH`` would read,
rewrite and delete them: beside a missing cache, or not in SQLite's own
format, or a journal (the cache never uses one), they are refused.

A new cache is built under a temporary name and hard-linked into place, so
another process never sees one without its mark. A marked cache that is
damaged (``PRAGMA quick_check`` fails, or SQLite reports it malformed) or has
another layout is rebuilt with one warning line, in place through SQLite's
backup API, which takes the write lock like any writer, so lists that have it
open go on safely; a cache too damaged for SQLite to open is replaced by
rename. A cache that is locked or read-only is skipped with one warning line.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import struct
import sys
import uuid
from urllib.parse import quote

from tfshards.errors import InputError

APPLICATION_ID = 0x74667368  # "tfsh": PRAGMA application_id, our mark
SCHEMA = 2  # PRAGMA user_version; 2: rows carry a CRC-32 of their content
# A flush of 20,000 files holds the write lock ~10 ms; a lock held 100x that
# long is a process holding it on purpose or hung: list without the cache.
BUSY_MS = 1_000
TABLES = (
    "CREATE TABLE folders (path TEXT PRIMARY KEY, names TEXT NOT NULL, stats BLOB NOT NULL, "
    "sha256 BLOB NOT NULL, crc INTEGER NOT NULL) WITHOUT ROWID"
)
# What tfshards made before caches were marked (user_version 1, application_id 0).
_LEGACY_TABLES = (
    "CREATE TABLE folders ( path TEXT PRIMARY KEY, names TEXT NOT NULL, stats BLOB NOT NULL, "
    "sha256 BLOB NOT NULL ) WITHOUT ROWID"
)
_MAGIC = b"SQLite format 3\x00"
_WAL_MAGICS = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
_SHM_HEADS = (struct.pack("=I", 3007000), bytes(4))  # wal-index version, or not yet written
_SIDE_FILES = ("-wal", "-shm", "-journal")
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def warn(message: str) -> None:
    """One ``tfshards: warning:`` line on stderr."""
    print(f"tfshards: warning: {message}", file=sys.stderr, flush=True)


def connect(path: str) -> sqlite3.Connection | None:
    """An open connection to the cache at ``path``, created if missing; None when unusable.

    Raises:
        InputError: ``path`` or one of its side files holds something tfshards
            did not make; nothing was changed.
    """
    for _ in range(3):  # another list may create it between our looks
        try:
            exists = inspect(path)
        except OSError as exc:
            warn(f"hash cache {path}: cannot open ({exc}); listing without it")
            return None
        if exists:
            return _open(path)
        try:
            _create(path)
        except (OSError, sqlite3.Error) as exc:
            warn(f"hash cache {path}: cannot create ({exc}); listing without it")
            return None
    warn(f"hash cache {path}: replaced while being opened; listing without it")
    return None


def inspect(path: str) -> bool:
    """Whether there is a cache at ``path``: True when it is ours (by its mark), False if none.

    Reads only: the header with ``open``, and another database's table names
    through an immutable read-only connection, which writes no file.

    Raises:
        InputError: ``path`` or a side file is not the cache's.
        OSError: ``path`` cannot be read.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        stray = [path + suffix for suffix in _SIDE_FILES if os.path.lexists(path + suffix)]
        if stray and not os.path.lexists(path):
            raise _stray(stray[0], f"a file beside a missing hash cache {path}") from None
        return bool(stray) and inspect(path)
    if not stat.S_ISREG(st.st_mode):
        raise _foreign(path, "a folder" if stat.S_ISDIR(st.st_mode) else "a special file")
    with open(path, "rb") as f:
        head = f.read(100)
    if len(head) < 100 or not head.startswith(_MAGIC):
        raise _foreign(path, _describe(head))
    app_id = int.from_bytes(head[68:72], "big")
    if app_id != APPLICATION_ID and not (app_id == 0 and _tables(path) == [_LEGACY_TABLES]):
        found = ", ".join(_table_names(path)) or "none"
        raise _foreign(
            path,
            f"another application's SQLite database (application_id {app_id}, tables: {found})",
        )
    _check_side_files(path)
    return True


def _check_side_files(path: str) -> None:
    for suffix, heads in (("-wal", _WAL_MAGICS), ("-shm", _SHM_HEADS), ("-journal", ())):
        try:
            with open(path + suffix, "rb") as f:
                head = f.read(4)
        except FileNotFoundError:
            continue
        if suffix == "-journal" or (head and head not in heads):
            what = "SQLite's own" if suffix != "-journal" else "none: the cache keeps no journal"
            raise _stray(path + suffix, f"a file that is not SQLite's (expected {what})")


def _describe(head: bytes) -> str:
    if not head:
        return "an empty file"
    if head.startswith(_MAGIC):
        return f"a truncated SQLite file ({len(head)} bytes)"
    try:
        text = b"\x00" not in head and bool(head.decode())
    except UnicodeDecodeError as exc:
        text = exc.start >= len(head) - 3  # a character cut at the 100th byte
    return "a text file" if text else f"a file that is not SQLite (starts with {head[:8]!r})"


def _foreign(path: str, found: str) -> InputError:
    return InputError(
        f"{path}: expected a tfshards hash cache (SQLite application_id {APPLICATION_ID:#010x}), "
        f"found {found}; left as it is: remove it or choose another --hash-cache",
        path=path,
    )


def _stray(path: str, found: str) -> InputError:
    return InputError(
        f"{path}: expected no file there or SQLite's side file of a tfshards hash cache, "
        f"found {found}; left as it is: remove it or choose another --hash-cache",
        path=path,
    )


def _tables(path: str) -> list[str]:
    """The normalized ``CREATE`` statements of ``path``, read without writing anything."""
    uri = f"file:{quote(path)}?mode=ro&immutable=1"
    try:
        db = sqlite3.connect(uri, uri=True)
        try:
            rows = db.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []
    return [" ".join(str(sql).split()) for (sql,) in rows]


def _table_names(path: str) -> list[str]:
    return [sql.split()[2] for sql in _tables(path) if sql.startswith("CREATE TABLE ")]


def _init(db: sqlite3.Connection, page_size: int = 4096) -> None:
    """Lay out an empty database as the cache: mark, table, schema version."""
    db.execute(f"PRAGMA page_size={int(page_size)}")
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    db.execute(TABLES)
    db.execute(f"PRAGMA user_version={SCHEMA}")


def _build(folder: str) -> str:
    """A new, complete cache file in ``folder`` under a temporary name; its path."""
    temp = os.path.join(folder, f".tfshards-hashcache-{uuid.uuid4().hex}.tmp")
    os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # never another's file
    try:
        db = sqlite3.connect(temp, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=MEMORY")  # no side file under the temporary name
            _init(db)
            db.execute("PRAGMA journal_mode=WAL")
        finally:
            db.close()  # checkpoints and removes the temporary name's -wal and -shm
        if os.path.lexists(temp + "-wal"):
            raise sqlite3.OperationalError("new cache not checkpointed on close")
    except BaseException:
        for suffix in ("", "-wal", "-shm"):
            if os.path.lexists(temp + suffix):
                os.unlink(temp + suffix)
        raise
    return temp


def _create(path: str) -> None:
    """Build a cache and link it to ``path``; if another process got there first, keep theirs."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temp = _build(folder)
    try:
        os.link(temp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(temp)


def _open(path: str) -> sqlite3.Connection | None:
    """Open our cache; rebuild it (one warning) when it is damaged or laid out otherwise."""
    try:
        db = sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None)
    except sqlite3.Error as exc:
        warn(f"hash cache {path}: cannot open ({exc}); listing without it")
        return None
    try:
        problem = _problem(db)
        if problem is not None:
            warn(f"hash cache {path}: {problem}; rebuilding it")
            return rebuild(db, path)
        return db
    except (OSError, sqlite3.Error) as exc:  # locked, read-only, disk full
        db.close()
        warn(f"hash cache {path}: unusable ({exc}); listing without it")
        return None


def _problem(db: sqlite3.Connection) -> str | None:
    """Why our cache must be rebuilt, or None; switches it back to WAL if someone changed that."""
    try:
        check = db.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            return f"damaged ({str(check[0][0]).splitlines()[-1]})"
        version = db.execute("PRAGMA user_version").fetchone()[0]
        sql = db.execute("SELECT sql FROM sqlite_master").fetchall()
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as exc:  # malformed, not a database
        return f"damaged ({exc})"
    if version != SCHEMA or [" ".join(str(s).split()) for (s,) in sql] != [TABLES]:
        return f"made by another tfshards version (schema {version}, expected {SCHEMA})"
    if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        db.execute("PRAGMA journal_mode=WAL")
    return None


def rebuild(db: sqlite3.Connection, path: str) -> sqlite3.Connection:
    """Empty our cache in place (SQLite's backup API, one transaction); ``db`` stays open.

    A file too damaged for SQLite to write is replaced by rename instead, and
    a new connection returned.

    Raises:
        sqlite3.OperationalError: the cache is locked (after :data:`BUSY_MS`) or read-only.
        OSError: the file cannot be replaced.
    """
    try:  # the backup into a WAL file needs the same page size
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.DatabaseError:
        page_size = 4096
    fresh = sqlite3.connect(":memory:", isolation_level=None)
    try:
        _init(fresh, page_size)

        def give_up_when_locked(status: int, remaining: int, total: int) -> None:
            if status in (_SQLITE_BUSY, _SQLITE_LOCKED):  # else the copy retries forever
                raise sqlite3.OperationalError("database is locked")

        fresh.backup(db, progress=give_up_when_locked)
        db.execute("PRAGMA journal_mode=WAL")
        return db
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError:
        db.close()
        return _replace(path)
    finally:
        fresh.close()


def _replace(path: str) -> sqlite3.Connection:
    """Put a new cache in place of ours by rename; its side files, ours too, go first."""
    temp = _build(os.path.dirname(path))
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)
    os.replace(temp, path)
    return sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None)
