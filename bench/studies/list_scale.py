"""Time ``list_files`` on a large local tree against a plain walk: CPU, wall, peak memory.

    python -m bench.studies.list_scale --files 200000            # tree in a temp dir, removed after
    python -m bench.studies.list_scale --files 1000000 --dir /data/bench-tree --keep
    python -m bench.studies.list_scale --dir /tmp/tree --keep --repeat 5   # medians of 5

Rows: the bound (``os.scandir`` + ``stat`` + sort in Python, no content read),
``list`` reading and hashing every file, ``list`` with a cold hash cache (hashes
and fills it), and the re-list with the cache warm (stats only). Each row is
the median of ``--repeat`` runs in this process; the tree stays in the page
cache throughout.

Files are 16-byte (``--file-bytes``) ``.jpg`` stubs spread over ``--labels`` label folders with
``--per-dir`` files per leaf folder, each a hard link to its folder's one
stub (200,000 take seconds to build; the listing opens, reads and hashes each
through its own name). Creating the tree is not timed. Peak RSS is the
process's high-water mark (``ru_maxrss``), read before and after listing, so
the difference bounds what the listing holds.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

from bench.common.trees import make_tree, plain_walk
from tfshards.listing import hashcache
from tfshards.listing.listing import list_files, listing_digest, write_listing

T = TypeVar("T")


def timed(run: Callable[[], T], repeat: int) -> tuple[float, float, T]:
    """Median wall and CPU seconds (all threads) of ``repeat`` calls, and the last result."""
    walls: list[float] = []
    cpus: list[float] = []
    result = run()  # warm-up, not timed: page cache, imports, thread pool
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        result = run()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--labels", type=int, default=10)
    parser.add_argument("--per-dir", type=int, default=1000, help="files per leaf folder")
    parser.add_argument("--file-bytes", type=int, default=16, help="size of each file")
    parser.add_argument("--dir", help="where to build the tree (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the tree (reuse with --dir)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (median)")
    args = parser.parse_args()

    root = args.dir or tempfile.mkdtemp(prefix="tfshards-list-")
    try:
        built_at = 0.0
        if not os.path.isdir(os.path.join(root, "label_00")):
            start = time.perf_counter()
            make_tree(root, args.files, args.labels, args.per_dir, args.file_bytes)
            built_at = time.time()
            print(
                f"built {args.files} files in {time.perf_counter() - start:.1f} s", file=sys.stderr
            )
        # Files changed within 2 s of a list are not remembered (racy-git rule).
        time.sleep(max(0.0, hashcache.RACY_NS / 1e9 + 0.1 - (time.time() - built_at)))
        rss_before = peak_rss_mb()
        rows: dict[str, tuple[float, float]] = {}
        wall, cpu, _ = timed(lambda: plain_walk(root), args.repeat)
        rows["plain walk: scandir + stat + sort"] = wall, cpu
        wall, cpu, listing = timed(lambda: list_files(root), args.repeat)
        rows["list, every file read + sha256"] = wall, cpu
        cache_dir = tempfile.mkdtemp(prefix="tfshards-hashcache-")
        caches = iter(os.path.join(cache_dir, f"{i}.sqlite") for i in range(args.repeat + 1))
        wall, cpu, _ = timed(lambda: list_files(root, hash_cache=next(caches)), args.repeat)
        rows["list, hash cache cold (hash + fill)"] = wall, cpu
        cache = os.path.join(cache_dir, "0.sqlite")
        wall, cpu, warm = timed(lambda: list_files(root, hash_cache=cache), args.repeat)
        rows["re-list, hash cache warm"] = wall, cpu
        cache_mb = os.path.getsize(cache) / 1e6
        shutil.rmtree(cache_dir)
        if warm != listing:
            raise SystemExit("the warm re-list differs from the plain list")
        out = tempfile.mkdtemp(prefix="tfshards-listing-")
        start = time.perf_counter()
        write_listing(listing, out)
        written = time.perf_counter() - start
        shutil.rmtree(out)
        n = len(listing.entries)
        bound_wall, bound_cpu = rows["plain walk: scandir + stat + sort"]
        print(f"{n} files, medians of {args.repeat}, load {os.getloadavg()[0]:.1f}:")
        for name, (wall, cpu) in rows.items():
            print(
                f"  {name:40s} wall {wall:6.2f} s ({wall / bound_wall:4.2f}x)  "
                f"CPU {cpu:6.2f} s ({cpu / bound_cpu:4.2f}x)"
            )
        print(
            f"write_listing: {written:.2f} s; hash cache {cache_mb:.1f} MB; peak RSS (all rows) "
            f"{rss_before:.0f} MB before, {peak_rss_mb():.0f} MB after "
            f"({(peak_rss_mb() - rss_before) * 1e6 / n:.0f} B/file); "
            f"sha256 {listing_digest(listing)[:12]}"
        )
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
