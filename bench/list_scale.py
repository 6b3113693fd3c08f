"""Time ``list_files`` on a large local tree: files per second and peak memory.

    python bench/list_scale.py --files 200000            # tree in a temp dir, removed after
    python bench/list_scale.py --files 1000000 --dir /data/bench-tree --keep

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
import sys
import tempfile
import time

from tfshards.listing.listing import list_files, listing_digest, write_listing


def make_tree(root: str, files: int, labels: int, per_dir: int, file_bytes: int = 16) -> None:
    """Create ``files`` small files: ``root/label_XX/dir_XXXX/XXXXXXX.jpg``."""
    made: set[str] = set()
    for i in range(files):
        label, leaf = i % labels, i // (labels * per_dir)
        directory = os.path.join(root, f"label_{label:02d}", f"dir_{leaf:05d}")
        if directory not in made:
            os.makedirs(directory, exist_ok=True)
            made.add(directory)
            stub = os.path.join(directory, ".stub.jpg")  # hidden: the listing skips it
            with open(stub, "wb") as f:
                f.write(b"\xff\xd8\xff" + b"\0" * max(0, file_bytes - 3))
        os.link(stub, os.path.join(directory, f"{i:07d}.jpg"))


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
    args = parser.parse_args()

    root = args.dir or tempfile.mkdtemp(prefix="tfshards-list-")
    try:
        if not os.path.isdir(os.path.join(root, "label_00")):
            start = time.perf_counter()
            make_tree(root, args.files, args.labels, args.per_dir, args.file_bytes)
            print(
                f"built {args.files} files in {time.perf_counter() - start:.1f} s", file=sys.stderr
            )
        rss_before = peak_rss_mb()
        start, cpu = time.perf_counter(), time.process_time()
        listing = list_files(root)
        listed, cpu = time.perf_counter() - start, time.process_time() - cpu
        out = tempfile.mkdtemp(prefix="tfshards-listing-")
        start = time.perf_counter()
        write_listing(listing, out)
        written = time.perf_counter() - start
        shutil.rmtree(out)
        n = len(listing.entries)
        print(
            f"list_files: {n} files in {listed:.2f} s = {n / listed:,.0f} files/s "
            f"(CPU {cpu:.2f} s, all threads); "
            f"write_listing: {written:.2f} s; peak RSS {rss_before:.0f} MB before, "
            f"{peak_rss_mb():.0f} MB after ({(peak_rss_mb() - rss_before) * 1e6 / n:.0f} B/file); "
            f"sha256 {listing_digest(listing)[:12]}"
        )
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
