"""Time listing an S3 tree (moto's server on 127.0.0.1): label folders one by one or at once.

    python -m bench.studies.list_remote                    # 20,000 objects in 10 label prefixes
    python -m bench.studies.list_remote --files 5000 --labels 50 --per-dir 100 --repeat 5

The server runs in its own process, so it does not share this one's GIL.
Objects are spread like ``list_scale.py``'s tree (``label_XX/dir_XXXXX/N.jpg``);
uploading them is not timed. Rows: ``list_files`` with label folders listed
one after another (``REMOTE_LISTERS = 1``), several at once (the default), and
for reference one flat recursive ``fs.find`` of the whole root (no labels, no
filters). Each row is the median of ``--repeat`` runs, the listing cache of the
filesystem emptied before each.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from tfshards import storage
from tfshards.listing import walker
from tfshards.listing.listing import list_files


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return server, url
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("moto server did not start")


def timed(run: Callable[[], object], before: Callable[[], None], repeat: int) -> float:
    walls = []
    for _ in range(repeat):
        before()
        start = time.perf_counter()
        run()
        walls.append(time.perf_counter() - start)
    return statistics.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--labels", type=int, default=10)
    parser.add_argument("--per-dir", type=int, default=1000, help="objects per leaf prefix")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    server, url = start_server()
    try:
        options: dict[str, Any] = {"endpoint_url": url, "key": "bench", "secret": "bench"}
        root = "s3://bench/raw"
        fs, base = storage.open_url(root, **options)
        fs.mkdir("bench")
        start = time.perf_counter()
        objects = {
            f"{base}/label_{i % args.labels:02d}/dir_{i // (args.labels * args.per_dir):05d}/"
            f"{i:07d}.jpg": b"\xff\xd8\xff" + i.to_bytes(8, "little")
            for i in range(args.files)
        }
        fs.pipe(objects)
        print(f"uploaded {args.files} objects in {time.perf_counter() - start:.1f} s")

        rows = {}
        for listers in (1, walker.REMOTE_LISTERS):
            walker.REMOTE_LISTERS = listers
            rows[f"list_files, {listers} label folder(s) at once"] = timed(
                lambda: list_files(root, storage_options=options), fs.invalidate_cache, args.repeat
            )
        rows["one fs.find of the root (reference)"] = timed(
            lambda: fs.find(base, detail=True), fs.invalidate_cache, args.repeat
        )
        listing = list_files(root, storage_options=options)
        assert len(listing.entries) == args.files
        first = next(iter(rows.values()))
        print(
            f"{args.files} objects, {args.labels} labels, medians of {args.repeat}, "
            f"load {os.getloadavg()[0]:.1f}:"
        )
        for name, wall in rows.items():
            print(f"  {name:45s} {wall:6.2f} s ({first / wall:4.2f}x)")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
