"""``tfshards list`` against its bounds, cold and warm hash cache, each in a fresh process.

    python -m bench.studies.list_bounds                       # 20,000 and 200,000 files
    python -m bench.studies.list_bounds --files 20000 --repeat 5

Bounds (whole process, CPU of it and its children, from ``os.wait4``):

- cold: ``os.walk`` + read + ``hashlib.sha256`` of every file in a
  ``multiprocessing.Pool(2)``: what reading and hashing every file costs;
- warm: ``os.scandir`` + ``stat`` + sort (:func:`bench.common.trees.plain_walk`):
  what looking at every file costs, which a re-list with a warm cache should be near.

Rows ``list_to`` run :func:`tfshards.listing.treelisting.list_to` (the streamed
``tfshards list``) with a fresh or a warm hash cache and
``threads=2``; ``in-process`` is the CPU of the listing call alone (all
threads), without interpreter start and imports (fsspec's too, ~0.2 s, which
:mod:`tfshards.storage` imports on first use). ``cli`` rows run the
``tfshards list`` command as it stands, imports included. Ratios are bound / row (1.0: at
the bound), medians of ``--repeat`` runs, all from one run of this study.
Trees are 4.2 KB ``.jpg`` stubs, hard links to one file per folder
(:func:`bench.common.trees.make_tree`), in the page cache throughout.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common.trees import make_tree, plain_walk

BOUND_COLD = """
import hashlib, os, sys
from multiprocessing import Pool

def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

if __name__ == "__main__":
    paths = [os.path.join(d, n) for d, _, names in os.walk(sys.argv[1])
             for n in names if not n.startswith(".")]
    with Pool(2) as pool:
        print(len(pool.map(digest, paths, chunksize=256)))
"""
# The warm bound's child runs bench.common.trees.plain_walk's own text: no tfshards import.
BOUND_WARM = (
    "import os, sys\n\n" + inspect.getsource(plain_walk) + "\nprint(len(plain_walk(sys.argv[1])))\n"
)
LIST = """
import sys, time
import fsspec.implementations.local  # storage imports it on first use: not the listing's work
from tfshards.listing.treelisting import list_to
cpu = time.process_time()
summary = list_to(sys.argv[1], sys.argv[2], hash_cache=sys.argv[3], threads=2)
print(summary.files, time.process_time() - cpu)
"""


def run_child(args: list[str]) -> tuple[float, float, float, str]:
    """Whole-process CPU (with its children), wall seconds, peak RSS (MB), stdout."""
    start = time.perf_counter()
    child = subprocess.Popen(args, stdout=subprocess.PIPE, env=_env())
    assert child.stdout is not None
    out = child.stdout.read().decode()
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args[:3]} failed")
    wall = time.perf_counter() - start
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024, out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _fresh(path: str) -> str:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    return path


def measure(root: str, work: str, repeat: int) -> dict[str, list[tuple[float, float, float]]]:
    """Each row's (process CPU, in-process CPU or 0, peak RSS MB), ``repeat`` times, interleaved."""
    py = sys.executable
    cache = os.path.join(work, "hashes.sqlite")
    out = os.path.join(work, "listing")
    cli = [py, "-m", "tfshards", "list", root, "--out", out, "--hash-cache", cache]
    rows: dict[str, list[tuple[float, float, float]]] = {}

    def add(name: str, args: list[str], in_process: bool = False) -> None:
        cpu, _, rss, text = run_child(args)
        inner = float(text.split()[1]) if in_process else 0.0
        rows.setdefault(name, []).append((cpu, inner, rss))

    for _ in range(repeat):
        add(COLD_BOUND, [py, "-c", BOUND_COLD, root])
        add(WARM_BOUND, [py, "-c", BOUND_WARM, root])
        _fresh(cache)
        add("list_to, cold cache", [py, "-c", LIST, root, out, cache], True)
        time.sleep(0.1)
        add("list_to, warm cache", [py, "-c", LIST, root, out, cache], True)
        _fresh(cache)
        add("cli `tfshards list`, cold cache", cli)
        add("cli `tfshards list`, warm cache", cli)
    return rows


COLD_BOUND = "bound cold: walk + read + sha256, Pool(2)"
WARM_BOUND = "bound warm: scandir + stat + sort"


def report(files: int, rows: dict[str, list[tuple[float, float, float]]]) -> None:
    """One line per row: medians, and the bound's CPU over the row's."""
    runs = len(next(iter(rows.values())))
    med = {
        name: [statistics.median(col) for col in zip(*r, strict=True)] for name, r in rows.items()
    }
    print(f"{files} files, medians of {runs}, load {os.getloadavg()[0]:.1f}:")
    for name, (cpu, inner, rss) in med.items():
        bound = med[COLD_BOUND if "cold" in name else WARM_BOUND][0]
        ratio = f"bound/this {bound / cpu:4.2f}x" if not name.startswith("bound") else " " * 16
        extra = f"  in-process {inner:5.2f} s" if inner else ""
        print(f"  {name:42s} CPU {cpu:6.2f} s  {ratio}  peak RSS {rss:5.0f} MB{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--file-bytes", type=int, default=4200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="where to build the trees (default: a temp dir)")
    args = parser.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="tfshards-list-bounds-")
    try:
        for files in args.files:
            root = os.path.join(base, f"tree{files}")
            if not os.path.isdir(root):
                make_tree(root, files, 10, 1000, args.file_bytes)
                time.sleep(2.1)  # files changed within 2 s of a list are not remembered
            work = tempfile.mkdtemp(prefix="work", dir=base)
            report(files, measure(root, work, args.repeat))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
