"""Gather a version's perceptual hashes and publish ``phash.bin`` before its manifest.

A shard written (or resumed) in this write brings its hashes in its result
(:func:`tfshards.writing.shard.write_shard` reads it back and hashes its
images). A shard kept from the version this one grows from brings none: its
rows are carried from that version's ``phash.bin`` (the same bytes, so the
same hashes), or, when that version has none, hashed from the shard here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tfshards import storage
from tfshards.format.phash import shard_hashes
from tfshards.shardset import phashfile
from tfshards.shardset.manifest import Manifest
from tfshards.writing.shard import ShardResult


def publish(
    fs: Any,
    version: str,
    shards: Sequence[ShardResult],
    manifest: Manifest,
    kept_from: Mapping[str, str],
    base: Manifest | None,
    **options: Any,
) -> int:
    """Write ``phash.bin`` for ``shards`` (in manifest order); the shards hashed here again.

    ``kept_from``: each kept shard's name in ``base``, by its name here.
    """
    carried = None
    if base is not None and kept_from:
        fs_base, base_path = storage.open_url(base.directory, **options)
        carried = phashfile.load(fs_base, base_path, base)
    rows, hashed = [], 0
    for result in shards:
        old = kept_from.get(result.info.name)
        if result.phashes is not None:
            rows.append(result.phashes)
        elif carried is not None and old in carried:
            rows.append(carried[old].tobytes())
        else:
            data = storage.read_bytes(fs, storage.join(version, result.info.name))
            rows.append(shard_hashes(data, manifest.compression, _image_feature(manifest)))
            hashed += 1
    phashfile.save(fs, version, rows)
    return hashed


def _image_feature(manifest: Manifest) -> str:
    return str(manifest.params.get("image_feature", "image"))
