"""Count the stored images that carry an EXIF orientation other than 1, per side of the split.

TensorFlow's decoders ignore the tag, so such a record reaches the model
turned or mirrored (``write.exif: apply`` stores them upright: then none is
counted). Only each payload's header is read (:mod:`tfshards.format.exif`),
never its pixels; the shards are read once more for it, one at a time.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection
from typing import Any

from tfshards import storage
from tfshards.format import exif, tfrecord
from tfshards.format.records import parse_records
from tfshards.shardset.manifest import Manifest


def rotated_in_shard(data: bytes, compression: str, image_feature: str) -> int:
    """Records of one shard (its bytes as stored) whose image's orientation is 2..8."""
    buf = tfrecord.decompress(data, compression)
    count = 0
    for parsed in parse_records(buf, [image_feature]):
        outline = parsed.fields.get(image_feature) if parsed.fields else None
        if outline is not None and outline.first is not None:
            count += exif.orientation(outline.first) != exif.UPRIGHT
    return count


def rotated_per_side(
    fs: Any, root: str, manifest: Manifest, val: Collection[str]
) -> dict[str, int]:
    """``{"train": n, "val": m}``: rotated records on each side (a shard it cannot read: 0)."""
    feature = str(manifest.params.get("image_feature", "image"))
    out = {"train": 0, "val": 0}
    for shard in manifest.shards:
        try:
            data = storage.read_bytes(fs, storage.join(root, shard.name))
            found = rotated_in_shard(data, manifest.compression, feature)
        except (OSError, ValueError, zlib.error):  # the shard checks report what is wrong with it
            continue
        out["val" if shard.name in val else "train"] += found
    return out
