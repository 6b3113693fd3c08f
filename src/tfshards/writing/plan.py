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

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import jsonfile, storage
from tfshards.errors import ConfigError, InputError
from tfshards.format.columns import Column, columns_json
from tfshards.listing.protocol import FileListing
from tfshards.shardset import buckets, grouping, layout
from tfshards.shardset.manifest import FORMAT_VERSION, Manifest, Reject, ShardInfo
from tfshards.writing import growth, labelmap, orientation, placement, sharding
from tfshards.writing.config import WriteConfig
from tfshards.writing.shard import ShardTask

# Bump whenever a change to tfshards changes the shard bytes written for the same
# inputs and params (framing, feature encoding, record order): the version name
# then changes too, so no directory ever holds two kinds of bytes under one name.
BYTES_VERSION = 2  # 2: records placed by split bucket (tfshards.writing.placement)


@dataclass(frozen=True)
class KeptFile:
    """A shard of the previous version that this one holds byte for byte, under a new name."""

    name: str
    info: ShardInfo  # as the previous manifest lists it


@dataclass(frozen=True)
class Plan:
    """A write, decided: where it goes, what its manifest records, each shard's work.

    Attributes:
        version: the version directory URL (``config.out`` + :func:`fingerprint`).
        params: the manifest's params (``on_error`` included, though not in the name).
        tasks: one per shard to write, in shard order.
        labels: the manifest's label names, in id order (:func:`labelmap.resolve`).
        kept: the previous version's shards this one reuses.
        base: the version this one grows from, or None (written from scratch).
        changes: what changed since ``base``, as the manifest's ``changes`` counts.
        fresh: why a previous version lent no shard ("" when there was none, or it did).
    """

    version: str
    params: Mapping[str, Any]
    tasks: tuple[ShardTask, ...]
    labels: tuple[str, ...]
    kept: tuple[KeptFile, ...] = ()
    base: Manifest | None = None
    changes: Mapping[str, int] = field(default_factory=dict)
    fresh: str = ""
    rejected: tuple[Reject, ...] = ()  # the base's rejects listed again unchanged: left out

    @property
    def fingerprint(self) -> str:
        """The version directory's name."""
        return self.version.rstrip("/").rsplit("/", 1)[-1]

    @property
    def is_base(self) -> bool:
        """Nothing changed: the plan keeps every previous shard, in order, with its params.

        ``num_shards`` aside: growing, it only sizes the shards new records go into, so
        with none to place the shards are the base's whatever it asks (a new name, for
        the same bytes, made DVC train on them again)."""
        base = self.base
        return (
            base is not None
            and not self.tasks
            and [k.info for k in self.kept] == list(base.shards)
            and _shaping(self.params, "num_shards") == _shaping(base.params, "num_shards")
            and self.labels == base.labels
            and sorted(self.rejected, key=str) == sorted(base.rejected, key=str)
        )


def _shaping(params: Mapping[str, Any], *aside: str) -> dict[str, Any]:
    """The params that shape a version's bytes: ``on_error`` aside (a version without
    rejects is the same under either, and one with rejects is written again under fail),
    and the keys ``aside``."""
    return {k: v for k, v in params.items() if k != "on_error" and k not in aside}


def fingerprint(
    listing: FileListing, params: Mapping[str, Any], labels: Sequence[str], base: str = ""
) -> str:
    """Name of the version directory: a hash of what goes into the shards.

    ``files.jsonl`` (each file's path relative to the root, label and content
    token), the byte-shaping ``params``, the label map, the version it grows
    from (``base``) and the format versions. Not the root: the same files read
    from another folder or clone give the same shards.
    """
    doc: dict[str, Any] = {
        "bytes": BYTES_VERSION,
        "files_sha256": listing.digest,
        "format": FORMAT_VERSION,
        "labels": list(labels),
        "params": dict(params),
    }
    if base:
        doc["base"] = base
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


def record_buckets(
    listing: FileListing, group_by: str | None, count: int, indices: array[int] | None = None
) -> array[int]:
    """Each file's split bucket (of ``indices`` only, when given), in that order.

    A file's key is its path, or its group's key under ``group_by``.
    """
    parsed = grouping.GroupBy.parse(group_by)
    if indices is None:
        paths: Iterator[str] = (path for path, _, _ in listing.scan())
    else:
        paths = (e.path for batch in listing.rows(indices).batches() for e in batch)
    out = array("I")
    for path in paths:
        key = path if parsed is None else parsed.key(path)
        out.append(buckets.bucket_of(key if key is not None else path, count))
    return out


def plan(
    listing: FileListing,
    config: WriteConfig,
    transform_identity: str = "none",
    groups: grouping.Groups | None = None,
    previous: Manifest | None = None,
    carried: Sequence[str] | None = None,
    carried_gaps: Sequence[int] = (),
) -> Plan:
    """The version directory, manifest params and shard tasks of writing ``listing``.

    ``transform_identity`` is :func:`tfshards.run.transform.identity` of
    ``config.transform``, resolved by the caller (it imports the user's module).
    Each task carries :meth:`FileListing.rows` of its records: entries in
    memory, or line numbers of a stored listing (4 bytes per file) read
    where the shard is written. With ``config.group_by``, ``groups`` is
    :func:`read_groups` of the same listing; read here when None.
    ``previous`` (:func:`growth.find`) lends its shards whose records are all
    listed again unchanged (:mod:`.placement`); label ids come from it, else
    from ``carried`` (:func:`growth.last`: the pipeline's last version) and the
    gaps of its map, ``carried_gaps`` (:func:`labelmap.gap_ids`).
    """
    if transform_identity.split("@", 1)[0] != (config.transform or "none"):
        raise ConfigError(
            f"transform_identity: expected the identity of transform {config.transform!r}, "
            f"got {transform_identity!r}"
        )
    if not listing.files:
        raise InputError(f"{listing.root}: the listing has no files", path=listing.root)
    if previous is not None:
        carried, carried_gaps = previous.labels, previous.label_gaps
    labels = labelmap.resolve(listing.labels, config.labels, carried, config.relabel, carried_gaps)
    gaps = labelmap.gap_ids(
        labels, listing.labels, carried, carried_gaps, pinned=config.labels is not None
    )
    ids = labelmap.label_ids(listing.labels, labels)
    if config.group_by is not None and groups is None:
        groups = read_groups(listing, config.group_by)
    if grouping.GroupBy.parse(config.group_by) is None:
        groups = None
    num_shards = _num_shards(listing, config, groups)
    params = _params(config, num_shards, transform_identity, labels, listing.labels, gaps)
    _check_columns(listing.columns, config.image_feature)
    if listing.columns:  # absent otherwise: sets without columns keep their bytes and name
        params["columns"] = columns_json(listing.columns)
    keys = groups[1] if groups is not None else listing.files  # what buckets are keyed by
    params["buckets"] = bucket_count(config.buckets, num_shards, previous, keys)
    fresh = "" if previous is None else growth.growable(previous, params)
    base = previous if previous is not None and not fresh else None
    placed, found, moved, rejected = _place(
        listing, config, params, num_shards, groups, base, labels, ids
    )
    names = [layout.shard_name(config.name, i, len(placed)) for i in range(len(placed))]
    version = storage.join(
        config.out, fingerprint(listing, params, labels, base.fingerprint if base else "")
    )
    tasks = tuple(
        _task(listing, config, version, name, p, ids)
        for name, p in zip(names, placed, strict=True)
        if isinstance(p, placement.NewShard)
    )
    kept = tuple(
        KeptFile(name, base.shards[p.previous])
        for name, p in zip(names, placed, strict=True)
        if isinstance(p, placement.KeptShard) and base is not None
    )
    changes = (
        {} if found is None or base is None else growth.changes(found, base, labels, moved, gaps)
    )
    return Plan(
        version,
        {**params, "on_error": config.on_error},
        tasks,
        labels,
        kept,
        base,
        changes,
        fresh,
        rejected,
    )


def _place(
    listing: FileListing,
    config: WriteConfig,
    params: Mapping[str, Any],
    num_shards: int,
    groups: grouping.Groups | None,
    base: Manifest | None,
    labels: Sequence[str],
    ids: Sequence[int],
) -> tuple[list[placement.Placed], growth.Match | None, tuple[int, int], tuple[Reject, ...]]:
    """Each shard's bucket and records, new or kept; the match with the base; records
    moved to another bucket (by path, and files moved or renamed); the base's rejects
    left out again.

    Growing, only the files no kept shard holds are hashed into buckets.
    """
    count = int(params["buckets"])
    group_ids = None if groups is None else groups[0]
    if base is None:
        members = placement.by_bucket(record_buckets(listing, config.group_by, count), count)
        return placement.fresh(members, num_shards, config.seed, group_ids), None, (0, 0), ()
    found = growth.match(base, listing, labels, ids, **config.out_options)
    rest = placement.not_kept(found.held, listing.files)
    rejected: tuple[Reject, ...] = ()
    if config.on_error == "skip":  # under "fail" a file still bad fails the write
        rest, rejected = _rejected_again(listing, rest, base)
    rest_buckets = record_buckets(listing, config.group_by, count, rest)
    pending: list[array[int]] = [array("I") for _ in range(count)]
    for i, b in zip(rest, rest_buckets, strict=True):
        pending[b].append(i)
    target = math.ceil(listing.files / num_shards)
    placed = placement.grown(pending, found.held, target, config.seed, group_ids)
    moved = (
        placement.moved(found.found, rest, rest_buckets, listing.files),
        placement.moved_files(found.moved_files, rest, rest_buckets),
    )
    return placed, found, moved, rejected


def _rejected_again(
    listing: FileListing, rest: array[int], base: Manifest
) -> tuple[array[int], tuple[Reject, ...]]:
    """``rest`` less the files ``base`` left out for their bytes and lists again with the
    same content token, and those rejects (in listing order): they are not read again."""
    known = {(r.path, r.token): r for r in base.rejected if r.token}
    if not known or not rest:
        return rest, ()
    kept, again = array("I"), []
    entries = (entry for batch in listing.rows(rest).batches() for entry in batch)
    for i, entry in zip(rest, entries, strict=True):
        reject = known.get((entry.path, entry.token))
        if reject is None:
            kept.append(i)
        else:
            again.append(reject)
    return kept, tuple(again)


def _task(
    listing: FileListing,
    config: WriteConfig,
    version: str,
    name: str,
    shard: placement.NewShard,
    ids: Sequence[int],
) -> ShardTask:
    rows = listing.rows(shard.indices)
    return ShardTask(
        name=name,
        source=storage.absolute(listing.root),
        out=storage.absolute(version),
        rows=labelmap.relabel(rows, ids),
        image_feature=config.image_feature,
        transform=config.transform,
        compression=config.compression,
        on_error=config.on_error,
        source_options=dict(config.source_options),
        out_options=dict(config.out_options),
        resize=config.resized,
        bucket=shard.bucket,
        exif=config.exif,
        columns=listing.columns,
    )


def _check_columns(columns: Sequence[Column], image_feature: str) -> None:
    """No extra column takes the payload's feature name."""
    for column in columns:
        if column.name == image_feature:
            raise ConfigError(
                f"columns: {column.name}: expected a name other than the payload's "
                f"image_feature {image_feature!r}, found it",
                option="columns",
            )


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


def bucket_count(
    asked: int, num_shards: int, previous: Manifest | None, files: int | None = None
) -> int:
    """The split buckets of this version: a lineage keeps its first version's count.

    A first version has ``min(asked, num_shards)`` (a filled bucket needs a
    shard), or ``asked`` when it has a shard per file (``files``): its records
    fill at most that many buckets, and a set started from a few files grows
    with all of them. A later one keeps the previous version's count, whatever
    ``num_shards`` is now, unless ``asked`` is lower: that would move records
    across the split, which :func:`growth.growable` refuses. A previous count
    of 1 splits nothing and is not kept.
    """
    before = previous.params.get("buckets") if previous is not None else None
    if isinstance(before, int) and before >= 2 and asked >= before:
        return before
    if files is not None and files <= num_shards:
        return asked
    return min(asked, num_shards)


def _params(
    config: WriteConfig,
    num_shards: int,
    transform_identity: str,
    labels: Sequence[str],
    listed: Sequence[str],
    gaps: Sequence[int] = (),
) -> dict[str, Any]:
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
    exif = orientation.params(config.exif)
    if exif is not None:  # absent under ignore: those sets keep their names
        params["exif"] = exif
    if tuple(labels) != tuple(listed):  # a pinned, carried or numeric map: absent otherwise
        params["labels"] = list(labels)
    if gaps:  # absent otherwise: sets without gaps keep their bytes and name
        params["label_gaps"] = list(gaps)
    return params
