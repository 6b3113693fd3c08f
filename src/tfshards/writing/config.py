"""What to write and how: the write stage's options, checked when the config is made."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any, Literal

from tfshards.errors import ConfigError
from tfshards.format.wire import COMPRESSIONS
from tfshards.option import Option, zero_is_none
from tfshards.run.executor import RunOptions
from tfshards.run.options import run_options, with_run_keywords
from tfshards.shardset import buckets, grouping
from tfshards.shardset.buckets import DEFAULT_BUCKETS, MAX_BUCKETS
from tfshards.shardset.resize import Resize
from tfshards.writing import orientation, sharding
from tfshards.writing.labelmap import check_labels, parse_labels

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
        on_error: ``"fail"`` fails the write once every shard is done, naming every
            bad file (a shard stops at 20 of them); ``"skip"`` records each in the
            manifest and goes on.
        run: where and how wide the shards are written. ``run.executor``
            ``auto`` means threads when :mod:`tfshards.format.native` is built, there is
            no transform and the source is local (the per-record loop then runs
            in C without the GIL), else processes; threads for ``memory://``.
            ``workers``, ``executor``, ``dask_address`` and ``shared_fs`` given as
            keywords replace those of ``run``.
        manifest_copy: also save the manifest here (the DVC-tracked copy).
        source_options / out_options: fsspec storage options (credentials stay out of params).
        resize: store every image as ``resize`` x ``resize`` pixels, re-encoded
            (:mod:`tfshards.writing.resize`); None stores the files' bytes as listed.
        resize_format: ``"jpeg"`` or ``"raw"`` (uint8 pixels in a BMP) with ``resize``.
        labels: the pinned label map, label names in id order (a record's label id is
            its label's position here; :mod:`tfshards.writing.labelmap`); None: the
            previous version's map with new labels appended, else the listing's.
        buckets: split buckets (:mod:`tfshards.shardset.buckets`): each record hashes
            into one by its key, each shard holds one bucket, validation takes whole
            buckets. At most ``num_shards`` are used.
        previous: the version this one grows from (:mod:`tfshards.writing.growth`): a
            manifest path or URL, ``"auto"`` (``manifest_copy`` when it exists), or None
            (write from scratch).
        relabel: allow label ids to differ from the previous version's.
        exif: ``ignore`` (the files' bytes), ``warn`` (the same, files with an EXIF
            orientation of 2..8 counted) or ``apply`` (those stored upright;
            :mod:`tfshards.writing.orientation`).
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
    run: RunOptions = field(default_factory=RunOptions)
    manifest_copy: str | None = None
    source_options: Mapping[str, Any] = field(default_factory=dict)
    out_options: Mapping[str, Any] = field(default_factory=dict)
    resize: int | None = None
    resize_format: str = "jpeg"
    labels: tuple[str, ...] | None = None
    buckets: int = DEFAULT_BUCKETS
    previous: str | None = "auto"
    relabel: bool = False
    exif: str = "ignore"
    workers: InitVar[int | None] = None
    executor: InitVar[str | None] = None
    dask_address: InitVar[str | None] = None
    shared_fs: InitVar[bool | None] = None

    def __post_init__(
        self,
        workers: int | None,
        executor: str | None,
        dask_address: str | None,
        shared_fs: bool | None,
    ) -> None:
        run = with_run_keywords(self.run, workers, executor, dask_address, shared_fs)
        object.__setattr__(self, "run", run)
        if self.num_shards is not None and self.num_shards < 1:
            raise ConfigError(
                f"num_shards: expected at least 1, or 0 in params.yaml and on the command "
                f"line (None in Python) to derive it from target_shard_mb, found "
                f"{self.num_shards}"
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
        if any(c in self.name for c in "*?[]"):  # readers find the shards by NAME-* globs
            raise ConfigError(
                f"name must hold no glob character (* ? [ ]): readers find the shards by "
                f"the glob {self.name}-*, which would not match them; got {self.name!r}"
            )
        grouping.GroupBy.parse(self.group_by)
        orientation.check_mode(self.exif)
        Resize(1 if self.resize is None else self.resize, self.resize_format)  # checks both
        if self.labels is not None:
            object.__setattr__(self, "labels", check_labels(self.labels))
        if not buckets.is_count(self.buckets):
            raise ConfigError(
                f"buckets must be an integer in [1, {MAX_BUCKETS}], got {self.buckets!r}"
            )
        if self.previous is not None and (not isinstance(self.previous, str) or not self.previous):
            raise ConfigError(
                f"previous must be 'auto', 'none' or a manifest path, got {self.previous!r}"
            )
        if self.previous is not None and self.previous.lower() in ("none", "null"):
            object.__setattr__(self, "previous", None)

    @property
    def resized(self) -> Resize | None:
        """How images are resized when written, or None."""
        return None if self.resize is None else Resize(self.resize, self.resize_format)


def mib_to_bytes(mib: float) -> int:
    """``--target-shard-mb`` as bytes."""
    if not math.isfinite(mib) or mib <= 0:
        raise ValueError(f"expected a number of MiB above 0, got {float(mib)}")
    return int(mib * (1 << 20))


# The write stage's options, in the order of `tfshards write --help`. Every `param`
# reaches the command through DVC's unpacking of the whole `write` section.
OPTIONS = (
    Option(
        "listing", str, None, "Listing directory written by `tfshards list`.",
        argument=True, field=None,
    ),
    Option(
        "out", str, "data/shards", "Where version directories go: a local path or any fsspec URL.",
        param=True, comment="version directories go here (local path or fsspec URL)",
    ),
    Option(
        "manifest", str | None, "data/manifest.json",
        "Also save the manifest here (a local path; the DVC-tracked copy).",
        field="manifest_copy",
    ),
    Option(
        "name", str, "data", "Shard file prefix: NAME-00003-of-00016.tfrecord.",
        param=True, comment="shard prefix: NAME-00003-of-00016.tfrecord",
    ),
    Option(
        "num_shards", int, 0, "Number of shards; 0 derives it from --target-shard-mb (>= 16).",
        param=True, comment="0 = from target_shard_mb (at least 16)", convert=zero_is_none,
    ),
    Option(
        "target_shard_mb", float, sharding.DEFAULT_TARGET_SHARD_BYTES >> 20,
        "Shard size aimed at when --num-shards is 0, in MiB.",
        param=True, field="target_shard_bytes", convert=mib_to_bytes,
    ),
    Option(
        "seed", int, 0, "Seed of the global record shuffle.",
        param=True, comment="global record shuffle",
    ),
    Option(
        "group_by", str, "none",
        "Keep each group's records in one shard: a regex over the path relative to "
        "the root; its first (...) group, else the whole match, names the group. "
        "Example: '^([^/]+/[^_]+)_' groups cat/s01_0.jpg with cat/s01_1.jpg. "
        "A path it does not match is an error. none: no groups.",
        param=True,
        comment="none | a regex over the path: its first (...) group's records share a shard",
    ),
    Option(
        "compression", str, "none",
        "none | gzip | zlib. JPEG/PNG do not shrink; gzip is 10-30x slower.",
        param=True, comment="none | gzip | zlib",
    ),
    Option("image_feature", str, "image", "Feature name of the raw file bytes."),
    Option(
        "transform", str | None, None,
        "package.module:function(path, data, label) -> dict of features.",
    ),
    Option(
        "on_error", str, "fail",
        "fail: no version, and one line naming every bad file (the first by path, then "
        "how many more and five of them); skip: leave them out, listed in the manifest.",
        param=True, comment="fail | skip (skipped files are listed in the manifest)",
    ),
    Option(
        "labels", str | None, None,
        "Pinned label map: the label names in id order, comma-separated (cat,dog,bird); "
        "a label's id is its position. A listed label missing from it stops the write: "
        "append new labels, never reorder. none: ids follow the sorted label names.",
        param=True, convert=parse_labels,
        comment="none | label names in id order, comma-separated: append new ones, never reorder",
    ),
    Option(
        "relabel", bool, False,
        "Allow label ids that differ from the previous version's (a renamed or "
        "reordered label map). Without it such a write stops: a model trained on the "
        "old ids would read the new ones wrong.",
        param=True,
        comment="true: allow label ids to differ from the previous version's (then set back)",
    ),
    Option(
        "buckets", int, DEFAULT_BUCKETS,
        "Split buckets: each record hashes into one by its path (or group), each shard "
        "holds one bucket, and validation takes whole buckets, so a record keeps its side "
        "in every later version. Validation fractions come in steps of 1/BUCKETS. A first "
        "version uses at most --num-shards of them; later versions keep its count (fewer "
        "is refused: records would cross the split; more needs --previous none).",
        param=True,
        comment="records hash into this many buckets; validation takes whole buckets",
    ),
    Option(
        "previous", str | None, "auto",
        "The version this one grows from: its shards whose records are all unchanged are "
        "reused as they are (hard links on local disk, server-side copies on object "
        "stores), the rest written anew. auto: the manifest at --manifest, when there is "
        "one; none: write every shard anew (label ids are still kept); or a manifest path "
        "or URL.",
        param=True,
        comment="auto: grow from the last version (--manifest) | none: write every shard anew",
    ),
    Option(
        "resize", int, 0,
        "Store every image resized to RESIZE x RESIZE pixels (stretched, as the "
        "loader resizes), re-encoded once here instead of resized every epoch; "
        "0 stores the files as listed.",
        param=True, convert=zero_is_none,
        comment="store images as RESIZE x RESIZE pixels (e.g. train.image_size); 0 = as listed",
    ),
    Option(
        "resize_format", str, "jpeg",
        "With --resize: jpeg (quality 90) or raw (uint8 pixels in a BMP: 147 KB "
        "per 224 px RGB image, nothing to decode; 16x the bench's resized JPEGs).",
        param=True,
        comment="jpeg (quality 90) | raw (uint8 pixels in a BMP: no decode, 16x larger)",
    ),
    Option(
        "exif", str, "ignore",
        "ignore | warn | apply: the EXIF orientation tag (TensorFlow's decoders ignore it). "
        "ignore: store the files' bytes; warn: the same, and count the files tagged 2-8 "
        "(turned or mirrored); apply: store those upright (re-encoded: a JPEG with its own "
        "quantization tables, a PNG losslessly), every other file byte for byte.",
        param=True, comment="ignore | warn (count tagged files) | apply (store them upright)",
    ),
    Option(
        # Older params.yaml files hold write.near_duplicates: DVC passes it when true.
        "near_duplicates", bool, False, "Moved: validate.near_duplicates.", field=None,
        hidden=True,
    ),
    Option(
        "old_versions", str, "keep",
        "keep | remove. remove: once this version's manifest is out, delete the other "
        "finished versions under OUT that nothing is writing (as `tfshards prune --delete "
        "--min-age-minutes 0` does), so OUT holds exactly this version: a DVC out of it then "
        "hashes the same on every clone, and DVC's cache keeps the others; a version that "
        "cache does not hold (written outside `dvc repro`) is kept, with a warning. Refused "
        "where OUT is not local disk: nothing would keep them. Folders tfshards did not "
        "write are never touched.",
        param=True, field=None,
        comment="keep | remove: the other versions under out (a local DVC out: remove)",
    ),
    *run_options(
        "auto | process | thread | serial | dask. auto: threads when the per-record "
        "loop runs in the compiled tfshards.format._native (no transform, no resize, local "
        "files), threads for memory://, else processes."
    ),
)  # fmt: skip
