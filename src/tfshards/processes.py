"""Whether a process is alive (told apart from a later process that reused its pid), and how
many cores this one may use."""

from __future__ import annotations

import os


def cpu_count() -> int:
    """Cores this process may use (its affinity mask where the OS has one): the default width."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
