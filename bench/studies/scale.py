"""The scale series: list, write and validate 20k to 1M small files, each in a fresh process.

    python -m bench.studies.scale                               # 20k and 200k (minutes)
    python -m bench.studies.scale --files 20000,200000,1000000  # the long series (~15 min, 2 cores)
    python -m bench.studies.scale --dir /data/scale --keep      # keep the trees for the next run
    python -m bench.studies.scale --eager                       # validate vs the eager TF loop

Each size gets a tree of ``--file-bytes`` ``.jpg`` stubs, hard links to one
file per folder (:func:`bench.common.trees.make_tree`: the listing still opens,
reads and hashes each through its own name). Then ``python -m tfshards list``,
``write`` and ``validate`` run as the DVC stages run them, one fresh
interpreter each: wall seconds, CPU seconds of the whole process tree
(``RUSAGE_CHILDREN``), and peak RSS sampled every 20 ms over the process and
its pool workers. Beside them, the bounds, timed in this process on the same
tree (page cache warm): a plain walk (``os.scandir`` + ``stat`` + sort) and the
same walk + SHA-256 of every file (the least a content-named listing can do),
and the write bound of :mod:`bench.suite.bound` (read + sha256 + crc32c per record
on all cores). With ``--eager``, the loop a user writes to check shards with
TensorFlow alone (``TFRecordDataset`` + ``Example.FromString``) also runs over
each size's shards in a fresh process, and a second table gives validate's
ratio to it. The tables go to ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Any

from bench.common.timing import per_record, run_sampled
from bench.common.trees import make_tree


def run_step(args: list[str], src: str | None = None) -> dict[str, float]:
    """``python -m tfshards ARGS`` in a fresh process: wall, tree CPU seconds, peak RSS (MB).

    ``src``: another checkout's ``src/`` to import tfshards from (a before/after run).
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if src:
        env["PYTHONPATH"] = src
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "tfshards", *args]
    wall, _, sampler = run_sampled(cmd, env, f"tfshards {args[0]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall": wall, "cpu": cpu, "rss_mb": sampler.peak_sum / 2**20}


# The loop a user writes to check a shard set with TensorFlow alone: read every record
# (TFRecordDataset checks both CRCs of each) and parse it as an Example.
EAGER_LOOP = """
import sys
import tensorflow as tf

for raw in tf.data.TFRecordDataset(sys.argv[1:]):
    tf.train.Example.FromString(raw.numpy())
"""


def run_eager(manifest_path: str) -> dict[str, float]:
    """The eager loop over the manifest's shards in a fresh process, measured as run_step is."""
    from tfshards import storage
    from tfshards.shardset.manifest import load

    manifest = load(manifest_path)
    paths = [storage.join(manifest.directory, s.name) for s in manifest.shards]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, _, sampler = run_sampled([sys.executable, "-c", EAGER_LOOP, *paths], env, "eager loop")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall": wall, "cpu": cpu, "rss_mb": sampler.peak_sum / 2**20}


def walk(root: str, hash_files: bool) -> int:
    """The plain bound: scandir + stat (+ sha256 of the bytes) of every file, then sort."""
    rows = []
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():
                    stack.append(entry.path)
                    continue
                size = entry.stat().st_size
                token = ""
                if hash_files:
                    with open(entry.path, "rb") as f:
                        token = hashlib.sha256(f.read()).hexdigest()
                rows.append((entry.path, size, token))
    rows.sort()
    return len(rows)


def timed(fn: Any, *args: Any) -> dict[str, float]:
    start, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu}


def write_bound_us(root: str, n: int = 1000) -> float:
    """CPU microseconds per record of read + sha256 + crc32c (the suite's write bound pieces)."""
    import crc32c

    paths = []
    for dirpath, _, names in os.walk(root):
        paths += [os.path.join(dirpath, x) for x in names if not x.startswith(".")]
        if len(paths) >= n:
            break
    paths = paths[:n]
    blobs = [open(p, "rb").read() for p in paths]  # noqa: SIM115 - bench, closed by GC

    def read() -> None:
        for p in paths:
            with open(p, "rb") as f:
                f.read()

    pieces = {
        "read_file": per_record(read, len(paths)),
        "sha256": per_record(lambda: [hashlib.sha256(b).digest() for b in blobs], len(blobs)),
        "crc32c": per_record(lambda: [crc32c.crc32c(b) for b in blobs], len(blobs)),
    }
    return sum(pieces.values()) * 1e6


def one_size(
    files: int, base: str, workers: int, file_bytes: int, src: str | None, eager: bool, log: Any
) -> dict[str, Any]:
    root = os.path.join(base, f"tree-{files}")
    if not os.path.isdir(os.path.join(root, "label_00")):
        start = time.perf_counter()
        make_tree(root, files, labels=10, per_dir=1000, file_bytes=file_bytes)
        log(f"{files}: built the tree in {time.perf_counter() - start:.0f} s")
    work = tempfile.mkdtemp(prefix="scale-", dir=base)
    try:
        listing, out = os.path.join(work, "listing"), os.path.join(work, "shards")
        row: dict[str, Any] = {"files": files}
        row["walk"] = timed(walk, root, False)
        row["walk_sha256"] = timed(walk, root, True)
        row["list"] = run_step(["list", root, "--out", listing], src)
        w = str(workers)
        manifest = os.path.join(work, "manifest.json")  # never the caller's data/manifest.json
        write = ["write", listing, "--out", out, "--manifest", manifest, "--workers", w]
        row["write"] = run_step([*write, "--no-progress"], src)
        metrics = os.path.join(work, "metrics.json")
        # Every file of the tree is one hard-linked file under many labels: label
        # conflicts by construction, counted but not failed.
        checks = ["--fail-on-label-conflict", "false", "--workers", w, "--no-progress"]
        row["validate"] = run_step(["validate", manifest, "--metrics", metrics, *checks], src)
        if eager:
            row["eager"] = run_eager(manifest)
        row["write_bound_us"] = write_bound_us(root)
        log(json.dumps(row))
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table; ratios against the first (smallest) size."""
    first = rows[0]
    lines = [
        "| files | list s | plain walk s | walk + sha256 s | write s (CPU) | validate s "
        "| list MB | write MB | validate MB | write CPU us/rec | bound us/rec |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n, wr, va = r["files"], r["write"], r["validate"]
        cells = [
            f"{n:,}",
            f"{r['list']['wall']:.2f}",
            f"{r['walk']['wall']:.2f}",
            f"{r['walk_sha256']['wall']:.2f}",
            f"{wr['wall']:.2f} ({wr['cpu']:.2f})",
            f"{va['wall']:.2f}",
            f"{r['list']['rss_mb']:.0f}",
            f"{wr['rss_mb']:.0f} ({wr['rss_mb'] / first['write']['rss_mb']:.2f}x)",
            f"{va['rss_mb']:.0f} ({va['rss_mb'] / first['validate']['rss_mb']:.2f}x)",
            f"{wr['cpu'] * 1e6 / n:.1f}",
            f"{r['write_bound_us']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if all("eager" in r for r in rows):
        lines += ["", *eager_table(rows)]
    return "\n".join(lines)


def eager_table(rows: list[dict[str, Any]]) -> list[str]:
    """validate against the eager TensorFlow loop, both fresh processes: CPU and wall ratios."""
    lines = [
        "| files | eager loop CPU s (wall) | validate CPU s (wall) | CPU ratio | wall ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        eager, va = r["eager"], r["validate"]
        cells = [
            f"{r['files']:,}",
            f"{eager['cpu']:.2f} ({eager['wall']:.2f})",
            f"{va['cpu']:.2f} ({va['wall']:.2f})",
            f"{eager['cpu'] / va['cpu']:.1f}x",
            f"{eager['wall'] / va['wall']:.1f}x",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", default="20000,200000", help="comma-separated tree sizes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--file-bytes", type=int, default=4096, help="size of each stub")
    parser.add_argument("--dir", help="where the trees go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the trees (reuse with --dir)")
    parser.add_argument("--json", help="also save the rows here")
    parser.add_argument("--src", help="import tfshards from this src/ (another checkout)")
    parser.add_argument(
        "--eager",
        action="store_true",
        help="also time the eager TFRecordDataset + Example.FromString loop over the shards",
    )
    args = parser.parse_args()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    base = args.dir or tempfile.mkdtemp(prefix="tfshards-scale-")
    os.makedirs(base, exist_ok=True)
    try:
        sizes = [int(x) for x in args.files.split(",")]
        rows = [
            one_size(n, base, args.workers, args.file_bytes, args.src, args.eager, log)
            for n in sizes
        ]
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    print(table(rows))


if __name__ == "__main__":
    main()
