"""How worker processes start (``fork`` when safe, else a lean
``forkserver``) and how they die with their parent."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from multiprocessing import popen_forkserver
from typing import Any

from tfshards.processes import pid_alive, process_start

PRELOAD = [
    "tfshards.writing.shard",
    "tfshards.validation.validate",
]  # what forkserver workers import once
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_SECONDS = 0.5  # how often a worker without PR_SET_PDEATHSIG looks for its parent


def mp_context() -> multiprocessing.context.BaseContext:
    """``fork`` when it is safe, else a ``forkserver`` with the workers' modules preloaded.

    Forking costs ~50 ms and inherits every imported module, where a fresh
    interpreter costs 0.5-1.5 s of imports per pool (measured: it dominated a
    whole 20,000-file write). Forking is unsafe only in a parent with other
    threads (TensorFlow's pools, fsspec's async I/O loop), which would be copied
    mid-lock; such a parent gets :class:`LeanForkServerContext`.
    """
    if "tensorflow" not in sys.modules and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    ctx = LeanForkServerContext()
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Make ``__main__`` look like a module without a file for the duration.

    ``spawn.get_preparation_data`` reads ``sys.modules["__main__"]`` to tell a
    new worker which script to re-import; a bare stand-in tells it none.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _LeanPopen(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        with _main_module_hidden():
            super()._launch(process_obj)  # type: ignore[misc]


class _LeanProcess(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _LeanPopen(process_obj)


class LeanForkServerContext(multiprocessing.context.ForkServerContext):
    """``forkserver`` whose workers do not re-import the parent's ``__main__``.

    A stock forkserver (or spawn) worker first re-runs the script that started
    the parent, so that functions defined there unpickle. Ours run only
    functions of tfshards modules, and a script that imports TensorFlow at the
    top would cost every worker 3-5 s and ~300 MB for nothing. Measured: a
    2-process validate of 144 MB took 0.25 s under ``python -m bench.suite.run``
    (whose import is 0.2 s), and 0.15 s in the next run with this context.

    For functions pickled by reference from ``__main__`` (a user's generator
    function), use the stock context: :mod:`tfshards.reading.pools` does.
    """

    Process = _LeanProcess


def die_with_parent(owner: int) -> None:
    """Worker initializer: end this process as soon as its parent dies.

    Without it, a pool worker whose parent is SIGKILLed (the OOM killer,
    ``kill -9``) lives on forever, blocked on its task queue, holding memory
    and the caller's stdout/stderr: it holds the write end of that queue
    itself, so it never reads end-of-file. On Linux the kernel sends SIGKILL
    when the parent dies (``PR_SET_PDEATHSIG``); elsewhere a daemon thread
    polls ``getppid()``. A ``fork`` worker's parent is ``owner``, the process
    that made the pool. A ``forkserver`` worker's parent is the server, which
    would exit when ``owner`` does (end-of-file on its "alive" pipe), but each
    worker it forks holds that pipe's write end too (for pools of its own), so
    it never sees the end while one lives: a worker of a SIGKILLed write lived
    on for good with its server, holding the caller's stdout (``| tail`` never
    returned). So such a worker also watches ``owner`` itself, by pid and start
    time. ``owner`` may have died before this runs: then the worker exits at once.
    """
    parent = os.getppid()
    if not _set_parent_death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    start = process_start(owner)
    if parent != owner:  # forked by a forkserver
        threading.Thread(target=_watch_owner, args=(owner, start), daemon=True).start()
    if not pid_alive(owner, start) or os.getppid() != parent:
        os._exit(1)


def _set_parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_owner(owner: int, start: int | None) -> None:
    while pid_alive(owner, start):
        time.sleep(WATCH_SECONDS)
    os._exit(1)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_SECONDS)
    os._exit(1)
