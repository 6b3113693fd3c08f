"""Walk a local label folder in listing order: every path comes out already sorted.

A folder's children are visited by the key ``name`` for a file and
``name + "/"`` for a folder; every path below a folder starts with that key,
so no sibling's key falls between them and the walk gives the paths in plain
``str`` order with no sort over the whole tree (``"a b/x" < "a/y"``: the
folder ``a`` is visited by ``"a/"``). Memory is one folder's names per level.

The walk yields a :class:`Folder` when it first reads one (its kept files,
sorted, so they can be stat'ed and hashed together), then :class:`Run` pieces
of it between its subfolders' own pieces, in order.
"""

from __future__ import annotations

import bisect
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tfshards.errors import InputError
from tfshards.listing.walker import (
    TreeFilter,
    check_link_label,
    checked_name,
    unreadable,
    why,
)


@dataclass(eq=False)
class Folder:
    """One folder's kept files, sorted; ``result`` is filled in by whoever hashes them."""

    path: str  # absolute folder to open
    rel_dir: str  # relative to the root, with a trailing "/"
    names: list[str]
    result: Any = field(default=None)


@dataclass(frozen=True)
class Run:
    """Files ``lo:hi`` of ``folder``, the next paths in listing order."""

    folder: Folder
    lo: int
    hi: int
    last: bool  # no run of this folder follows


Step = Folder | Run


def walk_sorted(base: str, prefix: str, filt: TreeFilter, skipped: Counter[str]) -> Iterator[Step]:
    """The folders under ``base`` (relative name ``prefix``) and their runs, in path order.

    Follows linked folders (data sets are often assembled from links) but
    stops at a link to one of its own parents, and counts what it skips in
    ``skipped``; the checks and messages are those of :mod:`tfshards.listing.walker`.
    """
    if os.path.islink(base.rstrip(os.sep)):
        check_link_label(base.rstrip(os.sep), base, prefix)
    top = os.stat(base)
    yield from _visit(base, prefix, ((top.st_dev, top.st_ino),), base, prefix, filt, skipped)


def _visit(
    directory: str,
    rel_dir: str,
    ancestors: tuple[tuple[int, int], ...],
    base: str,
    prefix: str,
    filt: TreeFilter,
    skipped: Counter[str],
) -> Iterator[Step]:
    names, subdirs = _read_folder(directory, rel_dir, ancestors, base, prefix, filt, skipped)
    folder = Folder(directory, rel_dir, names)
    if names:
        yield folder
    lo = 0
    for key, path, ino in subdirs:
        hi = bisect.bisect_left(names, key, lo)  # the files before "<sub>/"
        if hi > lo:
            yield Run(folder, lo, hi, False)
            lo = hi
        sub_rel = rel_dir + key
        yield from _visit(path, sub_rel, (*ancestors, ino), base, prefix, filt, skipped)
    if names:
        yield Run(folder, lo, len(names), True)


def _read_folder(
    directory: str,
    rel_dir: str,
    ancestors: tuple[tuple[int, int], ...],
    base: str,
    prefix: str,
    filt: TreeFilter,
    skipped: Counter[str],
) -> tuple[list[str], list[tuple[str, str, tuple[int, int]]]]:
    """Sorted kept file names, and ``(name + "/", path, (dev, ino))`` per subfolder, sorted."""
    try:
        it = os.scandir(directory)
    except OSError as exc:
        raise InputError(f"{directory}: cannot list folder ({why(exc)})", path=directory) from None
    files: list[str] = []
    subdirs: list[tuple[str, str, tuple[int, int]]] = []
    others: list[str] = []
    with it:
        for entry in it:
            name = entry.name
            if name[0] == ".":
                skipped["hidden"] += 1
                continue
            if not name.isascii():
                checked_name(rel_dir + name, base)
            try:  # is_dir follows symlinks: datasets are often assembled from links
                if not entry.is_dir():
                    if entry.is_file():  # the directory entry's type: no stat unless a link
                        files.append(name)
                    else:  # socket, FIFO, device, dangling symlink
                        others.append(name)
                    continue
                st = entry.stat()
            except OSError as exc:  # a symlink loop, a path longer than PATH_MAX
                raise unreadable(entry.path, exc) from None
            key = (st.st_dev, st.st_ino)
            if key in ancestors:
                raise InputError(
                    f"{entry.path}: symlink loop: expected a folder below the root, "
                    "found a link to one of its own parents",
                    path=entry.path,
                )
            if entry.is_symlink():
                check_link_label(entry.path, base, prefix)
            subdirs.append((name + "/", entry.path, key))
    reason = filt.reason
    exts = filt.extensions
    if filt.glob is None and exts is not None:  # the usual filter: one pass, no call per name
        kept = [n for n in files if (d := n.rfind(".")) > 0 and n[d:].lower() in exts]
        if len(kept) < len(files):
            skipped["extension"] += len(files) - len(kept)
    elif filt.glob is None:
        kept = files
    else:
        kept = []
        for name in files:
            skip = reason(rel_dir + name)
            if skip is None:
                kept.append(name)
            else:
                skipped[skip] += 1
    for name in others:
        skipped[reason(rel_dir + name) or "not-a-file"] += 1
    kept.sort()
    subdirs.sort()
    return kept, subdirs
