"""What to write and how: the write stage's options, checked when the config is made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tfshards.errors import ConfigError
from tfshards.format.tfrecord import COMPRESSIONS
from tfshards.run import executor as executors
from tfshards.shardset import grouping
from tfshards.shardset.resize import Resize
from tfshards.writing import sharding

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
        seed: seeds the global record shuffle (of groups, then of records
            within each shard, with ``group_by``).
        group_by: a regex over each file's path relative to the root; its first
            capture group (else the whole match) names the file's group, and
            every group's records go to one shard (:func:`sharding.grouped_indices`).
            None or ``"none"``: no groups. A path it does not match is an error.
        compression: ``"none"`` (default: JPEG/PNG payloads do not shrink),
            ``"gzip"`` or ``"zlib"``.
        image_feature: feature name of the raw file bytes.
        transform: ``package.module:function`` applied to each file, or None.
        on_error: ``"fail"`` stops at the first bad file; ``"skip"`` records it
            in the manifest and goes on.
        workers: shards written at once (with processes, this process works too).
        executor: ``auto``, ``process``, ``thread``, ``serial`` or ``dask``.
            ``auto`` means threads when :mod:`tfshards.format.native` is built, there is
            no transform and the source is local (the per-record loop then runs
            in C without the GIL), else processes; threads for ``memory://``.
        dask_address: scheduler address for ``executor="dask"`` (None: a local cluster).
        shared_fs: local paths are on a filesystem every Dask worker mounts at
            the same path (without it, a scheduler address refuses local paths).
        manifest_copy: also save the manifest here (the DVC-tracked copy).
        source_options / out_options: fsspec storage options (credentials stay out of params).
        resize: store every image as ``resize`` x ``resize`` pixels, re-encoded
            (:mod:`tfshards.writing.resize`); None stores the files' bytes as listed.
        resize_format: ``"jpeg"`` or ``"raw"`` (uint8 pixels in a BMP) with ``resize``.
    """

    out: str
    name: str = "data"
    num_shards: int | None = None
    target_shard_bytes: int = sharding.DEFAULT_TARGET_SHARD_BYTES
    seed: int = 0
    group_by: str | None = None
    compression: str = "none"
    image_feature: str = "image"
    transform: str | None = None
    on_error: OnError = "fail"
    workers: int = 1
    executor: str = "auto"
    dask_address: str | None = None
    shared_fs: bool = False
    manifest_copy: str | None = None
    source_options: Mapping[str, Any] = field(default_factory=dict)
    out_options: Mapping[str, Any] = field(default_factory=dict)
    resize: int | None = None
    resize_format: str = "jpeg"

    def __post_init__(self) -> None:
        if self.num_shards is not None and self.num_shards < 1:
            raise ConfigError(
                f"num_shards must be >= 1, got {self.num_shards} (0 on the command line, "
                "or None here, derives it from the target shard size)"
            )
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
        grouping.GroupBy.parse(self.group_by)
        Resize(1 if self.resize is None else self.resize, self.resize_format)  # checks both

    @property
    def run_options(self) -> executors.RunOptions:
        """Where and how wide the shards are written."""
        return executors.RunOptions(self.workers, self.executor, self.dask_address, self.shared_fs)

    @property
    def resized(self) -> Resize | None:
        """How images are resized when written, or None."""
        return None if self.resize is None else Resize(self.resize, self.resize_format)
