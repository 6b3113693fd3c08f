"""List a tree of raw files and their labels, and store that listing as JSON lines.

A listing is the first stage's output and every later stage's input, so it is
canonical: entries sorted by path (codepoint order), labels sorted, one JSON
object per line with sorted keys. Each file's ``token`` names its content
(:mod:`tfshards.listing.contenthash`), so the same files give the same ``files.jsonl``
bytes wherever they are and however they were copied.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import operator
import os
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import atomicfile, jsonfile, storage
from tfshards.errors import ConfigError, InputError
from tfshards.format.columns import Column
from tfshards.listing import contenthash, jsonlines
from tfshards.listing.entry import Entry
from tfshards.listing.hashcache import HashCache
from tfshards.listing.indexfile import read_index, scan_index
from tfshards.listing.meta import FILES_NAME, META_NAME, meta_columns, meta_doc, read_meta
from tfshards.listing.protocol import EntryRows
from tfshards.listing.sortedscan import scan_local
from tfshards.listing.storedlisting import OFFSETS_NAME, offsets_bytes, parse_line
from tfshards.listing.treefilter import DEFAULT_EXTENSIONS, TreeFilter
from tfshards.listing.walker import check_label_forms, check_root, scan_tree

SKIP_REASONS = ("hidden", "extension", "glob", "no-label", "not-a-file")
_SIZE = operator.attrgetter("size")
_PATH = operator.itemgetter(0)
_LABEL = operator.itemgetter(2)
_LINES_PER_CHUNK = 64  # ~10 KB chunks: atomicfile.write_atomic batches 1024 per writev


@dataclass(frozen=True)
class Listing:
    """Every file to convert, with its label; validates its own invariants.

    Attributes:
        root: the root URL or path as given, without a trailing slash.
        labels: sorted, unique label names; a label id is a position here.
        entries: files sorted by path (plain ``str`` order), paths unique.
        skipped: how many files or folders were left out, per reason in ``SKIP_REASONS``.
        columns: the index file's declared extra columns; each entry's ``values`` holds them.
    """

    root: str
    labels: tuple[str, ...]
    entries: tuple[Entry, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)
    columns: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        if list(self.labels) != sorted(set(self.labels)):
            raise ConfigError(f"labels must be sorted and unique, got {list(self.labels)[:10]}")
        if any(not label for label in self.labels):
            raise ConfigError("labels must be non-empty strings")
        unknown = set(self.skipped) - set(SKIP_REASONS)
        if unknown or any(n < 0 for n in self.skipped.values()):
            raise ConfigError(f"skipped must map {SKIP_REASONS} to counts >= 0, got {self.skipped}")
        n_labels = len(self.labels)
        paths = list(map(_PATH, self.entries))
        # C-level passes (map with operator functions): ~10x a Python loop on 1M entries
        if any(map(operator.ge, paths, itertools.islice(paths, 1, None))):
            i = next(i for i in range(1, len(paths)) if paths[i] <= paths[i - 1])
            raise ConfigError(
                f"entries must be sorted by unique path: {paths[i]!r} follows {paths[i - 1]!r}"
            )
        labels = list(map(_LABEL, self.entries))
        sizes = list(map(_SIZE, self.entries))
        if labels and (min(labels) < 0 or max(labels) >= n_labels or min(sizes) < 0):
            entry = next(e for e in self.entries if not 0 <= e.label < n_labels or e.size < 0)
            raise ConfigError(
                f"{entry.path}: label id in 0..{n_labels - 1} and size >= 0 "
                f"expected, found label {entry.label}, size {entry.size}"
            )

    @property
    def files(self) -> int:
        """Number of entries."""
        return len(self.entries)

    @property
    def total_bytes(self) -> int:
        """Sum of the listed files' sizes."""
        return sum(map(_SIZE, self.entries))

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the canonical ``files.jsonl`` bytes (:func:`listing_digest`)."""
        return listing_digest(self)

    def paths(self) -> Iterator[str]:
        """Each file's path relative to the root, in order."""
        return map(_PATH, self.entries)

    def jsonl(self) -> None:
        """None: the entries are in memory already (:meth:`scan`)."""
        return None

    def scan(self) -> Iterator[tuple[str, str, int]]:
        """Each file's ``(path, token, label id)``, in order."""
        return ((e.path, e.token, e.label) for e in self.entries)

    def rows(self, indices: array[int]) -> EntryRows:
        """The entries at ``indices`` (record order), for a shard task."""
        entries = self.entries
        return EntryRows(tuple(entries[j] for j in indices))

    def files_per_label(self) -> dict[str, int]:
        """Label name -> number of files, for every label (zeros included)."""
        counts = Counter(entry.label for entry in self.entries)
        return {name: counts[i] for i, name in enumerate(self.labels)}


def list_files(
    root: str,
    *,
    index: str | None = None,
    extensions: Sequence[str] | None = DEFAULT_EXTENSIONS,
    glob: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    threads: int | None = None,
    hash_cache: str | None = None,
    columns: Sequence[Column] = (),
) -> Listing:
    """List the files under ``root`` with their labels and content tokens.

    Labels come from the first folder level under ``root`` (ImageFolder layout;
    files directly under ``root`` are skipped as ``no-label``), or from an
    ``index`` file: CSV with ``path`` and ``label`` columns, or JSON lines with
    ``path`` and ``label`` keys, paths relative to ``root``.

    Hidden files and folders (any path component starting with ``.``) are
    skipped; a hidden folder counts once and is not entered. Then files must
    match ``extensions`` and ``glob``. The checks run in that order and each
    skipped file is counted under the first reason that applies.

    Every kept file gets a content token: the hash its storage keeps (S3 ETag,
    GCS md5Hash), or else the SHA-256 of its bytes, read in ``threads`` threads.

    Args:
        root: local path or fsspec URL (``s3://``, ``gs://``, ``memory://`` ...).
            Credentials come from the environment or fsspec config, never the URL.
        index: CSV (``.csv``) or JSON lines (``.jsonl``/``.json``) file; local or URL.
        extensions: file suffixes to keep, case-insensitive, with or without the
            dot; ``None`` or empty keeps every file.
        glob: ``fnmatch`` pattern the relative path must match (``*`` crosses ``/``).
        storage_options: passed to fsspec for ``root`` (and ``index`` when on
            the same kind of storage).
        threads: files hashed at once (default: all cores).
        hash_cache: SQLite file remembering local files' SHA-256 by their stat
            (:mod:`tfshards.listing.hashcache`), so an unchanged file is not read
            again; ``None`` reads every file. Never changes the listing.
        columns: extra columns of the ``index`` to keep with each file
            (:func:`tfshards.format.columns.parse_columns`).

    Returns:
        The listing, entries sorted by path.

    Raises:
        InputError: missing, unreadable or empty root; nothing matched; bad index.
    """
    with no_cycle_collection():
        options = dict(storage_options or {})
        return _list_files(root, index, extensions, glob, options, threads, hash_cache, columns)


@contextlib.contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Pause the cyclic GC: a listing allocates a few tuples per file and no cycles.

    Its passes over the growing entry list took 0.14 of 0.80 s CPU of a warm
    re-list of 200,000 files (2 cores, load 7).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _list_files(
    root: str,
    index: str | None,
    extensions: Sequence[str] | None,
    glob: str | None,
    options: dict[str, Any],
    threads: int | None,
    hash_cache: str | None,
    columns: Sequence[Column] = (),
) -> Listing:
    if columns and index is None:
        raise ConfigError("columns: expected an index file (--index) to read them from, found none")
    fs, base = storage.open_url(root, **options)
    check_root(fs, base, root)
    filt = TreeFilter.build(extensions, glob)
    counts: Counter[str] = Counter()
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    cache = HashCache(hash_cache) if hash_cache and storage.is_local(fs) else None
    try:
        labels, entries = _scan(
            fs, base, root, index, options, filt, counts, threads, cache, columns
        )
    finally:
        if cache is not None:
            cache.close()
    skipped = {reason: counts[reason] for reason in SKIP_REASONS}
    if not entries:
        raise nothing_listed(index or root, bool(index), skipped, filt)
    check_label_forms(labels, index or root)
    return Listing(normalize_root(root), tuple(labels), tuple(entries), skipped, tuple(columns))


def nothing_listed(
    source: str, index: bool, skipped: Mapping[str, int], filt: TreeFilter
) -> InputError:
    """The error for a tree or index that gave no entry, with what was skipped and why."""
    seen = sum(skipped.values())
    if seen == 0:
        found = "no rows" if index else "no files"
        expected = "rows of path,label" if index else "label folders with files"
        return InputError(f"{source}: expected {expected}, found {found}", path=source)
    return InputError(
        f"{source}: no file to list: all {seen} entries were skipped "
        f"({format_skipped(skipped)}; {filt.describe()})",
        path=source,
        skipped=dict(skipped),
    )


def _scan(
    fs: Any,
    base: str,
    root: str,
    index: str | None,
    options: dict[str, Any],
    filt: TreeFilter,
    counts: Counter[str],
    threads: int,
    cache: HashCache | None,
    columns: Sequence[Column] = (),
) -> tuple[list[str], list[Entry]]:
    """Labels and entries (sorted by path, each with its token) from the tree or the index."""
    if index is None and storage.is_local(fs):  # walked in path order, every file hashed
        return scan_local(fs, base, filt, counts, threads, cache)
    if index is None:
        labels, entries = scan_tree(fs, base, filt, counts)
    else:
        from fsspec.utils import get_protocol

        same = get_protocol(index) == get_protocol(root)
        index_fs, index_path = storage.open_url(index, **(options if same else {}))
        rows = read_index(index_fs, index_path, index, columns)
        labels, entries = scan_index(fs, base, root, rows, index, filt, counts)
    entries.sort(key=_PATH)  # unique paths; str keys sort ~3x faster than tuples
    _hash_contents(fs, base, root, entries, threads, cache)
    return labels, entries


def _hash_contents(
    fs: Any, base: str, root: str, entries: list[Entry], threads: int, cache: HashCache | None
) -> None:
    """Give the entries without a token yet the SHA-256 of their bytes."""
    todo = [i for i, entry in enumerate(entries) if not entry.token]
    if not todo:
        return
    rows = [(entries[i].path, entries[i].size) for i in todo]
    for i, (size, token) in zip(
        todo, contenthash.hash_files(fs, base, rows, root, threads, cache), strict=True
    ):
        entries[i] = entries[i]._replace(size=size, token=token)


_SKIPPED_AS = {  # each reason of SKIP_REASONS as a phrase after its count
    "hidden": "hidden",
    "extension": "of another extension",
    "glob": "outside the glob",
    "no-label": "outside a label folder",
    "not-a-file": "not a regular file",
}


def format_skipped(skipped: Mapping[str, int]) -> str:
    """``"3 hidden, 1 of another extension"``, or ``"none"``: the reasons counted."""
    parts = [f"{n} {_SKIPPED_AS.get(reason, reason)}" for reason, n in skipped.items() if n]
    return ", ".join(parts) or "none"


def normalize_root(root: str) -> str:
    """``root`` without a trailing slash (``"s3://"`` and ``"/"`` stay as they are)."""
    stripped = root.rstrip("/")
    return root if not stripped or stripped.endswith(":") else stripped


# --- files.jsonl and meta.json ---------------------------------------------------------


def _file_chunks(listing: Listing, offsets: array[int] | None = None) -> Iterator[bytes]:
    """``files.jsonl`` in chunks; appends each line's end offset to ``offsets`` if given."""
    heads = jsonlines.label_heads(listing.labels)
    entries = listing.entries
    end = 0
    for at in range(0, len(entries), _LINES_PER_CHUNK):
        lines = jsonlines.entry_lines(heads, entries[at : at + _LINES_PER_CHUNK])
        data = jsonlines.chunk(lines, end, offsets)
        end += len(data)
        yield data


_DIGEST = "_files_sha256"  # memo in the instance dict: the listing is immutable


def listing_digest(listing: Listing) -> str:
    """SHA-256 (hex) of the canonical ``files.jsonl`` bytes of ``listing``.

    Computed once per listing (re-encoding a million entries takes seconds);
    a listing read back from disk already carries its verified digest.
    """
    memo: str | None = listing.__dict__.get(_DIGEST)
    if memo is None:
        digest = hashlib.sha256()
        for chunk in _file_chunks(listing):
            digest.update(chunk)
        memo = digest.hexdigest()
        object.__setattr__(listing, _DIGEST, memo)
    return memo


def _meta(listing: Listing, digest: str) -> dict[str, Any]:
    return meta_doc(
        listing.root,
        listing.labels,
        listing.total_bytes,
        listing.files_per_label(),
        listing.skipped,
        digest,
        listing.columns,
    )


def write_listing(listing: Listing, out_dir: str) -> None:
    """Write ``OUT/files.jsonl``, ``OUT/files.idx`` then ``OUT/meta.json``, each atomically.

    ``files.idx`` holds where each line starts (:mod:`tfshards.listing.storedlisting`),
    so a writer reads any line without loading the rest. ``meta.json`` is
    written last and carries the SHA-256 of ``files.jsonl``, so a reader that
    finds both consistent knows neither is stale or truncated.
    """
    fs, base = storage.open_url(out_dir)
    digest = hashlib.sha256()
    offsets = array("Q", [0])

    def hashed() -> Iterator[bytes]:
        for chunk in _file_chunks(listing, offsets):
            digest.update(chunk)
            yield chunk

    atomicfile.write_atomic(fs, storage.join(base, FILES_NAME), hashed())
    atomicfile.write_atomic(fs, storage.join(base, OFFSETS_NAME), [offsets_bytes(offsets)])
    meta = jsonfile.encode(_meta(listing, digest.hexdigest()))
    atomicfile.write_atomic(fs, storage.join(base, META_NAME), [meta])


def read_listing(out_dir: str) -> Listing:
    """Read a listing written by :func:`write_listing`, checking every line.

    Raises:
        InputError: a file is missing or malformed (names the file and line), or
            ``files.jsonl`` does not match the count and SHA-256 in ``meta.json``.
    """
    fs, base = storage.open_url(out_dir)
    files_path = storage.unstrip(fs, storage.join(base, FILES_NAME))
    meta, meta_path = read_meta(fs, base)
    try:
        data = storage.read_bytes(fs, storage.join(base, FILES_NAME))
    except FileNotFoundError:
        raise InputError(f"{files_path}: listing file not found", path=files_path) from None
    labels: list[str] = meta["labels"]
    columns = meta_columns(meta, meta_path)
    lines = data.split(b"\n")  # not splitlines(): U+2028 may appear unescaped inside a path
    if lines[-1]:
        raise InputError(
            f"{files_path}: expected a newline at the end, found none (truncated?)", path=files_path
        )
    entries = [
        parse_line(files_path, n, line, labels, columns) for n, line in enumerate(lines[:-1], 1)
    ]
    for n, (before, after) in enumerate(itertools.pairwise(entries), start=2):
        if after.path <= before.path:
            raise InputError(
                f"{files_path}:{n}: expected paths sorted and unique, found "
                f"{after.path!r} after {before.path!r}",
                path=files_path,
                line=n,
            )
    if len(entries) != meta["files"]:
        raise InputError(
            f"{files_path}: expected {meta['files']} lines ({META_NAME}), found {len(entries)}",
            path=files_path,
        )
    found = hashlib.sha256(data).hexdigest()
    if found != meta["files_sha256"]:
        raise InputError(
            f"{files_path}: expected sha256 {meta['files_sha256']} ({META_NAME}), found "
            f"{found}: edited or stale",
            path=files_path,
        )
    try:
        root = storage.resolve_relative(meta["root"], out_dir)
        listing = Listing(root, tuple(labels), tuple(entries), dict(meta["skipped"]), columns)
    except ConfigError as exc:
        raise InputError(f"{meta_path}: {exc}", path=meta_path) from None
    object.__setattr__(listing, _DIGEST, found)  # the bytes just hashed are canonical
    return listing


__all__ = [
    "SKIP_REASONS",
    "Listing",
    "format_skipped",
    "list_files",
    "listing_digest",
    "read_listing",
    "write_listing",
]
