"""Reach any storage through fsspec: open a URL, join and resolve paths, read files.

Data locations are only ever touched through an ``fsspec`` filesystem that is
passed in or opened from a URL with :func:`open_url`. Local disk gets a fast
path for small reads: plain ``os`` calls (``LocalFileSystem`` adds ~10 us per
file). Atomic publication lives in :mod:`tfshards.atomicfile`.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath
import stat
from typing import Any

from tfshards.errors import ConfigError, ShardError, StorageError

Chunk = bytes | bytearray | memoryview


def open_url(url: str, **storage_options: Any) -> tuple[Any, str]:
    """Return ``(filesystem, path)`` for a local path or any fsspec URL.

    Credentials come from ``storage_options`` or the environment/fsspec config;
    they are never part of the returned path.
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise ConfigError(f"expected a path or URL, got {type(url).__name__} {url!r:.60}")
    if not url:
        raise ConfigError("storage URL is empty")
    if url.startswith("/") and not storage_options:
        return _absolute_local(url)
    reject_credentials(url)
    return _url_to_fs(url, **storage_options)


@functools.lru_cache(maxsize=256)
def _absolute_local(path: str) -> tuple[Any, str]:
    """An absolute local path's answer, the same every time: a write of 16 small shards
    asked it ~100 times, ~80 us each in fsspec's URL parsing."""
    return _url_to_fs(path)


def _url_to_fs(url: str, **storage_options: Any) -> tuple[Any, str]:
    import fsspec  # on first use: ~0.1 s that `tfshards --help` need not pay

    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{url}: cannot open storage: {exc}") from exc
    return fs, path


def reject_credentials(url: str, option: str = "") -> None:
    """Refuse ``scheme://user:password@...`` (of ``option``, if named), never repeating it.

    A password inside a URL would end up in shell history, logs, meta.json,
    the manifest and DVC's params; every URL a command takes passes here.
    """
    scheme, sep, rest = url.partition("://")
    if sep and ":" in rest.split("/", 1)[0].rpartition("@")[0]:
        where = f"{option}: " if option else ""
        raise ConfigError(
            f"{where}{scheme}://...: URL contains a password; expected credentials from "
            "the environment or fsspec config, found them in the URL"
        )


# Where the exceptions of remote storage clients come from: they are the
# user's environment (endpoint down, no credentials), not bugs in tfshards.
_BACKEND_MODULES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "google.auth")


def backend_error(exc: BaseException) -> StorageError | None:
    """The storage client's exception inside ``exc`` (or its causes) as one line, or None."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes, not a cycle
        if seen is None:
            return None
        if type(seen).__module__.startswith(_BACKEND_MODULES):
            what = f"{type(seen).__name__}: {seen}".replace("\n", " ")
            hint = ""
            if "credential" in what.lower():
                hint = "; expected credentials from the environment (AWS_* variables, a profile) "
                hint += "or fsspec config"
            return StorageError(f"cannot use remote storage ({what}){hint}")
        seen = seen.__cause__ or seen.__context__
    return None


def is_local(fs: Any) -> bool:
    """True when ``fs`` is local disk (rename is atomic, os calls are safe)."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def protocol(fs: Any) -> str:
    """The filesystem's main protocol name, e.g. ``"file"``, ``"s3"``, ``"memory"``."""
    proto = fs.protocol
    return str(proto[0] if isinstance(proto, (tuple, list)) else proto)


def inside(url: str, directory: str) -> bool:
    """Whether ``url`` lies inside ``directory``: local paths as the system resolves them
    (links followed, ``file://`` read as a path), URLs of one store by their text."""
    fs, path = open_url(url)
    fs_dir, folder = open_url(directory)
    if protocol(fs) != protocol(fs_dir):
        return False
    if is_local(fs):
        path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path.startswith(folder.rstrip("/") + "/")


def join(base: str, *parts: str) -> str:
    """Join path parts with ``/`` (fsspec paths are posix on every backend)."""
    return posixpath.join(base.rstrip("/") or "/", *parts)


def absolute(url: str) -> str:
    """``url`` with a relative local path made absolute; other URLs unchanged.

    Tasks carry absolute paths: a worker started in another directory (a Dask
    worker) would resolve a relative one against its own.
    """
    protocol, path = split_protocol(url)
    if protocol is None:
        return os.path.abspath(str(path))
    return url


def split_protocol(url: str) -> tuple[str | None, str]:
    """``("s3", "bucket/key")`` for ``s3://bucket/key``; ``(None, url)`` for a local path.

    fsspec's rule (``fsspec.core.split_protocol``) without importing fsspec: a
    scheme of two or more characters before ``://`` (one letter is a Windows drive).
    """
    scheme, found, rest = str(url).partition("://")
    if found and len(scheme) > 1:
        return scheme, rest
    return None, str(url)


PROJECT_MARKERS = (".dvc", ".git")  # a folder holding one is a project's top


def find_upward(fs: Any, folder: str, rel: str) -> str | None:
    """The first existing ``rel`` under ``folder`` or a folder above it, on ``fs``.

    The search stops at the project's top (the first folder holding one of
    :data:`PROJECT_MARKERS`) or the filesystem's root. Used to find what a
    relative path, written relative to the project folder, names when read
    from a file in a subfolder (a manifest copy, a listing).
    """
    base = folder
    while True:
        candidate = posixpath.normpath(posixpath.join(base, rel))
        if fs.exists(candidate):
            return candidate
        parent = posixpath.dirname(base)
        if parent in ("", base) or any(fs.exists(join(base, m)) for m in PROJECT_MARKERS):
            return None
        base = parent


def resolve_relative(url: str, near: str) -> str:
    """``url`` as given if it is a URL, absolute, or exists from here; else found from ``near``.

    ``near`` is the local folder of the file that named ``url`` (relative to
    the project folder where it was written); :func:`find_upward` looks from
    there. Unchanged when found nowhere: the caller's error names it.
    """
    protocol, path = split_protocol(url)
    if protocol is not None or os.path.isabs(url) or os.path.exists(url):
        return url
    fs, folder = open_url(near)
    if not is_local(fs):
        return url
    found = find_upward(fs, folder, str(path))
    return url if found is None else found


def file_sizes(fs: Any, directory: str, *, nested: bool = False) -> dict[str, int]:
    """Path -> size of each file ``directory`` holds ({} if absent), in one listing call.

    Paths are relative to ``directory`` with ``/`` between parts: the top level
    only, or with ``nested`` every file below it. On local disk with
    ``os.scandir``: fsspec's ``find`` stats each entry again in Python, ~40 us a
    file (a grown version's 400 files took ~15 ms of a 0.1 s write).
    """
    if is_local(fs):
        return _local_sizes(directory, "", nested)
    try:
        found = fs.find(directory, maxdepth=None if nested else 1, detail=True)
    except FileNotFoundError:
        return {}
    base = directory.rstrip("/") + "/"
    return {str(p)[len(base) :]: int(info.get("size") or 0) for p, info in found.items()}


def _local_sizes(directory: str, prefix: str, nested: bool) -> dict[str, int]:
    sizes: dict[str, int] = {}
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return sizes
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                if nested:
                    sizes.update(_local_sizes(entry.path, f"{prefix}{entry.name}/", nested))
            elif entry.is_file():
                sizes[prefix + entry.name] = entry.stat().st_size
        except FileNotFoundError:
            continue  # removed since the folder was read: not there
    return sizes


def write_error(fs: Any, path: str, exc: OSError) -> ShardError:
    """A failed write of the shard set (disk full, file too large, read-only), located."""
    where = unstrip(fs, path)
    code = errno.errorcode.get(exc.errno or 0)
    why = f"{exc.strerror or type(exc).__name__}" + (f" ({code})" if code else "")
    if isinstance(exc, FileNotFoundError) and not is_local(fs):  # s3fs: no such bucket
        bucket = where.split("://", 1)[-1].split("/", 1)[0]
        why = f"the store has no bucket {bucket!r} (or it refused the path): {why}"
    return ShardError(f"{where}: cannot write: {why}", path=where, errno=exc.errno)


def unstrip(fs: Any, path: str) -> str:
    """Turn an fs-internal path back into a URL a user (or another process) can open."""
    if is_local(fs):
        return path
    return str(fs.unstrip_protocol(path))


def read_bytes(fs: Any, path: str, size_hint: int | None = None) -> bytes:
    """Read a whole file; on local disk with plain ``os`` calls (the fast path).

    With ``size_hint`` (the size a listing recorded), a local read skips the
    ``fstat`` and asks for one byte more, so a file that grew still shows.
    """
    if is_local(fs):
        fd = open_regular(path)
        try:
            if size_hint is not None:
                data = os.read(fd, size_hint + 1)
                if len(data) <= size_hint:  # complete (or shrunk: the caller compares)
                    return data
                return data + read_rest(fd)
            size = os.fstat(fd).st_size
            data = os.read(fd, size)
            if len(data) < size:  # os.read may return short on some filesystems
                data += read_rest(fd)
            return data
        finally:
            os.close(fd)
    return bytes(fs.cat_file(path))


class NotAFileError(OSError):
    """A local path that is not a regular file (a FIFO, device, socket or folder): never read."""


def not_a_file(mode: int, path: str | None = None) -> NotAFileError:
    """The error for a path whose ``st_mode`` is ``mode``: what was expected, what was found
    (and the path, when given: a caller that does not wrap it still names the file)."""
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    )
    found = next((kind for test, kind in kinds if test(mode)), f"file type {stat.S_IFMT(mode):#o}")
    return NotAFileError(errno.EINVAL, f"expected a regular file, found {found}", path)


def open_regular(path: str) -> int:
    """Open a local regular file for reading, and nothing else; returns the descriptor.

    Opening a FIFO for reading waits for a writer, forever if none comes:
    ``O_NONBLOCK`` returns at once (it changes nothing for a regular file) and
    ``fstat`` then refuses anything but a regular file.

    Raises:
        NotAFileError: ``path`` is a FIFO, device, socket or folder.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_a_file(mode, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_rest(fd: int) -> bytes:
    """Everything left to read from ``fd``."""
    parts = []
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)
