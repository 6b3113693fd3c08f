"""Training read throughput from S3 with the cache limited to 20% of the set, against no limit.

    python -m bench.studies.cache_limit --reps 3
    python -m bench.studies.cache_limit --store memory --reps 3   # the cache's own cost
    python -m bench.studies.cache_limit --images 1000 --reps 1   # smoke run

:mod:`bench.common.limitedcache` runs each read (the suite's ``cachelimit``
section runs the same on S3). Runs alternate (unlimited, limited, ...) after
one warm-up of each; the ratio is taken within a round.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Annotated

import typer


def main(
    images: Annotated[int, typer.Option(help="Synthetic JPEGs in the set.")] = 8000,
    size: Annotated[int, typer.Option(help="Their side in pixels.")] = 96,
    shards: Annotated[int, typer.Option(help="Shards to write them into.")] = 80,
    reps: Annotated[int, typer.Option(min=1, help="Timed rounds after the warm-up.")] = 3,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 64,
    data: Annotated[str, typer.Option(help="Where the images are kept.")] = "bench/data",
    store: Annotated[str, typer.Option(help="s3 (moto's server) or memory (memory://).")] = "s3",
) -> None:
    """Print one row: unlimited and limited seconds for 3 epochs, and their ratio."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from bench.common import limitedcache
    from bench.common.data import DataSet, ensure, listing_of

    root, _ = ensure(DataSet("cachelimit", images, size), data)
    with limitedcache.store(store) as options:
        manifest = limitedcache.write_set(listing_of(root), store, shards, options)
        limit = int(manifest.bytes * limitedcache.SHARE)
        largest = max(s.bytes for s in manifest.shards)
        limitedcache.epochs(manifest, options, None, batch)  # warm-up: TensorFlow's first graphs
        limitedcache.epochs(manifest, options, limit, batch)
        ratios, walls = [], {"unlimited": [], "limited": []}
        for _ in range(reps):
            free = limitedcache.epochs(manifest, options, None, batch)
            bounded = limitedcache.epochs(manifest, options, limit, batch)
            walls["unlimited"].append(free.wall_s)
            walls["limited"].append(bounded.wall_s)
            ratios.append(free.wall_s / bounded.wall_s)
            print(
                f"round: unlimited {free.wall_s:.2f} s ({free.cpu_s:.2f} s CPU), limited "
                f"{bounded.wall_s:.2f} s ({bounded.cpu_s:.2f} s CPU), throughput ratio "
                f"{ratios[-1]:.3f}, peak {bounded.peak_bytes} B (limit {limit} + largest shard "
                f"{largest})",
                file=sys.stderr,
                flush=True,
            )
    records = limitedcache.EPOCHS * manifest.records // batch * batch
    free_s, bounded_s = statistics.median(walls["unlimited"]), statistics.median(walls["limited"])
    where = "S3 (moto)" if store == "s3" else "memory://"
    print(f"| read 3 epochs from {where} | unlimited | limited to 20% | ratio |")
    print("|---|---|---|---|")
    print(
        f"| {manifest.records} x {size} px JPEG, {shards} shards, {manifest.bytes / 2**20:.1f} MiB"
        f" | {records / free_s:,.0f} rec/s ({free_s:.2f} s) | {records / bounded_s:,.0f} rec/s "
        f"({bounded_s:.2f} s) | {statistics.median(ratios):.2f}x |"
    )


if __name__ == "__main__":
    typer.run(main)
