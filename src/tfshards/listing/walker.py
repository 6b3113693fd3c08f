"""Walk a folder tree into listing entries, labelled by their first folder (ImageFolder).

What a tree walk keeps and skips (:class:`TreeFilter`), the root's and the
label folders' checks, and the walk of storage other than local disk:
``fs.walk(detail=True)``, one directory listing at a time, content tokens
taken from the listing. Local trees are walked in path order by
:mod:`tfshards.listing.sortedwalk`, with the checks and messages here.
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from tfshards import storage
from tfshards.errors import InputError
from tfshards.listing.contenthash import storage_token
from tfshards.listing.entry import Entry
from tfshards.listing.treefilter import TreeFilter

FoundFile = tuple[str, int, str]  # (path relative to the root, size, token)
REMOTE_LISTERS = 16  # label folders listed at once on object stores (measured: bench/README.md)


def check_root(fs: Any, base: str, root: str) -> None:
    """Raise :class:`InputError` unless ``root`` is a readable folder."""
    try:
        if storage.is_local(fs):
            is_dir = stat.S_ISDIR(os.stat(base).st_mode)
            if is_dir and not os.access(base, os.R_OK | os.X_OK):
                raise PermissionError(13, "permission denied")
        else:
            is_dir = fs.info(base)["type"] == "directory"
    except FileNotFoundError:
        raise InputError(f"{root}: root folder not found", path=root) from None
    except OSError as exc:
        raise InputError(f"{root}: cannot read root folder ({why(exc)})", path=root) from None
    if not is_dir:
        raise InputError(f"{root}: expected a folder of files, found a file", path=root)


def check_label_forms(labels: Sequence[str], root: str) -> None:
    """Raise :class:`InputError` for two label folders whose names differ only in Unicode
    normalization (``café`` as one code point, and as ``e`` + a combining accent: what
    macOS and some tools write): they print alike and were two classes of one name."""
    seen: dict[str, str] = {}
    for label in labels:
        form = unicodedata.normalize("NFC", label)
        if form in seen:
            raise InputError(
                f"{root}: label folders {seen[form]!a} and {label!a} are one name, {form!r}, "
                "in two Unicode forms (NFC and NFD), so they print alike but would be two "
                "labels: rename one to the other's form, or merge them",
                path=root,
            )
        seen[form] = label


def scan_tree(
    fs: Any,
    base: str,
    filt: TreeFilter,
    skipped: Counter[str],
) -> tuple[list[str], list[Entry]]:
    """Every first-level folder with at least one kept file is a label; returns labels, entries.

    Files directly under ``base`` count as ``no-label``; ``skipped`` is updated in place.
    For storage other than local disk (:mod:`tfshards.listing.sortedscan` walks local trees).
    """
    labels: list[str] = []
    entries: list[Entry] = []
    names = label_folders(fs, base, filt, skipped)
    found = _walk_remote(fs, base, names, filt, skipped)
    for name, rows in zip(names, found, strict=True):
        label_id, before = len(labels), len(entries)
        entries += [Entry(rel, size, label_id, token) for rel, size, token in rows]
        if len(entries) > before:  # a folder whose files were all skipped is no label
            labels.append(name)
    return labels, entries


def _walk_remote(
    fs: Any, base: str, names: Sequence[str], filt: TreeFilter, skipped: Counter[str]
) -> Iterator[list[FoundFile]]:
    """The rows of each label folder in ``names``, in order, listed :data:`REMOTE_LISTERS` at once.

    Object stores answer each listing request in tens of milliseconds, most of
    it waiting; several label folders are listed at once while the results are
    kept in label order, so the listing stays the same.
    """

    def walk(name: str) -> tuple[list[FoundFile], Counter[str]]:
        counts: Counter[str] = Counter()
        return list(_walk(fs, storage.join(base, name), name + "/", filt, counts)), counts

    workers = max(1, min(REMOTE_LISTERS, len(names)))
    from concurrent.futures import ThreadPoolExecutor  # remote storage only

    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(walk, name) for name in names]
        try:
            for future in futures:
                rows, counts = future.result()
                skipped.update(counts)
                yield rows
        finally:
            for future in futures:
                future.cancel()


def label_folders(fs: Any, base: str, filt: TreeFilter, skipped: Counter[str]) -> list[str]:
    """Sorted names of the folders under ``base``; counts the files beside them."""
    labels = []
    if storage.is_local(fs):
        with os.scandir(base) as it:
            items = [(e.name, e.is_dir()) for e in it]
    else:
        items = [
            (info_name(info), info["type"] == "directory")
            for info in fs.ls(base, detail=True)
            if info["name"].rstrip("/") != base.rstrip("/")
        ]
    for name, is_dir in items:
        if name.startswith("."):
            skipped["hidden"] += 1
        elif is_dir:
            labels.append(checked_name(name, base))
        else:
            skipped[filt.reason(name) or "no-label"] += 1
    return sorted(labels)


def _walk(
    fs: Any, base: str, prefix: str, filt: TreeFilter, skipped: Counter[str]
) -> Iterator[FoundFile]:
    """Yield ``(prefix + relative path, size, token)`` for every kept file under ``base``.

    The token is the storage's own content hash, or ``""`` when it keeps none.
    """
    try:
        for dirpath, dirs, files in fs.walk(base, detail=True, on_error="raise"):
            sub = dirpath[len(base) :].strip("/")
            rel_dir = f"{prefix}{sub}/" if sub else prefix
            for name in [d for d in dirs if d.startswith(".")]:
                del dirs[name]  # fs.walk honours pruning when walking top-down
                skipped["hidden"] += 1
            for name, info in files.items():
                if name.startswith("."):
                    skipped["hidden"] += 1
                    continue
                rel = rel_dir + name
                reason = filt.reason(rel) or (None if info.get("type") == "file" else "not-a-file")
                if reason:
                    skipped[reason] += 1
                    continue
                yield rel, int(info.get("size") or 0), storage_token(info)
    except OSError as exc:
        where = storage.unstrip(fs, base)
        raise InputError(f"{where}: cannot list folder ({why(exc)})", path=where) from None


def check_link_label(path: str, base: str, prefix: str) -> None:
    """A linked folder may not bring another label's files under this label.

    Links are followed (data sets are often assembled from them), but a link
    to the root or into another label folder would list that label's images
    under this one: ``raw/triangle/loop -> ../circle`` made 101 circles triangles.
    """
    root = os.path.realpath(os.path.dirname(base.rstrip(os.sep)))
    target = os.path.realpath(path)
    if target != root and not target.startswith(root + os.sep):
        return  # outside the root: images kept elsewhere, linked in
    inside = target[len(root) + 1 :].split(os.sep, 1)[0]
    label = prefix.split("/", 1)[0]
    if inside != label:
        found = "the root itself" if target == root else f"label folder {inside!r}"
        raise InputError(
            f"{path}: linked folder: expected a folder of label {label!r}, found a link to "
            f"{found}; its files would be listed under {label!r}. Remove the link, or "
            "link the files into their own label's folder",
            path=path,
        )


def info_name(info: dict[str, Any]) -> str:
    """Last path component of an fsspec ``info`` dict's name."""
    return str(info["name"]).rstrip("/").rsplit("/", 1)[-1]


def checked_name(rel: str, base: str) -> str:
    """File names must survive UTF-8 encoding (files.jsonl, TFRecord features)."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{base}: file name {rel!r}: expected valid UTF-8, found undecodable bytes",
            path=base,
        ) from None
    return rel


def unreadable(path: str, exc: OSError) -> InputError:
    """A file or folder under the root that cannot be looked at, named with its errno."""
    code = errno.errorcode.get(exc.errno or 0, "")
    reason = f"{why(exc)}{', ' + code if code else ''}"
    if exc.errno == errno.ENAMETOOLONG:
        limit, found = os.pathconf("/", "PC_PATH_MAX"), len(os.fsencode(path))
        reason = f"expected a path of at most {limit} bytes, found {found}: {reason}"
    return InputError(f"{path}: cannot read ({reason})", path=path)


def why(exc: OSError) -> str:
    """The short reason of an ``OSError`` (``"Permission denied"``)."""
    return exc.strerror or str(exc) or type(exc).__name__
