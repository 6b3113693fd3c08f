"""Shards of a finished local version changed in place since it was written (same size, other
bytes: a hand, a tool), found before the writer keeps that version or lends its shards.

A version's shards are written, or linked from the version before, ahead of its
``manifest.json``, so a shard modified after the manifest was changed since. Only
those are read, hashed against the manifest's SHA-256, and each once for as long
as its stat stays: the digest goes into the listing's hash cache
(:mod:`tfshards.listing.hashcache`). After ``dvc checkout`` of copies about a third
of the shards date after the manifest for good (6 of 16 in one trial), and every
re-run read them again. A size change is :func:`tfshards.writing.growth.damage`'s.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from tfshards import storage
from tfshards.errors import ShardError, TfshardsError
from tfshards.listing import contenthash, hashcache
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest

_BYTES = hashcache.STAT_BYTES  # a file's stat, packed
_STAT = _BYTES // 8  # int64 fields per file: dev, ino, size, mtime, ctime


def check(version: Manifest, **options: Any) -> None:
    """Refuse ``version`` when a shard of it was changed in place after its manifest.

    Raises:
        ShardError: the first such shard whose SHA-256 is not the manifest's, in one
            line naming the file, the expected and the found digest.
    """
    fs, directory = storage.open_url(version.directory, **options)
    if not storage.is_local(fs):
        return  # an object is replaced, never changed in place
    try:
        written = os.stat(os.path.join(directory, MANIFEST_NAME)).st_mtime_ns
    except OSError:
        return  # a manifest elsewhere: nothing to date the shards by
    names = [shard.name for shard in version.shards]
    stats = contenthash.stat_local(directory, names)
    fields = memoryview(stats).cast("q")
    newer = [
        i
        for i in range(len(names))
        if fields[_STAT * i + 2] >= 0 and fields[_STAT * i + 3] > written  # gone: damage()'s
    ]
    if not newer:
        return
    folder = os.path.abspath(directory)
    picked = [names[i] for i in newer]
    picked_stats = b"".join(stats[_BYTES * i : _BYTES * (i + 1)] for i in newer)
    cache = _cache()
    known = cache.lookup(folder, picked, picked_stats) if cache else [None] * len(picked)
    digests = []
    for i, digest in zip(newer, known, strict=True):
        shard = version.shards[i]
        path = os.path.join(directory, shard.name)
        found = digest or _sha256_file(path)
        if found != shard.sha256:
            raise ShardError(
                f"{path}: changed since version {version.fingerprint} was written: expected "
                f"sha256 {shard.sha256}, found {found}; nothing written: restore it "
                "(`dvc checkout --force`: DVC's cache holds the version as written, unless "
                "its cache.type links the file there too, then `dvc pull`; or a copy), or set "
                "write.previous: none (--previous none) to write every shard anew as a new "
                "lineage",
                shard=shard.name,
            )
        digests.append(bytes.fromhex(found))
    if cache is not None:
        cache.store(folder, picked, picked_stats, b"".join(digests))
        cache.close()


def _cache() -> hashcache.HashCache | None:
    """The user's hash cache, or None (off, or not usable: the shards are read each time)."""
    path = hashcache.default_path()
    if path is None:
        return None
    try:
        return hashcache.HashCache(path)
    except (TfshardsError, OSError):
        return None


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
