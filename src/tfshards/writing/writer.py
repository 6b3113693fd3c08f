"""Write a listing into versioned, byte-deterministic TFRecord shards, in parallel.

The plan (record order, shard contents, names) is a pure function of the
listing and the parameters, so any number of workers on any executor writes
the same bytes. Each shard is one task (:func:`write_shard`) on plain values.
A shard (and, uncompressed, its record index file: :mod:`tfshards.writing.recordindex`)
is published atomically, then recorded in a sidecar under
``_work/`` (:mod:`tfshards.shardset.layout`); a re-run after a crash re-hashes finished
shards against their sidecars, keeps the good ones and writes the rest.
The TensorFlow Datasets metadata (:mod:`tfshards.shardset.datasetinfo`) comes next, and
``manifest.json``, written last with their sha256, commits the set.

The version directory is named after the content (:func:`fingerprint`): the
files' paths relative to the root, labels and content tokens, the parameters
that shape the bytes, and :data:`BYTES_VERSION`. Never mtimes, never where or
how the root was spelled: the same files give the same name on every clone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import operator
import posixpath
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import jsonfile, storage
from tfshards.errors import ConfigError, InputError, ShardError, TransformError
from tfshards.format import native
from tfshards.format.schema import FeatureSpec, merge_specs
from tfshards.listing.listing import (
    Listing,
    listing_counts,
    listing_digest,
    listing_root,
    open_stored,
    read_listing,
)
from tfshards.listing.storedlisting import ListedRows, StoredListing
from tfshards.listing.walker import Entry
from tfshards.progress import Progress
from tfshards.run import executor as executors
from tfshards.run.cluster import Needs
from tfshards.shardset import datasetinfo, grouping, layout, lease
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import FORMAT_VERSION, Manifest
from tfshards.writing import sharding
from tfshards.writing import transform as transforms
from tfshards.writing.config import BASE_FEATURES, WriteConfig
from tfshards.writing.shard import ShardResult, ShardTask, keys_differ, write_shard

# Bump whenever a change to tfshards changes the shard bytes written for the same
# inputs and params (framing, feature encoding, record order): the version name
# then changes too, so no directory ever holds two kinds of bytes under one name.
BYTES_VERSION = 1
_PATH_LABEL_SIZE = operator.itemgetter(0, 2, 1)  # listing Entry -> ShardTask entry


@dataclass(frozen=True)
class WriteResult:
    manifest: Manifest
    reused: int
    seconds: float


# ----------------------------------------------------------------------------- plan & run


def fingerprint(listing: Listing, params: Mapping[str, Any]) -> str:
    """Name of the version directory: a hash of what goes into the shards.

    ``files.jsonl`` (each file's path relative to the root, label and content
    token), the byte-shaping ``params`` and the format versions. Not the root:
    the same files read from another folder or clone give the same shards.
    """
    return _fingerprint(listing_digest(listing), listing.labels, params)


def _fingerprint(files_sha256: str, labels: Sequence[str], params: Mapping[str, Any]) -> str:
    doc = {
        "bytes": BYTES_VERSION,
        "files_sha256": files_sha256,
        "format": FORMAT_VERSION,
        "labels": list(labels),
        "params": dict(params),
    }
    return jsonfile.digest(doc)[:16]


def read_groups(listing: Listing | StoredListing, group_by: str | None) -> grouping.Groups | None:
    """The files' group ids under ``group_by`` (None without it): one pass over the paths.

    Raises:
        InputError: a listed path the pattern does not match.
    """
    parsed = grouping.GroupBy.parse(group_by)
    if parsed is None:
        return None
    paths = (
        listing.paths() if isinstance(listing, StoredListing) else (e.path for e in listing.entries)
    )
    return grouping.group_ids(parsed, paths, listing.root)


def plan(
    listing: Listing | StoredListing,
    config: WriteConfig,
    transform_identity: str = "none",
    groups: grouping.Groups | None = None,
) -> tuple[str, dict[str, Any], list[ShardTask]]:
    """The version directory URL, manifest params and shard tasks (pure: no I/O, no imports).

    ``transform_identity`` is :func:`tfshards.writing.transform.identity` of
    ``config.transform``, resolved by the caller (it imports the user's module).
    From a :class:`StoredListing` the tasks carry line numbers of its
    ``files.jsonl`` (4 bytes per file) and read their entries themselves.
    With ``config.group_by``, ``groups`` is :func:`read_groups` of the same
    listing (which reads a stored listing's paths); read here when None for a
    :class:`Listing` in memory.
    """
    if transform_identity.split("@", 1)[0] != (config.transform or "none"):
        raise ConfigError(
            f"transform_identity: expected the identity of transform {config.transform!r}, "
            f"got {transform_identity!r}"
        )
    files = listing.files if isinstance(listing, StoredListing) else len(listing.entries)
    if not files:
        raise InputError(f"{listing.root}: the listing has no files", path=listing.root)
    group_by = grouping.GroupBy.parse(config.group_by)
    if group_by is not None and groups is None:
        if isinstance(listing, StoredListing):
            raise ConfigError("plan: group_by needs the stored listing's groups (read_groups)")
        groups = read_groups(listing, config.group_by)
    if group_by is None:
        groups = None
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
    params: dict[str, Any] = {
        "compression": config.compression,
        "image_feature": config.image_feature,
        "name": config.name,
        "num_shards": num_shards,
        "seed": config.seed,
        "transform": transform_identity,
    }
    if group_by is not None:  # absent, not null, without groups: older version names hold
        params["group_by"] = group_by.pattern
    resize = config.resized
    if resize is not None:  # absent otherwise: sets written without it keep their bytes and name
        params["resize"] = resize.params()
    digest = listing.digest if isinstance(listing, StoredListing) else listing_digest(listing)
    version = storage.join(config.out, _fingerprint(digest, listing.labels, params))
    source, out = storage.absolute(listing.root), storage.absolute(version)
    tasks = []
    contents = _contents(listing, files, num_shards, config.seed, groups)
    for i, (rows, picked) in enumerate(contents):
        tasks.append(
            ShardTask(
                name=layout.shard_name(config.name, i, num_shards),
                source=source,
                out=out,
                entries=tuple(map(_PATH_LABEL_SIZE, picked)),  # C loops: 20k files in ~3 ms
                image_feature=config.image_feature,
                transform=config.transform,
                compression=config.compression,
                on_error=config.on_error,
                source_options=dict(config.source_options),
                out_options=dict(config.out_options),
                tokens=tuple(entry.token for entry in picked),
                listed=rows,
                resize=resize,
            )
        )
    params["on_error"] = config.on_error
    return version, params, tasks


def _contents(
    listing: Listing | StoredListing,
    files: int,
    num_shards: int,
    seed: int,
    groups: grouping.Groups | None = None,
) -> Iterator[tuple[ListedRows | None, list[Entry]]]:
    """Each shard's lines of a stored listing, or its entries of one in memory."""
    if groups is not None:
        indices, cuts = sharding.grouped_indices(groups[0], groups[1], num_shards, seed)
        for start, stop in itertools.pairwise(cuts):
            if isinstance(listing, StoredListing):
                yield listing.rows(indices[start:stop]), []
            else:
                yield None, [listing.entries[j] for j in indices[start:stop]]
        return
    bounds = itertools.pairwise(sharding.shard_boundaries(files, num_shards))
    if isinstance(listing, StoredListing):
        indices = sharding.shuffled_indices(files, seed)  # 4 bytes per file
        for start, stop in bounds:
            yield listing.rows(indices[start:stop]), []
    else:
        order = sharding.shuffled_order(files, seed)
        for start, stop in bounds:
            yield None, [listing.entries[j] for j in order[start:stop]]


def write(config: WriteConfig, listing: Listing | str, *, progress: bool = True) -> WriteResult:
    """Write ``listing`` (a :class:`Listing` or its directory) as a shard set.

    Returns the committed manifest. Raises :class:`InputError` for a bad input
    (with ``on_error="fail"``), and never leaves a manifest for a partial set.
    """
    start = time.monotonic()
    root = listing.root if isinstance(listing, Listing) else listing_root(listing)
    fs_in, _ = storage.open_url(root, **config.source_options)
    fs_out, _ = storage.open_url(config.out, **config.out_options)
    # Never more workers than shards; meta.json alone gives the count before the listing loads.
    files, nbytes = (
        (len(listing.entries), listing.total_bytes)
        if isinstance(listing, Listing)
        else listing_counts(listing)
    )
    shards = config.num_shards or sharding.auto_num_shards(files, nbytes, config.target_shard_bytes)
    pool = executors.start(
        config.run,
        [storage.protocol(fs_in), storage.protocol(fs_out)],
        gil_free=native.NATIVE is not None
        and config.transform is None
        and config.resize is None
        and storage.is_local(fs_in),
        tasks=shards,
    )
    # Workers start before the listing is loaded: forked later, each would count it in its RSS.
    with pool:
        loaded: Listing | StoredListing
        if isinstance(listing, str):
            # Tasks read their own lines of a stored listing; Dask workers may not
            # see the listing directory, so they get the entries themselves.
            stored = open_stored(listing) if pool.options.executor != "dask" else None
            loaded = stored or read_listing(listing)
        else:
            loaded = listing
        groups = read_groups(loaded, config.group_by)
        version, params, tasks = plan(loaded, config, transforms.identity(config.transform), groups)
        listed = loaded.files if isinstance(loaded, StoredListing) else len(loaded.entries)
        fs_out, version_path = storage.open_url(version, **config.out_options)
        # Held from before the first shard is reused until the manifest is out: prune
        # leaves the version alone meanwhile (tfshards.shardset.lease).
        with lease.hold(fs_out, version_path):
            done = _write_shards(pool, tasks, params, config.transform, listed, progress)
            manifest = Manifest(
                root=version,
                fingerprint=version.rstrip("/").rsplit("/", 1)[-1],
                params=params,
                schema=_merge_schema(done, tasks),
                labels=loaded.labels,
                compression=config.compression,
                shards=tuple(r.info for r in done),
                rejected=tuple(rej for r in done for rej in r.rejected),
                listed=listed,
            )
            manifest = _write_metadata(fs_out, version_path, manifest)
            _check_shards_present(fs_out, version_path, manifest)
            _publish(fs_out, storage.join(version_path, MANIFEST_NAME), manifest)
    if config.manifest_copy:
        _publish(*storage.open_url(config.manifest_copy), manifest)
    folders = (storage.join(version_path, folder) for folder in sorted(layout.FOLDERS))
    for directory in (version_path, *folders):  # a killed writer's temps, wherever it wrote
        storage.remove_stale_temps(fs_out, directory)
    return WriteResult(manifest, sum(r.reused for r in done), time.monotonic() - start)


def _write_shards(
    pool: executors.Executor,
    tasks: Sequence[ShardTask],
    params: Mapping[str, Any],
    transform: str | None,
    listed: int,
    progress: bool,
) -> list[ShardResult]:
    """Run every shard task on ``pool``, with a progress bar; the results in task order."""
    with Progress("write", total=listed, enabled=progress) as bar:
        return executors.in_order(
            pool.map(
                write_shard,
                tasks,
                describe=lambda t: t.name,
                needs=Needs(
                    locations=(tasks[0].source, tasks[0].out),
                    inputs=(tasks[0].source,),
                    transform=transform,
                    transform_identity=params["transform"],
                ),
                note=bar.note,
            ),
            len(tasks),
            on_result=lambda r: bar.update(r.info.records + len(r.rejected), r.info.bytes),
        )


def _check_shards_present(fs: Any, version_path: str, manifest: Manifest) -> None:
    """Every shard the manifest lists is in place with its size (one listing call).

    Raises:
        ShardError: a shard went away while this write ran (a concurrent
            ``prune`` from another host, or a user): no manifest is published.
    """
    try:
        found = {
            posixpath.basename(str(p)): int(info.get("size") or 0)
            for p, info in fs.find(version_path, maxdepth=1, detail=True).items()
        }
    except FileNotFoundError:
        found = {}
    for shard in manifest.shards:
        size = found.get(shard.name)
        if size != shard.bytes:
            what = "missing" if size is None else f"{size} bytes"
            raise ShardError(
                f"{storage.join(version_path, shard.name)}: expected the shard just written "
                f"({shard.bytes} bytes), found it {what}: something deleted it while this "
                "write ran; no manifest was published, run write again",
                shard=shard.name,
            )


def _publish(fs: Any, path: str, manifest: Manifest) -> None:
    try:
        storage.write_atomic(fs, path, [manifest.to_json()])
    except OSError as exc:  # disk full, read-only: one line naming the file
        raise storage.write_error(fs, path, exc) from None


def _write_metadata(fs: Any, version_path: str, manifest: Manifest) -> Manifest:
    """Write the TensorFlow Datasets metadata; the manifest to commit, with their sha256."""
    files = datasetinfo.tfds_files(manifest)
    for name, data in files.items():
        path = storage.join(version_path, name)
        try:
            storage.write_atomic(fs, path, [data])
        except OSError as exc:  # disk full, read-only: one line naming the file
            raise storage.write_error(fs, path, exc) from None
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    return dataclasses.replace(manifest, metadata_files=digests)


def _merge_schema(
    results: Sequence[ShardResult], tasks: Sequence[ShardTask]
) -> tuple[FeatureSpec, ...]:
    merged: dict[str, FeatureSpec] = {}
    first = ""  # the first good file of the first shard with records: its features are the rule
    for result, task in zip(results, tasks, strict=True):
        if result.info.records == 0:
            continue
        base = (task.image_feature, *BASE_FEATURES)
        names = [spec.name for spec in result.schema if spec.name not in base]
        if merged and set(names) != set(merged) - set(base):
            here = _first_kept(task, result)
            expected = sorted(set(merged) - set(base))
            raise TransformError(
                f"{here}: transform {task.transform}: " + keys_differ(expected, first, names),
                path=here,
            )
        first = first or _first_kept(task, result)
        for spec in result.schema:
            merged[spec.name] = (
                merge_specs(merged[spec.name], spec) if spec.name in merged else spec
            )
    return tuple(merged[k] for k in sorted(merged))


def _first_kept(task: ShardTask, result: ShardResult) -> str:
    """The path of the task's first file that became a record (read from the listing if need be)."""
    rejected = {r.path for r in result.rejected}
    batches = task.listed.batches() if task.listed is not None else [task.entries]
    return next(row[0] for rows in batches for row in rows if row[0] not in rejected)
