"""Finding one record in a large version: ``tfshards show`` in a fresh process.

A tree of ``records`` tiny files (hard links of one stub per folder, 16
bytes each, so the set is cheap to make at 1,000,000 records) is listed and
written as 64 shards, untimed. Then each lookup runs ``reps`` times,
interleaved, each a new ``tfshards show`` process as a user types it: a
listed path near the end of the last shard (the member lists of its split
bucket are read), and ``SHARD:INDEX`` (one seek through the shard's index
file). Wall is ``perf_counter`` around the child, CPU its user + system time.
The stub records are not images, so no ``--png`` is asked for.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common.timing import spread
from bench.common.trees import make_tree
from tfshards.listing.listing import list_files, write_listing
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

GROUP = "show"
RECORDS = 1_000_000  # at scale 1
SHARDS = 64
AIM_S = 1.0  # a record of a 1M-record version, found and printed, in a fresh process


def build(records: int, workroot: str) -> tuple[str, list[str]]:
    """A version of ``records`` stub records (untimed); its manifest and the records to look up."""
    root = tempfile.mkdtemp(dir=workroot, prefix="show-tree-")
    make_tree(root, records, labels=10, per_dir=1000)
    listed = list_files(root)
    listing_dir = tempfile.mkdtemp(dir=workroot, prefix="show-listing-")
    write_listing(listed, listing_dir)
    out = tempfile.mkdtemp(dir=workroot, prefix="show-shards-")
    shards = min(SHARDS, max(1, records // 2))
    manifest = write(
        WriteConfig(out=out, num_shards=shards, workers=2), listed, progress=False
    ).manifest
    last = manifest.shards[-1]
    specs = [listed.entries[-1].path, f"{last.name}:{last.records - 1}"]  # the last listed file
    return os.path.join(manifest.root, MANIFEST_NAME), specs


def _tfshards() -> list[str]:
    script = Path(sys.executable).with_name("tfshards")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tfshards"]


def _once(argv: Sequence[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compare(
    records: int, reps: int, workroot: str, log: Callable[[str], None], warmup: bool = True
) -> list[dict[str, Any]]:
    """One row per lookup kind: wall and CPU spreads of ``tfshards show`` over ``reps`` rounds,
    after one warm-up run of each unless ``warmup`` is false."""
    log(f"show / writing a version of {records:,} stub records (untimed)")
    manifest, specs = build(records, workroot)
    kinds = {"by path": specs[0], "by SHARD:INDEX": specs[1]}
    argvs = {kind: [*_tfshards(), "show", manifest, spec] for kind, spec in kinds.items()}
    for argv in argvs.values() if warmup else ():  # warm-up: bytecode and page cache
        _once(argv)
    walls: dict[str, list[float]] = {kind: [] for kind in argvs}
    cpus: dict[str, list[float]] = {kind: [] for kind in argvs}
    for round_ in range(reps):
        log(f"show / round {round_ + 1} of {reps}")
        for kind, argv in argvs.items():
            wall, cpu = _once(argv)
            walls[kind].append(wall)
            cpus[kind].append(cpu)
    return [
        {
            "group": GROUP,
            "name": f"tfshards show, {kind}",
            "records": records,
            "wall_s": spread(walls[kind]),
            "cpu_s": spread(cpus[kind]),
            # a smoke run's cold first runs say nothing about the aim
            "within_aim": statistics.median(walls[kind]) <= AIM_S if warmup else None,
        }
        for kind in argvs
    ]


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The lookup table, in markdown lines; nothing when the section did not run."""
    if not rows:
        return []
    lines = [
        "",
        f"#### One record of a large version, fresh process (aim: at most {AIM_S} s)",
        "",
        "| lookup | records | wall s (min-max) | CPU s | within the aim |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        w, c = r["wall_s"], r["cpu_s"]
        lines.append(
            f"| {r['name']} | {r['records']:,} | {w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f}) "
            f"| {c['median']:.3f} | {_aim(r['within_aim'])} |"
        )
    return lines


def _aim(within: bool | None) -> str:
    return "-" if within is None else ("yes" if within else "no")
