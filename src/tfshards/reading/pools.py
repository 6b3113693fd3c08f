"""Run a per-file function over chunks of files, in order, on a thread or process pool.

The unit of work is :func:`apply_chunk`, a top-level function of plain
picklable values: ``fn`` over a chunk of ``(path, label)`` items, each result
checked against the declared outputs in the worker (so a mismatch names the
file), optionally stacked. Pools, of threads or of processes, are shared by
every dataset of the process: thread pools one per worker count asked for (a
small listing's datasets share it: threads start only as tasks need them),
process pools one per worker count used (at most the listing's tasks, so never
more processes than tasks). TensorFlow keeps a
``from_generator`` dataset's generator reachable after the dataset is gone, so
a pool per dataset was never shut down (20 datasets of 32 threads held 450
threads).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import multiprocessing
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any, NamedTuple

import numpy as np

from tfshards.errors import InputError
from tfshards.processes import cpu_count
from tfshards.run.executor import canonical
from tfshards.run.localexec import process_pool

DEFAULT_THREADS = 32  # 16 calls + 16 threads gave 5.8x on a 2 ms wait (2 cores); more waits more
CHUNK_ITEMS = 64  # elements per task / per yield when not batching: amortizes IPC and tf.data
AHEAD = 4  # tasks in flight per worker: a worker the OS pauses does not stall the others


def chunk_items(count: int, workers: int) -> int:
    """Elements per process task when not batching: :data:`CHUNK_ITEMS`, or fewer when
    ``count`` items would not give each of ``workers`` :data:`AHEAD` tasks (60 files in
    one chunk of 64 ran on one process of two, the first element after all 60)."""
    return max(1, min(CHUNK_ITEMS, -(-count // (max(1, workers) * AHEAD))))


Item = tuple[str, int]  # (path or URL of a file, label index)


# ----------------------------------------------------------------------------- checks


class Leaf(NamedTuple):
    """One declared output: numpy dtype (None for strings) and shape (None = any size)."""

    dtype: str | None
    shape: tuple[int | None, ...] | None
    name: str


def _flatten(value: Any) -> list[Any]:
    """Leaves in ``tf.nest`` order (dict values by sorted key), without TensorFlow."""
    if isinstance(value, Mapping):
        return [leaf for key in sorted(value) for leaf in _flatten(value[key])]
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


_KINDS = {"b": "biu", "i": "iu", "u": "iu", "f": "fiu", "c": "cfiu"}


def _nested_list_hint(value: Any) -> str:
    """Why the count is off when an output is a Python list: ``([1, 2, 3, 4], label)`` is 5
    values to ``tf.nest``, not a tensor of 4 and a label."""
    items = value.values() if isinstance(value, Mapping) else value
    if not isinstance(items, (tuple, list)) and not isinstance(value, Mapping):
        return ""
    if not any(isinstance(item, list) for item in items):
        return ""
    return (
        " (a Python list inside the result is a structure whose every item is a value, "
        "as tf.nest flattens it: return np.asarray(the list) for one tensor)"
    )


def check_element(value: Any, leaves: Sequence[Leaf], path: str) -> list[np.ndarray[Any, Any]]:
    """Flatten ``value`` and check it against ``leaves``; returns arrays of the declared dtypes.

    Raises:
        InputError: naming ``path``, the output, what was declared and what was found.
    """
    if value is None:  # a missing return: not "1 values"
        many = f"{len(leaves)} values" if len(leaves) != 1 else "1 value"
        raise InputError(f"{path}: fn returned None, output_signature declares {many}", path=path)
    found = _flatten(value)
    if len(found) != len(leaves):
        raise InputError(
            f"{path}: fn returned {len(found)} values, output_signature declares "
            f"{len(leaves)}{_nested_list_hint(value)}",
            path=path,
        )
    out = []
    for i, (raw, leaf) in enumerate(zip(found, leaves, strict=True)):
        array = np.asarray(raw)
        label = f"output {i}" + (f" ({leaf.name})" if leaf.name else "")
        if leaf.dtype is None:
            ok = array.dtype.kind in "SUO"
        else:
            want = np.dtype(leaf.dtype)
            ok = array.dtype.kind in _KINDS.get(want.kind, want.kind)
        shape_ok = leaf.shape is None or (
            array.ndim == len(leaf.shape)
            and all(d is None or d == n for d, n in zip(leaf.shape, array.shape, strict=True))
        )
        if not (ok and shape_ok):
            expected = "string" if leaf.dtype is None else np.dtype(leaf.dtype).name
            shape = "any shape" if leaf.shape is None else f"shape {list(leaf.shape)}"
            raise InputError(
                f"{path}: {label}: expected {expected} of {shape}, "
                f"found {array.dtype.name} of shape {list(array.shape)}",
                path=path,
                output=i,
            )
        if leaf.dtype is not None:
            _check_range(array, np.dtype(leaf.dtype), path, label, i)
        out.append(array if leaf.dtype is None else array.astype(leaf.dtype, copy=False))
    return out


def _check_range(
    array: np.ndarray[Any, Any], want: np.dtype[Any], path: str, label: str, output: int
) -> None:
    """Integers cast to a narrower integer, bool or float type must fit: astype wraps 300
    to 44 as uint8, and makes 70,000 inf as float16.

    Raises:
        InputError: naming ``path``, the output, the type and the values out of its range.
    """
    if array.dtype.kind not in "iu" or want.kind not in "biuf" or np.can_cast(array.dtype, want):
        return
    if want.kind == "f":  # 70,000 as float16 is inf
        low, high = float(np.finfo(want).min), float(np.finfo(want).max)
    elif want.kind == "b":
        low, high = 0, 1
    else:
        low, high = np.iinfo(want).min, np.iinfo(want).max
    if array.size and (array.min() < low or array.max() > high):
        raise InputError(
            f"{path}: {label}: expected {want.name} values in [{low}, {high}], found values "
            f"from {array.min()} to {array.max()}",
            path=path,
            output=output,
        )


def apply_chunk(
    fn: Callable[..., Any], chunk: Sequence[Item], leaves: Sequence[Leaf], stack: bool
) -> list[Any]:
    """The unit of work in the pools: ``fn`` over a chunk, checked, optionally stacked."""
    elements = []
    for path, label in chunk:
        try:
            value = fn(path, label)
        except InputError:
            raise
        except (Exception, SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
            # A user's function can raise anything: report which file. A sys.exit() there
            # too, and a KeyboardInterrupt off a process's main thread, where no Ctrl-C
            # lands: both reached TensorFlow as an UnknownError with a screen of traceback.
            if isinstance(exc, KeyboardInterrupt) and _on_main_thread():
                raise
            raise InputError(
                f"{path}: {getattr(fn, '__name__', 'fn')} failed: {type(exc).__name__}: {exc}",
                path=path,
            ) from exc
        elements.append(check_element(value, leaves, path))
    if not stack:
        return elements
    return [[np.stack(column) for column in zip(*elements, strict=True)]]


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ----------------------------------------------------------------------------- pools


class Runner:
    """Maps ``fn`` over items in order on a pool that lives as long as the dataset."""

    def __init__(
        self,
        mode: str,
        fn: Callable[..., Any],
        leaves: Sequence[Leaf],
        workers: int | None,
        tasks: int | None = None,
    ) -> None:
        """``tasks``: most tasks an epoch has; never more workers than that."""
        mode = canonical(mode, "mode")
        self.mode, self.fn, self.leaves = mode, fn, tuple(leaves)
        self.pool: cf.Executor | None = None
        most = max(1, tasks) if tasks is not None else 1 << 30
        if mode == "thread":
            self.workers = min(workers or DEFAULT_THREADS, most)
            self.pool = _thread_pool(workers or DEFAULT_THREADS)  # by the count asked for
        elif mode == "process":
            self.workers = min(workers or cpu_count(), most)
            # Keyed by the count used: a pool of more processes would start them (a
            # process pool keeps workers * AHEAD tasks in flight), unlike a thread pool.
            self.pool = _process_pool(self.workers)
            for _ in range(self.workers):  # start the workers and import fn's module now
                self.pool.submit(_warm, fn)
        else:
            self.workers = 1

    def run(
        self, items: Sequence[Item], stack: int | None, size: int = CHUNK_ITEMS
    ) -> Iterator[list[Any]]:
        """Flat leaves of each element in order, or of each ``stack`` elements stacked; a
        process task takes ``stack`` items, else ``size``."""
        if self.mode == "thread":
            # One file per task keeps every thread busy; stacking happens here, in order.
            results = self._ordered([items[i : i + 1] for i in range(len(items))], False)
            if stack is None:
                yield from results
            else:
                yield from _stacked(results, stack)
            return
        size = stack or size
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        if self.pool is None:
            for part in chunks:
                yield from apply_chunk(self.fn, part, self.leaves, stack is not None)
            return
        yield from self._ordered(chunks, stack is not None)

    def _ordered(self, chunks: Sequence[Sequence[Item]], stack: bool) -> Iterator[list[Any]]:
        if self.pool is None:
            raise RuntimeError("no pool")  # pragma: no cover - run() handles serial mode
        pending: collections.deque[tuple[str, cf.Future[list[Any]]]] = collections.deque()
        try:
            for part in chunks:
                future = self.pool.submit(apply_chunk, self.fn, part, self.leaves, stack)
                pending.append((part[0][0], future))
                if len(pending) >= self.workers * AHEAD:
                    yield from self._result(*pending.popleft())
            while pending:
                yield from self._result(*pending.popleft())
        finally:
            for _, future in pending:
                future.cancel()

    def _result(self, first: str, future: cf.Future[list[Any]]) -> list[Any]:
        try:
            return future.result()
        except BrokenProcessPool as exc:
            with _POOLS_LOCK:  # the next dataset starts a fresh pool
                for key in [k for k, pool in _POOLS.items() if pool is self.pool]:
                    del _POOLS[key]
            raise InputError(
                f"{first}: a worker process died (killed by a signal or out of memory) "
                f"while running fn on a chunk of files starting here{_guard_hint()}",
                path=first,
            ) from exc


def _guard_hint() -> str:
    """Where the main module is a script without ``if __name__ == "__main__":``: the
    workers' server imports it, its work starts this pool again there, which Python
    refuses, and the workers die at once with the reason only in their stderr."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if script is None:
        return ""  # an interactive session, a notebook, python -c: nothing imported again
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            source = f.read(1 << 20)
    except OSError:
        return ""
    if re.search(r"""__name__\s*==\s*['"]__main__['"]""", source):
        return ""  # guarded: the worker died of something else
    return (
        '; the script has no `if __name__ == "__main__":`, so each worker\'s server runs '
        "its work again, which Python refuses: put the work under one"
    )


_POOLS: dict[int, cf.ProcessPoolExecutor] = {}
_THREADS: dict[int, cf.ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _thread_pool(workers: int) -> cf.ThreadPoolExecutor:
    """One pool of ``workers`` threads per process, shared by every dataset: its threads
    start as tasks come and stay for the next dataset."""
    with _POOLS_LOCK:
        pool = _THREADS.get(workers)
        if pool is None:
            pool = _THREADS[workers] = cf.ThreadPoolExecutor(
                workers, thread_name_prefix="tfshards-files"
            )
        return pool


def _process_pool(workers: int) -> cf.ProcessPoolExecutor:
    """One pool per worker count, shared by every dataset: workers start once per process.

    ``forkserver``: the workers are forked from a clean server process, never
    from this one (which has TensorFlow's threads running).
    """
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            # The stock forkserver: fn may be pickled by reference from __main__.
            context = multiprocessing.get_context("forkserver")
            pool = _POOLS[workers] = process_pool(workers, context)
        return pool


def _stacked(elements: Iterator[list[Any]], size: int) -> Iterator[list[Any]]:
    group: list[list[Any]] = []
    for element in elements:
        group.append(element)
        if len(group) == size:
            yield [np.stack(column) for column in zip(*group, strict=True)]
            group = []
    if group:
        yield [np.stack(column) for column in zip(*group, strict=True)]


def _warm(fn: Callable[..., Any]) -> None:
    """Nothing: receiving ``fn`` imports its module in the worker, before the first epoch."""
