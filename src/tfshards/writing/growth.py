"""The version a write grows from: found, checked, and matched against the new listing.

A write with a previous version (``--previous``; by default the manifest a
pipeline keeps at ``--manifest``) keeps its label ids and reuses each of its
shards whose records are all listed again unchanged (:mod:`.placement`). This
module reads that version's manifest and member lists
(:mod:`tfshards.shardset.members`) and says, for each of its shards, where
its records are in the new listing.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from tfshards import storage
from tfshards.errors import ConfigError, InputError
from tfshards.listing.protocol import FileListing
from tfshards.shardset import manifest as manifests
from tfshards.shardset import members
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest

# Params that must match for a previous shard's bytes to be this write's: the
# others (the shard count, the label map) are settled record by record.
SAME_BYTES = ("compression", "image_feature", "name", "resize", "seed", "transform")
# Params that decide a record's bucket, hence its side of the split.
SAME_SPLIT = ("buckets", "group_by")

PreviousShards = list[tuple[int, "array[int]"]]  # per previous shard: bucket, listing index or -1


def find(previous: str | None, manifest_copy: str | None, **options: Any) -> Manifest | None:
    """The previous version's manifest, or None to write from scratch.

    ``previous``: ``"auto"`` (the manifest at ``manifest_copy``, when there is
    one), a manifest path or URL, or None.

    Raises:
        InputError: the manifest names a version directory that is gone (one line
            saying how to get it back or start anew).
    """
    url = manifest_copy if previous == "auto" else previous
    if url is None:
        return None
    if previous == "auto":
        fs, path = storage.open_url(url)
        if not fs.exists(path):
            return None
    found = manifests.load(url, **options)
    fs, directory = storage.open_url(found.directory, **options)
    if not fs.exists(storage.join(directory, MANIFEST_NAME)):
        raise InputError(
            f"{url}: previous version {found.directory}: expected its shards and manifest, "
            "found no manifest there; fetch it (dvc pull) to grow from it, or pass "
            "--previous none to write every shard anew",
            path=url,
        )
    return found


def growable(previous: Manifest, params: Mapping[str, Any]) -> bool:
    """Whether ``previous`` can lend its shards to a write with ``params``.

    Raises:
        ConfigError: records would hash into other buckets, so surviving records
            would change sides of the split (one line: what changed, what to do).
    """
    if "buckets" not in previous.params:  # written before split buckets
        return False
    for key in SAME_SPLIT:
        old, new = previous.params.get(key), params.get(key)
        if old != new:
            raise ConfigError(
                f"{key}: the previous version {previous.fingerprint} was written with "
                f"{key} {old!r}, this write has {new!r}: records would change sides of the "
                f"train/validation split; keep {key} (buckets are at most num_shards), or "
                "pass --previous none to start a new lineage",
                option=key,
                param=f"write.{key}",
            )
    return all(previous.params.get(k) == params.get(k) for k in SAME_BYTES)


def match(
    previous: Manifest, listing: FileListing, ids: Sequence[int], **options: Any
) -> PreviousShards:
    """For each previous shard: its bucket and where each of its records is in ``listing``.

    A record is found when the listing has its path with the same content token
    and the same label id (``ids``: the new id of each listing label); -1 otherwise.
    Holds one small int per listed file, never its path.
    """
    where: dict[int, int] = {}
    content = array("Q")
    for i, (path, _, label, token) in enumerate(_entries(listing)):
        where[_key(path)] = i
        content.append(_key(f"{token}\0{ids[label]}"))
    fs, directory = storage.open_url(previous.directory, **options)
    out: PreviousShards = []
    for shard in previous.shards:
        held = array("i")
        for path, token, label in members.load(fs, directory, shard):
            i = where.get(_key(path), -1)
            same = i >= 0 and content[i] == _key(f"{token}\0{label}")
            held.append(i if same else -1)
        out.append((shard.bucket if shard.bucket is not None else -1, held))
    return out


def _entries(listing: FileListing) -> Any:
    every = array("I", range(listing.files))
    for batch in listing.rows(every).batches():
        yield from batch


def _key(text: str) -> int:
    """An 8-byte digest of ``text``: a collision among a million keys has odds of 3e-8."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")
