"""The scale series: list, write and validate 20k to 1M small files, each in a fresh process.

    python -m bench.studies.scale                               # 20k and 200k (minutes)
    python -m bench.studies.scale --files 20000,200000,1000000  # the long series (~15 min, 2 cores)
    python -m bench.studies.scale --dir /data/scale --keep      # keep the trees for the next run
    python -m bench.studies.scale --usual                       # against the usual TF recipes

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
on all cores). ``list`` runs with a fresh hash cache (cold). With ``--usual``,
what a user writes with TensorFlow alone runs too, each in a fresh process: a
``Pool(--workers)`` of ``TFRecordWriter`` loops writing the tree as many
shards as tfshards wrote, and the eager ``TFRecordDataset`` +
``Example.FromString`` loop over tfshards' shards; ``list`` runs again with
the hash cache it filled (warm), and a second table gives the ratios: the
Pool loop against list + write, cold and warm, the eager loop against
validate. The tables go to ``bench/README.md``.
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


def run_measured(cmd: list[str], what: str, **env: str) -> dict[str, float]:
    """``cmd`` in a fresh process: wall, tree CPU seconds, peak RSS (MB)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, _, sampler = run_sampled(cmd, env, what)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall": wall, "cpu": cpu, "rss_mb": sampler.peak_sum / 2**20}


def run_step(args: list[str], src: str | None = None, **env: str) -> dict[str, float]:
    """``python -m tfshards ARGS`` measured by :func:`run_measured`.

    ``src``: another checkout's ``src/`` to import tfshards from (a before/after run).
    """
    if src:
        env["PYTHONPATH"] = src
    return run_measured([sys.executable, "-m", "tfshards", *args], f"tfshards {args[0]}", **env)


# The usual recipes, what a user writes with TensorFlow alone. Checking a shard set: read
# every record (TFRecordDataset checks both CRCs of each) and parse it as an Example.
EAGER_LOOP = """
import sys
import tensorflow as tf

for raw in tf.data.TFRecordDataset(sys.argv[1:]):
    tf.train.Example.FromString(raw.numpy())
"""

# Writing one: walk the label folders, then a Pool of workers, each writing whole shards
# of (file bytes, label) Examples with TFRecordWriter. argv: root, out, shards, workers.
POOL_WRITE = """
import os, sys
from multiprocessing import Pool

import tensorflow as tf

root, out, shards, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
labels = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
files = sorted(
    (os.path.join(folder, name), label)
    for label, d in enumerate(labels)
    for folder, _, names in os.walk(os.path.join(root, d))
    for name in names
    if not name.startswith(".")
)


def write(k):
    feature = tf.train.Feature
    with tf.io.TFRecordWriter(os.path.join(out, f"shard-{k:05d}.tfrecord")) as writer:
        for path, label in files[k::shards]:
            with open(path, "rb") as f:
                data = f.read()
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": feature(bytes_list=tf.train.BytesList(value=[data])),
                "label": feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())


if __name__ == "__main__":
    os.makedirs(out)
    with Pool(workers) as pool:
        pool.map(write, range(shards))
"""


def run_usual(root: str, manifest_path: str, out: str, workers: int) -> dict[str, dict[str, float]]:
    """The usual recipes over the same tree and shards, each in a fresh process."""
    from tfshards import storage
    from tfshards.shardset.manifest import load

    manifest = load(manifest_path)
    paths = [storage.join(manifest.directory, s.name) for s in manifest.shards]
    shards, w = str(len(manifest.shards)), str(workers)
    return {
        "check": run_measured([sys.executable, "-c", EAGER_LOOP, *paths], "eager loop"),
        "write": run_measured([sys.executable, "-c", POOL_WRITE, root, out, shards, w], "pool"),
    }


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
    files: int, base: str, workers: int, file_bytes: int, src: str | None, usual: bool, log: Any
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
        hashes = os.path.join(work, "hashes.sqlite")  # a fresh hash cache: a cold list
        row["list"] = run_step(["list", root, "--out", listing], src, TFSHARDS_HASH_CACHE=hashes)
        if usual:  # the same again, every file's hash in the cache
            again = ["list", root, "--out", listing + "-warm"]
            row["list_warm"] = run_step(again, src, TFSHARDS_HASH_CACHE=hashes)
        w = str(workers)
        manifest = os.path.join(work, "manifest.json")  # never the caller's data/manifest.json
        write = ["write", listing, "--out", out, "--manifest", manifest, "--workers", w]
        row["write"] = run_step([*write, "--no-progress"], src)
        metrics = os.path.join(work, "metrics.json")
        # Every file of the tree is one hard-linked file under many labels: label
        # conflicts by construction, counted but not failed.
        checks = ["--fail-on-label-conflict", "false", "--workers", w, "--no-progress"]
        row["validate"] = run_step(["validate", manifest, "--metrics", metrics, *checks], src)
        if usual:
            row["usual"] = run_usual(root, manifest, os.path.join(work, "usual"), workers)
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
    if all("usual" in r for r in rows):
        lines += ["", *usual_table(rows)]
    return "\n".join(lines)


def usual_table(rows: list[dict[str, Any]]) -> list[str]:
    """tfshards against the usual recipes, all fresh processes: wall (CPU) s, wall ratios."""
    lines = [
        "| files | step | usual recipe s (CPU) | tfshards s (CPU) | wall ratio | CPU ratio |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        wr = r["write"]
        pairs = {
            "check: eager loop / validate": (r["usual"]["check"], r["validate"]),
            "write: Pool loop / list (cold) + write": (r["usual"]["write"], _sum(r["list"], wr)),
            "write: Pool loop / list (warm) + write": (
                r["usual"]["write"],
                _sum(r["list_warm"], wr),
            ),
        }
        for step, (usual, ours) in pairs.items():
            cells = [
                f"{r['files']:,}",
                step,
                f"{usual['wall']:.2f} ({usual['cpu']:.2f})",
                f"{ours['wall']:.2f} ({ours['cpu']:.2f})",
                f"{usual['wall'] / ours['wall']:.2f}x",
                f"{usual['cpu'] / ours['cpu']:.2f}x",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _sum(*steps: dict[str, float]) -> dict[str, float]:
    return {"wall": sum(s["wall"] for s in steps), "cpu": sum(s["cpu"] for s in steps)}


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
        "--usual",
        action="store_true",
        help="also time the usual recipes: a Pool loop of TFRecordWriters over the tree, "
        "the eager TFRecordDataset + Example.FromString loop over the shards, a warm re-list",
    )
    args = parser.parse_args()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    base = args.dir or tempfile.mkdtemp(prefix="tfshards-scale-")
    os.makedirs(base, exist_ok=True)
    try:
        sizes = [int(x) for x in args.files.split(",")]
        rows = [
            one_size(n, base, args.workers, args.file_bytes, args.src, args.usual, log)
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
