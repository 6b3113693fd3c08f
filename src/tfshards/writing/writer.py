"""Write a listing into versioned, byte-deterministic TFRecord shards, in parallel.

Runs a :class:`~tfshards.writing.plan.Plan`: workers start, the listing
loads, the plan is made (:mod:`tfshards.writing.plan`), and each shard is one
task (:func:`~tfshards.writing.shard.write_shard`) on plain values, under a
lease on the version directory (:mod:`tfshards.shardset.lease`).
A shard (and, uncompressed, its record index file: :mod:`tfshards.writing.recordindex`)
is published atomically, then recorded in a sidecar under
``_work/`` (:mod:`tfshards.shardset.layout`); a re-run after a crash re-hashes finished
shards against their sidecars, keeps the good ones and writes the rest.
The TensorFlow Datasets metadata (:mod:`tfshards.shardset.datasetinfo`) comes next, then
``imagestats.json`` (:mod:`tfshards.writing.imagestats`: read from the records as they were
framed), and ``manifest.json``, written last with the metadata's sha256, commits the set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import posixpath
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from tfshards import atomicfile, storage
from tfshards.errors import ConfigError, ShardError, TfshardsError, TransformError
from tfshards.format import native
from tfshards.format.schema import FeatureSpec, merge_specs
from tfshards.listing.listing import read_listing
from tfshards.listing.meta import listing_counts, listing_root, read_meta
from tfshards.listing.protocol import FileListing
from tfshards.listing.storedlisting import open_stored
from tfshards.progress import Progress
from tfshards.run import executor as executors
from tfshards.run import transform as transforms
from tfshards.run.executor import Needs
from tfshards.shardset import datasetinfo, diff, layout, lease
from tfshards.shardset import manifest as manifests
from tfshards.shardset.imagestats import ImageStats, VersionStats
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.writing import changedshards, growth, imagestats, reuse, sharding
from tfshards.writing.config import BASE_FEATURES, WriteConfig
from tfshards.writing.features import keys_differ
from tfshards.writing.plan import Plan, plan, read_groups
from tfshards.writing.shard import (
    ShardResult,
    ShardTask,
    bad_files_error,
    write_shard,
    written_files,
)


@dataclass(frozen=True)
class WriteResult:
    """A committed write: its manifest, shards reused, seconds.

    ``unchanged``: nothing changed since the previous version, which is the
    result. ``fresh``: why a previous version lent no shard ("" otherwise);
    ``damaged``: that reason, when it was a shard of it missing or resized.
    ``resplit``: how a write that did not grow keys the split unlike the last
    version (its buckets or ``group_by``), so records may have changed sides.
    """

    manifest: Manifest
    reused: int
    seconds: float
    unchanged: bool = False
    fresh: str = ""
    resplit: str = ""
    rotated: int = 0  # files written here with an EXIF orientation of 2..8 (exif warn, apply)
    resumed: int = 0  # of ``reused``: shards an interrupted write of this version finished
    damaged: str = ""
    base_directory: str = ""  # where the version this one grew from is ("": none)


def write(config: WriteConfig, listing: FileListing | str, *, progress: bool = True) -> WriteResult:
    """Write ``listing`` (a listing in memory or stored, or its directory) as a shard set.

    Returns the committed manifest. Raises :class:`InputError` for a bad input
    (with ``on_error="fail"``), and never leaves a manifest for a partial set.
    """
    start, options = time.monotonic(), config.out_options
    _check_manifest_copy(config)
    pool = _start_pool(config, _checked(listing))
    # Workers start before the listing is loaded: forked later, each would count it in its RSS.
    with pool:
        loaded = _load(listing, pool.options.executor)
        groups = read_groups(loaded, config.group_by)
        previous = growth.find(config.previous, config.manifest_copy, **options)
        last = previous or growth.last(config.manifest_copy)
        identity = transforms.identity(config.transform)
        planned, previous, damaged, unlent = _plan(loaded, config, identity, groups, previous, last)
        if planned.base is not None:  # before it is kept as it is, or lends a shard
            changedshards.check(planned.base, **options)
        if planned.is_base and previous is not None:  # nothing changed since that version
            if config.manifest_copy:
                _publish(*storage.open_url(config.manifest_copy), previous)
            seconds = time.monotonic() - start
            return WriteResult(previous, len(previous.shards), seconds, unchanged=True)
        fs_out, version_path = storage.open_url(planned.version, **options)
        _check_own_folder(fs_out, version_path)
        # Held from before the first shard is reused until the manifest is out: prune
        # leaves the version, and the one it grows from, alone meanwhile
        # (tfshards.shardset.lease).
        with lease.hold(fs_out, version_path), _hold_base(fs_out, planned):
            # The version grown from, not the last: one name, one imagestats.json.
            base_stats = imagestats.read_base(planned.base, planned.fingerprint, **options)
            carried = _carried_stats(planned, base_stats)
            kept = reuse.keep(fs_out, version_path, planned, carried, **options)
            done = _write_shards(pool, planned, config.transform, progress)
            _fail_on_bad_files(done)
            shards = sorted([*kept, *done], key=lambda r: r.info.name)
            manifest = _manifest(planned, config, loaded.files, kept, done)
            manifest = _write_metadata(fs_out, version_path, manifest)
            _check_shards_present(fs_out, version_path, manifest)
            stats = [(r.info.bucket, r.images) for r in shards] + list(carried.items())
            imagestats.save_version(fs_out, version_path, stats, planned.base, base_stats)
            # The new files and their folders were renamed in without an fsync: made
            # durable here in one pass, before the manifest makes them count.
            _sync(fs_out, version_path, done, manifest)
            _publish(fs_out, storage.join(version_path, MANIFEST_NAME), manifest)
    if config.manifest_copy:
        _publish(*storage.open_url(config.manifest_copy), manifest)
    folders = (storage.join(version_path, folder) for folder in sorted(layout.FOLDERS))
    for directory in (version_path, *folders):  # a killed writer's temps, wherever it wrote
        atomicfile.remove_stale_temps(fs_out, directory)
    resumed = sum(r.reused for r in done)
    reused = len(kept) + resumed
    fresh = planned.fresh or unlent or damaged
    fresh = fresh or ("previous is none" if previous is None and last else "")
    resplit = growth.split_change(last, manifest.params) if fresh and last else ""
    rotated = sum(r.rotated for r in done)
    seconds = time.monotonic() - start
    return WriteResult(
        manifest,
        reused,
        seconds,
        fresh=fresh,
        resplit=f"since version {last.fingerprint}: {resplit}" if last and resplit else "",
        rotated=rotated,
        resumed=resumed,
        damaged=damaged,
        base_directory=planned.base.directory if planned.base is not None else "",
    )


def _checked(listing: Any) -> FileListing | str:
    """``listing`` when it is one (or a stored one's folder).

    Raises:
        ConfigError: anything else, in one line.
    """
    if not isinstance(listing, str) and not hasattr(listing, "paths"):
        raise ConfigError(
            "listing must be a Listing (tfshards.list_files(root)) or a stored listing's "
            f"folder, got {type(listing).__name__} {listing!r:.60}"
        )
    return cast("FileListing | str", listing)


def _manifest(
    planned: Plan,
    config: WriteConfig,
    listed: int,
    kept: Sequence[ShardResult],
    done: Sequence[ShardResult],
) -> Manifest:
    """The version's manifest: the kept and written shards in name order, every reject."""
    shards = sorted([*kept, *done], key=lambda r: r.info.name)
    return Manifest(
        root=planned.version,
        fingerprint=planned.fingerprint,
        params=planned.params,
        schema=_merge_schema(done, planned.tasks, kept),
        labels=planned.labels,
        compression=config.compression,
        shards=tuple(r.info for r in shards),
        rejected=(*planned.rejected, *(rej for r in done for rej in r.rejected)),
        listed=listed,
        base=planned.base.fingerprint if planned.base is not None else "",
        changes=_with_rejects(planned, list(done), **config.out_options),
    )


def _plan(
    loaded: FileListing,
    config: WriteConfig,
    identity: str,
    groups: Any,
    previous: Manifest | None,
    last: Manifest | None,
) -> tuple[Plan, Manifest | None, str, str]:
    """The plan; the previous version it may grow from (None when it lacks a shard); that
    damage, when the plan repairs that very version; why a damaged one lends nothing.
    ``last``: the pipeline's last version, whose label map (and its gaps) is kept.

    Raises:
        ShardError: the previous version lacks a shard it would lend (or is unchanged): a
            clone holding the shard grows it and names another version than a fresh plan.
    """
    labels = last.labels if last else None  # the ids, and gaps, of the last version kept
    gaps = last.label_gaps if last else ()
    damaged = growth.damage(previous, **config.out_options) if previous else ""
    if not damaged:
        return plan(loaded, config, identity, groups, previous, labels, gaps), previous, "", ""
    assert previous is not None
    planned = plan(loaded, config, identity, groups, None, labels, gaps)
    if planned.fingerprint == previous.fingerprint:  # the same version: its shards resume
        return planned, None, damaged, ""
    trial = plan(loaded, config, identity, groups, previous, labels, gaps)
    if trial.base is not None:
        raise ShardError(
            f"{damaged}: restore it (dvc checkout --force, dvc pull, or a copy) to grow from "
            "it, or set write.previous: none (--previous none) to write every shard anew as a "
            "new lineage",
            path=previous.directory,
        )
    return planned, None, "", trial.fresh  # it lends nothing either way: why not


def _with_rejects(planned: Plan, done: list[ShardResult], **options: Any) -> dict[str, int]:
    """The plan's counts of what changed, with the files left out: one the base left out
    and this write again (unread), or a new one rejected now, was not added; a record's
    file rejected now (emptied, damaged) was removed."""
    changes = dict(planned.changes)
    if not changes or planned.base is None:
        return changes
    changes["added"] -= len(planned.rejected)
    rejected = {r.path for result in done for r in result.rejected}
    if not rejected:
        return changes
    members = diff.load_members(planned.base, **options)
    were = sum(1 for _, rows in members for row in rows if row[0] in rejected)
    changed = min(were, changes["changed"])  # else read errors of unchanged files
    changes["added"] -= len(rejected) - were
    changes["changed"] -= changed
    changes["unchanged"] -= were - changed
    changes["removed"] += were
    return changes


def _carried_stats(planned: Plan, found: VersionStats | None) -> dict[int, ImageStats]:
    """The image statistics of the split buckets kept whole from the base version, from
    ``found`` (the base's)."""
    if planned.base is None:
        return {}
    buckets = [k.info.bucket for k in planned.kept]
    return imagestats.carried(planned.base, buckets, found)


@contextlib.contextmanager
def _hold_base(fs_out: Any, planned: Plan) -> Iterator[None]:
    """A lease on the version this one grows from, where it shares the output's store.

    A base this process cannot write to (a read-only store) is read without one.
    """
    base = planned.base
    if base is None or not planned.kept:
        yield
        return
    fs_base, base_path = storage.open_url(base.directory)
    if storage.protocol(fs_base) != storage.protocol(fs_out):
        yield
        return
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(TfshardsError):
            stack.enter_context(lease.hold(fs_out, base_path))
        yield


def _start_pool(config: WriteConfig, listing: FileListing | str) -> executors.Executor:
    """Workers for the shards: never more than shards, counted from ``meta.json`` alone."""
    root = listing_root(listing) if isinstance(listing, str) else listing.root
    fs_in, _ = storage.open_url(root, **config.source_options)
    fs_out, _ = storage.open_url(config.out, **config.out_options)
    files, nbytes = (
        listing_counts(listing)
        if isinstance(listing, str)
        else (listing.files, listing.total_bytes)
    )
    shards = config.num_shards or sharding.auto_num_shards(files, nbytes, config.target_shard_bytes)
    columns = (  # extra columns take the Python path: it holds the GIL
        "columns" in read_meta(*storage.open_url(listing))[0]
        if isinstance(listing, str)
        else bool(listing.columns)
    )
    return executors.start(
        config.run,
        [storage.protocol(fs_in), storage.protocol(fs_out)],
        gil_free=native.NATIVE is not None
        and config.transform is None
        and config.resize is None
        and config.exif != "apply"  # warn stores the files as they are
        and not columns
        and storage.is_local(fs_in),
        tasks=shards,
        user_code=config.transform is not None,
    )


def _load(listing: FileListing | str, executor: str) -> FileListing:
    """The listing itself, or its directory opened: tasks then read their own lines.

    Dask workers may not see the listing directory: they get the entries themselves.
    """
    if not isinstance(listing, str):
        return listing
    stored = open_stored(listing) if executor != "dask" else None
    return stored or read_listing(listing)


def _write_shards(
    pool: executors.Executor,
    planned: Plan,
    transform: str | None,
    progress: bool,
) -> list[ShardResult]:
    """Run every shard task on ``pool``, with a progress bar; the results in task order."""
    tasks = planned.tasks
    if not tasks:
        return []
    with Progress("write", total=sum(len(t.rows) for t in tasks), enabled=progress) as bar:
        return executors.in_order(
            pool.map(
                write_shard,
                tasks,
                describe=lambda t: t.name,
                needs=Needs(
                    locations=(tasks[0].source, tasks[0].out),
                    inputs=(tasks[0].source,),
                    samples=lambda: _sample_files(tasks),
                    transform=transform,
                    transform_identity=planned.params["transform"],
                ),
                note=bar.note,
            ),
            len(tasks),
            on_result=lambda r: bar.update(r.info.records + len(r.rejected), r.info.bytes),
        )


def _check_own_folder(fs: Any, version_path: str) -> None:
    """Refuse a local version folder tfshards did not make: a link, or a folder holding
    files but neither a manifest nor ``_work/`` (a writer makes ``_work/`` before its first
    file). Files of the user's at a shard's name there were written over without a word.

    Raises:
        ShardError: naming the folder and what is there.
    """
    if not storage.is_local(fs):
        return
    above = os.path.dirname(version_path)
    while above and not os.path.lexists(above):
        above = os.path.dirname(above)
    if above and not os.path.isdir(above):  # --out names a file, or a folder inside one
        found = "a link to nothing" if os.path.islink(above) else "a file"
        raise ShardError(
            f"{storage.unstrip(fs, above)}: expected a folder for the shard versions (--out) "
            f"or none, found {found}",
            path=storage.unstrip(fs, above),
        )
    if not os.path.lexists(version_path):
        return
    where = storage.unstrip(fs, version_path)
    if os.path.islink(version_path) or not os.path.isdir(version_path):
        found = "a link" if os.path.islink(version_path) else "a file"
        raise ShardError(
            f"{where}: expected a version folder tfshards made (or none), found {found}: "
            "remove it or pass another --out",
            path=where,
        )
    entries = sorted(os.listdir(version_path))
    if entries and MANIFEST_NAME not in entries and layout.WORK_DIR not in entries:
        raise ShardError(
            f"{where}: expected a version folder tfshards made (or none), found one holding "
            f"{len(entries)} entries and no {layout.WORK_DIR}/ nor {MANIFEST_NAME} (first: "
            f"{entries[0]!r}): remove it or pass another --out",
            path=where,
        )


def _check_manifest_copy(config: WriteConfig) -> None:
    """Refuse a manifest copy (``--manifest``) inside the shard folder (``--out``): there it
    is a version's own ``manifest.json``, or a file beside the versions, which the copy of
    another version's manifest replaced without a word (the version then read as another).
    Elsewhere, :func:`_check_copy_target`.

    Raises:
        ConfigError: one line naming both.
    """
    if config.manifest_copy is None:
        return
    if not storage.inside(config.manifest_copy, config.out):
        _check_copy_target(config.manifest_copy)
        return
    raise ConfigError(
        f"manifest: expected a path outside the shard folder {config.out} (--out), found "
        f"{config.manifest_copy} inside it, where it would replace a version's own "
        "manifest; keep the copy beside that folder (data/manifest.json beside data/shards)",
        option="manifest",
    )


def _check_copy_target(url: str) -> None:
    """Refuse a manifest copy path that holds a file no write made there: not a manifest
    (a user's file), or a version's own manifest in its folder (of another shard set:
    that version then read as the new one, its shards failing validate).

    Raises:
        ConfigError: one line naming the file and what it is.
    """
    fs, path = storage.open_url(url)
    if not fs.isfile(path):  # none, or a folder or a FIFO: refused where it is written
        return
    found = ""
    try:  # parsed only: the version it names may be gone (pruned), and that is fine
        existing = Manifest.from_json(storage.read_bytes(fs, path), source=url)
    except (TfshardsError, OSError):
        found = "a file that is no manifest"
    else:
        if manifests.in_version_folder(existing, fs, posixpath.dirname(path)):
            found = f"the own manifest of version {existing.fingerprint}, in its folder"
    if found:
        raise ConfigError(
            f"manifest: expected a new file or an earlier copy of a manifest at {url}, "
            f"found {found}: pass another --manifest",
            option="manifest",
        )


def _fail_on_bad_files(done: Sequence[ShardResult]) -> None:
    """Under ``on_error="fail"``: raise for every bad file of every shard, at once.

    Raises:
        InputError: at least one listed file could not become a record.
    """
    failed = [error for result in done for error in result.failed]
    if failed:
        raise bad_files_error(failed)


def _sample_files(tasks: Sequence[ShardTask]) -> list[str]:
    """The first file of the first, middle and last shard: what every worker must see."""
    picked = {0: tasks[0], len(tasks) // 2: tasks[len(tasks) // 2], -1: tasks[-1]}
    out = []
    for task in picked.values():
        batch = next(iter(task.rows.batches()), ())
        if batch:
            out.append(storage.join(task.source, batch[0].path))
    return sorted(set(out))


def _check_shards_present(fs: Any, version_path: str, manifest: Manifest) -> None:
    """Every shard the manifest lists is in place with its size, and so are the record
    index and member list it names (one listing call).

    Raises:
        ShardError: a file went away while this write ran (a concurrent ``prune``
            from another process or host, or a user): no manifest is published.
    """
    found = storage.file_sizes(fs, version_path, nested=True)
    for shard in manifest.shards:
        size = found.get(shard.name)
        if size != shard.bytes:
            what = "missing" if size is None else f"{size} bytes"
            _gone(version_path, shard.name, f"the shard just written ({shard.bytes} bytes)", what)
        companions = ((layout.INDEX, shard.index_sha256), (layout.RECORDS, shard.records_sha256))
        for companion, sha in companions:
            if sha is not None and companion.path(shard.name) not in found:
                what = f"the {companion.folder} file of {shard.name} just written"
                _gone(version_path, companion.path(shard.name), what, "missing")


def _gone(version_path: str, name: str, expected: str, found: str) -> NoReturn:
    raise ShardError(
        f"{storage.join(version_path, name)}: expected {expected}, found it {found}: "
        "something deleted it while this write ran; no manifest was published, run write again",
        shard=name,
    )


def _publish(fs: Any, path: str, manifest: Manifest) -> None:
    try:
        atomicfile.write_atomic(fs, path, [manifest.to_json()])
    except OSError as exc:  # disk full, read-only: one line naming the file
        raise storage.write_error(fs, path, exc) from None
    # A writer killed while it published this file left its temp beside it (a manifest
    # copy's folder is the user's: only this file's temps go).
    atomicfile.remove_stale_temps(fs, posixpath.dirname(path), posixpath.basename(path))


def _write_metadata(fs: Any, version_path: str, manifest: Manifest) -> Manifest:
    """Write the TensorFlow Datasets metadata; the manifest to commit, with their sha256."""
    files = datasetinfo.tfds_files(manifest)
    for name, data in files.items():
        path = storage.join(version_path, name)
        try:  # durable by _sync, before the manifest
            atomicfile.write_atomic(fs, path, [data], sync_dir=False, durable=False)
        except OSError as exc:  # disk full, read-only: one line naming the file
            raise storage.write_error(fs, path, exc) from None
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    return dataclasses.replace(manifest, metadata_files=digests)


def _sync(fs: Any, version_path: str, done: Sequence[ShardResult], manifest: Manifest) -> None:
    """Make what this run wrote durable: each shard written or resumed (a killed run's
    shard may never have been flushed) with its companions, the metadata files and the
    image statistics, then the version's folders (the renames into them). Kept shards
    are links to durable files.

    One pass: a 1% append's files fsynced each as they were written took ~2x its wall.
    """
    files = [path for r in done for path in written_files(version_path, r.info)]
    files.extend(storage.join(version_path, name) for name in manifest.metadata_files)
    files.append(storage.join(version_path, layout.IMAGESTATS_NAME))
    try:
        atomicfile.sync_files(fs, files)
    except OSError as exc:
        raise storage.write_error(fs, exc.filename or version_path, exc) from None
    folders = [storage.join(version_path, f) for f in sorted(layout.FOLDERS)]
    atomicfile.sync_dirs(fs, [version_path, *folders])


def _merge_schema(
    results: Sequence[ShardResult], tasks: Sequence[ShardTask], kept: Sequence[ShardResult] = ()
) -> tuple[FeatureSpec, ...]:
    """The features of every record: the written shards' (alike), merged with the kept ones'."""
    merged: dict[str, FeatureSpec] = {}
    for spec in (spec for result in kept[:1] for spec in result.schema):
        merged[spec.name] = spec
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
    return next(e.path for rows in task.rows.batches() for e in rows if e.path not in rejected)
