"""Write a listing into versioned, byte-deterministic TFRecord shards, in parallel.

The plan (record order, shard contents, names) is a pure function of the
listing and the parameters, so any number of workers on any executor writes
the same bytes. Each shard is one task (:func:`write_shard`) on plain values.
A shard is published atomically, then recorded in a ``<shard>.done`` sidecar;
a re-run after a crash re-hashes finished shards against their sidecars, keeps
the good ones and writes the rest. ``manifest.json``, written last, commits
the set.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tfshards import executor as executors
from tfshards import sharding, storage
from tfshards import transform as transforms
from tfshards.errors import ConfigError, InputError, TransformError
from tfshards.example import encode
from tfshards.listing import Listing, listing_digest, read_listing
from tfshards.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    SIDECAR_SUFFIX,
    Manifest,
    Reject,
    ShardInfo,
    sidecar_from_json,
    sidecar_json,
)
from tfshards.progress import Progress
from tfshards.schema import Dtype, FeatureSpec, Values, merge_specs, normalize
from tfshards.tfrecord import COMPRESSIONS, Compressor, frame

FLUSH_BYTES = 4 << 20  # hand chunks to the OS in ~4 MB writev calls
BASE_FEATURES = ("label", "path", "sha256")
OnError = Literal["fail", "skip"]


@dataclass(frozen=True)
class WriteConfig:
    """What to write and how; validated on construction.

    Attributes:
        out: where version directories go (local path or fsspec URL).
        name: shard file prefix.
        num_shards: shard count; None derives it from ``target_shard_bytes``.
        target_shard_bytes: size aimed at when ``num_shards`` is None.
        seed: seeds the global record shuffle.
        compression: ``"none"`` (default: JPEG/PNG payloads do not shrink),
            ``"gzip"`` or ``"zlib"``.
        image_feature: feature name of the raw file bytes.
        transform: ``package.module:function`` applied to each file, or None.
        on_error: ``"fail"`` stops at the first bad file; ``"skip"`` records it
            in the manifest and goes on.
        workers: parallel tasks.
        executor: ``auto``, ``process``, ``thread``, ``serial`` or ``dask``.
        dask_address: scheduler address for ``executor="dask"`` (None: a local cluster).
        manifest_copy: also save the manifest here (the DVC-tracked copy).
        source_options / out_options: fsspec storage options (credentials stay out of params).
    """

    out: str
    name: str = "data"
    num_shards: int | None = None
    target_shard_bytes: int = sharding.DEFAULT_TARGET_SHARD_BYTES
    seed: int = 0
    compression: str = "none"
    image_feature: str = "image"
    transform: str | None = None
    on_error: OnError = "fail"
    workers: int = 1
    executor: str = "auto"
    dask_address: str | None = None
    manifest_copy: str | None = None
    source_options: Mapping[str, Any] = field(default_factory=dict)
    out_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_shards is not None and self.num_shards < 1:
            raise ConfigError(f"num_shards must be >= 1, got {self.num_shards}")
        if self.target_shard_bytes < 1:
            raise ConfigError(f"target_shard_bytes must be >= 1, got {self.target_shard_bytes}")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression must be one of {COMPRESSIONS}, got {self.compression!r}"
            )
        if self.on_error not in ("fail", "skip"):
            raise ConfigError(f"on_error must be 'fail' or 'skip', got {self.on_error!r}")
        if self.image_feature in BASE_FEATURES or not self.image_feature:
            raise ConfigError(
                f"image_feature must be a name other than {BASE_FEATURES}, "
                f"got {self.image_feature!r}"
            )
        if not self.name or "/" in self.name:
            raise ConfigError(f"name must be a non-empty file prefix, got {self.name!r}")
        executors.check_options(self.executor, self.workers)


@dataclass(frozen=True)
class ShardTask:
    """One shard's work, as plain picklable values (any executor can run it)."""

    name: str
    source: str
    out: str
    entries: tuple[tuple[str, int, int], ...]  # (relative path, label index, listed size)
    image_feature: str
    transform: str | None
    compression: str
    on_error: str
    source_options: Mapping[str, Any]
    out_options: Mapping[str, Any]


@dataclass(frozen=True)
class ShardResult:
    info: ShardInfo
    rejected: tuple[Reject, ...]
    schema: tuple[FeatureSpec, ...]
    reused: bool


@dataclass(frozen=True)
class WriteResult:
    manifest: Manifest
    reused: int
    seconds: float


# ----------------------------------------------------------------------------- worker


def write_shard(task: ShardTask) -> ShardResult:
    """Write one shard (or keep it, if a finished and verified copy exists)."""
    fs_out, out_dir = storage.open_url(task.out, **task.out_options)
    shard_path = storage.join(out_dir, task.name)
    kept = _reuse(fs_out, shard_path)
    if kept is not None:
        return kept
    fs_in, root = storage.open_url(task.source, **task.source_options)
    fn = transforms.load(task.transform) if task.transform else None
    specs = {
        task.image_feature: FeatureSpec(task.image_feature, "bytes", ()),
        "label": FeatureSpec("label", "int64", ()),
        "path": FeatureSpec("path", "bytes", ()),
        "sha256": FeatureSpec("sha256", "bytes", ()),
    }
    rejected: list[Reject] = []
    hasher = hashlib.sha256()
    compressor = Compressor(task.compression)
    sink = storage.AtomicSink(fs_out, shard_path)
    records = 0
    try:
        pending: list[bytes | memoryview] = []
        pending_bytes = 0
        for rel, label, listed_size in task.entries:
            try:
                features = _features(fs_in, root, rel, label, listed_size, task, fn, specs)
            except (OSError, InputError) as exc:
                if task.on_error == "fail" or getattr(exc, "fatal", False):
                    raise _as_input_error(exc, task.source, rel) from exc
                rejected.append(Reject(rel, _reason(exc)))
                continue
            pieces, _ = encode(features)
            for chunk in compressor.feed(frame(pieces)):
                hasher.update(chunk)
                pending.append(chunk)
                pending_bytes += len(chunk)
            records += 1
            if pending_bytes >= FLUSH_BYTES:
                sink.write(pending)
                pending, pending_bytes = [], 0
        for chunk in compressor.finish():
            hasher.update(chunk)
            pending.append(chunk)
        sink.write(pending)
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    info = ShardInfo(task.name, records, sink.size, hasher.hexdigest())
    schema = tuple(specs[k] for k in sorted(specs))
    storage.write_atomic(
        fs_out, shard_path + SIDECAR_SUFFIX, [sidecar_json(info, rejected, schema)]
    )
    return ShardResult(info, tuple(rejected), schema, reused=False)


def _features(
    fs: Any,
    root: str,
    rel: str,
    label: int,
    listed_size: int,
    task: ShardTask,
    fn: transforms.Transform | None,
    specs: dict[str, FeatureSpec],
) -> dict[str, tuple[Dtype, Values]]:
    data = storage.read_bytes(fs, storage.join(root, rel))
    if not data:
        raise InputError("empty file: expected at least 1 byte, found 0", path=rel)
    if len(data) != listed_size:
        raise InputError(
            f"file changed since it was listed: expected {listed_size} bytes, found {len(data)}",
            path=rel,
        )
    features: dict[str, tuple[Dtype, Values]] = {
        task.image_feature: ("bytes", [data]),
        "label": ("int64", [label]),
        "path": ("bytes", [rel.encode()]),
        "sha256": ("bytes", [hashlib.sha256(data).hexdigest().encode()]),
    }
    if fn is not None and task.transform is not None:
        for key, value in transforms.apply(fn, task.transform, rel, data, label).items():
            dtype, values, shape = normalize(key, value)
            seen = FeatureSpec(key, dtype, shape)
            try:
                specs[key] = merge_specs(specs[key], seen) if key in specs else seen
            except TransformError as exc:
                raise TransformError(f"{rel}: {exc}", path=rel, fatal=True) from exc
            features[key] = (dtype, values)
    return features


def _as_input_error(exc: Exception, source: str, rel: str) -> InputError:
    """Re-raise a per-file problem with the file's full location in front."""
    where = storage.join(source, rel)
    if isinstance(exc, InputError):
        return type(exc)(f"{where}: {_reason(exc)}", **{**_attrs(exc), "path": rel})
    return InputError(f"{where}: cannot read: {_reason(exc)}", path=rel)


def _attrs(exc: Exception) -> dict[str, Any]:
    return {k: v for k, v in vars(exc).items() if k not in ("message", "path")}


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__}"
    text = str(exc)
    path = getattr(exc, "path", None)
    prefix = f"{path}: "
    return text[len(prefix) :] if path and text.startswith(prefix) else text


def _reuse(fs: Any, shard_path: str) -> ShardResult | None:
    """A finished shard whose bytes still match its sidecar, or None."""
    try:
        info, rejected, schema = sidecar_from_json(
            storage.read_bytes(fs, shard_path + SIDECAR_SUFFIX)
        )
        data = storage.read_bytes(fs, shard_path)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(data) != info.bytes or hashlib.sha256(data).hexdigest() != info.sha256:
        return None
    return ShardResult(info, rejected, schema, reused=True)


# ----------------------------------------------------------------------------- plan & run


def fingerprint(listing: Listing, params: Mapping[str, Any]) -> str:
    """Name of the version directory: a hash of the listing and the byte-shaping params."""
    doc = {
        "files_sha256": listing_digest(listing),
        "format": FORMAT_VERSION,
        "labels": list(listing.labels),
        "params": dict(params),
        "source": listing.root,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def plan(listing: Listing, config: WriteConfig) -> tuple[str, dict[str, Any], list[ShardTask]]:
    """The version directory URL, manifest params and shard tasks (pure, no I/O)."""
    entries = listing.entries
    if not entries:
        raise InputError(f"{listing.root}: the listing has no files", path=listing.root)
    total_bytes = sum(e.size for e in entries)
    num_shards = config.num_shards or sharding.auto_num_shards(
        len(entries), total_bytes, config.target_shard_bytes
    )
    if num_shards > len(entries):
        raise ConfigError(
            f"num_shards: expected at most one shard per record ({len(entries)}), got {num_shards}"
        )
    params: dict[str, Any] = {
        "compression": config.compression,
        "image_feature": config.image_feature,
        "name": config.name,
        "num_shards": num_shards,
        "seed": config.seed,
        "transform": transforms.identity(config.transform),
    }
    version = storage.join(config.out, fingerprint(listing, params))
    order = sharding.shuffled_order(len(entries), config.seed)
    bounds = sharding.shard_boundaries(len(entries), num_shards)
    tasks = []
    for i in range(num_shards):
        picked = (entries[j] for j in order[bounds[i] : bounds[i + 1]])
        tasks.append(
            ShardTask(
                name=sharding.shard_name(config.name, i, num_shards),
                source=listing.root,
                out=version,
                entries=tuple((e.path, e.label, e.size) for e in picked),
                image_feature=config.image_feature,
                transform=config.transform,
                compression=config.compression,
                on_error=config.on_error,
                source_options=dict(config.source_options),
                out_options=dict(config.out_options),
            )
        )
    params["on_error"] = config.on_error
    return version, params, tasks


def write(config: WriteConfig, listing: Listing | str, *, progress: bool = True) -> WriteResult:
    """Write ``listing`` (a :class:`Listing` or its directory) as a shard set.

    Returns the committed manifest. Raises :class:`InputError` for a bad input
    (with ``on_error="fail"``), and never leaves a manifest for a partial set.
    """
    start = time.monotonic()
    if isinstance(listing, str):
        listing = read_listing(listing)
    version, params, tasks = plan(listing, config)
    fs_in, _ = storage.open_url(listing.root, **config.source_options)
    fs_out, version_path = storage.open_url(version, **config.out_options)
    kind = executors.resolve(
        config.executor, config.workers, [storage.protocol(fs_in), storage.protocol(fs_out)]
    )
    results: list[ShardResult | None] = [None] * len(tasks)
    with Progress("write", total=len(listing.entries), enabled=progress) as bar:
        for i, result in executors.run(
            write_shard,
            tasks,
            executor=kind,
            workers=config.workers,
            dask_address=config.dask_address,
            describe=lambda t: t.name,
        ):
            results[i] = result
            bar.update(result.info.records + len(result.rejected), result.info.bytes)
    done = [r for r in results if r is not None]
    manifest = Manifest(
        root=version,
        fingerprint=version.rstrip("/").rsplit("/", 1)[-1],
        params=params,
        schema=_merge_schema(done),
        labels=listing.labels,
        compression=config.compression,
        shards=tuple(r.info for r in done),
        rejected=tuple(rej for r in done for rej in r.rejected),
        listed=len(listing.entries),
    )
    storage.write_atomic(fs_out, storage.join(version_path, MANIFEST_NAME), [manifest.to_json()])
    if config.manifest_copy:
        fs_copy, copy_path = storage.open_url(config.manifest_copy)
        storage.write_atomic(fs_copy, copy_path, [manifest.to_json()])
    storage.remove_stale_temps(fs_out, version_path)
    return WriteResult(manifest, sum(r.reused for r in done), time.monotonic() - start)


def _merge_schema(results: Sequence[ShardResult]) -> tuple[FeatureSpec, ...]:
    merged: dict[str, FeatureSpec] = {}
    for result in results:
        if result.info.records == 0:
            continue
        for spec in result.schema:
            merged[spec.name] = (
                merge_specs(merged[spec.name], spec) if spec.name in merged else spec
            )
    return tuple(merged[k] for k in sorted(merged))
