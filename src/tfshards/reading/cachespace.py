"""The cache directory's space: its limit, its locks, part files, eviction.

Every process sharing a cache directory follows the same protocol, so two
readers never see a partial file, never download one shard twice at once and
never evict each other's open shards:

- ``.locks/<sha256>``: ``LOCK_EX`` while a shard is checked or downloaded; a
  second process asking for it waits, then finds it verified.
- a download streams into a part file ``.<sha256>.tfrecord.part-HOST-PID.START-RAND``
  created at its full size (``ftruncate``), so a scan counts its bytes from the
  start, and is renamed under its final name only once size and sha256 match.
  Part files of dead processes on this host are removed by the next scan.
- ``.lock``: ``LOCK_EX`` while space is counted, shards evicted and a part
  file created, so two processes cannot both spend the same free bytes.
- a shard's last use is its sidecar's mtime (set at each pin). Eviction takes
  first the shards the evicting reader has read this pass (the most recent
  first), then the least recently used, skipping any shard pinned
  (:mod:`tfshards.reading.pins`) by any process or whose download lock is held.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import threading
import uuid
from collections.abc import Collection, Iterator

from tfshards.errors import ConfigError
from tfshards.processes import pid_alive, process_start

LIMIT_ENV = "TFSHARDS_CACHE_LIMIT"
SUFFIX = ".tfrecord"
SIDECAR = ".ok"
LOCKS = ".locks"
DIR_LOCK = ".lock"
SIDECAR_BYTES = 256  # counted with each shard reserved: its sidecar is ~160 bytes
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_PART = re.compile(
    r"^\.(?P<name>.+)\.part-(?P<host>[^-]+)-(?P<pid>\d+)(?:\.(?P<start>\d+))?-[0-9a-f]+$"
)


def parse_limit(value: int | str | None) -> int | None:
    """Bytes from ``123``, ``"500M"``, ``"1.5G"`` (K, M, G, T: powers of 1024); None: no limit."""
    if value is None or isinstance(value, int):
        if value is not None and value < 1:
            raise ConfigError(f"cache limit must be at least 1 byte, got {value}", option="limit")
        return value
    text = value.strip().upper().removesuffix("IB").removesuffix("B")
    if not text:
        return None
    unit = text[-1] if text[-1] in _UNITS else ""
    try:
        number = float(text[: len(text) - len(unit)])
    except ValueError:
        number = -1.0
    if number <= 0:
        raise ConfigError(
            f"cache limit {value!r}: expected bytes, optionally with K, M, G or T (e.g. 20G)",
            option=LIMIT_ENV,
        )
    return max(1, int(number * _UNITS[unit]))


def limit_from_env() -> int | None:
    """``$TFSHARDS_CACHE_LIMIT`` in bytes; None (no limit) when unset or empty."""
    return parse_limit(os.environ.get(LIMIT_ENV, ""))


class Part:
    """A download's file, at its full size from the start; visible under ``path`` on commit."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size, self.written = path, size, 0
        directory, name = os.path.split(path)
        pid = os.getpid()
        start = process_start(pid)
        writer = f"{pid}" if start is None else f"{pid}.{start}"
        temp = f".{name}.part-{_host()}-{writer}-{uuid.uuid4().hex[:8]}"
        self.temp = os.path.join(directory, temp)
        self._fd: int | None = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(self._fd, size)
        except BaseException:
            self.abort()
            raise

    def write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
            self.written += n

    def commit(self, *, durable: bool = True) -> None:
        """Publish it: durable first (fsync) when asked, then renamed over ``path``.

        The folder is not fsynced: a rename a power loss drops costs a
        download again, never a wrong copy. A sidecar needs no fsync either:
        it is written after its shard's data was made durable, and one lost or
        cut short only makes the next run hash the shard (~7 ms a download
        saved, of ~20 ms for a 200 KB shard from memory://).
        """
        assert self._fd is not None and self.written == self.size
        if durable:
            os.fsync(self._fd)
        fd, self._fd = self._fd, None
        os.close(fd)
        os.replace(self.temp, self.path)

    def abort(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.temp)


class CacheSpace:
    """Counts, reserves and frees the bytes of one cache directory (``limit`` None: no limit)."""

    def __init__(self, directory: str, limit: int | None) -> None:
        self.directory, self.limit = directory, limit
        self.evicted = 0  # shards this object removed
        self.peak = 0  # the most bytes a reservation of this object left the directory holding
        self._lock = threading.Lock()  # flock is per descriptor: threads take turns here first

    @contextlib.contextmanager
    def shard_lock(self, sha256: str) -> Iterator[None]:
        """Hold ``sha256``'s download lock (waits while another thread or process holds it)."""
        folder = os.path.join(self.directory, LOCKS)
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, sha256), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _dir_lock(self) -> Iterator[None]:
        with self._lock:
            path = os.path.join(self.directory, DIR_LOCK)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def reserve(
        self,
        path: str,
        size: int,
        *,
        keep: Collection[str] = (),
        first: Collection[str] = (),
        must: bool = True,
        spare: int = 0,
    ) -> Part | None:
        """A part file for ``size`` bytes of ``path``, room made by evicting unpinned shards.

        Shards in ``first`` (read this pass: not needed again before the
        next) go first, the most recently used of them first; then the others
        least recently used first; shards in ``keep`` (brought ahead, not read
        yet) last, and only when ``must``. Without ``must``, None when the room
        cannot be made with ``spare`` bytes left over under the limit (a
        lookahead leaves room for a shard a reader asks for while it downloads,
        which no eviction can take back); with it, the part file is made all
        the same (pinned shards can fill the limit).
        """
        if self.limit is None:
            return Part(path, size)
        need = size + SIDECAR_BYTES + (0 if must else spare)
        with self._dir_lock():
            used, shards = self.scan()
            if used + need > self.limit:
                order = _eviction_order(shards, keep, first, must)
                used = self._evict(order, used, used + need - self.limit)
            if used + need > self.limit and not must:
                return None
            part = Part(path, size)
            self.peak = max(self.peak, used + need)
            return part

    def write_small(self, path: str, data: bytes) -> None:
        """Publish a small file (a sidecar) whole or not at all, without fsync."""
        part = Part(path, len(data))
        try:
            part.write(data)
        except BaseException:
            part.abort()
            raise
        part.commit(durable=False)

    def used(self) -> int:
        """Bytes the directory holds now (shards, sidecars, part files in flight)."""
        with self._dir_lock():
            return self.scan()[0]

    def scan(self) -> tuple[int, list[tuple[int, str, int]]]:
        """Bytes held, and each shard as ``(last use ns, path, bytes)``; drops dead part files."""
        used, files = 0, {}
        host = _host()
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                m = _PART.match(entry.name) if entry.name.startswith(".") else None
                if m is not None and m["host"] == host:
                    start = None if m["start"] is None else int(m["start"])
                    if not pid_alive(int(m["pid"]), start):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)
                        continue
                used += st.st_size
                files[entry.name] = st
        shards = []
        for name, st in files.items():
            if name.endswith(SUFFIX) and not name.startswith("."):
                sidecar = files.get(name + SIDECAR, st)  # none: its own mtime
                shards.append((sidecar.st_mtime_ns, os.path.join(self.directory, name), st.st_size))
        return used, shards

    def _evict(self, order: list[tuple[int, str, int]], used: int, need: int) -> int:
        freed = 0
        for _, path, size in order:
            if freed >= need:
                break
            gone = self._remove_unpinned(path)
            if gone is not None:
                freed += size + gone
                self.evicted += 1
        return used - freed

    def _remove_unpinned(self, path: str) -> int | None:
        """Unlink a shard and its sidecar unless pinned or being brought; the sidecar's bytes.

        None when it stays. Both locks are tried without waiting.
        """
        sha = os.path.basename(path).removesuffix(SUFFIX)
        name = os.path.join(self.directory, LOCKS, sha)
        fds = []
        try:
            for target in (name, path):
                flags = os.O_RDWR | os.O_CREAT if target == name else os.O_RDONLY
                fds.append(os.open(target, flags | os.O_CLOEXEC, 0o644))
                fcntl.flock(fds[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
            try:
                sidecar = os.stat(path + SIDECAR).st_size
                os.unlink(path + SIDECAR)
            except FileNotFoundError:
                sidecar = 0
            return sidecar
        except (BlockingIOError, FileNotFoundError):
            return None  # being brought, pinned by a reader, or gone
        finally:
            for fd in fds:
                os.close(fd)

    def touch(self, path: str) -> None:
        """Mark the shard at ``path`` used now (its sidecar's mtime; the shard's stat is kept)."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(path + SIDECAR)


def _eviction_order(
    shards: list[tuple[int, str, int]], keep: Collection[str], first: Collection[str], must: bool
) -> list[tuple[int, str, int]]:
    """``first`` most recent first, the rest least recent first, then ``keep`` if ``must``."""
    done = sorted((s for s in shards if s[1] in first and s[1] not in keep), reverse=True)
    rest = sorted(s for s in shards if s[1] not in first and s[1] not in keep)
    kept = sorted(s for s in shards if s[1] in keep) if must else []
    return done + rest + kept


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"
