"""Content tokens of listed files: their SHA-256, or the content hash their storage keeps.

A token names a file's bytes, never when or where it was written: the version
directory is named after the tokens, so the same bytes give the same name on
every clone and machine. Local files (and storage that keeps no content hash,
like ``memory://``) are read and hashed, in threads: the compiled
:func:`tfshards._native.hash_files` works through a folder's files without the
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
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tfshards import native, storage
from tfshards.errors import InputError
from tfshards.listing.hashcache import HashCache, Stat

SHA256 = "sha256"
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
Row = tuple[str, int]  # (path relative to the root, size found when listed)


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


def expected_sha256(token: str) -> bytes | None:
    """The raw digest a ``sha256`` token promises, or None for other tokens."""
    kind, _, value = token.partition(":")
    return bytes.fromhex(value) if kind == SHA256 else None


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


def hash_local(
    batches: Sequence[Batch],
    threads: int,
    cache: HashCache | None = None,
    stats: Sequence[Sequence[Stat]] | None = None,
) -> Iterator[tuple[str, int, str]]:
    """``(relative path, size, "sha256:...")`` of every file named in ``batches``.

    Folders are hashed in ``threads`` threads, results come in batch order.
    The size is the one the hashed bytes have (a file may change while it is
    listed: the token and the size then describe the same bytes). With a
    ``cache``, each digest is remembered with the file's stat in ``stats``
    (one per name, taken before hashing).

    Raises:
        InputError: a file cannot be read or is no longer a regular file.
    """
    chunks = [
        (folder, rel_dir, names[at : at + _BATCH], b, at)
        for b, (folder, rel_dir, names) in enumerate(batches)
        for at in range(0, len(names), _BATCH)
    ]

    def run(chunk: tuple[str, str, list[str], int, int]) -> list[tuple[int, bytes]]:
        return _hash_local(chunk[0], chunk[2])

    pool = ThreadPoolExecutor(max(1, threads))
    try:
        done = pool.map(run, chunks) if threads > 1 and len(chunks) > 1 else map(run, chunks)
        for (folder, rel_dir, names, b, at), hashed in zip(chunks, done, strict=True):
            for i, (name, (size, digest)) in enumerate(zip(names, hashed, strict=True), at):
                if size < 0:
                    raise _unreadable(os.path.join(folder, name), size)
                if cache is not None and stats is not None:
                    cache.add(folder, name, stats[b][i], digest)
                yield rel_dir + name, size, f"{SHA256}:{digest.hex()}"
    finally:  # on an error, do not hash the rest of the tree first
        pool.shutdown(cancel_futures=True)


def hash_files(
    fs: Any, base: str, rows: Sequence[Row], root: str, threads: int
) -> list[tuple[int, str]]:
    """``(size, "sha256:...")`` per ``(relative path, size)`` row, in order, reading every file.

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
        found = {rel: (size, token) for rel, size, token in hash_local(batches, threads)}
        return [found[rel] for rel, _ in rows]

    def run(row: Row) -> tuple[int, bytes]:
        return _hash_remote(fs, storage.join(base, row[0]))

    out = []
    pool = ThreadPoolExecutor(max(1, threads))
    try:
        for (rel, _), (size, digest) in zip(rows, pool.map(run, rows), strict=True):
            if size < 0:
                raise _unreadable(storage.join(root, rel), size)
            out.append((size, sha256_token(digest)))
    finally:
        pool.shutdown(cancel_futures=True)
    return out


def _unreadable(where: str, code: int) -> InputError:
    found = "a folder or special file" if -code == errno.EINVAL else os.strerror(-code)
    return InputError(
        f"{where}: cannot read while listing: expected a regular file, found {found}", path=where
    )


def _hash_local(folder: str, names: Sequence[str]) -> list[tuple[int, bytes]]:
    """``(size or -errno, raw digest)`` of each file ``names`` in ``folder``."""
    c = native.NATIVE
    if c is not None:
        digests, sizes = c.hash_files(os.fsencode(folder), [os.fsencode(n) for n in names])
        sized = memoryview(sizes).cast("q")
        return [(sized[i], digests[32 * i : 32 * i + 32]) for i in range(len(names))]
    return [_hash_path(os.path.join(folder, name)) for name in names]


def _hash_path(path: str) -> tuple[int, bytes]:
    """The pure-Python :func:`tfshards._native.hash_files` for one file."""
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
