"""Training read throughput from S3 with the cache limited to 20% of the set, against no limit.

    python -m bench.studies.cache_limit --reps 3
    python -m bench.studies.cache_limit --store memory --reps 3   # the cache's own cost
    python -m bench.studies.cache_limit --images 1000 --reps 1   # smoke run

The set lives on moto's S3 server, started in its own process on 127.0.0.1
(so serving does not share this process's GIL), or on ``memory://`` in this
process, where a download costs a copy and the limit's own work (locks,
scans, eviction, the rewrites to disk) is what is measured. Each run starts from an empty
cache directory and reads 3 epochs (``training=True``, decoded, batched) in
this process; unlimited, epoch 1 downloads the whole set and epochs 2 and 3
read local copies, limited, every epoch downloads what was evicted. Runs
alternate (unlimited, limited, ...) after one warm-up of each; the ratio is
taken within a round. A thread samples the cache directory's size throughout.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Annotated, Any

import typer

SHARE = 0.2  # the limit, as a share of the set's bytes
CYCLE = 4  # files read at once: the limit must hold the shards being read (~2x this)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _moto() -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    port = _free_port()
    server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "testing", "secret": "testing"}
    return proc, options


def _dir_bytes(directory: str) -> int:
    total = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            pass
    return total


def _epochs(
    manifest: Any, options: dict[str, Any], limit: int | None, batch: int
) -> tuple[float, int]:
    """Seconds to read 3 epochs from an empty cache, and the cache's peak bytes."""
    from tfshards.reading import loader
    from tfshards.reading.cachespace import LIMIT_ENV

    os.environ.pop(LIMIT_ENV, None)
    if limit is not None:
        os.environ[LIMIT_ENV] = str(limit)
    cache_dir = tempfile.mkdtemp(prefix="cachelimit-")
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.001):
            peak[0] = max(peak[0], _dir_bytes(cache_dir))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        start = time.perf_counter()
        ds = loader.make_dataset(
            manifest.shards,
            manifest,
            batch_size=batch,
            training=True,
            cycle_length=CYCLE,
            cache_dir=cache_dir,
            storage_options=options,
        )
        for _ in ds.take(3 * manifest.records // batch):
            pass
        seconds = time.perf_counter() - start
    finally:
        stop.set()
        sampler.join()
        os.environ.pop(LIMIT_ENV, None)
        shutil.rmtree(cache_dir, ignore_errors=True)
    return seconds, peak[0]


def main(
    images: Annotated[int, typer.Option(help="Synthetic JPEGs in the set.")] = 8000,
    size: Annotated[int, typer.Option(help="Their side in pixels.")] = 96,
    shards: Annotated[int, typer.Option(help="Shards to write them into.")] = 80,
    reps: Annotated[int, typer.Option(min=1, help="Timed rounds after the warm-up.")] = 3,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 64,
    data: Annotated[str, typer.Option(help="Where the images are kept.")] = "bench/data",
    store: Annotated[str, typer.Option(help="s3 (moto's server) or memory (memory://).")] = "s3",
) -> None:
    """Print one row: unlimited and limited seconds for 3 epochs, and their ratio."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from bench.common.data import DataSet, ensure, listing_of
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    root, _ = ensure(DataSet("cachelimit", images, size), data)
    server, options = _moto() if store == "s3" else (None, {})
    try:
        if server is not None:
            import s3fs

            s3fs.S3FileSystem(**options).mkdir("bench")
        config = WriteConfig(
            out=f"{store}://bench/shards", num_shards=shards, executor="serial", out_options=options
        )
        manifest = write(config, listing_of(root), progress=False).manifest
        limit = int(manifest.bytes * SHARE)
        largest = max(s.bytes for s in manifest.shards)
        _epochs(manifest, options, None, batch)  # warm-up: TensorFlow's first graphs
        _epochs(manifest, options, limit, batch)
        ratios, walls = [], {"unlimited": [], "limited": []}
        for _ in range(reps):
            free, _ = _epochs(manifest, options, None, batch)
            bounded, peak = _epochs(manifest, options, limit, batch)
            walls["unlimited"].append(free)
            walls["limited"].append(bounded)
            ratios.append(free / bounded)
            print(
                f"round: unlimited {free:.2f} s, limited {bounded:.2f} s, throughput ratio "
                f"{free / bounded:.3f}, peak {peak} B (limit {limit} + largest shard {largest})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    records = 3 * manifest.records // batch * batch
    free_s, bounded_s = statistics.median(walls["unlimited"]), statistics.median(walls["limited"])
    where = "S3 (moto)" if store == "s3" else "memory://"
    print(f"| read 3 epochs from {where} | unlimited | limited to 20% | ratio |")
    print("|---|---|---|---|")
    print(
        f"| {manifest.records} x {size} px JPEG, {shards} shards, {manifest.bytes / 2**20:.1f} MiB"
        f" | {records / free_s:,.0f} rec/s ({free_s:.2f} s) | {records / bounded_s:,.0f} rec/s "
        f"({bounded_s:.2f} s) | {statistics.median(ratios):.2f}x |"
    )


if __name__ == "__main__":
    typer.run(main)
