"""Time ``tfshards diff``'s comparison of two 1,000,000-record versions, member lists read.

    python -m bench.studies.diff_scale                       # 1000 shards x 1000 records
    python -m bench.studies.diff_scale --shards 100 --repeat 1

Builds, in a temp dir (not timed), an old version of SHARDS x RECORDS records
over 16 split buckets and 10 labels, and a new one with 1% of that added, 0.5%
removed and 50 records' tokens changed: two manifests and their member lists
(the shard files themselves are never written: diff reads none). Then times,
page cache warm, loading both manifests and :func:`tfshards.shardset.diff.compare`
over :func:`~tfshards.shardset.diff.load_members` of each (every member list
read, sha256-checked against the manifest and parsed), as the median of
``--repeat`` runs, and the peak RSS the process grew by across them.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import resource
import shutil
import statistics
import tempfile
import time

from tfshards.shardset import buckets, layout, members
from tfshards.shardset.diff import Changes, compare, load_members
from tfshards.shardset.manifest import Manifest, ShardInfo, load

BUCKETS = 16
LABELS = tuple(f"label_{i:02d}" for i in range(10))
FOLDERS = ("0" * 16, "1" * 16)  # the old version, the new one
Row = tuple[str, str, int]


def _token(i: int, salt: str = "") -> str:
    return "sha256:" + hashlib.sha256(f"{salt}{i}".encode()).hexdigest()


def _rows(count: int, start: int = 0) -> list[Row]:
    return [
        (f"{LABELS[i % 10]}/d{i // 1000:05d}/img_{i:08d}.jpg", _token(i), i % 10)
        for i in range(start, start + count)
    ]


def write_version(parent: str, fingerprint: str, rows: list[Row], per_shard: int) -> str:
    """A version directory with a manifest and member lists (no shards); its manifest path."""
    directory = os.path.join(parent, fingerprint)
    os.makedirs(os.path.join(directory, layout.RECORDS.folder))
    by_bucket: dict[int, list[Row]] = {}
    for row in rows:
        by_bucket.setdefault(buckets.bucket_of(row[0], BUCKETS), []).append(row)
    chunks = [
        (bucket, part[i : i + per_shard])
        for bucket, part in sorted(by_bucket.items())
        for i in range(0, len(part), per_shard)
    ]
    shards = []
    for index, (bucket, chunk) in enumerate(chunks):
        name = layout.shard_name("data", index, len(chunks))
        data = members.encode(chunk)
        with open(layout.records_path(directory, name), "wb") as f:
            f.write(data)
        sha = hashlib.sha256(data).hexdigest()
        shards.append(ShardInfo(name, len(chunk), 1, "0" * 64, None, bucket, sha))
    manifest = Manifest(
        root=directory,
        fingerprint=fingerprint,
        params={"name": "data", "buckets": BUCKETS},
        schema=(),
        labels=LABELS,
        compression="none",
        shards=tuple(shards),
        listed=len(rows),
    )
    path = os.path.join(directory, layout.MANIFEST_NAME)
    with open(path, "wb") as f:
        f.write(manifest.to_json())
    return path


def _removed(total: int) -> set[int]:
    return set(range(0, total, 200))  # 0.5%


def _changed(total: int) -> set[int]:
    return set(range(1, total, max(1, total // 50)))  # 50


def build(parent: str, total: int, per_shard: int) -> None:
    """The old version and the new one under ``parent`` (:data:`FOLDERS`)."""
    old_rows = _rows(total)
    removed, changed = _removed(total), _changed(total)
    new_rows = [
        (path, _token(i, "v2") if i in changed else token, label)
        for i, (path, token, label) in enumerate(old_rows)
        if i not in removed
    ] + _rows(total // 100, start=total)  # 1%
    for folder, rows in zip(FOLDERS, (old_rows, new_rows), strict=True):
        write_version(parent, folder, rows, per_shard)


def diff(old_url: str, new_url: str) -> Changes:
    old, new = load(old_url), load(new_url)
    return compare(old, new, load_members(old), load_members(new))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--records", type=int, default=1000, help="records per shard")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (median)")
    args = parser.parse_args()

    total = args.shards * args.records
    removed, changed = _removed(total), _changed(total)
    parent = tempfile.mkdtemp(prefix="tfshards-diff-")
    try:
        start = time.perf_counter()
        # Built in a child process, so this one's peak RSS is the diff's.
        child = multiprocessing.get_context("fork").Process(
            target=build, args=(parent, total, args.records)
        )
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"building the versions failed (exit code {child.exitcode})")
        old_url, new_url = (os.path.join(parent, f, layout.MANIFEST_NAME) for f in FOLDERS)
        print(f"built 2 versions of {total} records in {time.perf_counter() - start:.1f} s")
        rss_before = peak_rss_mb()
        walls, cpus = [], []
        for _ in range(args.repeat):
            start, cpu = time.perf_counter(), time.process_time()
            changes = diff(old_url, new_url)
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)
        metrics = changes.to_metrics()
        expected = (total // 100, len(removed), len(changed - removed))
        if (metrics["added"], metrics["removed"], metrics["changed"]) != expected:
            raise SystemExit(f"unexpected counts {metrics}, expected {expected}")
        print(
            f"diff of {total} vs {total - len(removed) + total // 100} records, median of "
            f"{args.repeat}, load {os.getloadavg()[0]:.1f}: wall {statistics.median(walls):.2f} s "
            f"(range {min(walls):.2f}-{max(walls):.2f}), CPU {statistics.median(cpus):.2f} s; "
            f"peak RSS {rss_before:.0f} MB before, {peak_rss_mb():.0f} MB after"
        )
        print(f"metrics: {metrics}")
    finally:
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
