"""A writer's lease on a version directory, so ``prune`` never deletes a set being written.

Re-writing a finished version (``dvc exp run`` back to earlier params) reuses
its shards without touching them, so from the outside the version looks old
and finished until the new manifest lands. The writer therefore holds a lease
from before it looks at the first shard until after it publishes the manifest:
a small JSON file ``_work/<host>-<pid>.<start>.lease`` naming the process,
rewritten every :data:`REFRESH_S` seconds so its modification time shows the
writer is alive, and deleted at the end.

A lease is live while its process runs (the writer is on this host: checked
by pid and start time, as for temp files) or, for a writer on another host,
while its file was refreshed within :data:`TTL_S`. ``prune`` keeps every
version with a live lease; a writer killed on this host stops holding its
version at once, one killed elsewhere after :data:`TTL_S`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import posixpath
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tfshards import atomicfile, jsonfile, processes, storage
from tfshards.shardset import layout

REFRESH_S = 60.0  # a lease file is rewritten this often while its writer works
TTL_S = 15 * REFRESH_S  # a remote writer missing 15 refreshes in a row is taken as dead
SUFFIX = ".lease"
_NAME = re.compile(r"^(?P<host>[^/]+)-(?P<pid>\d+)\.(?P<start>\d+)\.lease$")


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


@contextlib.contextmanager
def hold(fs: Any, version: str, *, refresh_s: float = REFRESH_S) -> Iterator[str]:
    """Hold a lease on ``version`` (a path on ``fs``) for the body of the ``with``.

    Yields the lease file's path. Stale leases of dead writers of this host are
    removed first.
    """
    remove_stale(fs, version)
    pid = os.getpid()
    name = f"{_host()}-{pid}.{processes.process_start(pid) or 0}{SUFFIX}"
    path = posixpath.join(layout.work_dir(version), name)
    doc = {"host": socket.gethostname(), "pid": pid}
    created = _missing_folders(fs, layout.work_dir(version))
    try:
        if created:
            atomicfile.make_dirs(layout.work_dir(version))
        fs.pipe_file(path, jsonfile.encode(doc))
    except OSError as exc:  # read-only, disk full: one line naming the version, not this file
        raise storage.write_error(fs, version, exc) from None
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(refresh_s):
            with contextlib.suppress(OSError):  # a missed refresh is retried; TTL is 15 of them
                _touch(fs, path, jsonfile.encode(doc))

    beat = threading.Thread(target=refresh, name="tfshards-lease", daemon=True)
    beat.start()
    try:
        yield path
    finally:
        stop.set()
        beat.join()
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)
        for folder in created:  # deepest first; only if nothing was written into them
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def _touch(fs: Any, path: str, data: bytes) -> None:
    """A new modification time for the lease at ``path``: a local file's ``utime`` (its
    bytes are never cut short under a reader), a rewrite elsewhere or where it went."""
    if storage.is_local(fs):
        try:
            os.utime(path)
            return
        except FileNotFoundError:
            pass
    fs.pipe_file(path, data)


def _missing_folders(fs: Any, folder: str) -> list[str]:
    """The local folders up to ``folder`` that do not exist yet, deepest first."""
    missing: list[str] = []
    if not storage.is_local(fs):
        return missing
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder.rstrip("/"))
        if parent == folder:
            break
        folder = parent
    return missing


def live_holders(files: Mapping[str, Mapping[str, Any]], *, now: float | None = None) -> list[str]:
    """The writers holding a live lease among ``files`` (``fs.find(..., detail=True)``)."""
    clock = time.time() if now is None else now
    holders = []
    for path, info in sorted(files.items()):
        m = _NAME.match(posixpath.basename(str(path)))
        if m is None or not is_lease(str(path)):
            continue
        pid, start = int(m["pid"]), int(m["start"]) or None
        if m["host"] == _host():
            alive = processes.pid_alive(pid, start)
        else:
            alive = clock - modified(info) < TTL_S
        if alive:
            holders.append(f"pid {pid} on {m['host']}")
    return holders


def is_lease(path: str) -> bool:
    """True for a lease file's path (relative to the version directory, or whole)."""
    folder, _, name = path.rpartition("/")
    return posixpath.basename(folder) == layout.WORK_DIR and _NAME.match(name) is not None


def remove_stale(fs: Any, version: str) -> None:
    """Delete the leases of writers of this host that died (a kill skips ``finally``)."""
    try:
        files = fs.find(layout.work_dir(version), detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return
    live = set(live_holders(files))
    for path in files:
        m = _NAME.match(posixpath.basename(str(path)))
        if m is None or m["host"] != _host():
            continue
        if f"pid {m['pid']} on {m['host']}" not in live:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(path)


def modified(info: Mapping[str, Any]) -> float:
    """A file's modification time from fsspec's details, as seconds since the epoch.

    Backends name and type it differently (local ``mtime`` as a float, S3
    ``LastModified`` as a datetime, GCS ``updated`` as text); unknown counts as now.
    """
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and value:
            try:
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return time.time()


__all__ = ["REFRESH_S", "TTL_S", "hold", "is_lease", "live_holders", "modified", "remove_stale"]
