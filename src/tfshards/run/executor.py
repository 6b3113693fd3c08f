"""The executor seam: how to run one picklable function over many tasks, and on what.

An :class:`Executor` has one verb, :meth:`Executor.map`, yielding ``(task
index, result)`` as tasks finish; entering it starts its workers. The
built-in ones are ``serial``, ``thread`` and ``process``
(:mod:`tfshards.run.localexec`) and ``dask`` (:mod:`tfshards.run.cluster`), named
here as ``"module:Class"`` and imported on first use (those modules import this
one); another (Ray, a batch queue) is one subclass with a ``name``, registered
with :func:`register`. What a run asks for is a :class:`RunOptions`, shared by
write, validate, the generator and the sample writer; what its tasks need from
remote workers is a :class:`Needs`.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from tfshards.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")

AUTO = "auto"
# Spellings of earlier releases (from_files said "threads"/"processes"): still accepted.
OLD_NAMES = {"threads": "thread", "processes": "process"}
BUILTIN = {
    "serial": "tfshards.run.localexec:SerialExecutor",
    "thread": "tfshards.run.localexec:ThreadExecutor",
    "process": "tfshards.run.localexec:ProcessExecutor",
    "dask": "tfshards.run.cluster:DaskExecutor",
}
_REGISTRY: dict[str, type[Executor]] = {}  # imported or registered classes, by name


def canonical(name: str, option: str = "executor") -> str:
    """``name`` in today's vocabulary; an old spelling warns (DeprecationWarning) and maps."""
    new = OLD_NAMES.get(name)
    if new is None:
        return name
    warnings.warn(f"{option} {name!r} is deprecated; use {new!r}", DeprecationWarning, stacklevel=3)
    return new


def names() -> tuple[str, ...]:
    """``auto`` and every registered executor name, sorted."""
    return (AUTO, *sorted(BUILTIN.keys() | _REGISTRY.keys()))


@dataclass(frozen=True)
class Needs:
    """What the tasks of one run need from every remote (Dask) worker.

    Attributes:
        locations: data the tasks read or write, as URLs or absolute local paths.
        inputs: those of ``locations`` that must already exist (checked on the
            workers when local).
        transform: ``package.module:function`` the workers must import, or None.
        transform_identity: the client's :func:`tfshards.run.transform.identity` of
            it; a worker whose module source differs would write other bytes.
        shared_fs: the user states that local paths are on a filesystem every
            worker mounts at the same path.
        samples: a few files of the inputs every worker must see, found only when
            asked (a worker whose share is not mounted sees its empty mount point:
            every file of it failed as missing, and under ``on_error: skip`` a version
            of the rest was published).
        after: what a line saying the run was lost (its workers, its scheduler) ends
            with: what is kept and what to do.
    """

    locations: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    transform: str | None = None
    transform_identity: str = "none"
    shared_fs: bool = False
    samples: Callable[[], Sequence[str]] | None = None
    after: str = "finished shards are kept: run again to resume"  # ends a lost run's line


def is_remote(address: str | None) -> bool:
    """True when ``address`` names a scheduler (None and ``"local"`` start a local cluster)."""
    return address not in (None, "", "local")


@dataclass(frozen=True)
class RunOptions:
    """Where and how wide a run goes; validated (and old names mapped) on construction.

    Attributes:
        workers: tasks run at once (>= 1); a ``process`` run counts this process.
        executor: ``auto`` or a registered name (``serial``, ``thread``,
            ``process``, ``dask``); ``threads``/``processes`` still map, with a warning.
        address: a Dask scheduler address (implies ``dask``); None or
            ``"local"`` with ``dask`` starts a local cluster for the run.
        shared_fs: local paths are on a filesystem every remote worker mounts
            at the same path (without it, a scheduler address refuses them).
    """

    workers: int = 1
    executor: str = AUTO
    address: str | None = None
    shared_fs: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "executor", canonical(self.executor))
        if self.executor not in names():
            raise ConfigError(f"executor must be one of {names()}, got {self.executor!r}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")


class Executor(abc.ABC):
    """Runs tasks; a subclass sets ``name`` and the two capabilities, and implements ``map``.

    Attributes:
        name: what ``RunOptions.executor`` calls it.
        in_process: tasks run in this process's memory (so ``memory://`` works).
        remote: it can run on the scheduler named by ``RunOptions.address``.
    """

    name: ClassVar[str]
    in_process: ClassVar[bool] = False
    remote: ClassVar[bool] = False

    def __init__(self, options: RunOptions, *, user_code: bool = False) -> None:
        self.options = options
        # The tasks run the user's code (a transform): a crash there (a segfault, the OOM
        # killer) must end a worker, not the process that reports it.
        self.user_code = user_code

    def __enter__(self) -> Executor:
        """Start the workers now (a pool forked later would count the caller's data in its RSS)."""
        return self

    def __exit__(self, *exc: object) -> None:  # noqa: B027 - most executors hold nothing
        """Stop the workers; tasks not started are cancelled."""

    @abc.abstractmethod
    def map(
        self,
        fn: Callable[[T], R],
        tasks: Sequence[T],
        *,
        describe: Callable[[T], str] = str,
        needs: Needs | None = None,
        note: Callable[[str], object] | None = None,
    ) -> Iterator[tuple[int, R]]:
        """Yield ``(task index, result)`` as tasks finish.

        The first failing task stops the run: tasks not started are cancelled
        and its exception (a :class:`~tfshards.errors.TfshardsError` arrives
        whole) is re-raised. ``describe`` names a task in errors; ``needs``
        says what remote workers must have; ``note`` gets a line saying what ran.
        """


def register(cls: type[Executor]) -> type[Executor]:
    """Class decorator: make ``cls`` available as ``RunOptions(executor=cls.name)``."""
    _REGISTRY[cls.name] = cls
    return cls


def executor_class(name: str) -> type[Executor]:
    """The class registered as ``name``; a built-in one is imported on first use."""
    if name not in _REGISTRY:
        module, cls = BUILTIN[name].split(":")
        _REGISTRY[name] = getattr(importlib.import_module(module), cls)
    return _REGISTRY[name]


def check_options(executor: str, workers: int) -> None:
    """Reject an unknown executor or a worker count below one (configs call this)."""
    RunOptions(workers=workers, executor=executor)


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
    in :mod:`tfshards.format.native` without the GIL: threads start in microseconds,
    a process pool in tens of milliseconds). Otherwise processes. A Dask
    scheduler address means ``dask``; with a local executor it is refused.
    """
    executor = RunOptions(workers, executor).executor
    in_memory = "memory" in protocols
    if is_remote(dask_address):
        if executor != AUTO and not executor_class(executor).remote:
            raise ConfigError(
                f"a Dask scheduler address ({dask_address}) needs executor 'dask' "
                f"(or 'auto'), got {executor!r}"
            )
        executor = "dask" if executor == AUTO else executor
    if executor == AUTO:
        if in_memory:
            return "thread"
        if workers == 1:
            return "serial"
        return "thread" if gil_free else "process"
    if in_memory and not executor_class(executor).in_process:
        raise ConfigError(
            f"memory:// lives in one process, so executor {executor!r} cannot share it; "
            "use executor 'thread' or 'serial'"
        )
    return executor


def start(
    options: RunOptions,
    protocols: Sequence[str] = (),
    *,
    gil_free: bool = False,
    tasks: int | None = None,
    user_code: bool = False,
) -> Executor:
    """The executor ``options`` resolve to (see :func:`resolve`), at most ``tasks`` wide;
    ``user_code``: the tasks run the user's code (see :attr:`Executor.user_code`).

    Enter it (``with``) to start its workers.
    """
    workers = options.workers if tasks is None else max(1, min(options.workers, tasks))
    name = resolve(
        options.executor, workers, protocols, gil_free=gil_free, dask_address=options.address
    )
    options = dataclasses.replace(options, executor=name, workers=workers)
    return executor_class(name)(options, user_code=user_code)


def run(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    *,
    executor: str,
    workers: int,
    dask_address: str | None = None,
    describe: Callable[[T], str] = str,
    needs: Needs | None = None,
    note: Callable[[str], object] | None = None,
) -> Iterator[tuple[int, R]]:
    """One :meth:`Executor.map` on a freshly started ``executor`` (no ``auto``); see there."""
    if not tasks:
        return
    options = RunOptions(workers, executor, dask_address)
    if options.executor == AUTO:
        raise ConfigError(f"run needs a concrete executor, got {executor!r}; see resolve()")
    with start(options, tasks=len(tasks)) as pool:
        yield from pool.map(fn, tasks, describe=describe, needs=needs, note=note)


def in_order(
    results: Iterable[tuple[int, R]], count: int, on_result: Callable[[R], object]
) -> list[R]:
    """What :meth:`Executor.map` yields, in task order; ``on_result`` sees each as it arrives."""
    found: dict[int, R] = {}
    for i, result in results:
        found[i] = result
        on_result(result)
    return [found[i] for i in range(count)]
