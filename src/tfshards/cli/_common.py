"""What every command shares: one-line errors, how a command is run, the worker-count default."""

from __future__ import annotations

import errno
import functools
import gc
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
import typer.exceptions

from tfshards import heavyimport
from tfshards.errors import TfshardsError, one_line
from tfshards.processes import cpu_count
from tfshards.storage import backend_error, reject_credentials

P = ParamSpec("P")
R = TypeVar("R")


# Optional dependencies, by the module a missing one fails to import, and the extra
# that installs it (pyproject.toml).
_TF = "pip install 'tfshards[cpu]' (or 'tfshards[gpu]' on a machine with a GPU)"
EXTRAS = {
    "tensorflow": _TF,
    "keras": _TF,
    "tensorflow_datasets": "pip install 'tfshards[bench]'",
    "dask": "pip install 'tfshards[dask]'",
    "distributed": "pip install 'tfshards[dask]'",
    "s3fs": "pip install 'tfshards[s3]'",
    "gcsfs": "pip install 'tfshards[gcs]'",
}


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a :class:`TfshardsError` into one line on stderr and exit code 1.

    Before the command runs, every text argument that is a URL with a
    password (``s3://KEY:SECRET@bucket``) is refused without being repeated.
    So are an ``OSError`` that names its file (a full or read-only disk under
    an output the library does not wrap) and the exceptions of remote storage
    clients (endpoint down, no credentials). Anything else is a bug and keeps
    its traceback. Missing compiled loops are said first, once
    (:func:`announce_python_loops`).
    """

    params = inspect.signature(fn).parameters  # no default: an ARGUMENT, else an --option
    spelled = {
        name: name.upper() if p.default is p.empty else "--" + name.replace("_", "-")
        for name, p in params.items()
    }

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        announce_python_loops()
        try:
            for name, value in kwargs.items():
                if isinstance(value, str):
                    reject_credentials(value, spelled.get(name, name))
            return fn(*args, **kwargs)
        except TfshardsError as exc:
            typer.echo(f"error: {one_line(str(exc))}", err=True)
            raise typer.Exit(1) from None
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").partition(".")[0]
            if missing not in EXTRAS:
                raise
            typer.echo(
                f"error: this needs {missing}, which is not installed: {EXTRAS[missing]}", err=True
            )
            raise typer.Exit(1) from None
        except OSError as exc:  # an output the library does not wrap: disk full, read-only
            if exc.filename is None:  # s3fs turns a refused request into a bare PermissionError
                _say_backend_error(exc, kwargs)
                raise
            code = errno.errorcode.get(exc.errno or 0)
            why = f"{exc.strerror} ({code})" if code else exc.strerror
            from tfshards.atomicfile import published_name  # only when an error is said

            where = published_name(str(exc.filename))  # not its temp file's name
            typer.echo(f"error: {where}: {why}", err=True)
            raise typer.Exit(1) from None
        except Exception as exc:  # a storage client's own errors; anything else is a bug
            _say_backend_error(exc, kwargs)
            raise

    return wrapper


# A Dask scheduler's address (--dask-address) is a URL too, but never the storage at fault.
_SCHEDULER_SCHEMES = ("tcp://", "tls://", "ucx://", "inproc://", "ws://", "wss://")


def _say_backend_error(exc: BaseException, kwargs: dict[str, Any]) -> None:
    """One line and exit 1 when a storage client's error is in ``exc`` or its causes."""
    error = backend_error(exc)
    if error is None:
        return
    urls = [
        v
        for v in kwargs.values()
        if isinstance(v, str) and "://" in v and not v.startswith(_SCHEDULER_SCHEMES)
    ]
    typer.echo(f"error: {''.join(u + ': ' for u in urls[:1])}{error}", err=True)
    raise typer.Exit(1) from None


_announced = False


def announce_python_loops() -> None:
    """Say once per process, on stderr, that the compiled loops are missing and how to get them.

    Called as a command starts (after its options parsed, so never for
    ``--help`` or ``--version``), not on import: a library user is not told,
    and ``TFSHARDS_PURE_PYTHON=1`` (the Python loops asked for) silences it.
    """
    global _announced
    from tfshards.format import native

    if _announced or native.MISSING is None:
        return
    _announced = True
    typer.echo(
        f"note: tfshards' compiled loops (tfshards.format._native) are {native.MISSING}, so "
        "the Python loops run, 1.5-3x slower: install the tfshards wheel, which carries them "
        "(`make dist` in a clone, then pip install dist/tfshards-*.whl), or set "
        "TFSHARDS_PURE_PYTHON=1 to keep the Python loops without this note",
        err=True,
    )


INTERRUPTED = 130  # 128 + SIGINT, the shell's code for Ctrl-C


def run_app(app: typer.Typer, args: Sequence[str] | None = None) -> NoReturn:
    """Run ``app`` and exit: a bad option or value is one line naming it (exit 2), an
    interrupt is one line (exit 130), never a usage box or a traceback.

    A value from ``params.yaml`` that does not parse (``num_shards: abc``) reaches
    the command as an option, so the line names the option and the value
    (``'abc' is not a valid int``).
    TensorFlow's C++ start-up logging (``E0000 ...`` lines that are not errors) is
    silenced unless ``TF_CPP_MIN_LOG_LEVEL`` is already set.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    heavyimport.own_process()  # TensorFlow's objects, once imported, frozen for good
    warnings.formatwarning = _warning_line
    try:
        code: Any = app(args=list(args) if args is not None else None, standalone_mode=False)
    except typer.exceptions.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as --help
            typer.echo(exc.ctx.get_help())  # type: ignore[attr-defined]
            _exit(0)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = " ".join(exc.format_message().split())
        if message.startswith("No such option: -") and not message.startswith("No such option: --"):
            message += "; a value that starts with '-' (a path) goes after `--`"  # -dash/a.jpg
        typer.echo(f"error: {message}{hint}", err=True)
        _exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        code = INTERRUPTED
    if code == INTERRUPTED:  # typer turns Ctrl-C into this exit code, silently
        typer.echo(f"error: interrupted{_RESUMES.get(_command(args), '')}", err=True)
    _exit(code if isinstance(code, int) else 0)


def _exit(code: int) -> NoReturn:
    """Exit with ``code``, without the collector walking every object again as the
    interpreter tears the modules down.

    The garbage there is now is collected (its finalizers run, files close); what
    lives on is frozen, so the collections the teardown sets off skip it. After
    ``import tensorflow, keras``, exiting took ~0.8 s of CPU more than this (3.0-3.2 s
    against 2.3-2.5 s for the whole process, two runs each on 2 cores): every command
    that trains paid it.
    """
    gc.collect()
    gc.freeze()
    sys.exit(code)


_PYTHON_FORMAT = warnings.formatwarning


def _warning_line(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: Any = None
) -> str:
    """tfshards' own warnings (a split off the fraction asked) as one ``warning:`` line, like
    the commands' other warnings; another library's keep Python's form."""
    if category.__module__.split(".")[0] == "tfshards":
        return f"warning: {message}\n"
    return _PYTHON_FORMAT(message, category, filename, lineno, line)


# What an interrupted command leaves for the next run, by command.
_RESUMES = {
    "write": " (finished shards are kept; a write resumes)",
    "train": " (the last checkpoint is kept; the next run resumes from it)",
}


def _command(args: Sequence[str] | None) -> str:
    """The subcommand of ``args`` (the process's arguments when None) that leaves something
    for the next run, or ``""``: global options and their values come before it."""
    words = sys.argv[1:] if args is None else args
    return next((w for w in words if w in _RESUMES), "")


def run_command(
    command: Callable[..., Any], context_settings: dict[str, Any] | None = None
) -> NoReturn:
    """Run one command function as a program (a ``stages/*.py`` script), as :func:`run_app`."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command(context_settings=context_settings)(command)
    run_app(app)


def default_workers() -> int:
    """All cores this process may use."""
    return cpu_count()
