"""Each shard's perceptual hashes, kept in the user's cache under the shard's sha256.

validate's near-duplicate check hashes every image of a shard once (a small
grey decode and a DCT: ~70 us of CPU for a 96 px JPEG, ~3x what writing the
record costs; 20,000 took 1.0 s of CPU against 0.23 s for the rest of
validate, ``python -m bench.suite.run --only imagecheck``). The rows depend
only on the shard's bytes and the image feature, so any later validate of a
version holding the same shard (a grown version keeps most of its shards)
reads them back instead. A file is a header line (the format, the sha256 of
the rows), then one :data:`tfshards.format.phash.DTYPE` row per record. One
that does not match is hashed again and replaced; one that cannot be written
costs only time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

from fsspec.implementations.local import LocalFileSystem

from tfshards import atomicfile, cachedir
from tfshards.format.phash import DTYPE

FOLDER = "phash"
HEADER = b"tfshards phash 2 "


def path(shard_sha256: str, image_feature: str) -> str:
    """Where the rows of the shard with this sha256, hashed from ``image_feature``, live."""
    key = hashlib.sha256(f"{shard_sha256}\0{image_feature}".encode()).hexdigest()
    return os.path.join(cachedir.root(), FOLDER, key[:2], key + ".bin")


def get(shard_sha256: str, image_feature: str, records: int) -> bytes | None:
    """The shard's rows, when the cache holds them whole; else None."""
    try:
        with open(path(shard_sha256, image_feature), "rb") as f:
            data = f.read()
    except OSError:
        return None
    head, _, rows = data.partition(b"\n")
    if len(rows) != records * DTYPE.itemsize or head != _header(rows):
        return None
    return rows


def put(shard_sha256: str, image_feature: str, rows: bytes) -> None:
    """Keep the shard's rows (atomically; not fsynced: a lost file is hashed again)."""
    target = path(shard_sha256, image_feature)
    with contextlib.suppress(OSError):  # a read-only or full cache: the next validate hashes again
        atomicfile.write_atomic(
            LocalFileSystem(), target, [_header(rows) + b"\n", rows], sync_dir=False, durable=False
        )


def _header(rows: bytes) -> bytes:
    return HEADER + hashlib.sha256(rows).hexdigest().encode()
