"""Training throughput from S3 (moto's server) with the shard cache limited to 20% of the set,
against an unlimited cache (:mod:`bench.common.limitedcache` runs each read).

Two consumers of the batches: none (reading only: every download the limit
costs is on the critical path) and Keras fitting the train stage's
``small_cnn`` at its default 16 px, as the train stage consumes them. For each,
one warm-up of each cache, then ``reps`` rounds (unlimited, limited); the ratio
is taken within a round. Rows: each contender's wall and CPU seconds (this
process and the moto server) and the cache's peak bytes, and the
limited/unlimited throughput ratio.

    python -m bench.suite.cachelimit [IMAGES] [REPS]
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from bench.common import limitedcache
from bench.common.data import DataSet, ensure, listing_of
from bench.common.timing import spread

GROUP = "cachelimit"
IMAGES, SIZE, SHARDS, BATCH = 8000, 96, 80, 64
QUICK_SHARDS = 10  # a smoke run (--quick): 8 images a shard, 8x fewer requests to moto
UNLIMITED, LIMITED = "unlimited cache", f"cache limited to {limitedcache.SHARE:.0%} of the set"
TRAIN_SIZE = 16  # the train stage's default image_size
# What consumes the batches: nothing (the input alone), or Keras fitting small_cnn.
CONSUMERS = {"reading only": None, f"fitting small_cnn at {TRAIN_SIZE} px": TRAIN_SIZE}


def data_set(scale: float) -> DataSet:
    """The set this section reads: 8,000 96 px JPEGs at scale 1."""
    return DataSet("cachelimit", max(SHARDS, round(IMAGES * scale)), SIZE)


def compare(
    listing: Any,
    reps: int,
    log: Callable[[str], None],
    kind: str = "s3",
    warmup: bool = True,
    shards: int = SHARDS,
) -> list[dict[str, Any]]:
    """For each consumer (reading only, then fitting ``small_cnn``): two rows (unlimited,
    limited: wall s, CPU s, peak bytes), then the ratio row; a warm-up run of each first
    unless ``warmup`` is false. The set is written as ``shards`` shards."""
    with limitedcache.store(kind) as options:
        manifest = limitedcache.write_set(listing, kind, shards, options)
        limit = int(manifest.bytes * limitedcache.SHARE)
        rows: list[dict[str, Any]] = []
        for consumer, size in CONSUMERS.items():
            runs = {UNLIMITED: None, LIMITED: limit}
            for bound in runs.values() if warmup else ():  # warm-up: TensorFlow's first graphs
                limitedcache.epochs(manifest, options, bound, BATCH, size)
            done: dict[str, list[limitedcache.Run]] = {name: [] for name in runs}
            for round_ in range(reps):
                log(f"{GROUP} / {consumer} / round {round_ + 1} of {reps}")
                for name, bound in runs.items():
                    done[name].append(limitedcache.epochs(manifest, options, bound, BATCH, size))
            rows += _rows(manifest, kind, limit, consumer, done)
    return rows


def _rows(
    manifest: Any, kind: str, limit: int, consumer: str, done: dict[str, list[limitedcache.Run]]
) -> list[dict[str, Any]]:
    base = {
        "group": GROUP,
        "consumer": consumer,
        "records": limitedcache.EPOCHS * manifest.records // BATCH * BATCH,
        "shards": len(manifest.shards),
        "set_bytes": manifest.bytes,
        "limit_bytes": limit,
        "largest_shard": max(s.bytes for s in manifest.shards),
        "store": kind,
    }
    rows = [
        {
            **base,
            "name": name,
            "wall_s": spread([r.wall_s for r in got]),
            "cpu_s": spread([r.cpu_s for r in got]),
            "peak_bytes": max(r.peak_bytes for r in got),
        }
        for name, got in done.items()
    ]
    ratios = [a.wall_s / b.wall_s for a, b in zip(done[UNLIMITED], done[LIMITED], strict=True)]
    rows.append({**base, "name": "ratio", "ratio": spread(ratios)})
    return rows


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The section's table, in markdown lines; nothing when it did not run."""
    if not rows:
        return []
    first = rows[0]
    where = "S3 (moto)" if first["store"] == "s3" else "memory://"
    lines = [
        "",
        f"#### {limitedcache.EPOCHS} training epochs from {where} through the shard cache "
        f"({first['records']:,} records read, {first['shards']} shards, "
        f"{first['set_bytes'] / 2**20:.1f} MiB; limit {first['limit_bytes']:,} B, "
        f"largest shard {first['largest_shard']:,} B)",
        "",
        "| cache | wall s (min-max) | records/s | CPU s, with the server | peak cache bytes |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["name"] == "ratio":
            w = r["ratio"]
            lines.append(
                f"| {r['consumer']}: **throughput, limited / unlimited** | {w['median']:.2f}x "
                f"({w['min']:.2f}-{w['max']:.2f}) | | | |"
            )
            continue
        w = r["wall_s"]
        lines.append(
            f"| {r['consumer']}: {r['name']} | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | "
            f"{r['records'] / w['median']:,.0f} | {r['cpu_s']['median']:.2f} | "
            f"{r['peak_bytes']:,} |"
        )
    return lines


if __name__ == "__main__":
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    images = int(sys.argv[1]) if len(sys.argv) > 1 else IMAGES
    root, _ = ensure(DataSet("cachelimit", images, SIZE), "bench/data")
    found = compare(listing_of(root), int(sys.argv[2]) if len(sys.argv) > 2 else 3, print)
    print("\n".join(table(found)))
