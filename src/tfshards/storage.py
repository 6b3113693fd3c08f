"""Reach any storage through fsspec: open a URL, join paths, publish files atomically.

Data locations are only ever touched through an ``fsspec`` filesystem that is
passed in or opened from a URL with :func:`open_url`. Local disk gets two fast
paths, both measured: plain ``os`` calls for small reads (``LocalFileSystem``
adds ~10 us per file) and ``os.replace`` of a temp file in the same directory
for atomic publication (fsspec's local transaction stages its temp file in the
system temp dir, so its final move is not atomic across filesystems).
"""

from __future__ import annotations

import os
import posixpath
import uuid
from collections.abc import Iterable
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from tfshards.errors import ConfigError

Chunk = bytes | bytearray | memoryview


def open_url(url: str, **storage_options: Any) -> tuple[Any, str]:
    """Return ``(filesystem, path)`` for a local path or any fsspec URL.

    Credentials come from ``storage_options`` or the environment/fsspec config;
    they are never part of the returned path.
    """
    if not url:
        raise ConfigError("storage URL is empty")
    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{url}: cannot open storage: {exc}") from exc
    return fs, path


def is_local(fs: Any) -> bool:
    """True when ``fs`` is local disk (rename is atomic, os calls are safe)."""
    return isinstance(fs, LocalFileSystem)


def protocol(fs: Any) -> str:
    """The filesystem's main protocol name, e.g. ``"file"``, ``"s3"``, ``"memory"``."""
    proto = fs.protocol
    return str(proto[0] if isinstance(proto, (tuple, list)) else proto)


def join(base: str, *parts: str) -> str:
    """Join path parts with ``/`` (fsspec paths are posix on every backend)."""
    return posixpath.join(base.rstrip("/") or "/", *parts)


def unstrip(fs: Any, path: str) -> str:
    """Turn an fs-internal path back into a URL a user (or another process) can open."""
    if is_local(fs):
        return path
    return str(fs.unstrip_protocol(path))


def read_bytes(fs: Any, path: str) -> bytes:
    """Read a whole file; on local disk with plain ``os`` calls (the fast path)."""
    if is_local(fs):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            data = os.read(fd, size)
            if len(data) < size:  # os.read may return short on some filesystems
                parts = [data]
                while chunk := os.read(fd, size):
                    parts.append(chunk)
                data = b"".join(parts)
            return data
        finally:
            os.close(fd)
    return bytes(fs.cat_file(path))


def write_atomic(fs: Any, path: str, chunks: Iterable[Chunk]) -> int:
    """Publish ``chunks`` as ``path`` so that readers see all of it or nothing.

    Local disk: write a temp file beside ``path`` and ``os.replace`` it into
    place. Object stores (and ``memory://``): one upload, which becomes visible
    only once complete. Returns the number of bytes written.
    """
    if is_local(fs):
        directory = os.path.dirname(path)
        os.makedirs(directory or ".", exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:12]}")
        total = 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                total = _write_all(fd, chunks)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return total
    data = b"".join(chunks)
    parent = posixpath.dirname(path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    fs.pipe_file(path, data)
    return len(data)


_IOV_MAX = 1024  # Linux limit on buffers per writev call


def _write_all(fd: int, chunks: Iterable[Chunk]) -> int:
    """Write every chunk with batched ``os.writev`` (no joining, so no copies)."""
    total = 0
    batch: list[Chunk] = []
    for chunk in chunks:
        batch.append(chunk)
        if len(batch) >= _IOV_MAX:
            total += _writev(fd, batch)
            batch = []
    if batch:
        total += _writev(fd, batch)
    return total


def _writev(fd: int, batch: list[Chunk]) -> int:
    expected = sum(len(c) for c in batch)
    written = os.writev(fd, batch)
    if written < expected:  # short write: finish the rest the slow way
        rest = memoryview(b"".join(batch))[written:]
        while rest:
            n = os.write(fd, rest)
            rest = rest[n:]
    return expected


def remove_quietly(fs: Any, path: str) -> None:
    """Delete ``path`` if it exists; used for temp files left by a killed writer."""
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass
