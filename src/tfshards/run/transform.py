"""User transforms: ``package.module:function`` turning one raw file into features.

A transform is called as ``fn(path, data, label)`` with the file's path relative
to the listing root, its raw bytes and its label index, and returns a dict of
features: bytes/str, int, float, lists of those, or numpy arrays. It runs in
the writer's worker processes, once per file, so fixed preprocessing (decode,
resize, feature extraction) is paid offline instead of every epoch.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from tfshards.errors import TransformError, TransformOutputError

Transform = Callable[[str, bytes, int], Mapping[str, Any]]
RESERVED = ("label", "path", "sha256")  # written by tfshards itself for lineage
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _parse(spec: str) -> tuple[str, str]:
    if not _SPEC.match(spec):
        raise TransformError(
            f"transform {spec!r}: expected 'package.module:function'", transform=spec
        )
    module, func = spec.split(":")
    return module, func


@functools.lru_cache(maxsize=8)
def load(spec: str) -> Transform:
    """Import ``spec`` (``package.module:function``) and return the callable.

    The current directory is importable, as it is for ``python -m``.
    """
    module_name, func_name = _parse(spec)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TransformError(
            f"transform {spec!r}: cannot import module {module_name!r} ({exc})", transform=spec
        ) from exc
    except (Exception, SystemExit, GeneratorExit) as exc:  # a module's code can raise anything
        raise TransformError(
            f"transform {spec!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc})",
            transform=spec,
        ) from None
    fn = getattr(module, func_name, None)
    if fn is None:
        raise TransformError(
            f"transform {spec!r}: module {module_name!r} has no attribute {func_name!r}",
            transform=spec,
        )
    if not callable(fn):
        raise TransformError(
            f"transform {spec!r}: {func_name!r} is a {type(fn).__name__}, not a function",
            transform=spec,
        )
    return fn  # type: ignore[no-any-return]


def identity(spec: str | None) -> str:
    """What names a transform's behaviour: the spec plus a hash of its module's source.

    Editing the transform's module makes a new shard version.
    """
    if spec is None:
        return "none"
    fn = load(spec)
    try:
        source = inspect.getsource(sys.modules[fn.__module__])
    except (OSError, TypeError, KeyError):
        source = ""
    return f"{spec}@{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def apply(fn: Transform, spec: str, path: str, data: bytes, label: int) -> Mapping[str, Any]:
    """Call the transform; any exception it raises becomes a :class:`TransformError`.

    The message names the file and the cause, so ``on_error=skip`` can record it.
    """
    try:
        out = fn(path, data, label)
    except (Exception, SystemExit, GeneratorExit) as exc:  # a user's code can raise anything
        # (a sys.exit() there ended the write with its code and no word; Ctrl-C goes on)
        raise TransformError(
            f"{path}: transform {spec} failed: {type(exc).__name__}: {exc}",
            path=path,
            transform=spec,
        ) from exc
    if not isinstance(out, Mapping):
        raise TransformOutputError(
            f"transform {spec}: returned {type(out).__name__}, expected a dict of features",
            transform=spec,
        )
    for key in out:
        if key in RESERVED:
            raise TransformOutputError(
                f"transform {spec}: feature {key!r} is reserved (tfshards writes {RESERVED})",
                transform=spec,
                feature=key,
            )
    return out
