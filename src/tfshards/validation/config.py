"""What to check and how: the validate stage's options, checked when the config is made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any

from tfshards.errors import ConfigError
from tfshards.option import Option
from tfshards.run.executor import RunOptions
from tfshards.run.options import run_options, with_run_keywords
from tfshards.validation.imagelimits import ImageGates, parse_formats

# Bits of 64. On the synthetic set of tests/validation/test_nearduplicates.py (JPEG
# re-encodes at quality 50-95, resizes 0.5-2x, crops up to 5%) 8 bits found 96.9% of the
# copies (every re-encode, 297 of 300 resizes, 275 of 300 crops) and 3 of 471,600 other pairs.
DEFAULT_DISTANCE = 8
MAX_DISTANCE = 31  # bits of 64: unrelated images differ in ~32
MAX_PROBLEMS = 50  # kept per shard, and printed: enough to see a pattern, few enough to read


@dataclass(frozen=True)
class ValidateConfig:
    """What to check and how; validated on construction.

    Attributes:
        manifest: URL of the ``manifest.json`` to check (its ``root`` locates the shards).
        decode_images: also decode every image payload with TensorFlow's ``decode_image``
            (slow: ~0.5 ms each, and TensorFlow's import in each process).
        run: where and how wide the shards are checked. ``run.executor`` ``auto``
            means processes (the records a rule's bulk check cannot clear go
            through it in Python, holding the GIL: on 20,000 4 KB records, 2
            threads took 0.40 s and 2 processes 0.22 s, before the bulk checks);
            threads for ``memory://``. ``workers``,
            ``executor``, ``dask_address`` and ``shared_fs`` given as keywords
            replace those of ``run``.
        max_problems: problems kept per shard (all are counted).
        storage_options: fsspec options for the manifest and the shards.
        val_fraction: the training split's ``val_fraction`` (0: no split); with
            ``split_seed`` it picks the validation shards as
            :func:`tfshards.shardset.split.split` does, for the per-split counts and
            duplicates across the split.
        split_seed: the training split's seed.
        fail_on_leakage: a payload in both training and validation records is a problem.
        fail_on_label_conflict: a payload whose records carry different labels
            (the same image labelled twice) is a problem; False only counts them.
        image_gates: the rules over the image statistics the writer stored
            (:mod:`tfshards.validation.imagegates`).
        near_duplicates: hash every image (:mod:`tfshards.format.phash`; each shard's
            rows are kept in the user's cache, :mod:`tfshards.validation.phashcache`)
            and count near-duplicate pairs across the split.
        near_duplicate_distance: two images whose perceptual hashes differ in at most
            this many of 64 bits are near duplicates
            (:mod:`tfshards.validation.nearduplicates`).
        fail_on_near_duplicates: a near-duplicate pair across the split is a problem
            (turns ``near_duplicates`` on).
    """

    manifest: str
    decode_images: bool = False
    run: RunOptions = field(default_factory=RunOptions)
    max_problems: int = MAX_PROBLEMS
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    val_fraction: float = 0.0
    split_seed: int = 0
    fail_on_leakage: bool = False
    fail_on_label_conflict: bool = True
    image_gates: ImageGates = field(default_factory=ImageGates)
    near_duplicates: bool = False
    near_duplicate_distance: int = DEFAULT_DISTANCE
    fail_on_near_duplicates: bool = False
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
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.fail_on_near_duplicates:  # failing on pairs needs them counted
            object.__setattr__(self, "near_duplicates", True)
        if not 0 <= self.near_duplicate_distance <= MAX_DISTANCE:
            raise ConfigError(
                f"near_duplicate_distance must be in 0..{MAX_DISTANCE} bits, "
                f"got {self.near_duplicate_distance}"
            )
        if self.max_problems < 1:
            raise ConfigError(f"max_problems must be >= 1, got {self.max_problems}")


# The validate stage's options, in the order of its DVC command, then `--help`'s.
# The split params are train's: the same shards are held out here and there.
OPTIONS = (
    Option(
        "manifest", str, None, "manifest.json written by `tfshards write` (path or fsspec URL).",
        argument=True,
    ),
    Option(
        "metrics", str | None, None,
        "Where to write the metrics JSON (DVC metrics; no timings); the pipeline passes "
        "results/validate/metrics.json. Not given: no file, so a check by hand leaves the "
        "pipeline's metrics alone.", field=None,
    ),
    Option(
        "balance", str | None, None,
        "Folder for train.json and val.json, records per label of each side (a DVC bar plot).",
        field=None,
    ),
    Option(
        "val_fraction", float, 0.0,
        "The training split's val_fraction (0: no split): records per label on each "
        "side, and duplicates across it, are reported. The pipeline passes "
        "train.val_fraction (0.2 by default); by hand, give the one you train with.",
        param="train.val_fraction",
    ),
    Option(
        "seed", int, 0, "The training seed, the split's when --split-seed is none.",
        param="train.seed", field=None,
    ),
    Option(
        "split_seed", int | None, None, "The training split's seed; none: --seed.",
        param="train.split_seed", field=None,
    ),
    Option(
        "fail_on_leakage", bool, False,
        "true: a payload held by both a training and a validation record is a problem.",
        param=True, comment="true: a payload in both training and validation records fails",
    ),
    Option(
        "fail_on_label_conflict", bool, True,
        "true: a payload whose records carry different labels (the same image "
        "labelled twice) is a problem; false only counts them in the metrics.",
        param=True, comment="true: the same payload under two labels fails (false: counted)",
    ),
    Option(
        "image_metrics", str | None, None,
        "Where to write each side's image statistics (images, non-RGB share, formats, "
        "median width and height) as DVC metrics.", field=None,
    ),
    Option(
        "image_plots", str | None, None,
        "Folder for train.json and val.json, each side's width histogram (a DVC plot).",
        field=None,
    ),
    Option(
        "max_non_rgb_share", float, 1.0,
        "Fail when a side's share of images with other than 3 channels (grey, RGBA, CMYK, "
        "by their headers) is above this (1: off).",
        param=True, field="image_gates.max_non_rgb_share",
        comment="fail when a side's share of non-RGB images is above (1: off)",
    ),
    Option(
        "allowed_formats", str, "any",
        "Comma-separated image formats (JPEG, PNG, GIF, BMP, WebP); any other fails. any: all.",
        param=True, field="image_gates.allowed_formats", convert=parse_formats,
        comment="any | JPEG,PNG,...: another format fails",
    ),
    Option(
        "fail_on_new_format", bool, False,
        "true: an image format that a side of the previous version (the one this version "
        "was written from) did not hold fails.",
        param=True, field="image_gates.fail_on_new_format",
        comment="true: a format the previous version's side lacked fails",
    ),
    Option(
        "max_median_width_change", float, 0.0,
        "Fail when a side's median image width moved more than this many percent since "
        "the previous version (0: off).",
        param=True, field="image_gates.max_median_width_change",
        comment="percent the median width may move since the previous version (0: off)",
    ),
    Option(
        "near_duplicates", bool, False,
        "true: hash every image (decoded small and grey: ~70 us of CPU a 96 px JPEG, 3x what "
        "writing its record costs) "
        "and count near-duplicate pairs across the split, with examples. Each shard's "
        "hashes are kept in the user's cache ($TFSHARDS_CACHE, else "
        "$XDG_CACHE_HOME/tfshards, else ~/.cache/tfshards; 9 bytes an image) by its sha256, "
        "so a grown version hashes only its new shards.",
        param=True, comment="true: count re-encoded/resized/cropped copies across the split",
    ),
    Option(
        "near_duplicate_distance", int, DEFAULT_DISTANCE,
        "With near_duplicates: two images whose perceptual hashes differ in at most this "
        f"many of 64 bits (0..{MAX_DISTANCE}) are near duplicates (re-encoded, resized, "
        "cropped a little).",
        param=True, comment="bits of 64: closer images are near duplicates",
    ),
    Option(
        "fail_on_near_duplicates", bool, False,
        "true: a near-duplicate pair across the split is a problem (one line per pair); "
        "turns near_duplicates on.",
        param=True, comment="true: a near-duplicate pair across the split fails",
    ),
    Option(
        "decode", bool, False,
        "true: also decode every image with TensorFlow's decode_image, the decoder training "
        "uses, so a damaged file fails here and not in training (slow: ~0.5 ms each, and "
        "~2.5 s of CPU to import TensorFlow in each worker).",
        param=True, field="decode_images",
        comment="true: decode every image as training does (catches damaged files; ~0.5 ms each)",
    ),
    Option(
        "max_problems", int, MAX_PROBLEMS,
        "Problems printed (all are counted, in the metrics too).",
    ),
    *run_options(
        "auto | process | thread | serial | dask. auto: processes (the records a rule's "
        "bulk check cannot clear go through it in Python, which holds the GIL), threads "
        "for memory://."
    ),
)  # fmt: skip
