"""Reach any storage through fsspec: open a URL, join paths, publish files atomically.

Data locations are only ever touched through an ``fsspec`` filesystem that is
passed in or opened from a URL with :func:`open_url`. Local disk gets two fast
paths, both measured: plain ``os`` calls for small reads (``LocalFileSystem``
adds ~10 us per file) and ``os.replace`` of a temp file in the same directory
for atomic publication (fsspec's local transaction stages its temp file in the
system temp dir, so its final move is not atomic across filesystems).
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import socket
import stat
import uuid
from collections.abc import Iterable
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from tfshards.errors import ConfigError, ShardError, StorageError

Chunk = bytes | bytearray | memoryview


def open_url(url: str, **storage_options: Any) -> tuple[Any, str]:
    """Return ``(filesystem, path)`` for a local path or any fsspec URL.

    Credentials come from ``storage_options`` or the environment/fsspec config;
    they are never part of the returned path.
    """
    if not url:
        raise ConfigError("storage URL is empty")
    reject_credentials(url)
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
    return isinstance(fs, LocalFileSystem)


def protocol(fs: Any) -> str:
    """The filesystem's main protocol name, e.g. ``"file"``, ``"s3"``, ``"memory"``."""
    proto = fs.protocol
    return str(proto[0] if isinstance(proto, (tuple, list)) else proto)


def join(base: str, *parts: str) -> str:
    """Join path parts with ``/`` (fsspec paths are posix on every backend)."""
    return posixpath.join(base.rstrip("/") or "/", *parts)


def absolute(url: str) -> str:
    """``url`` with a relative local path made absolute; other URLs unchanged.

    Tasks carry absolute paths: a worker started in another directory (a Dask
    worker) would resolve a relative one against its own.
    """
    protocol, path = fsspec.core.split_protocol(url)
    if protocol is None:
        return os.path.abspath(str(path))
    return url


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
    protocol, path = fsspec.core.split_protocol(url)
    if protocol is not None or os.path.isabs(url) or os.path.exists(url):
        return url
    fs, folder = open_url(near)
    if not is_local(fs):
        return url
    found = find_upward(fs, folder, str(path))
    return url if found is None else found


def write_error(fs: Any, path: str, exc: OSError) -> ShardError:
    """A failed write of the shard set (disk full, file too large, read-only), located."""
    where = unstrip(fs, path)
    code = errno.errorcode.get(exc.errno or 0)
    why = f"{exc.strerror or type(exc).__name__}" + (f" ({code})" if code else "")
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


def not_a_file(mode: int) -> NotAFileError:
    """The error for a path whose ``st_mode`` is ``mode``: what was expected, what was found."""
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    )
    found = next((kind for test, kind in kinds if test(mode)), f"file type {stat.S_IFMT(mode):#o}")
    return NotAFileError(errno.EINVAL, f"expected a regular file, found {found}")


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
            raise not_a_file(mode)
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


def write_atomic(fs: Any, path: str, chunks: Iterable[Chunk], *, mode: int | None = None) -> int:
    """Publish ``chunks`` as ``path`` so that readers see all of it or nothing.

    Returns the number of bytes written. See :class:`AtomicSink` (``mode``: a
    local file's permission bits, e.g. those of the file it replaces).
    """
    sink = AtomicSink(fs, path, mode=mode)
    try:
        sink.write(chunks)
    except BaseException:
        sink.abort()
        raise
    sink.commit()
    return sink.size


class AtomicSink:
    """A file that becomes visible under its final name only on :meth:`commit`.

    Local disk: chunks stream into a temp file beside ``path``, or in
    ``temp_dir`` on the same filesystem (named with this host and pid, so a
    later run can tell a dead writer's leftovers from a live one's) and
    ``os.replace`` moves it into place. Object stores and ``memory://``:
    chunks are kept in memory and uploaded in one call, and an object appears
    only once its upload completes. ``mode`` sets a local file's permission
    bits exactly (umask aside) before it becomes visible; the default is 0644
    less the umask.
    """

    def __init__(
        self, fs: Any, path: str, temp_dir: str | None = None, *, mode: int | None = None
    ) -> None:
        self.fs, self.path, self.size = fs, path, 0
        self._fd: int | None = None
        self._chunks: list[Chunk] = []
        self._tmp = ""
        if is_local(fs):
            directory = os.path.dirname(path) or "."
            make_dirs(directory)
            if temp_dir:  # same filesystem (a subfolder), so the rename stays atomic
                os.makedirs(temp_dir, exist_ok=True)
            self._tmp = os.path.join(temp_dir or directory, _tmp_name(os.path.basename(path)))
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            if mode is not None:
                try:
                    os.fchmod(self._fd, mode)
                except BaseException:
                    self.abort()
                    raise

    def write(self, chunks: Iterable[Chunk]) -> None:
        if self._fd is not None:
            self.size += _write_all(self._fd, chunks)
        else:
            for chunk in chunks:  # a view's buffer is reused by the caller: keep a copy
                self._chunks.append(bytes(chunk) if isinstance(chunk, memoryview) else chunk)
                self.size += len(chunk)

    def commit(self) -> None:
        if self._fd is not None:
            # Durable before visible: without the fsync a power loss can leave the final
            # name pointing at missing content; the directory's fsync makes the rename last.
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            os.replace(self._tmp, self.path)
            fsync_dir(os.path.dirname(self.path) or ".")
            return
        parent = posixpath.dirname(self.path)
        if parent:
            self.fs.makedirs(parent, exist_ok=True)
        self.fs.pipe_file(self.path, b"".join(self._chunks))
        self._chunks = []

    def abort(self) -> None:
        """Drop everything written; nothing becomes visible."""
        self._chunks = []
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)


def make_dirs(directory: str) -> None:
    """``os.makedirs`` that also fsyncs each new folder's entry in its parent.

    A file renamed into a folder whose own entry a power loss drops is lost all the same.
    """
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # a racing writer made it first
            os.mkdir(folder)
        fsync_dir(os.path.dirname(folder) or ".")


def fsync_dir(directory: str) -> None:
    """Flush a local directory's entries (a rename into it) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: str) -> None:
    """Flush every file and folder under a local ``directory`` (itself included) to disk.

    For a folder written by a library that does not fsync (a SavedModel), before it
    is renamed into place: files first, then each folder's entries, deepest first.
    """
    for folder, _, files in os.walk(directory, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path):  # a link's target is not part of the tree
                continue
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


# .NAME.tmp-HOST-PID.START-RANDOM; START (the writer's start time in clock ticks since
# boot) tells a reused pid from the writer; names without it (no procfs) still match.
_TMP = re.compile(
    r"^\.(?P<name>.+)\.tmp-(?P<host>[^-]+)-(?P<pid>\d+)(?:\.(?P<start>\d+))?-[0-9a-f]+$"
)


def _tmp_name(name: str) -> str:
    host = socket.gethostname().replace("-", "_") or "host"
    pid = os.getpid()
    start = process_start(pid)
    writer = f"{pid}" if start is None else f"{pid}.{start}"
    return f".{name}.tmp-{host}-{writer}-{uuid.uuid4().hex[:8]}"


def is_temp_name(name: str) -> bool:
    """True for the temp files :class:`AtomicSink` writes before publishing."""
    return _TMP.match(name) is not None


def remove_stale_temps(fs: Any, directory: str) -> int:
    """Delete temp files left in ``directory`` by writers of this host that died.

    A temp file of a live process (another writer racing on the same
    directory) is left alone. Dead are: a pid that does not exist, a zombie (a
    killed worker nobody reaped, e.g. under a container init that does not
    reap orphans, still answers ``kill(pid, 0)``), and a pid now held by a
    process that started at another time than the writer (a restarted
    container reuses its small pids). Returns how many were removed.
    """
    if not is_local(fs) or not os.path.isdir(directory):
        return 0
    host = socket.gethostname().replace("-", "_") or "host"
    removed = 0
    for name in os.listdir(directory):
        m = _TMP.match(name)
        if m is None or m["host"] != host:
            continue
        start = None if m["start"] is None else int(m["start"])
        if pid_alive(int(m["pid"]), start):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            removed += 1
    return removed


def pid_alive(pid: int, start: int | None = None) -> bool:
    """True while process ``pid`` runs; a zombie (dead, not yet reaped) is not alive.

    With ``start`` (from :func:`process_start`), also false when ``pid`` now
    names a process that started at another time.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    fields = _proc_stat(pid)
    if fields is None:  # no procfs (macOS), or it just went away: trust kill()
        return True
    if fields[0] in (b"Z", b"X"):
        return False
    return start is None or int(fields[19]) == start


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot; None without ``/proc``."""
    fields = _proc_stat(pid)
    return None if fields is None else int(fields[19])


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the name (state first, start time 20th)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
    except OSError:
        return None
    return line[line.rfind(b")") + 2 :].split()  # the name may hold ")" and spaces


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
