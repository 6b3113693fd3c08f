"""What this machine allows: CPU cost per record of the work no implementation can skip.

Each piece is timed alone, on one core, over a sample of the data set's files
already in the page cache, as CPU seconds (``time.process_time``) per record.
A job's bound is ``cores / sum(its pieces)`` records per second: what it would
reach with every core doing nothing but those pieces. A result divided by its
bound says how much of the machine it used for useful work.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import crc32c
from PIL import Image

from bench.common.timing import per_record
from tfshards.listing.listing import Listing

# Which pieces each job cannot avoid (bench/README.md, "How it measures").
WRITE = ("read_file", "sha256", "crc32c")  # read every input, hash it, frame it
VALIDATE = ("read_shard", "sha256", "crc32c")  # read the shard, hash it, check record CRCs
READ = ("read_shard", "crc32c", "decode_tf")  # read, check CRCs, decode the image


def costs(listing: Listing, sample_bytes: int = 16 << 20, quick: bool = False) -> dict[str, float]:
    """Per-record CPU seconds of each piece, on evenly spread files (<= 1,000 of them).

    ``quick``: each piece timed over one pass of the files per round (a smoke run),
    not repeated to 0.2 s.
    """
    least = 0.0 if quick else 0.2
    import tensorflow as tf

    mean = max(1, listing.total_bytes // max(1, len(listing.entries)))
    sample = max(1, min(1000, sample_bytes // mean))
    step = max(1, len(listing.entries) // sample)
    paths = [os.path.join(listing.root, e.path) for e in listing.entries[::step][:sample]]
    blobs = []
    for path in paths:
        with open(path, "rb") as f:
            blobs.append(f.read())
    n = len(blobs)

    def read_files() -> None:
        for path in paths:
            with open(path, "rb") as f:
                f.read()

    with tempfile.NamedTemporaryFile(dir=os.path.dirname(listing.root)) as shard:
        for data in blobs:
            shard.write(data)
        shard.flush()

        def read_shard() -> None:
            with open(shard.name, "rb", buffering=0) as f:
                while f.read(4 << 20):
                    pass

        out: dict[str, float] = {
            "read_file": per_record(read_files, n, least),
            "read_shard": per_record(read_shard, n, least),
        }

    out["sha256"] = per_record(lambda: [hashlib.sha256(b).digest() for b in blobs], n, least)
    out["crc32c"] = per_record(lambda: [crc32c.crc32c(b) for b in blobs], n, least)

    # TensorFlow decodes inside one traced graph (map_fn, one image at a time): no eager
    # dispatch or tf.data per-element overhead, and the tracing is paid before timing.
    batch = tf.constant(blobs)
    shape = tuple(int(d) for d in tf.io.decode_jpeg(blobs[0], channels=3).shape)
    decode_all = tf.function(
        lambda: tf.map_fn(
            lambda b: tf.io.decode_jpeg(b, channels=3),
            batch,
            fn_output_signature=tf.TensorSpec(shape, tf.uint8),
            parallel_iterations=1,
        )
    )
    decode_all()
    out["decode_tf"] = per_record(decode_all, n, least)
    out["decode_pil"] = per_record(lambda: [pil_decode(b) for b in blobs], n, least)
    return out


def pil_decode(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def bound(costs: dict[str, float], pieces: Sequence[str], cores: int) -> float:
    """Records per second with ``cores`` cores doing only ``pieces``."""
    return cores / sum(costs[p] for p in pieces)


def as_rows(data: str, costs: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {"group": "bound", "data": data, "name": piece, "us_per_record": seconds * 1e6}
        for piece, seconds in costs.items()
    ]
