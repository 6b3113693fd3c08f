"""Read an index file of ``(path, label)`` rows (CSV or JSON lines) into listing entries.

Declared extra columns (:mod:`tfshards.format.columns`) ride along: each row's
values are checked here and kept in its entry.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import os
import posixpath
import stat
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from tfshards import storage
from tfshards.errors import InputError
from tfshards.format.columns import Column
from tfshards.listing.contenthash import storage_token
from tfshards.listing.entry import Entry
from tfshards.listing.treefilter import TreeFilter
from tfshards.listing.walker import info_name, why

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
_DIR_CACHE = 256  # directory listings kept while matching index rows on object stores

IndexLine = tuple[int, str, str, dict[str, Any] | None]  # (line number, path, label, values)


def scan_index(
    fs: Any,
    base: str,
    root: str,
    rows: Iterable[IndexLine],
    index: str,
    filt: TreeFilter,
    skipped: Counter[str],
) -> tuple[list[str], list[Entry]]:
    """Filter the index ``rows`` like a tree, then find each kept file under the root.

    Returns the sorted labels and the entries (in path order). Raises
    :class:`InputError` naming ``index`` and the line for a duplicate or missing path.
    """
    kept: list[tuple[str, int, str]] = []
    values: dict[str, dict[str, Any]] = {}  # by path, for rows with extra columns
    for line, rel, label, row_values in rows:
        if any(part.startswith(".") for part in rel.split("/")):
            skipped["hidden"] += 1
        elif skip := filt.reason(rel):
            skipped[skip] += 1
        else:
            kept.append((rel, line, label))
            if row_values is not None:
                values[rel] = row_values
    kept.sort()
    for (rel, first, *_), (again, line, *_) in itertools.pairwise(kept):
        if rel == again:
            raise InputError(
                f"{index}:{line}: duplicate path {rel!r}: expected each file once, "
                f"found it on lines {first} and {line}",
                path=index,
                line=line,
            )
    labels = sorted({label for _, _, label in kept})
    ids = {label: i for i, label in enumerate(labels)}
    stats = _stat_files(fs, base, ((rel, line) for rel, line, _ in kept), index, root)
    entries = [
        Entry(rel, size, ids[label], token, values.get(rel))
        for (rel, _, label), (size, token) in zip(kept, stats, strict=True)
    ]
    return labels, entries


def read_index(fs: Any, path: str, url: str, columns: Sequence[Column] = ()) -> Iterator[IndexLine]:
    """Yield ``(line number, path, label, values)`` from a CSV or JSON-lines index, validated.

    CSV needs a header with ``path`` and ``label`` columns (others are ignored
    but the declared ``columns``); JSON lines need objects with ``path`` and
    ``label`` keys (and the columns'). Paths are relative to the root (a
    leading ``./`` is dropped); labels are non-empty strings (JSON integers
    are turned into strings). ``values`` is None without columns.
    """
    ext = posixpath.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise InputError(
            f"{url}: unknown index format: expected .csv, .jsonl or .json, "
            f"found {ext or 'no extension'!r}",
            path=url,
        )
    parse = _csv_rows if FORMATS[ext] == "csv" else _jsonl_rows
    names = [c.name for c in columns]
    try:  # locally through open_regular: opening a FIFO waits for a writer, forever
        raw = (
            os.fdopen(storage.open_regular(path), "rb")
            if storage.is_local(fs)
            else fs.open(path, "rb")
        )
    except FileNotFoundError:
        raise InputError(f"{url}: index file not found", path=url) from None
    except OSError as exc:
        raise InputError(f"{url}: cannot read index file ({why(exc)})", path=url) from None
    with raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
        try:
            for line, rel, label, cells in parse(url, text, names):
                values = _values(url, line, columns, cells, parse is _csv_rows) if columns else None
                yield line, _index_path(url, line, rel), _index_label(url, line, label), values
        except UnicodeDecodeError as exc:
            raise InputError(f"{url}: expected UTF-8 text, found {exc.reason}", path=url) from None


def _values(
    url: str, line: int, columns: Sequence[Column], cells: list[Any], text: bool
) -> dict[str, Any]:
    """A row's extra columns by name, each cell (CSV ``text``, else JSON) checked."""
    out: dict[str, Any] = {}
    for column, cell in zip(columns, cells, strict=True):
        try:
            out[column.name] = column.parse(cell, text=text)
        except ValueError as exc:
            raise InputError(
                f"{url}:{line}: column {column.name!r} ({column.type}): {exc}",
                path=url,
                line=line,
            ) from None
    return out


def _csv_rows(
    url: str, text: TextIO, names: list[str]
) -> Iterator[tuple[int, Any, Any, list[Any]]]:
    import csv  # index files only: a tree walk does without (~5 ms)

    reader = csv.DictReader(text)
    try:
        header = reader.fieldnames
        needed = ["path", "label", *names]
        if header is None or not set(needed) <= set(header):
            raise InputError(
                f"{url}:1: expected a header with {_named(needed)} columns, "
                f"found {list(header or [])}",
                path=url,
                line=1,
            )
        twice = sorted({name for name in header if header.count(name) > 1})
        if twice:
            raise InputError(
                f"{url}:1: expected each column named once in the header, found {twice} twice",
                path=url,
                line=1,
            )
        for row in reader:
            if None in row:  # cells past the header's (DictReader's rest key)
                n, extra = reader.line_num, len(row[None])
                raise InputError(
                    f"{url}:{n}: expected {len(header)} cells (the header's), found "
                    f"{len(header) + extra}",
                    path=url,
                    line=n,
                )
            yield reader.line_num, row["path"], row["label"], [row[n] for n in names]
    except csv.Error as exc:
        n = reader.line_num
        raise InputError(f"{url}:{n}: malformed CSV ({exc})", path=url, line=n) from None


def _jsonl_rows(
    url: str, text: TextIO, names: list[str]
) -> Iterator[tuple[int, Any, Any, list[Any]]]:
    for n, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{url}:{n}: expected a JSON object, found invalid JSON ({exc.msg})",
                path=url,
                line=n,
            ) from None
        except RecursionError:  # arrays nested ~1,000 deep
            raise InputError(
                f"{url}:{n}: expected a JSON object, found values nested too deep to read",
                path=url,
                line=n,
            ) from None
        except ValueError:  # Python reads integers of at most 4,300 digits
            raise InputError(
                f"{url}:{n}: expected a JSON object, found a number too long to read "
                "(more than 4,300 digits)",
                path=url,
                line=n,
            ) from None
        needed = ["path", "label", *names]
        if not isinstance(record, dict) or not set(needed) <= record.keys():
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise InputError(
                f"{url}:{n}: expected an object with {_named(needed)}, found {found}",
                path=url,
                line=n,
            )
        yield n, record["path"], record["label"], [record[k] for k in names]


def _named(names: list[str]) -> str:
    """``'path' and 'label'``, ``'path', 'label' and 'box'``."""
    quoted = [repr(n) for n in names]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _index_path(url: str, line: int, value: Any) -> str:
    if not isinstance(value, str):
        raise InputError(
            f"{url}:{line}: expected 'path' a string, found {value!r}", path=url, line=line
        )
    rel: str = value
    if "\0" in rel:  # no filesystem takes it; os.stat would raise ValueError
        raise InputError(
            f"{url}:{line}: expected a path without NUL characters, found {rel!r}",
            path=url,
            line=line,
        )
    while rel.startswith("./"):
        rel = rel[2:]
    if not rel or rel.startswith("/") or {"", ".", ".."} & set(rel.split("/")):
        raise InputError(
            f"{url}:{line}: expected a path relative to the root without '.', '..' "
            f"or empty parts, found {rel!r}",
            path=url,
            line=line,
        )
    return _utf8(url, line, "path", rel)


def _index_label(url: str, line: int, label: Any) -> str:
    if isinstance(label, int) and not isinstance(label, bool):
        return str(label)
    if not isinstance(label, str) or not label.strip():
        raise InputError(
            f"{url}:{line}: expected a non-empty 'label', found {label!r}", path=url, line=line
        )
    return _utf8(url, line, "label", label)


def _utf8(url: str, line: int, what: str, text: str) -> str:
    """``text``, unless it holds a lone surrogate (a JSON ``"\\udcxx"`` escape) UTF-8 cannot."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{url}:{line}: expected a UTF-8 {what}, found {text!r}", path=url, line=line
        ) from None
    return text


def _stat_files(
    fs: Any, base: str, rows: Iterable[tuple[str, int]], index: str, root: str
) -> Iterator[tuple[int, str]]:
    """Yield ``(size, token)`` for each ``(relative path, index line)``, in order."""

    def missing(rel: str, line: int, found: str) -> InputError:
        return InputError(
            f"{index}:{line}: {rel}: expected a file under {root}, found {found}",
            path=index,
            line=line,
            file=rel,
        )

    if storage.is_local(fs):
        for rel, line in rows:
            try:
                st = os.stat(os.path.join(base, rel))
            except FileNotFoundError:
                raise missing(rel, line, "nothing") from None
            except OSError as exc:
                raise missing(rel, line, f"an unreadable path ({why(exc)})") from None
            if not stat.S_ISREG(st.st_mode):
                raise missing(rel, line, "a folder or special file")
            yield st.st_size, ""  # the content is hashed after the scan
        return

    # Object stores: one listing per folder (cached) instead of one request per file.
    @functools.lru_cache(maxsize=_DIR_CACHE)
    def folder(parent: str) -> dict[str, Any]:
        try:
            return {info_name(info): info for info in fs.ls(parent, detail=True)}
        except FileNotFoundError:
            return {}

    for rel, line in rows:
        parent, _, name = storage.join(base, rel).rpartition("/")
        info = folder(parent).get(name)
        if info is None or info.get("type") != "file":
            raise missing(rel, line, "nothing" if info is None else "a folder")
        yield int(info.get("size") or 0), storage_token(info)
