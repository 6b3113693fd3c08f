"""A local tree's files in listing order, each label folder walked sorted and hashed ahead.

Label folders are walked by the key ``name + "/"`` (their paths' order,
:mod:`tfshards.listing.sortedwalk`), so the runs come out sorted by path across
labels too; a run carries the id its label has among all label folders. A
folder whose files are all skipped is no label, so the ids are final only
once the walk is done: :func:`final_ids` maps them.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tfshards.listing.entry import Entry
from tfshards.listing.foldertokens import FolderTokens, Tokens
from tfshards.listing.hashcache import HashCache
from tfshards.listing.sortedwalk import Run, walk_sorted
from tfshards.listing.treefilter import TreeFilter
from tfshards.listing.walker import label_folders


@dataclass
class LabelRuns:
    """The label folders of a tree (sorted by name: a run's id indexes them) and files per id."""

    names: list[str]
    counts: list[int] = field(default_factory=list)

    def labels(self) -> list[str]:
        """The labels: the folders with at least one kept file."""
        return [name for name, n in zip(self.names, self.counts, strict=True) if n]

    def final_ids(self) -> list[int] | None:
        """The label id of each folder id, or None when every folder is a label (ids unchanged)."""
        if all(self.counts):
            return None
        ids, next_id = [], 0
        for n in self.counts:
            ids.append(next_id)
            next_id += n > 0
        return ids


def label_runs(
    fs: Any,
    base: str,
    filt: TreeFilter,
    skipped: Counter[str],
    threads: int,
    cache: HashCache | None,
) -> tuple[LabelRuns, Iterator[tuple[int, Run]]]:
    """The tree's label folders, and ``(folder id, run)`` in path order, tokens in each run."""
    names = label_folders(fs, base, filt, skipped)
    found = LabelRuns(names, [0] * len(names))
    order = sorted(range(len(names)), key=lambda i: names[i] + "/")

    def runs() -> Iterator[tuple[int, Run]]:
        tokens = FolderTokens(threads, cache)
        for i in order:
            steps = walk_sorted(
                os.path.join(base, names[i]), names[i] + "/", filt, skipped, cache is not None
            )
            for run in tokens.runs(steps):
                found.counts[i] += run.hi - run.lo
                yield i, run

    return found, runs()


def run_entries(label: int, run: Run) -> list[Entry]:
    """The entries of ``run``, with label id ``label``."""
    folder = run.folder
    tokens: Tokens = folder.result
    rel_dir, lo, hi = folder.rel_dir, run.lo, run.hi
    return [
        Entry(rel_dir + name, size, label, "sha256:" + hx)
        for name, size, hx in zip(
            folder.names[lo:hi], tokens.sizes[lo:hi], tokens.hexes[lo:hi], strict=True
        )
    ]


def scan_local(
    fs: Any,
    base: str,
    filt: TreeFilter,
    skipped: Counter[str],
    threads: int,
    cache: HashCache | None,
) -> tuple[list[str], list[Entry]]:
    """Labels and entries, sorted by path, of the local tree ``base``; all in memory."""
    found, runs = label_runs(fs, base, filt, skipped, threads, cache)
    entries = list(itertools.chain.from_iterable(run_entries(i, run) for i, run in runs))
    ids = found.final_ids()
    if ids is not None:
        entries = [e._replace(label=ids[e.label]) for e in entries]
    return found.labels(), entries
