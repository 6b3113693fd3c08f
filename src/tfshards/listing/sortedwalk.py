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
import functools
import os
import re
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tfshards.errors import InputError
from tfshards.format import native
from tfshards.listing import contenthash
from tfshards.listing.treefilter import TreeFilter
from tfshards.listing.walker import (
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
    stats: bytes | None  # five int64 per name (contenthash.stat_local), when asked for
    result: Any = field(default=None)


@dataclass(frozen=True)
class Run:
    """Files ``lo:hi`` of ``folder``, the next paths in listing order."""

    folder: Folder
    lo: int
    hi: int
    last: bool  # no run of this folder follows


Step = Folder | Run
Ancestors = tuple[tuple[int, int], ...]  # (st_dev, st_ino) of each folder above
# The walk recurses a level a folder; Python's recursion limit (1,000) stopped it near
# 1,000 levels with a RecursionError. No data set nests folders this deep.
MAX_DEPTH = 512
Subdir = tuple[str, str, tuple[int, int]]  # (name + "/", path, (st_dev, st_ino))
_F, _D = ord("f"), ord("d")


def walk_sorted(
    base: str, prefix: str, filt: TreeFilter, skipped: Counter[str], with_stats: bool
) -> Iterator[Step]:
    """The folders under ``base`` (relative name ``prefix``) and their runs, in path order.

    Follows linked folders (data sets are often assembled from links) but
    stops at a link to one of its own parents, and counts what it skips in
    ``skipped``; the checks and messages are those of :mod:`tfshards.listing.walker`.
    With ``with_stats`` each folder carries its files' stats, taken as it is read.
    """
    if os.path.islink(base.rstrip(os.sep)):
        check_link_label(base.rstrip(os.sep), base, prefix)
    top = os.stat(base)
    walk = _Walk(base, prefix, filt, skipped, with_stats)
    yield from walk.visit(base, prefix, ((top.st_dev, top.st_ino),))


@dataclass
class _Walk:
    base: str
    prefix: str
    filt: TreeFilter
    skipped: Counter[str]
    with_stats: bool
    # Each folder once: reached again through a link, its files would be listed twice,
    # and links to links doubled the work each level (15 files became 32,767 entries).
    seen: dict[tuple[int, int], str] = field(default_factory=dict)

    def visit(self, directory: str, rel_dir: str, ancestors: Ancestors) -> Iterator[Step]:
        scan = getattr(native.NATIVE, "scan_folder", None)
        if scan is not None:
            names, subdirs = self._read_native(scan, directory, rel_dir, ancestors)
        else:
            names, subdirs = self._read(directory, rel_dir, ancestors)
        stats = contenthash.stat_local(directory, names) if self.with_stats and names else None
        folder = Folder(directory, rel_dir, names, stats)
        if names:
            yield folder
        lo = 0
        for key, path, ino in sorted(subdirs):
            hi = bisect.bisect_left(names, key, lo)  # the files before "<sub>/"
            if hi > lo:
                yield Run(folder, lo, hi, False)
                lo = hi
            yield from self.visit(path, rel_dir + key, (*ancestors, ino))
        if names:
            yield Run(folder, lo, len(names), True)

    def _subdir(self, path: str, st: os.stat_result, link: bool, ancestors: Ancestors) -> Subdir:
        if len(ancestors) > MAX_DEPTH:
            raise InputError(
                f"{path}: expected at most {MAX_DEPTH} folder levels below the root, found more",
                path=path,
            )
        key = (st.st_dev, st.st_ino)
        if key in ancestors:
            raise InputError(
                f"{path}: symlink loop: expected a folder below the root, "
                "found a link to one of its own parents",
                path=path,
            )
        first = self.seen.setdefault(key, path)
        if first != path:
            raise InputError(
                f"{path}: expected each folder once, found it also as {first} (through "
                "a link): its files would be listed twice",
                path=path,
            )
        if link:
            check_link_label(path, self.base, self.prefix)
        return os.path.basename(path) + "/", path, key

    @functools.cached_property
    def _suffixes(self) -> re.Pattern[str] | None:
        """Any kept suffix at a name's end (names joined by "/"), if no suffix has two dots."""
        exts = self.filt.extensions
        if exts is None or any("." in ext[1:] for ext in exts):
            return None
        alternatives = "|".join(map(re.escape, sorted(ext[1:] for ext in exts)))
        return re.compile(rf"\.(?:{alternatives})(?=/|\Z)")

    def _all_match(self, files: list[str]) -> bool:
        """True when every (ASCII) name ends with a kept suffix: one regex pass over all."""
        joined = "/".join(files)
        pattern = self._suffixes
        if pattern is None or not joined.isascii():  # non-ASCII lower() may depend on context
            return False
        return len(pattern.findall(joined.lower())) == len(files)

    def _keep(self, rel_dir: str, files: list[str]) -> list[int] | None:
        """Positions of the files the filter keeps (skips counted), or None for all."""
        exts = self.filt.extensions
        if self.filt.glob is None:  # the usual filter: one pass, no call per name
            if exts is None:
                return None
            if self._all_match(files):
                return None
            ok = [(d := n.rfind(".")) > 0 and n[d:].lower() in exts for n in files]
            if all(ok):
                return None
            self.skipped["extension"] += len(files) - sum(ok)
            return [i for i, keep in enumerate(ok) if keep]
        keep = []
        for i, name in enumerate(files):
            skip = self.filt.reason(rel_dir + name)
            if skip is None:
                keep.append(i)
            else:
                self.skipped[skip] += 1
        return keep

    def _read_native(
        self, scan: Any, directory: str, rel_dir: str, ancestors: Ancestors
    ) -> tuple[list[str], list[Subdir]]:
        """Kept file names (sorted) and the subfolders, read by one C call."""
        try:
            names, kinds, hidden = scan(os.fsencode(directory))
        except OSError as exc:
            raise _cannot_list(directory, exc) from None
        self.skipped["hidden"] += hidden
        if not "".join(names).isascii():
            for name in names:
                checked_name(rel_dir + name, self.base)
        subdirs: list[Subdir] = []
        if kinds.count(_F) == len(names):
            files = names
        else:
            files, others = [], []
            for name, kind in zip(names, kinds, strict=True):
                if kind == _F:
                    files.append(name)
                    continue
                path = os.path.join(directory, name)
                try:  # links are followed: datasets are often assembled from them
                    st = os.stat(path)
                except FileNotFoundError:  # a dangling link
                    others.append(name)
                    continue
                except OSError as exc:  # a symlink loop, a path longer than PATH_MAX
                    raise unreadable(path, exc) from None
                if stat.S_ISDIR(st.st_mode):
                    link = kind != _D and os.path.islink(path)
                    subdirs.append(self._subdir(path, st, link, ancestors))
                elif stat.S_ISREG(st.st_mode):
                    files.append(name)
                else:
                    others.append(name)
            for name in others:
                self.skipped[self.filt.reason(rel_dir + name) or "not-a-file"] += 1
        keep = self._keep(rel_dir, files)
        return (files if keep is None else [files[i] for i in keep]), subdirs

    def _read(
        self, directory: str, rel_dir: str, ancestors: Ancestors
    ) -> tuple[list[str], list[Subdir]]:
        """Kept file names (sorted) and the subfolders, by ``os.scandir``."""
        try:
            it = os.scandir(directory)
        except OSError as exc:
            raise InputError(
                f"{directory}: cannot list folder ({why(exc)})", path=directory
            ) from None
        files: list[str] = []
        subdirs: list[Subdir] = []
        others: list[str] = []
        with it:
            for entry in it:
                name = entry.name
                if name[0] == ".":
                    self.skipped["hidden"] += 1
                    continue
                if not name.isascii():
                    checked_name(rel_dir + name, self.base)
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
                subdirs.append(self._subdir(entry.path, st, entry.is_symlink(), ancestors))
        for name in others:
            self.skipped[self.filt.reason(rel_dir + name) or "not-a-file"] += 1
        files.sort()
        keep = self._keep(rel_dir, files)
        return (files if keep is None else [files[i] for i in keep]), subdirs


def _cannot_list(directory: str, exc: OSError) -> InputError:
    return InputError(f"{directory}: cannot list folder ({why(exc)})", path=directory)
