"""Write time with and without the image statistics of the write pass.

    python -m bench.studies.image_stats --count 20000 --size 64 --reps 3

Writes one synthetic JPEG set (generated once under ``--data``) with
tfshards' defaults (2 workers, ``auto``: threads with the C loops built),
alternating rounds with the statistics on and off. Off replaces the per-flush
header reading (:class:`tfshards.writing.imagestats.ShardImages`) and the
statistics files with no-ops in this process, which reaches the workers of a
thread pool only: the executor used is printed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Annotated, Any

import typer


@contextlib.contextmanager
def stats_off() -> Iterator[None]:
    """The write pass without image statistics (threads and serial only)."""
    from tfshards.writing import imagestats

    saved = {
        "feed": imagestats.ShardImages.feed,
        "save_shard": imagestats.save_shard,
        "save_version": imagestats.save_version,
    }

    def nothing(*_: Any, **__: Any) -> None:
        return None

    imagestats.ShardImages.feed = nothing  # type: ignore[method-assign]
    imagestats.save_shard = nothing
    imagestats.save_version = nothing
    try:
        yield
    finally:
        imagestats.ShardImages.feed = saved["feed"]  # type: ignore[method-assign]
        imagestats.save_shard = saved["save_shard"]
        imagestats.save_version = saved["save_version"]


def _write(listing: Any, workers: int, executor: str) -> tuple[float, float]:
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    out = tempfile.mkdtemp(prefix="imagestats-bench-")
    try:
        start, cpu = time.perf_counter(), time.process_time()
        write(WriteConfig(out=out, workers=workers, executor=executor), listing, progress=False)
        return time.perf_counter() - start, time.process_time() - cpu
    finally:
        shutil.rmtree(out)


def main(
    count: Annotated[int, typer.Option(help="Images.")] = 20_000,
    size: Annotated[int, typer.Option(help="Side of each image, px.")] = 64,
    reps: Annotated[int, typer.Option(min=1, help="Timed rounds (after a warm-up).")] = 3,
    workers: Annotated[int, typer.Option(min=1)] = 2,
    executor: Annotated[str, typer.Option()] = "auto",
    data: Annotated[str, typer.Option(help="Where the images are kept.")] = "bench/data",
) -> None:
    """Print seconds per write with and without the statistics, and the ratio per round.

    Wall time, and CPU time of this process (its threads' together: the work
    a busy machine's noise hides less).
    """
    from tfshards.format import native
    from tfshards.listing.listing import list_files
    from tfshards.project.sample import write_synthetic
    from tfshards.run import executor as executors

    root = os.path.join(data, f"imagestats-{count}-{size}")
    if not os.path.isdir(root):
        write_synthetic(root, count, size, fmt="jpeg", classes=10, seed=0, workers=2)
    listing = list_files(root)
    used = executors.resolve(executor, workers, ["file"], gil_free=native.NATIVE is not None)
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    for rep in range(reps + 1):
        with stats_off():
            t_off = _write(listing, workers, executor)
        t_on = _write(listing, workers, executor)
        if rep:  # the first round warms up
            on.append(t_on)
            off.append(t_off)
    mb = listing.total_bytes / 1e6
    print(f"{count} images of {size}x{size} px, {mb:.1f} MB, {workers} workers ({used})")
    for k, what in enumerate(("wall", "cpu")):
        a, b = [t[k] for t in on], [t[k] for t in off]
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        print(f"{what} without statistics: median {statistics.median(b):.3f} s, min {min(b):.3f} s")
        print(f"{what} with statistics:    median {statistics.median(a):.3f} s, min {min(a):.3f} s")
        print(f"{what} ratio with/without: median {statistics.median(ratios):.3f} ({_fmt(ratios)})")
        print(f"{what} ratio of the minimums: {min(a) / min(b):.3f}")


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    typer.run(main)
