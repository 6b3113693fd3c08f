"""Time what durable publication costs ``write``: fsync of each file and folder, on and off.

    python -m bench.studies.durability --reps 5              # both data sets of bench/data
    python -m bench.studies.durability --scale 0.1 --reps 3

Separate from ``bench.suite.run``: no contender can choose to skip the fsync, so
this is a cost to record, not a row to compare. Rounds interleave "fsync" and
"no fsync" (``os.fsync`` replaced by a no-op in this process) for the serial
writer and the default one (``auto``: 2 threads with ``tfshards.format._native``),
each in a fresh output folder that is deleted after the run. Deleting it
drops any page the kernel had not yet written back, so "no fsync" is what a
machine with memory to spare sees: the writes never wait for the disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from bench.common.data import LARGE, SMALL, ensure, listing_of
from tfshards.listing.listing import Listing
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


def _no_fsync(fd: int) -> None:
    """Stands in for ``os.fsync``."""


def _timed(listing: Listing, workers: int, workroot: str) -> float:
    out = tempfile.mkdtemp(dir=workroot)
    try:
        start = time.perf_counter()
        executor = "auto" if workers > 1 else "serial"
        write(WriteConfig(out=out, workers=workers, executor=executor), listing, progress=False)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--data", default="bench/data")
    args = parser.parse_args()
    real_fsync = os.fsync
    os.makedirs(args.data, exist_ok=True)
    workroot = tempfile.mkdtemp(dir=args.data)  # the disk the data is on, not a tmpfs
    print("| data | writer | fsync s (min-max) | no fsync s (min-max) | cost |")
    print("|---|---|---:|---:|---:|")
    try:
        for data in (SMALL.scaled(args.scale), LARGE.scaled(args.scale)):
            listing = listing_of(ensure(data, args.data)[0])
            for writer, workers in (("1 process", 1), ("auto (2 workers)", 2)):
                times: dict[bool, list[float]] = {True: [], False: []}
                for rep in range(args.reps + 1):  # the first round warms up
                    for synced in (True, False):
                        os.fsync = real_fsync if synced else _no_fsync
                        try:
                            wall = _timed(listing, workers, workroot)
                        finally:
                            os.fsync = real_fsync
                        if rep:
                            times[synced].append(wall)
                on, off = times[True], times[False]
                ratio = statistics.median(a / b for a, b in zip(on, off, strict=True))
                print(
                    f"| {data.name} | {writer} | {statistics.median(on):.3f} "
                    f"({min(on):.3f}-{max(on):.3f}) | {statistics.median(off):.3f} "
                    f"({min(off):.3f}-{max(off):.3f}) | {ratio:.2f}x |",
                    flush=True,
                )
    finally:
        shutil.rmtree(workroot, ignore_errors=True)


if __name__ == "__main__":
    main()
