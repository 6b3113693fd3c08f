"""A version's perceptual hashes: ``phash.bin`` beside its manifest (``write.near_duplicates``).

One row of :data:`tfshards.format.phash.DTYPE` (9 bytes) per record, shard
after shard in manifest order, record order within each, after a one-line
header. The manifest does not name the file, so a set written without it keeps
its manifest's bytes; the shards' record counts say which rows are whose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfshards import atomicfile, storage
from tfshards.format.phash import DTYPE
from tfshards.shardset.layout import PHASH_NAME
from tfshards.shardset.manifest import Manifest

HEADER = b"tfshards phash 1\n"


def encode(rows: list[bytes]) -> bytes:
    """The file's bytes from each shard's rows, in manifest order."""
    return HEADER + b"".join(rows)


def save(fs: Any, version: str, rows: list[bytes]) -> None:
    """Publish the file in the version directory ``version`` (atomically)."""
    path = storage.join(version, PHASH_NAME)
    try:
        atomicfile.write_atomic(fs, path, [encode(rows)])
    except OSError as exc:
        raise storage.write_error(fs, path, exc) from None


def load(fs: Any, version: str, manifest: Manifest) -> dict[str, np.ndarray] | None:
    """Each shard's rows by shard name; None when the file is absent or does not fit the shards."""
    try:
        data = storage.read_bytes(fs, storage.join(version, PHASH_NAME))
    except (FileNotFoundError, OSError):
        return None
    if not data.startswith(HEADER):
        return None
    body = memoryview(data)[len(HEADER) :]
    if len(body) != DTYPE.itemsize * manifest.records:
        return None
    rows = np.frombuffer(body, dtype=DTYPE)
    out, at = {}, 0
    for shard in manifest.shards:
        out[shard.name] = rows[at : at + shard.records]
        at += shard.records
    return out
