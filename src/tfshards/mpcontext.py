"""How worker processes start: ``fork`` when it is safe, a lean ``forkserver`` otherwise."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import sys
import threading
import types
from collections.abc import Iterator
from multiprocessing import popen_forkserver
from typing import Any

PRELOAD = ["tfshards.shard", "tfshards.validate"]  # what forkserver workers import once


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
    2-process validate of 144 MB took 0.25 s under ``python -m bench.run``
    (whose import is 0.2 s), and 0.15 s in the next run with this context.

    For functions pickled by reference from ``__main__`` (a user's generator
    function), use the stock context: :mod:`tfshards.pools` does.
    """

    Process = _LeanProcess
