"""Run one picklable function over many tasks: local processes, threads, or Dask.

The writer and the validator hand their per-shard function here. Local work
uses ``concurrent.futures.ProcessPoolExecutor`` (a SIGKILLed worker raises
``BrokenProcessPool`` at once, where ``multiprocessing.Pool`` hangs forever).
Beyond one machine the same function runs on a Dask cluster.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import queue
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from tfshards import cluster
from tfshards.cluster import Needs
from tfshards.errors import ConfigError, ShardError
from tfshards.mpcontext import die_with_parent, mp_context

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("auto", "process", "thread", "serial", "dask")


def check_options(executor: str, workers: int) -> None:
    """Reject an unknown executor or a worker count below one (configs call this)."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")


def resolve(
    executor: str,
    workers: int,
    protocols: Sequence[str],
    *,
    gil_free: bool = False,
    dask_address: str | None = None,
) -> str:
    """Pick the concrete executor for ``"auto"`` and reject impossible combinations.

    ``auto`` means threads where processes cannot work or do not pay: for
    ``memory://`` (a per-process store: what a worker process writes there
    never reaches the parent) and when ``gil_free`` (the per-record loop runs
    in :mod:`tfshards.native` without the GIL: threads start in microseconds,
    a process pool in tens of milliseconds). Otherwise processes. A Dask
    scheduler address means ``dask``; with a local executor it is refused.
    """
    check_options(executor, workers)
    in_memory = "memory" in protocols
    if cluster.is_remote(dask_address):
        if executor not in ("auto", "dask"):
            raise ConfigError(
                f"a Dask scheduler address ({dask_address}) needs executor 'dask' "
                f"(or 'auto'), got {executor!r}"
            )
        executor = "dask"
    if executor == "auto":
        if in_memory:
            return "thread"
        if workers == 1:
            return "serial"
        return "thread" if gil_free else "process"
    if in_memory and executor in ("process", "dask"):
        raise ConfigError(
            f"memory:// lives in one process, so executor {executor!r} cannot share it; "
            "use executor 'thread' or 'serial'"
        )
    return executor


def _pool_worker_init(cwd: str, owner: int) -> None:
    die_with_parent(owner)  # a SIGKILLed writer must not leave its workers behind
    _worker_init(cwd)


def _worker_init(cwd: str) -> None:
    # DVC runs stages from the repository root; a transform `mypkg.mod:fn`
    # given there must import in the workers too.
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def _noop() -> None:
    """Submitted once per worker by :class:`LocalPool` to make the pool start its processes."""


class LocalPool:
    """``workers`` processes for one job (this one and ``workers - 1`` others), or threads.

    The calling process works too, taking tasks from the back of the queue
    while the pool's workers take them from the front, so a 2-worker job
    starts one process, not two. On this project's machine a freshly started
    worker runs its first shards 2-3x slower than a warm one (page faults on
    copy-on-write and new memory): every worker not started is time saved.
    Threads cost nothing to start: ``workers`` of them take every task from one
    queue, the next as soon as one is free, and the caller waits.

    Started on construction: a forked worker's RSS counts every page of the
    parent it was forked from, so a caller about to load a large listing
    starts its pool first, and peak RSS then stays flat as the data set grows.
    """

    def __init__(self, executor: str, workers: int) -> None:
        self._pool: cf.Executor | None = None
        self._workers = workers
        self._threads = executor == "thread"
        if workers > 1:
            self._pool = _new_pool(executor, workers if self._threads else workers - 1)
            if executor == "process":
                for _ in range(workers - 1):  # fork context: the first submit forks them all
                    self._pool.submit(_noop)

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def run(
        self, fn: Callable[[T], R], tasks: Sequence[T], describe: Callable[[T], str]
    ) -> Iterator[tuple[int, R]]:
        if self._pool is None:
            for i, task in enumerate(tasks):
                yield i, fn(task)
            return
        if self._threads:
            yield from _run_threads(self._pool, fn, tasks)
        else:
            yield from _run_pool(self._pool, self._workers - 1, fn, tasks, describe)


@contextlib.contextmanager
def started(executor: str, workers: int) -> Iterator[LocalPool | None]:
    """The :class:`LocalPool` :func:`run` would make, started now; None for serial and dask."""
    if executor not in ("process", "thread"):
        yield None
        return
    with LocalPool(executor, workers) as pool:
        yield pool


def _new_pool(executor: str, workers: int) -> cf.Executor:
    if executor == "thread":
        return cf.ThreadPoolExecutor(max_workers=workers)
    return cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp_context(),
        initializer=_pool_worker_init,
        initargs=(os.getcwd(), os.getpid()),
    )


def run(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    *,
    executor: str,
    workers: int,
    dask_address: str | None = None,
    describe: Callable[[T], str] = str,
    pool: LocalPool | None = None,
    needs: Needs | None = None,
    note: Callable[[str], object] | None = None,
) -> Iterator[tuple[int, R]]:
    """Yield ``(task index, result)`` as tasks finish.

    The first failing task stops the run: pending tasks are cancelled and its
    exception (a :class:`~tfshards.errors.TfshardsError` arrives whole) is
    re-raised. A worker process that dies (SIGKILL, OOM) becomes a
    :class:`ShardError` naming the tasks that were in flight. ``pool`` (from
    :func:`started`, for a ``process`` or ``thread`` executor) is used instead
    of a new one, and left running. On Dask, ``needs`` is checked on every
    worker before a task is shipped and ``note`` gets the line saying what
    ran (see :mod:`tfshards.cluster`).
    """
    if not tasks:
        return
    if executor == "dask":
        yield from cluster.run(fn, tasks, workers, dask_address, needs or Needs(), note)
        return
    if executor not in ("process", "thread", "serial"):
        raise ConfigError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if pool is not None:
        yield from pool.run(fn, tasks, describe)
        return
    size = 1 if executor == "serial" else min(workers, len(tasks))
    with LocalPool(executor, size) as own:  # one worker: this process alone, no pool
        yield from own.run(fn, tasks, describe)


def in_order(
    results: Iterable[tuple[int, R]], count: int, on_result: Callable[[R], object]
) -> list[R]:
    """What :func:`run` yields, back in task order; ``on_result`` sees each as it arrives."""
    found: dict[int, R] = {}
    for i, result in results:
        found[i] = result
        on_result(result)
    return [found[i] for i in range(count)]


def _run_threads(
    pool: cf.Executor, fn: Callable[[T], R], tasks: Sequence[T]
) -> Iterator[tuple[int, R]]:
    """Every task queued at once; the first error cancels those not started."""
    futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
    try:
        for future in cf.as_completed(futures):
            yield futures[future], future.result()
    finally:
        for future in futures:
            future.cancel()


def _run_pool(
    pool: cf.Executor,
    workers: int,
    fn: Callable[[T], R],
    tasks: Sequence[T],
    describe: Callable[[T], str],
) -> Iterator[tuple[int, R]]:
    """Run ``tasks`` on ``pool`` (``workers`` wide) and in this process; see :class:`LocalPool`.

    The pool gets tasks from the front, two per worker at a time (one running,
    one queued), and this process takes the last task left between handing
    them out. Nothing handed to the pool is ever taken back: cancelled
    futures trip CPython 3.11's clean-up of a broken pool (``InvalidStateError``
    in its manager thread, leaving the other futures pending forever).
    """
    done: queue.SimpleQueue[cf.Future[R]] = queue.SimpleQueue()
    in_flight: dict[cf.Future[R], int] = {}
    front, back = 0, len(tasks) - 1
    try:
        while front <= back or in_flight:
            while len(in_flight) < 2 * workers and front <= back:
                future = pool.submit(fn, tasks[front])
                in_flight[future] = front
                future.add_done_callback(done.put)
                front += 1
            mine = front <= back
            if mine:
                yield back, fn(tasks[back])
                back -= 1
            try:
                future = done.get(block=not mine)
                while True:
                    result = future.result()  # raises the task's error, or BrokenProcessPool
                    yield in_flight.pop(future), result
                    future = done.get(block=False)
            except queue.Empty:
                pass
    except BrokenProcessPool as exc:
        lost = [describe(tasks[i]) for i in sorted(in_flight.values())]
        raise ShardError(
            f"a worker process died (killed by a signal or out of memory) while working on "
            f"{', '.join(lost[:4])}{' ...' if len(lost) > 4 else ''}; "
            "finished shards are kept: run again to resume",
            shards=lost,
        ) from exc
