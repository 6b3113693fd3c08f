"""The executors of one machine (serial, threads, a process pool) and the one process-pool builder.

Processes use ``concurrent.futures.ProcessPoolExecutor``: a SIGKILLed worker
raises ``BrokenProcessPool`` at once, where ``multiprocessing.Pool`` hangs
forever.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing.context
import os
import queue
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from tfshards.errors import ShardError
from tfshards.run.executor import Executor, Needs
from tfshards.run.mpcontext import die_with_parent, mp_context

T = TypeVar("T")
R = TypeVar("R")


def process_pool(
    workers: int, context: multiprocessing.context.BaseContext | None = None
) -> cf.ProcessPoolExecutor:
    """``workers`` processes that die with this one; ``context`` defaults to :func:`mp_context`."""
    return cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context or mp_context(),
        initializer=_worker_init,
        initargs=(os.getcwd(), os.getpid()),
    )


def _worker_init(cwd: str, owner: int) -> None:
    die_with_parent(owner)  # a SIGKILLed caller must not leave its workers behind
    # DVC runs stages from the repository root; a transform `mypkg.mod:fn`
    # given there must import in the workers too.
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def _noop() -> None:
    """Submitted once per worker by :class:`ProcessExecutor`: the pool starts its processes."""


class SerialExecutor(Executor):
    """Every task in this process, one after another."""

    name = "serial"
    in_process = True

    def map(
        self,
        fn: Callable[[T], R],
        tasks: Sequence[T],
        *,
        describe: Callable[[T], str] = str,
        needs: Needs | None = None,
        note: Callable[[str], object] | None = None,
    ) -> Iterator[tuple[int, R]]:
        for i, task in enumerate(tasks):
            yield i, fn(task)


class ThreadExecutor(Executor):
    """``workers`` threads take every task from one queue, the next as soon as one is free.

    Threads cost nothing to start; the caller waits. One worker: the caller alone.
    """

    name = "thread"
    in_process = True
    _pool: cf.ThreadPoolExecutor | None = None

    def __enter__(self) -> ThreadExecutor:
        if self.options.workers > 1:
            self._pool = cf.ThreadPoolExecutor(max_workers=self.options.workers)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def map(
        self,
        fn: Callable[[T], R],
        tasks: Sequence[T],
        *,
        describe: Callable[[T], str] = str,
        needs: Needs | None = None,
        note: Callable[[str], object] | None = None,
    ) -> Iterator[tuple[int, R]]:
        if self._pool is None:
            yield from enumerate(map(fn, tasks))  # one worker: this process alone
            return
        futures = {self._pool.submit(fn, task): i for i, task in enumerate(tasks)}
        try:
            for future in cf.as_completed(futures):
                yield futures.pop(future), future.result()  # popped: its result is let go
        finally:
            for future in futures:
                future.cancel()


class ProcessExecutor(Executor):
    """``workers`` processes for one job: this one and ``workers - 1`` others.

    The calling process works too, taking tasks from the back of the queue
    while the pool's workers take them from the front, so a 2-worker job
    starts one process, not two. On this project's machine a freshly started
    worker runs its first shards 2-3x slower than a warm one (page faults on
    copy-on-write and new memory): every worker not started is time saved.

    Entering starts the processes: a forked worker's RSS counts every page of
    the parent it was forked from, so a caller about to load a large listing
    enters first, and peak RSS then stays flat as the data set grows.
    """

    name = "process"
    _pool: cf.ProcessPoolExecutor | None = None

    @property
    def _others(self) -> int:
        """The pool's processes: all the workers asked for when the tasks run the user's
        code, since this process then only hands them out (a crash in a worker is one line
        naming its shard; a crash here would end the command); else one fewer."""
        return self.options.workers - (0 if self.user_code else 1)

    def __enter__(self) -> ProcessExecutor:
        others = self._others
        if others > 0:
            self._pool = process_pool(others)
            for _ in range(others):  # fork context: the first submit forks them all
                self._pool.submit(_noop)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def map(
        self,
        fn: Callable[[T], R],
        tasks: Sequence[T],
        *,
        describe: Callable[[T], str] = str,
        needs: Needs | None = None,
        note: Callable[[str], object] | None = None,
    ) -> Iterator[tuple[int, R]]:
        """See :meth:`Executor.map`; a worker process that dies is a :class:`ShardError`.

        The pool gets tasks from the front, two per worker at a time (one
        running, one queued), and this process takes the last task left
        between handing them out. Nothing handed to the pool is ever taken
        back: cancelled futures trip CPython 3.11's clean-up of a broken pool
        (``InvalidStateError`` in its manager thread, leaving the other
        futures pending forever).
        """
        if self._pool is None:
            yield from enumerate(map(fn, tasks))  # one worker: this process alone
            return
        workers = self._others
        done: queue.SimpleQueue[cf.Future[R]] = queue.SimpleQueue()
        in_flight: dict[cf.Future[R], int] = {}
        front, back = 0, len(tasks) - 1
        try:
            while front <= back or in_flight:
                while len(in_flight) < 2 * workers and front <= back:
                    future = self._pool.submit(fn, tasks[front])
                    in_flight[future] = front
                    future.add_done_callback(done.put)
                    front += 1
                mine = front <= back and not self.user_code
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
                f"{(needs or Needs()).after}",
                shards=lost,
            ) from exc
