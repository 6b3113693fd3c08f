"""What a write makes of a listing and its config, as one frozen value: no I/O, no imports.

The plan (record order, shard contents, names) is a pure function of the
listing and the parameters, so any number of workers on any executor writes
the same bytes (:mod:`tfshards.writing.writer` runs it).

The version directory is named after the content (:func:`fingerprint`): the
files' paths relative to the root, labels and content tokens, the parameters
that shape the bytes, and :data:`BYTES_VERSION`. Never mtimes, never where or
how the root was spelled: the same files give the same name on every clone.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tfshards import jsonfile, storage
from tfshards.errors import ConfigError, InputError
from tfshards.listing.protocol import FileListing, Rows
from tfshards.shardset import grouping, layout
from tfshards.shardset.manifest import FORMAT_VERSION
from tfshards.writing import labelmap, sharding
from tfshards.writing.config import WriteConfig
from tfshards.writing.shard import ShardTask

# Bump whenever a change to tfshards changes the shard bytes written for the same
# inputs and params (framing, feature encoding, record order): the version name
# then changes too, so no directory ever holds two kinds of bytes under one name.
BYTES_VERSION = 1


@dataclass(frozen=True)
class Plan:
    """A write, decided: where it goes, what its manifest records, each shard's work.

    Attributes:
        version: the version directory URL (``config.out`` + :func:`fingerprint`).
        params: the manifest's params (``on_error`` included, though not in the name).
        tasks: one per shard, in shard order.
        labels: the manifest's label names, in id order: the pinned map
            (``config.labels``), else the listing's.
    """

    version: str
    params: Mapping[str, Any]
    tasks: tuple[ShardTask, ...]
    labels: tuple[str, ...]

    @property
    def fingerprint(self) -> str:
        """The version directory's name."""
        return self.version.rstrip("/").rsplit("/", 1)[-1]


def fingerprint(listing: FileListing, params: Mapping[str, Any]) -> str:
    """Name of the version directory: a hash of what goes into the shards.

    ``files.jsonl`` (each file's path relative to the root, label and content
    token), the byte-shaping ``params`` and the format versions. Not the root:
    the same files read from another folder or clone give the same shards.
    """
    doc = {
        "bytes": BYTES_VERSION,
        "files_sha256": listing.digest,
        "format": FORMAT_VERSION,
        "labels": list(listing.labels),
        "params": dict(params),
    }
    return jsonfile.digest(doc)[:16]


def read_groups(listing: FileListing, group_by: str | None) -> grouping.Groups | None:
    """The files' group ids under ``group_by`` (None without it): one pass over the paths.

    Raises:
        InputError: a listed path the pattern does not match.
    """
    parsed = grouping.GroupBy.parse(group_by)
    if parsed is None:
        return None
    return grouping.group_ids(parsed, listing.paths(), listing.root)


def plan(
    listing: FileListing,
    config: WriteConfig,
    transform_identity: str = "none",
    groups: grouping.Groups | None = None,
) -> Plan:
    """The version directory, manifest params and shard tasks of writing ``listing``.

    ``transform_identity`` is :func:`tfshards.run.transform.identity` of
    ``config.transform``, resolved by the caller (it imports the user's module).
    Each task carries :meth:`FileListing.rows` of its records: entries in
    memory, or line numbers of a stored listing (4 bytes per file) read
    where the shard is written. With ``config.group_by``, ``groups`` is
    :func:`read_groups` of the same listing; read here when None. With
    ``config.labels``, each task's rows carry the pinned ids (:mod:`.labelmap`).
    """
    if transform_identity.split("@", 1)[0] != (config.transform or "none"):
        raise ConfigError(
            f"transform_identity: expected the identity of transform {config.transform!r}, "
            f"got {transform_identity!r}"
        )
    if not listing.files:
        raise InputError(f"{listing.root}: the listing has no files", path=listing.root)
    ids = None if config.labels is None else labelmap.label_ids(listing.labels, config.labels)
    if config.group_by is not None and groups is None:
        groups = read_groups(listing, config.group_by)
    if grouping.GroupBy.parse(config.group_by) is None:
        groups = None
    num_shards = _num_shards(listing, config, groups)
    params = _params(config, num_shards, transform_identity)
    version = storage.join(config.out, fingerprint(listing, params))
    source, out = storage.absolute(listing.root), storage.absolute(version)
    tasks = tuple(
        ShardTask(
            name=layout.shard_name(config.name, i, num_shards),
            source=source,
            out=out,
            rows=rows if ids is None else labelmap.relabel(rows, ids),
            image_feature=config.image_feature,
            transform=config.transform,
            compression=config.compression,
            on_error=config.on_error,
            source_options=dict(config.source_options),
            out_options=dict(config.out_options),
            resize=config.resized,
        )
        for i, rows in enumerate(_shard_rows(listing, num_shards, config.seed, groups))
    )
    labels = listing.labels if config.labels is None else config.labels
    return Plan(version, {**params, "on_error": config.on_error}, tasks, labels)


def _num_shards(listing: FileListing, config: WriteConfig, groups: grouping.Groups | None) -> int:
    """The shard count: given, or derived from the size; checked against records and groups."""
    files = listing.files
    num_shards = config.num_shards or sharding.auto_num_shards(
        files, listing.total_bytes, config.target_shard_bytes
    )
    if groups is not None and len(groups[0]) != files:
        raise ConfigError(f"groups: expected one group id per file ({files}), got {len(groups[0])}")
    if groups is not None and num_shards > groups[1]:
        if config.num_shards:
            raise ConfigError(
                f"num_shards: expected at most one shard per group ({groups[1]} groups "
                f"under group_by '{config.group_by}'), got {num_shards}"
            )
        num_shards = groups[1]
    if num_shards > files:
        raise ConfigError(
            f"num_shards: expected at most one shard per record ({files}), got {num_shards}"
        )
    return num_shards


def _params(config: WriteConfig, num_shards: int, transform_identity: str) -> dict[str, Any]:
    """The parameters that shape the bytes, hashed into the version name."""
    params: dict[str, Any] = {
        "compression": config.compression,
        "image_feature": config.image_feature,
        "name": config.name,
        "num_shards": num_shards,
        "seed": config.seed,
        "transform": transform_identity,
    }
    group_by = grouping.GroupBy.parse(config.group_by)
    if group_by is not None:  # absent, not null, without groups: older version names hold
        params["group_by"] = group_by.pattern
    resize = config.resized
    if resize is not None:  # absent otherwise: sets written without it keep their bytes and name
        params["resize"] = resize.params()
    if config.labels is not None:  # absent otherwise, as group_by and resize
        params["labels"] = list(config.labels)
    return params


def _shard_rows(
    listing: FileListing, num_shards: int, seed: int, groups: grouping.Groups | None
) -> Iterator[Rows]:
    """Each shard's rows of ``listing``, in shard order."""
    if groups is not None:
        indices, cuts = sharding.grouped_indices(groups[0], groups[1], num_shards, seed)
    else:
        indices = sharding.shuffled_indices(listing.files, seed)  # 4 bytes per file
        cuts = sharding.shard_boundaries(listing.files, num_shards)
    for start, stop in itertools.pairwise(cuts):
        yield listing.rows(indices[start:stop])
