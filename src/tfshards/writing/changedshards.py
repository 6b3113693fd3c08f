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

import os
from typing import Any

from tfshards import storage
from tfshards.errors import ShardError, TfshardsError
from tfshards.listing import contenthash, hashcache
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest


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
    fields = memoryview(contenthash.stat_local(directory, names)).cast("q")
    newer = [  # dev, ino, size (-errno: gone, damage()'s), mtime, ctime per file
        shard
        for i, shard in enumerate(version.shards)
        if fields[5 * i + 2] >= 0 and fields[5 * i + 3] > written
    ]
    if not newer:
        return
    cache = _cache()
    try:
        rows = [(shard.name, shard.bytes) for shard in newer]
        found = contenthash.hash_files(fs, os.path.abspath(directory), rows, directory, 1, cache)
    finally:
        if cache is not None:
            cache.close()
    for shard, (_, token) in zip(newer, found, strict=True):
        digest = token.removeprefix("sha256:")
        if digest != shard.sha256:
            path = os.path.join(directory, shard.name)
            raise ShardError(
                f"{path}: changed since version {version.fingerprint} was written: expected "
                f"sha256 {shard.sha256}, found {digest}; nothing written: restore it "
                "(`dvc checkout --force`: DVC's cache holds the version as written, unless "
                "its cache.type links the file there too, then `dvc pull`; or a copy), or set "
                "write.previous: none (--previous none) to write every shard anew as a new "
                "lineage",
                shard=shard.name,
            )


def _cache() -> hashcache.HashCache | None:
    """The user's hash cache, or None (off, or not usable: the shards are read each time)."""
    path = hashcache.default_path()
    if path is None:
        return None
    try:
        return hashcache.HashCache(path)
    except (TfshardsError, OSError):
        return None
