"""How long a resumed training stream takes to give its first batch: at 80% of an epoch
against at its start (the loader's seekable epoch order), and against replaying 80% of
the epoch, which is what resuming costs without one (the shuffle-buffer order).

Each contender makes a fresh ``make_dataset`` (shards verified once per process, in
the warm-up) and times ``next(iter(ds))``; ``reps`` interleaved rounds.

    python -m bench.suite.resume MANIFEST [REPS]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.common.timing import spread

AT = 0.8  # where the resumed stream starts, as a share of the epoch
BATCH = 64


def _first_batch(manifest: Any, **options: Any) -> float:
    from tfshards.reading import loader

    start = time.perf_counter()
    ds = loader.make_dataset(manifest.shards, manifest, batch_size=BATCH, training=True, **options)
    next(iter(ds))
    return time.perf_counter() - start


def _replayed(manifest: Any) -> float:
    """The buffer order's first batch after skipping 80% of an epoch's batches."""
    from tfshards.reading import loader

    skip = int(manifest.records * AT) // BATCH
    start = time.perf_counter()
    ds = loader.make_dataset(
        manifest.shards, manifest, batch_size=BATCH, training=True, order="buffer"
    )
    next(iter(ds.skip(skip)))
    return time.perf_counter() - start


def contenders(manifest: Any) -> dict[str, Callable[[], float]]:
    at = (0, int(manifest.records * AT))
    return {
        "epoch order, first batch of the epoch": lambda: _first_batch(manifest),
        f"epoch order, first batch at {AT:.0%} of the epoch": lambda: _first_batch(
            manifest, start=at
        ),
        f"buffer order, replaying {AT:.0%} of the epoch": lambda: _replayed(manifest),
    }


def compare(manifest: Any, reps: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """One row per contender: wall seconds to the first batch over ``reps`` rounds."""
    runs = contenders(manifest)
    for run in runs.values():  # warm-up: shards verified, page cache, graph tracing
        run()
    walls: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(reps):
        log(f"resume / round {round_ + 1} of {reps}")
        for name, run in runs.items():
            walls[name].append(run())
    return [{"group": "resume", "name": n, "wall_s": spread(w)} for n, w in walls.items()]


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The resume table, in markdown lines; nothing when the section did not run."""
    if not rows:
        return []
    lines = [
        "",
        f"#### First training batch after a resume at {AT:.0%} of an epoch (batch {BATCH})",
        "",
        "| stream | wall s (min-max) |",
        "|---|---:|",
    ]
    for r in rows:
        w = r["wall_s"]
        lines.append(f"| {r['name']} | {w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f}) |")
    return lines


if __name__ == "__main__":
    from tfshards.shardset import manifest as manifests

    found = manifests.load(sys.argv[1])
    rows = compare(found, int(sys.argv[2]) if len(sys.argv) > 2 else 3, print)
    print("\n".join(table(rows)))
