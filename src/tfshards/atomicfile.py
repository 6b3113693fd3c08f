"""Publish files atomically: a temp file beside the target, fsynced, then renamed over it.

fsspec's local transaction stages its temp file in the system temp folder, so
its final move is not atomic across filesystems; here the temp file lives in
the target's folder (named so :func:`is_temp_name` finds leftovers) and
``os.replace`` publishes it. Object stores publish a whole ``put`` at once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import re
import socket
import uuid
from collections.abc import Iterable
from typing import Any, NoReturn

from tfshards.processes import pid_alive, process_start
from tfshards.storage import Chunk, is_local, protocol, unstrip

_SYNC_THREADS = 8  # sync_files' concurrent fsyncs
_BUCKET_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def write_atomic(
    fs: Any,
    path: str,
    chunks: Iterable[Chunk],
    *,
    mode: int | None = None,
    sync_dir: bool = True,
    durable: bool = True,
) -> int:
    """Publish ``chunks`` as ``path`` so that readers see all of it or nothing.

    Returns the number of bytes written. See :class:`AtomicSink` (``mode``: a
    local file's permission bits, e.g. those of the file it replaces;
    ``sync_dir``, ``durable``: see :meth:`AtomicSink.commit`).
    """
    sink = AtomicSink(fs, path, mode=mode)
    try:
        sink.write(chunks)
        sink.commit(sync_dir=sync_dir, durable=durable)
    except BaseException:
        sink.abort()  # a failed rename too: no temp file stays behind
        raise
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
            try:
                self.size += _write_all(self._fd, chunks)
            except OSError as exc:  # a full disk: name the file, not a bare errno
                _raise_named(exc, self.path)
        else:
            for chunk in chunks:  # a view's buffer is reused by the caller: keep a copy
                self._chunks.append(bytes(chunk) if isinstance(chunk, memoryview) else chunk)
                self.size += len(chunk)

    def commit(self, *, sync_dir: bool = True, durable: bool = True) -> None:
        """Make the file visible under its name.

        ``sync_dir=False`` leaves the directory's fsync (which makes the rename
        survive a power loss) to the caller: a writer of many files in a few
        folders calls :func:`sync_dirs` once before what makes them count.
        ``durable=False`` skips the file's own fsync too: for a file whose loss
        or truncation by a power cut costs only redoing work, never a wrong
        result (a shard's sidecar: the shard is hashed against it).
        """
        if self._fd is not None:
            # Durable before visible: without the fsync a power loss can leave the final
            # name pointing at missing content; the directory's fsync makes the rename last.
            if durable:
                try:
                    os.fsync(self._fd)
                except OSError as exc:
                    _raise_named(exc, self.path)
            fd, self._fd = self._fd, None  # forget it first: a Ctrl-C here must not close it twice
            os.close(fd)
            try:
                os.replace(self._tmp, self.path)
            except OSError as exc:  # name the file it was to become, not the temp file
                raise type(exc)(exc.errno, exc.strerror, self.path) from exc
            self._tmp = ""
            if sync_dir:
                fsync_dir(os.path.dirname(self.path) or ".")
            return
        parent = posixpath.dirname(self.path)
        # A store of buckets has no folders to make, and its makedirs makes a missing
        # bucket: a mistyped one in --metrics s3://typo/m.json was created, not refused.
        if parent and protocol(self.fs) not in _BUCKET_STORES:
            self.fs.makedirs(parent, exist_ok=True)
        try:
            self.fs.pipe_file(self.path, b"".join(self._chunks))
        except OSError as exc:  # no such bucket, refused: the URL it was to become
            _raise_named(exc, unstrip(self.fs, self.path))
        self._chunks = []

    def abort(self) -> None:
        """Drop everything written; nothing becomes visible."""
        self._chunks = []
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        if self._tmp:  # also after a commit interrupted between its close and its rename
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = ""


def _raise_named(exc: OSError, path: str) -> NoReturn:
    """Raise ``exc``, naming ``path`` where it names no file (``os.write``, ``os.fsync``, a
    store's refusal): the error says which file could not be written."""
    if exc.filename is not None:
        raise exc
    why = exc.strerror or str(exc) or type(exc).__name__  # a store's errors carry no strerror
    raise type(exc)(exc.errno, why, path) from exc


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


def sync_dirs(fs: Any, directories: Iterable[str]) -> None:
    """fsync each local folder of ``directories`` that exists: the renames into it last.

    The other half of ``commit(sync_dir=False)``; object stores need nothing.
    """
    if not is_local(fs):
        return
    for directory in directories:
        with contextlib.suppress(FileNotFoundError):
            fsync_dir(directory)


def sync_files(fs: Any, paths: Iterable[str]) -> None:
    """fsync local files renamed into place with ``commit(durable=False)``, all in one pass.

    The other half of such commits, before what makes the files count (a
    manifest). The fsyncs run on a few threads: ext4 makes concurrent fsyncs
    share a journal commit, where one after another each waits for its own.
    On this project's ext4 disk, 64 small files took ~8 ms over their writing
    this way and ~17 ms fsynced each before its rename (medians of 7); and a
    writer's fsyncs stall the file creations of its other threads behind the
    journal (a 1% append spent 88 ms of its threads' time in ``open``).

    Raises:
        OSError: naming the file that could not be flushed.
    """
    if not is_local(fs):
        return
    todo = list(paths)
    if not todo:
        return
    from concurrent.futures import ThreadPoolExecutor  # ~13 ms to import: only when writing

    def flush(path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise type(exc)(exc.errno, exc.strerror, path) from exc

    with ThreadPoolExecutor(min(_SYNC_THREADS, len(todo))) as pool:
        for _ in pool.map(flush, todo):
            pass


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
    return f".{name}.tmp-{_writer(os.getpid())}-{uuid.uuid4().hex[:8]}"


@functools.cache
def _writer(pid: int) -> str:
    """``HOST-PID.START`` of this process, read once per pid (a forked worker has its own):
    reading ``/proc/self/stat`` for each temp name was 0.3 ms of a tiny shard's ~5 ms."""
    host = socket.gethostname().replace("-", "_") or "host"
    start = process_start(pid)
    return f"{host}-{pid}" if start is None else f"{host}-{pid}.{start}"


def is_temp_name(name: str) -> bool:
    """True for the temp files :class:`AtomicSink` writes before publishing."""
    return _TMP.match(name) is not None


def published_name(path: str) -> str:
    """The file a temp file at ``path`` is written for (``path`` itself when it is not one):
    what an error about the temp file should name."""
    folder, _, name = path.rpartition("/")
    found = _TMP.match(name)
    if found is None:
        return path
    return f"{folder}/{found['name']}" if folder else found["name"]


def remove_stale_temps(fs: Any, directory: str, name: str | None = None) -> int:
    """Delete temp files left in ``directory`` by writers of this host that died (only
    those of the file ``name``, when given: a folder of the user's).

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
    for entry in os.listdir(directory):
        m = _TMP.match(entry)
        if m is None or m["host"] != host or (name is not None and m["name"] != name):
            continue
        start = None if m["start"] is None else int(m["start"])
        if pid_alive(int(m["pid"]), start):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, entry))
            removed += 1
    return removed


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
