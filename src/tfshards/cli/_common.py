"""What every command shares: one-line errors and the worker-count default."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Annotated, ParamSpec, TypeVar

import typer

from tfshards.errors import TfshardsError

P = ParamSpec("P")
R = TypeVar("R")


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a :class:`TfshardsError` into one line on stderr and exit code 1.

    Anything else is a bug and keeps its traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except TfshardsError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def default_workers() -> int:
    """All cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Options shared by the commands that fan out over shards (write, validate).
Workers = Annotated[
    int,
    typer.Option(help="Shards worked on at once (default: all cores)."),
]
Executor = Annotated[
    str,
    typer.Option(
        help="auto | process | thread | serial | dask. auto: threads when the per-record "
        "loop runs in the compiled tfshards._native (no transform), else processes."
    ),
]
DaskAddress = Annotated[
    str | None,
    typer.Option(
        help="Dask scheduler to run on, e.g. tcp://scheduler:8786 (implies --executor dask; "
        "--executor dask without it starts a local cluster)."
    ),
]
SharedFs = Annotated[
    bool,
    typer.Option(
        help="With --dask-address: local paths are on a filesystem every worker mounts at "
        "the same path (without it they are refused: each worker would use its own disk)."
    ),
]
ShowProgress = Annotated[bool, typer.Option(help="Show progress.")]
