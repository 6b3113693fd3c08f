"""Growing a shard set: writes from a previous version against the write from scratch.

The small set (its own tree of hard links, so ``bench/data`` is never touched)
is written as 64 shards, then grown three times, each version from the one
before (``WriteConfig(previous=...)``): 1% new files in the label folders, 5
files given new content, 0.5% of the files removed at random (seeded); last,
the final listing written from scratch. Every write reads a stored listing
(what the DVC write stage gets) and runs on 2 workers (``auto``).

The warm-up round writes the chain of versions every later round grows from;
each timed round writes every step again into fresh folders, so the ratio to
the full write is taken within a round. Kept shards are counted by inode (a
shard file of the new version that is a hard link of one of the previous
version's), and every version is checked: its record count, its member lists
against the listing, and ``tfshards diff`` against the version before.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common.data import DataSet
from bench.common.timing import spread, tree_cpu_seconds
from tfshards.listing.listing import list_files, write_listing
from tfshards.project.sample import SyntheticSpec, render_synthetic
from tfshards.shardset import diff
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

GROUP = "grow"
SHARDS = 64  # shards of the first version (fewer at tiny scales: at most half the files)
ADDED = 0.01  # share of new files
CHANGED = 5  # files given new content
REMOVED = 0.005  # share of files removed
SEED = 0  # picks the changed and the removed files
WORKERS = 2


@dataclass
class Step:
    """One version: its tree, its stored listing, what changed since the step it grows from."""

    name: str
    root: str
    listing_dir: str
    files: int
    nbytes: int
    grows: bool  # from the previous step's version; False: from scratch
    added: int = 0
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)


def compare(
    data: DataSet, source: str, reps: int, workroot: str, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Build the trees, write the chain (warm-up), time ``reps`` rounds; one row per step."""
    base = tempfile.mkdtemp(dir=workroot, prefix="grow-")
    try:
        steps = _steps(data, source, base)
        shards = min(SHARDS, steps[0].files // 2)
        chain: list[Manifest] = []
        facts: list[dict[str, Any]] = []
        for k, step in enumerate(steps):  # warm-up: the versions every later round grows from
            previous = chain[k - 1] if step.grows else None
            manifest, reused, wall = _write(step, shards, os.path.join(base, "chain"), previous)
            facts.append(_check(step, manifest, reused, previous))
            chain.append(manifest)
            log(f"  warm-up  {step.name:<44} {wall:6.2f} s")
        for rep in range(reps):
            out = os.path.join(base, f"round-{rep}")
            for k, step in enumerate(steps):
                previous = chain[k - 1] if step.grows else None
                cpu0 = tree_cpu_seconds()
                manifest, _, wall = _write(step, shards, out, previous)
                step.cpus.append(tree_cpu_seconds() - cpu0)
                step.walls.append(wall)
                if manifest.fingerprint != chain[k].fingerprint:
                    raise RuntimeError(
                        f"grow/{step.name}: expected version {chain[k].fingerprint} again, "
                        f"wrote {manifest.fingerprint}"
                    )
                log(f"  rep {rep + 1}/{reps} {step.name:<44} {wall:6.2f} s")
            shutil.rmtree(out)
        return [_row(step, steps[0], fact, reps) for step, fact in zip(steps, facts, strict=True)]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _write(
    step: Step, shards: int, out: str, previous: Manifest | None
) -> tuple[Manifest, int, float]:
    """One write of ``step`` into ``out``; its manifest, shards reused, wall seconds."""
    config = WriteConfig(
        out=out,
        num_shards=shards,
        workers=WORKERS,
        previous=os.path.join(previous.directory, MANIFEST_NAME) if previous else None,
    )
    t0 = time.perf_counter()
    result = write(config, step.listing_dir, progress=False)
    return result.manifest, result.reused, time.perf_counter() - t0


# ----------------------------------------------------------------------------- the trees


def _steps(data: DataSet, source: str, base: str) -> list[Step]:
    """Four trees (each a hard-linked copy of the one before, then changed) and their listings."""
    rng = random.Random(SEED)
    first = _link_tree(source, os.path.join(base, "tree-0"))
    steps = [_listed("full write (from scratch)", first, base, grows=False)]

    added = _link_tree(first, os.path.join(base, "tree-1"))
    count = max(1, round(data.count * ADDED))
    spec = SyntheticSpec(data.count + count, data.size, classes=data.classes, seed=data.seed)
    for index in range(data.count, data.count + count):  # the set's next images, same folders
        _put(os.path.join(added, spec.relpath(index)), render_synthetic(spec, index))
    steps.append(_listed(f"grow: {_n_files(count)} added ({ADDED:.0%})", added, base, True))
    steps[-1].added = count

    changed = _link_tree(added, os.path.join(base, "tree-2"))
    spec = SyntheticSpec(data.count, data.size, classes=data.classes, seed=data.seed + 1)
    picked = sorted(rng.sample(range(data.count), min(CHANGED, data.count)))
    for index in picked:  # an image of another seed under the same name and label
        os.unlink(os.path.join(changed, spec.relpath(index)))  # a link into tree-1: never in place
        _put(os.path.join(changed, spec.relpath(index)), render_synthetic(spec, index))
    steps.append(_listed(f"grow: {_n_files(len(picked))} changed", changed, base, True))
    steps[-1].changed = tuple(spec.relpath(i) for i in picked)

    removed = _link_tree(changed, os.path.join(base, "tree-3"))
    paths = sorted(_files_under(removed))
    gone = sorted(rng.sample(paths, max(1, round(len(paths) * REMOVED))))
    for path in gone:
        os.unlink(os.path.join(removed, path))
    name = f"grow: {_n_files(len(gone))} removed ({REMOVED:.1%})"
    steps.append(_listed(name, removed, base, True))
    steps[-1].removed = tuple(gone)
    steps.append(_listed("the final listing from scratch", removed, base, grows=False))
    return steps


def _listed(name: str, root: str, base: str, grows: bool) -> Step:
    """``root`` listed and the listing stored, as `tfshards list` leaves it for the write."""
    listing = list_files(root)
    listing_dir = tempfile.mkdtemp(dir=base, prefix="listing-")
    write_listing(listing, listing_dir)
    return Step(name, root, listing_dir, listing.files, listing.total_bytes, grows)


def _link_tree(src: str, dst: str) -> str:
    """A copy of ``src`` whose files are hard links (no byte copied); returns ``dst``."""
    for directory, _, names in os.walk(src):
        here = os.path.join(dst, os.path.relpath(directory, src))
        os.makedirs(here, exist_ok=True)
        for name in names:
            os.link(os.path.join(directory, name), os.path.join(here, name))
    return dst


def _files_under(root: str) -> list[str]:
    return [
        os.path.relpath(os.path.join(directory, name), root)
        for directory, _, names in os.walk(root)
        for name in names
    ]


def _n_files(n: int) -> str:
    return f"{n:,} file" + ("" if n == 1 else "s")


def _put(path: str, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)


# ----------------------------------------------------------------------------- checks and rows


def _check(
    step: Step, manifest: Manifest, reused: int, previous: Manifest | None
) -> dict[str, Any]:
    """What ``step``'s version holds and kept; raises unless it is exactly the step's listing."""
    where = f"grow/{step.name}"
    members = list(diff.load_members(manifest))
    paths = {row[0] for _, rows in members for row in rows}
    if manifest.records != step.files or len(paths) != step.files:
        raise RuntimeError(
            f"{where}: expected {step.files} records (the listing's files), found "
            f"{manifest.records} records, {len(paths)} distinct paths"
        )
    if any(path in paths for path in step.removed):
        raise RuntimeError(f"{where}: a removed file is still a member of the new version")
    fact: dict[str, Any] = {"shards": len(manifest.shards), "reused": reused}
    if previous is None:
        if manifest.base:
            raise RuntimeError(f"{where}: expected a version from scratch, base {manifest.base}")
        return fact | {"new_shards": len(manifest.shards), "records_written": manifest.records}
    old_members = list(diff.load_members(previous))
    changes = diff.compare(previous, manifest, old_members, members)
    expected = (step.added, len(step.changed), len(step.removed), 0)
    found = (changes.added, changes.changed, changes.removed, changes.relabeled)
    if found != expected or manifest.base != previous.fingerprint:
        raise RuntimeError(
            f"{where}: expected (added, changed, removed, relabeled) {expected} and base "
            f"{previous.fingerprint}, found {found} and base {manifest.base!r}"
        )
    kept = _kept_inodes(manifest, previous)
    if len(kept) != reused:
        raise RuntimeError(f"{where}: write says {reused} shards reused, {len(kept)} share inodes")
    touched = set(step.changed) | set(step.removed)
    return fact | {
        "previous_shards": len(previous.shards),
        "kept": len(kept),
        "rewritten": len(previous.shards) - len(kept),
        "held_changes": sum(any(r[0] in touched for r in rows) for _, rows in old_members),
        "new_shards": len(manifest.shards) - len(kept),
        "records_written": sum(s.records for s in manifest.shards if s.name not in kept),
    }


def _kept_inodes(manifest: Manifest, previous: Manifest) -> set[str]:
    """The shards of ``manifest`` whose file is one of ``previous``'s shard files (same inode)."""
    old = {os.stat(os.path.join(previous.directory, s.name)).st_ino for s in previous.shards}
    return {
        s.name
        for s in manifest.shards
        if os.stat(os.path.join(manifest.directory, s.name)).st_ino in old
    }


def _row(step: Step, full: Step, fact: dict[str, Any], reps: int) -> dict[str, Any]:
    wall = spread(step.walls)
    ratios: Sequence[float] = [a / b for a, b in zip(step.walls, full.walls, strict=True)]
    row: dict[str, Any] = {
        "group": GROUP,
        "data": "small",
        "name": step.name,
        "records": step.files,
        "bytes": step.nbytes,
        "reps": reps,
        "wall_s": wall,
        "cpu_s": spread(step.cpus),
        "records_per_s": step.files / wall["median"],
        "mb_per_s": step.nbytes / 1e6 / wall["median"],
        "of_full": spread(ratios),  # this step's wall / the full write's, within each round
        "grows": step.grows,
    }
    return row | fact
