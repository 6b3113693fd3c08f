"""What Dask costs against local workers: per run, per shard, and where it stops losing.

    python -m bench.studies.dask_cost --out bench/results  # a few minutes on 2 cores; a table
    python -m bench.studies.dask_cost --reps 1 --scale 0.05  # smoke run

Contenders, each ``tfshards.write`` with 2 workers from this process: local
processes (``executor="process"``, a new pool each run), local threads (what
``auto`` picks with the compiled loops), a running ``dask scheduler`` with one
``dask worker --nworkers 2 --nthreads 1`` (started once, as a user runs one;
each write connects a client) and ``--executor dask`` without an address (a
``LocalCluster`` started and stopped by every run).

Four runs per contender on the small synthetic set (~4 KB JPEGs), each the
median of ``--reps`` interleaved rounds after a warm-up:
* 256 files in 2 shards: the **fixed cost** of a run (the files take ~5 ms);
* 256 files in 128 shards: the **cost per shard** is the difference / 126;
* 1/16 of the 20,000 files and all of them, in 16 shards: the **cost per
  file** is the difference over the files added.
The two size runs give each contender a line ``wall = a + per_file * files``;
where Dask's line meets the local processes' line is the size from which the
cluster stops losing, and "never" when Dask's per-file cost is not lower.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import version

from bench.common.data import SMALL, ensure, listing_of, subset
from tfshards.listing.listing import Listing
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

SHARDS = (2, 128)
SHARD_SWEEP_FILES = 256
SIZE_EVERY = (16, 1)  # every 16th file of the set, then all of them
SIZE_SHARDS = 16


@contextlib.contextmanager
def dask_cluster(workdir: str) -> Iterator[str]:
    """A `dask scheduler` and `dask worker --nworkers 2 --nthreads 1` on 127.0.0.1."""
    from distributed import Client

    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    info = os.path.join(workdir, "scheduler.json")
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> None:
        procs.append(
            subprocess.Popen(
                [dask, *args],
                cwd=workdir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped whole below
            )
        )

    try:
        start(
            "scheduler",
            *("--host", "127.0.0.1", "--port", "0", "--no-dashboard"),
            *("--scheduler-file", info),
            *("--idle-timeout", "600"),  # gone even if this process is killed
        )
        deadline = time.monotonic() + 60
        while not os.path.exists(info):
            if time.monotonic() > deadline:
                raise RuntimeError("dask scheduler did not start in 60 s")
            time.sleep(0.1)
        with open(info) as f:
            address = str(json.load(f)["address"])
        start(
            "worker",
            address,
            *("--nworkers", "2", "--nthreads", "1"),
            *("--host", "127.0.0.1", "--no-dashboard", "--death-timeout", "30"),
        )
        with Client(address, timeout="60s") as client:  # type: ignore[no-untyped-call]
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@dataclass(frozen=True)
class Contender:
    name: str
    executor: str
    address: str | None = None
    shared_fs: bool = False


def _write(c: Contender, listing: Listing, shards: int, workroot: str) -> float:
    out = tempfile.mkdtemp(dir=workroot)
    try:
        config = WriteConfig(
            out=out,
            num_shards=shards,
            workers=2,
            executor=c.executor,
            dask_address=c.address,
            shared_fs=c.shared_fs,
        )
        start = time.perf_counter()
        write(config, listing, progress=False)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _sweep(
    contenders: Sequence[Contender],
    points: Sequence[tuple[Listing, int]],
    reps: int,
    workroot: str,
    log: Callable[[str], None],
) -> dict[str, list[float]]:
    """Median wall per contender and point; rounds interleave the contenders."""
    walls: dict[str, list[list[float]]] = {c.name: [[] for _ in points] for c in contenders}
    for c in contenders:  # warm-up: imports, first connection, page cache
        _write(c, points[0][0], points[0][1], workroot)
    for rep in range(reps):
        for i, (listing, shards) in enumerate(points):
            for c in contenders:
                wall = _write(c, listing, shards, workroot)
                walls[c.name][i].append(wall)
                log(
                    f"  rep {rep + 1}/{reps} {c.name:<22} {len(listing.entries):>6} files "
                    f"{shards:>4} shards {wall:6.2f} s"
                )
    return {name: [statistics.median(w) for w in per] for name, per in walls.items()}


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``y = a + b * x`` through the first and last points; returns ``(a, b)``."""
    b = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
    return ys[0] - b * xs[0], b


def crossover(
    base: tuple[float, float], other: tuple[float, float], within: float = 1.0
) -> float | None:
    """The ``x`` from which ``other``'s line stays under ``within`` x ``base``'s, or None."""
    (a0, b0), (a1, b1) = base, other
    if b1 >= within * b0:
        return None
    return max((a1 - within * a0) / (within * b0 - b1), 0.0)


# Not compared: the baseline itself, and a LocalCluster, whose start-up (seconds,
# varying by more than the whole per-file work) makes the line through its two
# size runs meaningless.
NOT_COMPARED = ("processes", "dask LocalCluster")


def _files(name: str, count: float | None) -> str:
    if name in NOT_COMPARED:
        return "—"
    return "never (per-file cost not lower)" if count is None else f"~{count:,.0f} files"


def _seconds(value: float) -> str:
    return "—" if value < 0 else f"{value:.3f}"  # below zero: start-up noise, not a cost


def render(doc: dict[str, object]) -> str:
    rows, files = doc["rows"], doc["files"]
    assert isinstance(rows, list) and isinstance(files, list)
    lines = [
        "| contender | fixed per run (s) | per shard (ms) | per 1,000 files (s) "
        f"| {files[-1]:,} files (s) | as fast as processes from | within 10% of them from |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['fixed_s']:.2f} | {r['per_shard_ms']:.1f} "
            f"| {_seconds(r['per_1000_files_s'])} | {r['largest_s']:.2f} "
            f"| {_files(r['name'], r['crossover_files'])} "
            f"| {_files(r['name'], r['within_10pct_files'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the 20,000 files")
    parser.add_argument("--data", default="bench/data")
    parser.add_argument("--out", help="also save dask_cost.json and dask_cost.md here")
    args = parser.parse_args()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    load_before = os.getloadavg()
    root, _ = ensure(SMALL.scaled(args.scale, minimum=SHARD_SWEEP_FILES), args.data)
    full = listing_of(root)
    few = Listing(full.root, full.labels, full.entries[:SHARD_SWEEP_FILES])
    sizes = [subset(full, every) for every in SIZE_EVERY]
    with tempfile.TemporaryDirectory() as workroot, dask_cluster(workroot) as address:
        contenders = [
            Contender("processes", "process"),
            Contender("threads", "thread"),
            Contender("dask scheduler", "dask", address, shared_fs=True),
            Contender("dask LocalCluster", "dask"),
        ]
        log("shards sweep")
        by_shards = _sweep(contenders, [(few, s) for s in SHARDS], args.reps, workroot, log)
        log("size sweep")
        by_size = _sweep(contenders, [(s, SIZE_SHARDS) for s in sizes], args.reps, workroot, log)
    files = [len(s.entries) for s in sizes]
    base = line(files, by_size["processes"])
    rows = []
    for c in contenders:
        per_file = line(files, by_size[c.name])
        rows.append(
            {
                "name": c.name,
                "fixed_s": by_shards[c.name][0],
                "per_shard_ms": line(SHARDS, by_shards[c.name])[1] * 1e3,
                "per_1000_files_s": per_file[1] * 1e3,
                "largest_s": by_size[c.name][-1],
                "crossover_files": crossover(base, per_file),
                "within_10pct_files": crossover(base, per_file, within=1.1),
                "shards_sweep_s": dict(zip(map(str, SHARDS), by_shards[c.name], strict=True)),
                "size_sweep_s": dict(zip(map(str, files), by_size[c.name], strict=True)),
            }
        )
    before = " ".join(f"{x:.1f}" for x in load_before)
    after = " ".join(f"{x:.1f}" for x in os.getloadavg())
    doc: dict[str, object] = {
        "reps": args.reps,
        "files": files,
        "rows": rows,
        "cpus": len(os.sched_getaffinity(0)),
        "distributed": version("distributed"),
        "load_before": before,
        "load_after": after,
    }
    table = render(doc)
    print(table)
    print(
        f"\n{doc['cpus']} cores, distributed {doc['distributed']}; load average "
        f"{before} before, {after} after; medians of {args.reps} rounds."
    )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "dask_cost.json"), "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
        with open(os.path.join(args.out, "dask_cost.md"), "w") as f:
            f.write(table + "\n")  # the load line is in the JSON


if __name__ == "__main__":
    main()
