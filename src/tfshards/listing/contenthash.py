"""Content tokens of listed files: their SHA-256, or the content hash their storage keeps.

A token names a file's bytes, never when or where it was written: the version
directory is named after the tokens, so the same bytes give the same name on
every clone and machine. Local files (and storage that keeps no content hash,
like ``memory://``) are read and hashed, in threads: the compiled
:func:`tfshards.format._native.hash_files` works through a folder's files without the
GIL, and ``hashlib`` releases it on large buffers. Object stores hand one out
with the listing: S3's ETag, GCS's md5Hash or crc32c.

A token is ``"<kind>:<value>"``. The writer checks ``sha256`` tokens against
the SHA-256 it computes per record anyway, and ``md5`` and plain (single-part
upload) ``etag`` tokens against an MD5 of the bytes it fetched, so a file
rewritten between ``list`` and ``write`` is caught even at the same size.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import errno
import hashlib
import os
import re
import stat
from array import array
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from tfshards import storage
from tfshards.errors import InputError
from tfshards.format import native
from tfshards.listing.hashcache import HashCache

SHA256 = "sha256"
_SHA256 = SHA256 + ":"
# Content hashes fsspec backends report, best first, and the token kind of each.
_STORAGE_KEYS = (
    ("ETag", "etag"),
    ("etag", "etag"),
    ("md5Hash", "md5"),
    ("md5", "md5"),
    ("crc32c", "crc32c"),
    ("checksum", "checksum"),
)
_BATCH = 1024  # files per task: enough to amortize a thread hand-off (~50 us)
_CHUNK = 1 << 20  # read size: one read for most images, bounded memory for any file
_HEX_MD5 = re.compile(r"^[0-9a-f]{32}$")
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
SizedPath = tuple[str, int]  # (path relative to the root, size found when listed)


def _pool(threads: int) -> Any:
    """A thread pool; imported here, as a re-list with a warm cache starts none (~20 ms)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max(1, threads))


def storage_token(info: Mapping[str, Any]) -> str:
    """The content token an fsspec ``info`` dict carries (``"etag:..."``), or ``""``."""
    for key, kind in _STORAGE_KEYS:
        value = info.get(key)
        if value is not None and value != "" and not isinstance(value, datetime.datetime):
            return kind + ":" + str(value).strip('"')  # S3 quotes its ETags
    return ""


def sha256_token(digest: bytes) -> str:
    """``"sha256:<hex>"`` for a raw 32-byte digest."""
    return f"{SHA256}:{digest.hex()}"


def token_problem(token: str) -> str | None:
    """What is wrong with a listed content token, or None: a ``sha256`` one holds 64
    lowercase hex digits (the writer checks each file against them); others are opaque."""
    kind, _, value = token.partition(":")
    if kind == SHA256 and not _HEX_SHA256.match(value):
        return f"expected 'token' {SHA256}: and 64 lowercase hex digits, found {token[:90]!r}"
    return None


def expected_sha256(token: str) -> bytes | None:
    """The raw digest a ``sha256`` token promises, or None for other tokens.

    Raises:
        InputError: a ``sha256`` token without 32 bytes of hex (a listing in
            memory, built by hand: stored ones are checked by :func:`token_problem`).
    """
    kind, _, value = token.partition(":")
    if kind != SHA256:
        return None
    try:
        digest = bytes.fromhex(value)
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise InputError(f"listed token: {token_problem(token) or 'expected 32 bytes'}")
    return digest


def expected_md5(token: str) -> str | None:
    """The MD5 (hex) an ``md5`` token, or a single-part upload's ETag, promises; else None.

    A multipart ETag (``<hex>-<parts>``) depends on the part size, not only on
    the bytes, so it cannot be checked from the bytes alone.
    """
    kind, _, value = token.partition(":")
    if kind == "etag" and _HEX_MD5.match(value):
        return value
    if kind == "md5":
        if _HEX_MD5.match(value):
            return value
        try:  # GCS: base64 of the raw digest
            return base64.b64decode(value, validate=True).hex()
        except (ValueError, binascii.Error):
            return None
    return None


Batch = tuple[str, str, list[str]]  # (folder to open, relative folder with "/", file names)


def hash_local(batches: Sequence[Batch], threads: int) -> Iterator[tuple[str, int, str]]:
    """``(relative path, size, "sha256:...")`` of every file named in ``batches``.

    Folders are hashed in ``threads`` threads, results come in batch order.
    The size is the one the hashed bytes have (a file may change while it is
    listed: the token and the size then describe the same bytes).

    Raises:
        InputError: a file cannot be read or is no longer a regular file.
    """
    chunks = [
        (folder, rel_dir, names[at : at + _BATCH])
        for folder, rel_dir, names in batches
        for at in range(0, len(names), _BATCH)
    ]

    def run(chunk: Batch) -> list[tuple[int, bytes]]:
        return _hash_local(chunk[0], chunk[2])

    pool = _pool(threads)
    try:
        done = pool.map(run, chunks) if threads > 1 and len(chunks) > 1 else map(run, chunks)
        for (folder, rel_dir, names), hashed in zip(chunks, done, strict=True):
            for name, (size, digest) in zip(names, hashed, strict=True):
                if size < 0:
                    raise unreadable_file(os.path.join(folder, name), size)
                yield rel_dir + name, size, f"{SHA256}:{digest.hex()}"
    finally:  # on an error, do not hash the rest of the tree first
        pool.shutdown(cancel_futures=True)


def hash_local_cached(
    batches: Sequence[Batch], threads: int, cache: HashCache
) -> Iterator[tuple[str, int, str]]:
    """:func:`hash_local`, reading only the files whose stat ``cache`` does not know.

    Each folder's files are stat'ed in one call (in ``threads`` threads, while
    earlier folders are looked up); the files the cache knows with that stat
    get its digest, the others are hashed, then the folder is remembered with
    the stats taken before hashing. Folders must be absolute paths.
    """
    todo: list[Batch] = []
    pending: list[tuple[list[str], bytes, list[str | None]]] = []
    pool = _pool(threads)
    try:
        stats = pool.map(lambda batch: stat_local(batch[0], batch[2]), batches)
        for (folder, rel_dir, names), found in zip(batches, stats, strict=True):
            check_stats(folder, names, found)
            known = cache.lookup(folder, names, found)
            sizes = memoryview(found).cast("q")[2::5]
            if None not in known:
                hits = cast(list[str], known)
                yield from [
                    (rel_dir + name, size, _SHA256 + digest)
                    for name, size, digest in zip(names, sizes, hits, strict=True)
                ]
                continue
            missing = []
            for name, size, digest in zip(names, sizes, known, strict=True):
                if digest is None:
                    missing.append(name)
                else:
                    yield rel_dir + name, size, _SHA256 + digest
            todo.append((folder, rel_dir, missing))
            pending.append((names, found, known))
    finally:
        pool.shutdown(cancel_futures=True)
    results = hash_local(todo, threads)
    for (folder, _, missing), (names, found, known) in zip(todo, pending, strict=True):
        hashed = []
        for _ in missing:
            row = next(results)
            hashed.append(row[2][len(_SHA256) :])
            yield row
        fill = iter(hashed)
        digests = bytes.fromhex("".join(h if h is not None else next(fill) for h in known))
        cache.store(folder, names, found, digests)


def hash_files(
    fs: Any,
    base: str,
    rows: Sequence[SizedPath],
    root: str,
    threads: int,
    cache: HashCache | None = None,
) -> list[tuple[int, str]]:
    """``(size, "sha256:...")`` per ``(relative path, size)`` row, in order, reading every file.

    Local files whose stat ``cache`` knows are not read.

    Raises:
        InputError: a file cannot be read or is no longer a regular file.
    """
    if storage.is_local(fs):
        by_folder: dict[str, list[str]] = defaultdict(list)
        for rel, _ in rows:
            folder, _, name = rel.rpartition("/")
            by_folder[folder].append(name)
        batches = [
            (storage.join(base, folder), f"{folder}/" if folder else "", names)
            for folder, names in by_folder.items()
        ]
        hashed = (
            hash_local(batches, threads)
            if cache is None
            else (hash_local_cached(batches, threads, cache))
        )
        found = {rel: (size, token) for rel, size, token in hashed}
        return [found[rel] for rel, _ in rows]

    def run(row: SizedPath) -> tuple[int, bytes]:
        return _hash_remote(fs, storage.join(base, row[0]))

    out = []
    pool = _pool(threads)
    try:
        for (rel, _), (size, digest) in zip(rows, pool.map(run, rows), strict=True):
            if size < 0:
                raise unreadable_file(storage.join(root, rel), size)
            out.append((size, sha256_token(digest)))
    finally:
        pool.shutdown(cancel_futures=True)
    return out


def unreadable_file(where: str, code: int) -> InputError:
    """``where`` could not be read for its hash (``code``: minus its errno)."""
    if -code == errno.EINVAL:
        why = "expected a regular file, found a folder or special file"
    elif -code == errno.ENOENT:
        why = "it was removed while listing (No such file or directory, ENOENT)"
    else:
        why = f"{os.strerror(-code)}, {errno.errorcode.get(-code, 'errno ' + str(-code))}"
    return InputError(f"{where}: cannot read while listing: {why}", path=where)


def _hash_local(folder: str, names: Sequence[str]) -> list[tuple[int, bytes]]:
    """``(size or -errno, raw digest)`` of each file ``names`` in ``folder``."""
    c = native.NATIVE
    if c is not None:
        digests, sizes = c.hash_files(os.fsencode(folder), _fsencoded(c, names))
        sized = memoryview(sizes).cast("q")
        return [(sized[i], digests[32 * i : 32 * i + 32]) for i in range(len(names))]
    return [_hash_path(os.path.join(folder, name)) for name in names]


def _fsencoded(c: Any, names: Sequence[str]) -> list[bytes]:
    """``os.fsencode`` of each name, in one C call where the module has it."""
    encode = getattr(c, "fsencode_all", None)
    if encode is not None and isinstance(names, list):
        return cast(list[bytes], encode(names))
    return [os.fsencode(n) for n in names]


def stat_local(folder: str, names: Sequence[str]) -> bytes:
    """Five int64 per name: ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``, links followed.

    The size is ``-errno`` where a name cannot be stat'ed (``-EINVAL``: not a
    regular file); :func:`check_stats` turns that into an error.
    """
    c = native.NATIVE
    if c is not None:
        return c.stat_files(os.fsencode(folder), _fsencoded(c, names))
    out = array("q")
    for name in names:
        try:
            st = os.stat(os.path.join(folder, name))
        except OSError as exc:
            out.extend((0, 0, -(exc.errno or errno.EIO), 0, 0))
            continue
        if not stat.S_ISREG(st.st_mode):
            out.extend((0, 0, -errno.EINVAL, 0, 0))
            continue
        out.extend((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return out.tobytes()


def check_stats(folder: str, names: Sequence[str], stats: bytes) -> None:
    """Raise :class:`InputError` for the first name :func:`stat_local` could not stat."""
    sizes = memoryview(stats).cast("q")[2::5]
    if min(sizes, default=0) < 0:
        i = next(i for i, size in enumerate(sizes) if size < 0)
        raise unreadable_file(os.path.join(folder, names[i]), sizes[i])


def _hash_path(path: str) -> tuple[int, bytes]:
    """The pure-Python :func:`tfshards.format._native.hash_files` for one file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except OSError as exc:
        return -(exc.errno or errno.EIO), b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return -errno.EINVAL, b""
        digest, size = hashlib.sha256(), 0
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
            size += len(chunk)
        return size, digest.digest()
    except OSError as exc:
        return -(exc.errno or errno.EIO), b""
    finally:
        os.close(fd)


def _hash_remote(fs: Any, path: str) -> tuple[int, bytes]:
    try:
        data = storage.read_bytes(fs, path)
    except OSError as exc:
        return -(exc.errno or errno.EIO), b""
    return len(data), hashlib.sha256(data).digest()
