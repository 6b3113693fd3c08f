"""Pins: cached shards this process is reading, held as shared ``flock`` locks on the files.

A pin is an open descriptor of the shard file with ``LOCK_SH`` on it. An
evicting process (this one or another sharing the cache directory) takes
``LOCK_EX | LOCK_NB`` on a descriptor of its own before it unlinks a shard, so
a pinned shard is never removed; the kernel drops a dead process's pins with
its descriptors. One descriptor per path is held however many readers pin it;
each :func:`pin` is undone by one :func:`release` (the reader is through with
the file) or by :func:`drop` of its owner (the fetch that took it is closed).
"""

from __future__ import annotations

import fcntl
import os
import threading

_lock = threading.Lock()
_held: dict[str, tuple[int, list[int]]] = {}  # path -> (descriptor, owner of each hold)


def pin(path: str, owner: int) -> bool:
    """Hold ``path`` against eviction for ``owner``; False when no file is there any more."""
    with _lock:
        held = _held.get(path)
        if held is not None:
            held[1].append(owner)
            return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits out an evictor's brief LOCK_EX
        mine, now = os.fstat(fd), os.stat(path)
        same = (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)
    except FileNotFoundError:
        same = False  # unlinked while this waited for the lock
    except BaseException:
        os.close(fd)
        raise
    if not same:
        os.close(fd)
        return False
    with _lock:
        held = _held.get(path)
        if held is None:
            _held[path] = (fd, [owner])
            return True
        held[1].append(owner)
    os.close(fd)  # another thread pinned it first: its descriptor holds the lock
    return True


def release(path: str) -> None:
    """Undo the oldest hold on ``path``; the lock goes with the last. No-op when unpinned."""
    with _lock:
        held = _held.get(path)
        if held is None:
            return
        held[1].pop(0)
        if held[1]:
            return
        del _held[path]
    os.close(held[0])


def drop(owner: int) -> None:
    """Undo every hold ``owner`` still has."""
    closing = []
    with _lock:
        for path, (fd, owners) in list(_held.items()):
            owners[:] = [o for o in owners if o != owner]
            if not owners:
                del _held[path]
                closing.append(fd)
    for fd in closing:
        os.close(fd)


def holds(path: str) -> int:
    """How many holds this process has on ``path``."""
    with _lock:
        held = _held.get(path)
        return 0 if held is None else len(held[1])
