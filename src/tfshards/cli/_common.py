"""What every command shares: one-line errors and the worker-count default."""

from __future__ import annotations

import errno
import functools
import inspect
from collections.abc import Callable
from typing import Annotated, ParamSpec, TypeVar

import typer

from tfshards.errors import TfshardsError
from tfshards.run.mpcontext import cpu_count
from tfshards.storage import backend_error, reject_credentials

P = ParamSpec("P")
R = TypeVar("R")


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a :class:`TfshardsError` into one line on stderr and exit code 1.

    Before the command runs, every text argument that is a URL with a
    password (``s3://KEY:SECRET@bucket``) is refused without being repeated.
    So are an ``OSError`` that names its file (a full or read-only disk under
    an output the library does not wrap) and the exceptions of remote storage
    clients (endpoint down, no credentials). Anything else is a bug and keeps
    its traceback.
    """

    params = inspect.signature(fn).parameters  # no default: an ARGUMENT, else an --option
    spelled = {
        name: name.upper() if p.default is p.empty else "--" + name.replace("_", "-")
        for name, p in params.items()
    }

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            for name, value in kwargs.items():
                if isinstance(value, str):
                    reject_credentials(value, spelled.get(name, name))
            return fn(*args, **kwargs)
        except TfshardsError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        except OSError as exc:  # an output the library does not wrap: disk full, read-only
            if exc.filename is None:
                raise
            code = errno.errorcode.get(exc.errno or 0)
            why = f"{exc.strerror} ({code})" if code else exc.strerror
            typer.echo(f"error: {exc.filename}: {why}", err=True)
            raise typer.Exit(1) from None
        except Exception as exc:  # a storage client's own errors; anything else is a bug
            error = backend_error(exc)
            if error is None:
                raise
            urls = [v for v in kwargs.values() if isinstance(v, str) and "://" in v]
            typer.echo(f"error: {''.join(u + ': ' for u in urls[:1])}{error}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def default_workers() -> int:
    """All cores this process may use."""
    return cpu_count()


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


def optional_int(value: str, option: str) -> int | None:
    """An ``INT|none`` option's value: None for ``none``/``null``/empty."""
    if value.strip().lower() in ("", "none", "null"):
        return None
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(
            f"expected an integer or none, got {value!r}", param_hint=option
        ) from None
