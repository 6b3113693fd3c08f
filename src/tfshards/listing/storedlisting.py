"""Read a stored listing in bounded memory: check it in one streamed pass, read lines by position.

``tfshards list`` writes ``files.idx`` beside ``files.jsonl``: the byte offset
where each line starts, plus the file's size, as little-endian unsigned 64-bit
integers (8 bytes per file). The writer's parent then holds only counts, labels
and a 4-byte-per-file permutation; each shard task carries the line numbers of
its records and reads those lines itself, a batch at a time (:class:`ListedRows`),
so no process ever holds the whole listing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import struct
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import storage
from tfshards.errors import InputError
from tfshards.format import native
from tfshards.format.columns import Column, row_problem
from tfshards.listing.contenthash import token_problem
from tfshards.listing.entry import Entry
from tfshards.listing.meta import META_NAME, meta_columns, read_meta

OFFSETS_NAME = "files.idx"
ENTRY_KEYS = frozenset({"label", "label_index", "path", "size", "token"})
VALUES_KEY = "values"  # a line's extra columns, when meta.json declares some
BATCH = 1024  # lines read and parsed at once: ~0.4 MB of entries, one json.loads call
_CHUNK = 1 << 20  # streamed read size when checking files.jsonl
_SPAN = struct.Struct("<QQ")  # a line's start and the next line's start
Reader = Callable[[int, int], bytes]  # (offset, length) -> bytes


def offsets_bytes(offsets: array[int]) -> bytes:
    """``files.idx`` bytes for line-start offsets (the last one is the file size)."""
    if sys.byteorder == "big":  # pragma: no cover - the format is little-endian everywhere
        offsets = array("Q", offsets)
        offsets.byteswap()
    return offsets.tobytes()


@dataclass(frozen=True)
class StoredListing:
    """What a writer needs of a stored listing, checked against ``meta.json``; no entries.

    Attributes:
        directory: the listing directory as given.
        root: the root the files were listed under.
        labels: sorted label names.
        files: number of lines (files).
        total_bytes: sum of the listed sizes.
        digest: SHA-256 (hex) of ``files.jsonl``, computed here and equal to ``meta.json``'s.
        columns: the extra columns ``meta.json`` declares (each line's ``values``).
    """

    directory: str
    root: str
    labels: tuple[str, ...]
    files: int
    total_bytes: int
    digest: str
    columns: tuple[Column, ...] = ()

    def rows(self, indices: array[int]) -> ListedRows:
        """The lines at ``indices`` (0-based line numbers, record order), for a shard task."""
        fs, base = storage.open_url(self.directory)
        return ListedRows(
            storage.unstrip(fs, storage.join(base, "files.jsonl")),
            storage.unstrip(fs, storage.join(base, OFFSETS_NAME)),
            self.labels,
            indices.tobytes(),
            self.columns,
        )

    def paths(self) -> Iterator[str]:
        """Each file's path relative to the root, in line order, in one streamed pass.

        Raises:
            InputError: a line is malformed (names the file and line).
        """
        return (path for path, _, _ in self.scan())

    def jsonl(self) -> bytes:
        """``files.jsonl``'s bytes, for comparing with other JSON written the same way
        (:mod:`tfshards.writing.growth`: :func:`plain_rows`, or in C)."""
        fs, base = storage.open_url(self.directory)
        return storage.read_bytes(fs, storage.join(base, "files.jsonl"))

    def scan(self) -> Iterator[tuple[str, str, int]]:
        """Each file's ``(path, token, label id)``, in line order, in one streamed pass.

        A chunk of lines is one ``json.loads`` with a type check of the three
        fields (2 us a line less than checking each record in full: the
        lines are those ``meta.json``'s digest vouched for when the listing
        opened); a chunk that does not pass goes through the full check,
        which names the line.

        Raises:
            InputError: a line is malformed (names the file and line).
        """
        fs, base = storage.open_url(self.directory)
        fs_path = storage.join(base, "files.jsonl")
        where, done, rest, last = storage.unstrip(fs, fs_path), 0, b"", ""
        with fs.open(fs_path, "rb") as f:
            while chunk := f.read(_CHUNK):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                rows = _scan_lines(lines, len(self.labels))
                if rows is None:
                    texts = [b"\n" + line + b"\n" for line in lines]
                    numbers = range(done, done + len(lines))
                    entries = _parse_lines(where, numbers, texts, self.labels, self.columns)
                    rows = [(e.path, e.token, e.label) for e in entries]
                last = _check_order(where, done, last, [row[0] for row in rows])
                yield from rows
                done += len(lines)


# A files.jsonl line as the listing writes it, when no string in it holds an escape:
# its path, token (raw JSON string bytes) and label id, read by one regex pass.
_PLAIN = rb'"([^"\\\n]*)"'
_PLAIN_LINE = re.compile(
    rb'^\{"label":"[^"\\\n]*","label_index":(\d+),"path":'
    + _PLAIN
    + rb',"size":\d+,"token":'
    + _PLAIN
    + rb"\}$",
    re.M,
)


def _check_order(where: str, done: int, last: str, paths: list[str]) -> str:
    """The last of ``paths`` (lines ``done + 1``...), each after the one before: a listing
    holds each path once, in ``str`` order (as ``tfshards list`` writes it).

    Raises:
        InputError: a path not after the one before it (names the line).
    """
    for k, (before, path) in enumerate(itertools.pairwise([last, *paths])):
        if not before < path:
            raise InputError(
                f"{where}:{done + k + 1}: expected each path once and after the line before "
                f"(as tfshards list writes them), found {path!r} after {before!r}",
                path=where,
                line=done + k + 1,
            )
    return paths[-1] if paths else last


def plain_rows(data: bytes, files: int, labels: int) -> list[tuple[bytes, bytes, bytes]] | None:
    """Each line's label id, path and token as ``files.jsonl`` holds them (JSON bytes).

    One regex pass over the file's ``data`` (24 ms for 20,000 lines where a
    ``json.loads`` took 82 ms). None when a line holds an escaped character,
    extra columns or a label id not below ``labels``, or a path is not after
    the one before (not ``files`` plain lines in order): then
    :meth:`StoredListing.scan`, which names a bad line.
    """
    found: list[tuple[bytes, bytes, bytes]] = _PLAIN_LINE.findall(data)
    ids = {b"%d" % i for i in range(labels)}
    if len(found) != files or not all(label in ids for label, _, _ in found):
        return None
    paths = [path for _, path, _ in found]  # UTF-8 bytes sort as their str: in order, once each
    if not all(a < b for a, b in itertools.pairwise(paths)):
        return None
    return found


def _scan_lines(lines: list[bytes], labels: int) -> list[tuple[str, str, int]] | None:
    """``(path, token, label id)`` of each line, or None when one is not what it should be."""
    try:
        records = json.loads(b"[" + b",".join(lines) + b"]")
        rows = [(r["path"], r["token"], r["label_index"]) for r in records]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if len(rows) != len(lines):
        return None
    for path, token, label in rows:
        if type(path) is not str or type(token) is not str or type(label) is not int:
            return None
        if not (path and 0 <= label < labels):
            return None
    return rows


def open_listing(directory: str, meta: dict[str, Any]) -> StoredListing | None:
    """Check ``files.jsonl`` and ``files.idx`` against ``meta`` in one streamed pass.

    Returns None when the listing has no ``files.idx`` (written by an older
    ``tfshards list``): the caller then reads it whole.

    Raises:
        InputError: ``files.jsonl`` is missing, truncated, or its line count or
            SHA-256 differ from ``meta.json``; ``files.idx`` does not match it.
    """
    fs, base = storage.open_url(directory)
    files_path = storage.join(base, "files.jsonl")
    idx_path = storage.join(base, OFFSETS_NAME)
    where = storage.unstrip(fs, files_path)
    if not fs.exists(idx_path):
        return None
    digest, lines, size, last = hashlib.sha256(), 0, 0, b"\n"
    try:
        with fs.open(files_path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                lines += chunk.count(b"\n")
                size += len(chunk)
                last = chunk[-1:]
    except FileNotFoundError:
        raise InputError(f"{where}: listing file not found", path=where) from None
    if last != b"\n":
        raise InputError(
            f"{where}: expected a newline at the end, found none (truncated?)", path=where
        )
    if lines != meta["files"]:
        raise InputError(
            f"{where}: expected {meta['files']} lines (meta.json), found {lines}", path=where
        )
    found = digest.hexdigest()
    if found != meta["files_sha256"]:
        raise InputError(
            f"{where}: expected sha256 {meta['files_sha256']} (meta.json), found "
            f"{found}: edited or stale",
            path=where,
        )
    idx_where = storage.unstrip(fs, idx_path)
    idx_size = fs.size(idx_path)
    with fs.open(idx_path, "rb") as f:
        f.seek(max(0, idx_size - 8))
        end = int.from_bytes(f.read(8), "little")
    if idx_size != 8 * (lines + 1) or end != size:
        raise InputError(
            f"{idx_where}: expected {8 * (lines + 1)} bytes ending with {size} (files.jsonl), "
            f"found {idx_size} bytes ending with {end}: stale",
            path=idx_where,
        )
    root = storage.resolve_relative(meta["root"], directory)  # written from the project folder
    columns = meta_columns(meta, storage.unstrip(fs, storage.join(base, META_NAME)))
    labels = tuple(meta["labels"])
    return StoredListing(directory, root, labels, lines, meta["bytes"], found, columns)


@dataclass(frozen=True)
class ListedRows:
    """Some lines of a stored listing, by line number, read where they are used.

    Plain picklable values (URLs, labels, 4 bytes per line), so a shard task
    carries them to any worker instead of the entries themselves.
    """

    files: str  # URL of files.jsonl
    offsets: str  # URL of files.idx
    labels: tuple[str, ...]
    indices: bytes  # array("I") of 0-based line numbers, in record order
    columns: tuple[Column, ...] = ()

    def __len__(self) -> int:
        return len(self.indices) // 4

    def batches(self, size: int = BATCH) -> Iterator[list[Entry]]:
        """The rows, in order, ``size`` at a time.

        Raises:
            InputError: a line is malformed (names the file and line) or
                ``files.idx`` does not point at line starts.
        """
        order = array("I")
        order.frombytes(self.indices)
        fs_files, files_path = storage.open_url(self.files)
        fs_idx, idx_path = storage.open_url(self.offsets)
        with fs_files.open(files_path, "rb") as lines, fs_idx.open(idx_path, "rb") as idx:
            read_lines = _reader(lines)
            read_idx = _reader(idx)
            fds = _fileno(idx), _fileno(lines)
            c = native.NATIVE if -1 not in fds else None
            for at in range(0, len(order), size):
                chunk = order[at : at + size]
                if c is not None:  # one C call reads the batch (~1 us a line less, no GIL)
                    text, bad = c.read_lines(*fds, chunk)
                    rows = (
                        None
                        if bad >= 0
                        else _parse_array(self.files, chunk, text, self.labels, self.columns)
                    )
                    if rows is not None:
                        yield rows
                        continue
                texts = [self._line(read_idx, read_lines, j) for j in chunk]
                yield _parse_lines(self.files, chunk, texts, self.labels, self.columns)

    def _line(self, read_idx: Reader, read_lines: Reader, j: int) -> bytes:
        """Line ``j`` with the newline before it (a check that it starts a line) and its own."""
        start, end = _SPAN.unpack(read_idx(8 * j, 16))
        text = read_lines(start - 1, end - start + 1) if start else b"\n" + read_lines(0, end)
        if len(text) != end - start + 1 or text[0] != 10 or text.find(b"\n", 1) != len(text) - 1:
            raise InputError(
                f"{self.offsets}: line {j + 1}: expected the offsets of a line of "
                f"{self.files}, found others: stale",
                path=self.offsets,
            )
        return text


def _fileno(f: Any) -> int:
    """The open file's descriptor, or -1 (a remote file)."""
    try:
        return int(f.fileno())
    except (AttributeError, OSError, ValueError):
        return -1


def _reader(f: Any) -> Reader:
    """``read(offset, length)`` on an open file: ``os.pread`` when it has a descriptor."""
    fd = _fileno(f)
    if fd >= 0:
        return lambda offset, length: os.pread(fd, length, offset)

    def read(offset: int, length: int) -> bytes:
        f.seek(offset)
        data: bytes = f.read(length)
        return data

    return read


def _parse_lines(
    path: str,
    numbers: Sequence[int],
    texts: list[bytes],
    labels: Sequence[str],
    columns: Sequence[Column] = (),
) -> list[Entry]:
    """Parse lines (each with its leading newline) in one ``json.loads`` call when all are valid."""
    try:
        records = json.loads(b"[" + b",".join(t[1:-1] for t in texts) + b"]")
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        records = None
    if records is None or len(records) != len(texts):  # find the bad line, for its message
        return [
            parse_line(path, j + 1, t[1:-1], labels, columns)
            for j, t in zip(numbers, texts, strict=True)
        ]
    return [
        check_record(path, j + 1, r, labels, columns) for j, r in zip(numbers, records, strict=True)
    ]


def _parse_array(
    path: str,
    numbers: Sequence[int],
    text: bytes,
    labels: Sequence[str],
    columns: Sequence[Column] = (),
) -> list[Entry] | None:
    """Lines joined as one JSON array, checked; None when some line is not one valid object."""
    try:
        records = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if len(records) != len(numbers):
        return None
    return [
        check_record(path, j + 1, r, labels, columns) for j, r in zip(numbers, records, strict=True)
    ]


def parse_line(
    path: str, n: int, line: bytes, labels: Sequence[str], columns: Sequence[Column] = ()
) -> Entry:
    """One ``files.jsonl`` line (without its newline) as an entry; ``n`` is its 1-based number.

    Raises:
        InputError: naming ``path:n``, what was expected and what was found.
    """
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"{path}:{n}: expected a JSON object, found invalid JSON ({exc})", path=path, line=n
        ) from None
    except RecursionError:  # arrays or objects nested ~1,000 deep
        raise InputError(
            f"{path}:{n}: expected a JSON object, found values nested too deep to read",
            path=path,
            line=n,
        ) from None
    return check_record(path, n, record, labels, columns)


def check_record(
    path: str, n: int, record: Any, labels: Sequence[str], columns: Sequence[Column] = ()
) -> Entry:
    """A decoded ``files.jsonl`` line as ``(path, size, label index, token, values)``, checked."""

    def bad(what: str) -> InputError:
        return InputError(f"{path}:{n}: {what}", path=path, line=n)

    keys = ENTRY_KEYS | {VALUES_KEY} if columns else ENTRY_KEYS
    if not isinstance(record, dict) or record.keys() != keys:
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise bad(f"expected keys {sorted(keys)}, found {found}")
    rel, size, label, label_index, token = (
        record["path"],
        record["size"],
        record["label"],
        record["label_index"],
        record["token"],
    )
    if not (isinstance(rel, str) and rel and isinstance(token, str)):
        raise bad("expected a non-empty string 'path' and a string 'token'")
    if problem := token_problem(token):
        raise bad(problem)
    wrapped = f"/{rel}/"  # no empty, "." or ".." part, as index files: 3 substring tests
    if "//" in wrapped or "/./" in wrapped or "/../" in wrapped:
        raise bad(
            f"expected a path relative to the root without '.', '..' or empty parts, found {rel!r}"
        )
    if type(size) is not int or size < 0:
        raise bad(f"expected 'size' an integer >= 0, found {size!r}")
    if type(label_index) is not int or not 0 <= label_index < len(labels):
        raise bad(f"expected 'label_index' in 0..{len(labels) - 1}, found {label_index!r}")
    if label != labels[label_index]:
        raise bad(
            f"label {label!r} does not match label_index {label_index} "
            f"({labels[label_index]!r} in meta.json)"
        )
    values = record[VALUES_KEY] if columns else None
    if columns and (problem := row_problem(values, columns)):
        raise bad(problem)
    return Entry(rel, size, label_index, token, values)


def open_stored(out_dir: str) -> StoredListing | None:
    """The counts, labels and verified digest of a listing directory, without its entries.

    None when the directory has no ``files.idx`` (an older ``tfshards list``
    wrote it): :func:`tfshards.listing.listing.read_listing` then reads it whole.
    """
    fs, base = storage.open_url(out_dir)
    return open_listing(out_dir, read_meta(fs, base)[0])
