"""``tfshards list`` in bounded memory: a local tree's lines go to disk as they are walked.

A local tree is walked in path order (:mod:`tfshards.listing.sortedscan`), so
each folder's lines are encoded and written at once, with their offsets
(``files.idx``) and the running SHA-256; nothing per file stays in memory.
The bytes are those of :func:`~tfshards.listing.listing.write_listing` of
:func:`~tfshards.listing.listing.list_files`. A label folder whose files are
all skipped is walked a second time (label ids shift); index files and other
storage go through those two functions, in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import atomicfile, jsonfile, storage
from tfshards.errors import ConfigError
from tfshards.format.columns import Column
from tfshards.listing import jsonlines
from tfshards.listing.foldertokens import Tokens
from tfshards.listing.hashcache import HashCache
from tfshards.listing.listing import (
    SKIP_REASONS,
    Listing,
    list_files,
    no_cycle_collection,
    normalize_root,
    nothing_listed,
    write_listing,
)
from tfshards.listing.meta import FILES_NAME, META_NAME, meta_doc
from tfshards.listing.sortedscan import label_runs
from tfshards.listing.storedlisting import OFFSETS_NAME, offsets_bytes
from tfshards.listing.treefilter import DEFAULT_EXTENSIONS, TreeFilter
from tfshards.listing.walker import check_label_forms, check_root

_IDX_FLUSH = 1 << 16  # offsets held before they are written: 512 KB


@dataclass(frozen=True)
class ListedSummary:
    """What ``tfshards list`` reports of the listing it wrote."""

    root: str
    labels: tuple[str, ...]
    files_per_label: dict[str, int]
    skipped: dict[str, int]
    total_bytes: int
    digest: str  # SHA-256 (hex) of files.jsonl

    @property
    def files(self) -> int:
        return sum(self.files_per_label.values())

    @classmethod
    def of(cls, listing: Listing) -> ListedSummary:
        return cls(
            listing.root,
            listing.labels,
            listing.files_per_label(),
            dict(listing.skipped),
            listing.total_bytes,
            listing.digest,
        )


def list_to(
    root: str,
    out: str,
    *,
    index: str | None = None,
    extensions: Sequence[str] | None = DEFAULT_EXTENSIONS,
    glob: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    threads: int | None = None,
    hash_cache: str | None = None,
    columns: Sequence[Column] = (),
) -> ListedSummary:
    """``write_listing(list_files(root, ...), out)``, in memory bounded by the largest folder.

    Same arguments, checks, errors and bytes as :func:`~tfshards.listing.listing.list_files`.
    """
    options = dict(storage_options or {})
    fs, base = storage.open_url(root, **options)
    check_out(fs, base, root, out)
    with no_cycle_collection():
        if index is None and storage.is_local(fs):
            empty: frozenset[str] = frozenset()
            for _ in range(2):  # again when a label folder had every file skipped
                found = _stream(fs, base, root, out, extensions, glob, threads, hash_cache, empty)
                if isinstance(found, ListedSummary):
                    return found
                empty = found
        listing = list_files(
            root,
            index=index,
            extensions=extensions,
            glob=glob,
            storage_options=options,
            threads=threads,
            hash_cache=hash_cache,
            columns=columns,
        )
        write_listing(listing, out)
        return ListedSummary.of(listing)


def check_out(fs_root: Any, base: str, root: str, out: str) -> None:
    """Refuse an ``out`` folder whose listing files ``list`` did not write (a user's
    ``meta.json`` or ``files.jsonl`` was replaced), or one inside the listed root (its
    files would be listed by the next run). ``fs_root``, ``base``: ``root`` opened.

    Raises:
        ConfigError: one line naming the folder or the file.
    """
    fs, folder = storage.open_url(out)
    if storage.is_local(fs_root) and storage.inside(storage.join(out, FILES_NAME), base):
        raise ConfigError(
            f"out: expected a folder outside the listed root {root}, found {out} inside "
            "it, where the next listing would list its files: pass another --out",
            option="out",
        )
    for name in (FILES_NAME, OFFSETS_NAME, META_NAME):
        path = storage.join(folder, name)
        if not fs.exists(path):
            continue
        if fs.isdir(path) or not _written_by_list(name, _head(fs, path, name)):
            where = storage.unstrip(fs, path)
            found = "a folder" if fs.isdir(path) else "a file list did not write"
            raise ConfigError(
                f"{where}: expected a listing file that tfshards list wrote (or none), found "
                f"{found}: pass another --out or remove it",
                option="out",
            )


def _head(fs: Any, path: str, name: str) -> bytes:
    """What :func:`_written_by_list` reads of a listing file: all of ``meta.json``, the
    first MB of the others."""
    if name == META_NAME:
        return storage.read_bytes(fs, path)
    return bytes(fs.cat_file(path, start=0, end=1 << 20))


def _written_by_list(name: str, head: bytes) -> bool:
    """Whether ``head`` (:func:`_head` of the listing file ``name``) is one ``list`` wrote:
    ``files.idx`` starts at offset 0, a ``files.jsonl`` line and ``meta.json`` are JSON
    objects with the listing's keys."""
    if name == OFFSETS_NAME:
        return head.startswith(bytes(8))
    text = head if name == META_NAME else head.split(b"\n", 1)[0]
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return name == FILES_NAME and not head  # an empty listing's file
    wanted = ("files_sha256", "labels") if name == META_NAME else ("path", "token")
    return isinstance(doc, dict) and all(key in doc for key in wanted)


def _stream(
    fs: Any,
    base: str,
    root: str,
    out: str,
    extensions: Sequence[str] | None,
    glob: str | None,
    threads: int | None,
    hash_cache: str | None,
    empty: frozenset[str],
) -> ListedSummary | frozenset[str]:
    """Walk, hash and write the local tree, the folders in ``empty`` being no label.

    A label id counts the labels before it by name, and a folder whose files
    are all skipped is no label, which is known only once it is walked: when
    the empty folders are not ``empty``, nothing is published and they are
    returned, for a second walk (with a hash cache, one that reads no file).
    """
    check_root(fs, base, root)
    filt = TreeFilter.build(extensions, glob)
    counts: Counter[str] = Counter()
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    cache = HashCache(hash_cache) if hash_cache else None
    sink = _Files(out)
    try:
        found, runs = label_runs(fs, base, filt, counts, threads, cache)
        labels = [name for name in found.names if name not in empty]
        check_label_forms(labels, root)
        ids = {name: i for i, name in enumerate(labels)}
        label_heads = jsonlines.label_heads(labels)
        heads = [label_heads[ids[name]] if name in ids else "" for name in found.names]
        digest = hashlib.sha256()
        offsets, end, total = array("Q", [0]), 0, 0
        for label, run in runs:
            folder, lo, hi = run.folder, run.lo, run.hi
            if lo == hi:  # a folder's last run, when all its files sort before a subfolder
                continue
            tokens: Tokens = folder.result
            sizes = tokens.sizes[lo:hi]
            text = jsonlines.run_lines(
                heads[label], folder.rel_dir, folder.names[lo:hi], sizes, tokens.hexes[lo:hi]
            )
            data = jsonlines.chunk(text, end, offsets)
            end += len(data)
            total += sum(sizes)
            digest.update(data)
            sink.write(data, offsets)
            if len(offsets) >= _IDX_FLUSH:
                offsets = array("Q")
        skipped = {reason: counts[reason] for reason in SKIP_REASONS}
        if end == 0:
            raise nothing_listed(root, False, skipped, filt)
        if frozenset(found.names) - frozenset(found.labels()) != empty:
            sink.abort()
            return frozenset(found.names) - frozenset(found.labels())
        sink.commit(offsets)
    except BaseException:
        sink.abort()
        raise
    finally:
        if cache is not None:
            cache.close()
    per_label = dict(zip(labels, [n for n in found.counts if n], strict=True))
    summary = ListedSummary(
        normalize_root(root), tuple(labels), per_label, skipped, total, digest.hexdigest()
    )
    meta = meta_doc(summary.root, labels, total, per_label, skipped, summary.digest)
    atomicfile.write_atomic(sink.fs, storage.join(sink.base, META_NAME), [jsonfile.encode(meta)])
    return summary


class _Files:
    """``files.jsonl`` and ``files.idx``, published together; nothing is created before a line.

    A listing that fails leaves no trace: not even the output folder, when it made it.
    """

    def __init__(self, out: str) -> None:
        self.fs, self.base = storage.open_url(out)
        self._made = storage.is_local(self.fs) and not os.path.isdir(self.base)
        self._sinks: tuple[atomicfile.AtomicSink, atomicfile.AtomicSink] | None = None

    def _open(self) -> tuple[atomicfile.AtomicSink, atomicfile.AtomicSink]:
        if self._sinks is None:
            self._sinks = (
                atomicfile.AtomicSink(self.fs, storage.join(self.base, FILES_NAME)),
                atomicfile.AtomicSink(self.fs, storage.join(self.base, OFFSETS_NAME)),
            )
        return self._sinks

    def write(self, data: bytes, offsets: array[int]) -> None:
        """Lines; their offsets too once :data:`_IDX_FLUSH` of them are held (then cleared)."""
        lines, idx = self._open()
        lines.write([data])
        if len(offsets) >= _IDX_FLUSH:
            idx.write([offsets_bytes(offsets)])

    def commit(self, offsets: array[int]) -> None:
        """Write the last offsets; publish ``files.jsonl``, then ``files.idx``."""
        lines, idx = self._open()
        idx.write([offsets_bytes(offsets)])
        lines.commit()
        idx.commit()

    def abort(self) -> None:
        for sink in self._sinks or ():
            sink.abort()
        self._sinks = None
        if self._made:
            with contextlib.suppress(OSError):
                os.rmdir(self.base)  # only when empty
