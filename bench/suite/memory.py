"""A whole write in a fresh process, as a DVC stage runs it: wall, CPU and peak memory.

Each run is ``python -m bench.suite.memory KIND LISTING_DIR OUT`` (what the write
stage does: read the listing, write the shards), at 1x and 10x the number of
files, so the bench process and its TensorFlow stay out of the numbers and
each contender pays its own imports (TensorFlow: seconds). Peak RSS is sampled
every 20 ms over the child and all its descendants (the pool workers started
by the forkserver): ``peak_rss_mb`` is the largest sum over the tree (pages
shared between processes count once per process), ``peak_single_mb`` the
largest ``VmHWM`` of any one process. CPU is the child's whole tree, which it
reports itself just before it exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from bench.common.timing import run_sampled, spread, tree_cpu_seconds
from tfshards.listing.listing import Listing, read_listing, write_listing

KINDS = {
    "naive": "naive loop (1 process)",
    "tfds": "tensorflow-datasets build",
    "tfshards": "tfshards (2 workers, auto)",
}


def run_child(kind: str, listing_dir: str, out: str) -> dict[str, float]:
    """One write in a fresh interpreter; wall and CPU seconds, peak RSS in MB."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = [sys.executable, "-m", "bench.suite.memory", kind, listing_dir, out]
    wall, out_text, sampler = run_sampled(cmd, env, f"bench.suite.memory {kind}")
    return {
        "wall": wall,
        "cpu": float(json.loads(out_text.decode().strip().splitlines()[-1])["cpu"]),
        "peak_rss_mb": sampler.peak_sum / 2**20,
        "peak_single_mb": sampler.peak_single / 2**20,
    }


def compare(
    listings: dict[str, Listing],
    kinds: Sequence[str],
    reps: int,
    workroot: str,
    log: Any,
    warmup: bool = True,
) -> list[dict[str, Any]]:
    """Interleaved runs of every (kind, listing), after a warm-up run of each kind unless
    ``warmup`` is false; one row per pair, ratio to the smallest set."""
    import shutil
    import tempfile

    dirs = {}
    for label, listing in listings.items():
        dirs[label] = tempfile.mkdtemp(dir=workroot)
        write_listing(listing, dirs[label])
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    try:
        for kind in kinds if warmup else ():  # warm-up: bytecode cache, page cache
            out = tempfile.mkdtemp(dir=workroot)
            try:
                r = run_child(kind, dirs[next(iter(listings))], out)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            log(f"  warm-up  fresh process {kind:<9} {r['wall']:6.2f} s")
        for rep in range(reps):
            for kind in kinds:
                for label in listings:
                    out = tempfile.mkdtemp(dir=workroot)
                    try:
                        r = run_child(kind, dirs[label], out)
                    finally:
                        shutil.rmtree(out, ignore_errors=True)
                    results.setdefault((kind, label), []).append(r)
                    log(
                        f"  rep {rep + 1}/{reps} fresh process {kind:<9} {label:<14} "
                        f"{r['wall']:6.2f} s  cpu {r['cpu']:6.2f} s  "
                        f"peak {r['peak_rss_mb']:5.0f} MB"
                    )
    finally:
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)
    rows = []
    first = next(iter(listings))
    for kind in kinds:
        base = spread([r["peak_rss_mb"] for r in results[(kind, first)]])["median"]
        for label, listing in listings.items():
            runs = results[(kind, label)]
            peak = spread([r["peak_rss_mb"] for r in runs])
            wall = spread([r["wall"] for r in runs])
            rows.append(
                {
                    "group": "memory",
                    "data": "small",
                    "name": KINDS[kind],
                    "kind": kind,
                    "records": len(listing.entries),
                    "bytes": listing.total_bytes,
                    "reps": len(runs),
                    "wall_s": wall,
                    "cpu_s": spread([r["cpu"] for r in runs]),
                    "records_per_s": len(listing.entries) / wall["median"],
                    "mb_per_s": listing.total_bytes / 1e6 / wall["median"],
                    "peak_rss_mb": peak,
                    "peak_single_mb": spread([r["peak_single_mb"] for r in runs]),
                    "baseline": f"{KINDS[kind]}, {first}",
                    "ratio": {k: v / base for k, v in peak.items()},
                    "ratio_of": "peak RSS",
                    "bound_records_per_s": None,
                    "of_bound": None,
                    "note": "wall includes interpreter start and imports",
                }
            )
    return rows


def _child(kind: str, listing_dir: str, out: str) -> None:
    if kind == "tfshards":
        from tfshards.writing.config import WriteConfig
        from tfshards.writing.writer import write

        write(WriteConfig(out=out, workers=2), listing_dir, progress=False)
    elif kind == "tfds":
        from bench.suite.tfds_builder import build
        from bench.suite.writers import NUM_SHARDS

        with contextlib.redirect_stdout(sys.stderr):
            build(read_listing(listing_dir), out, NUM_SHARDS)
    elif kind == "naive":
        from bench.suite.writers import naive_write

        naive_write(read_listing(listing_dir), out)
    else:
        raise SystemExit(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    print(json.dumps({"cpu": tree_cpu_seconds()}))


if __name__ == "__main__":
    _child(*sys.argv[1:4])
