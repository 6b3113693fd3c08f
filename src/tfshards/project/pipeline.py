"""The tfshards DVC stages (list -> write -> validate -> train) and their params sections.

The one definition of the pipeline: ``tfshards init`` writes it into a user's
repository, and this repository's own ``dvc.yaml`` is the same stages run
through ``python stages/*.py`` with the library's source files as extra
``deps`` (a test keeps the two in agreement). Pure data, no I/O.

Two variants, chosen by where the shards go:

- local (``data/shards``): the shard folder is a persisted, cached out, so a
  re-run after a crash resumes from finished shards and a tampered shard
  re-runs ``validate``.
- remote (``s3://``, ``gs://``, any fsspec URL): DVC tracks only the manifest
  and the metrics. DVC 3 refuses cached outs on ``s3://``; a ``cache: false``
  remote out makes DVC delete the whole prefix before each run unless it is
  persisted, and a persisted one leaves ``dvc.lock`` stale. The version
  directory is named by the write's inputs, so the manifest names the shards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec.utils

from tfshards.errors import ConfigError
from tfshards.listing.listing import DEFAULT_EXTENSIONS
from tfshards.training.trainconfig import TrainConfig

STAGES = ("list", "write", "validate", "train")
LISTING = "data/listing"
LIST_METRICS = "results/list/metrics.json"
MANIFEST = "data/manifest.json"
VALIDATE_METRICS = "results/validate/metrics.json"
BALANCE = "results/validate/balance"  # train.json, val.json: records per label of each side
# A bar per label, one plot per side of the split (`dvc plots show`).
BALANCE_PLOT = {"cache": False, "template": "bar_horizontal", "x": "count", "y": "label"}
TRAIN_METRICS = "results/train/metrics.json"
LIVE_DIR = "results/train/live"
MODEL = "models/model.keras"
SPLIT = "results/train/split.json"
EXPORT = "models/export"
CHECKPOINTS = "checkpoints/train"  # not an out: DVC deletes outs before a stage runs
PLOTS = {
    f"{LIVE_DIR}/plots/metrics": {"x": "step"},
    f"{LIVE_DIR}/plots/sklearn/confusion_matrix.json": {
        "template": "confusion",
        "x": "actual",
        "y": "predicted",
    },
    f"{LIVE_DIR}/plots/custom/val_class_accuracy.json": {
        "template": "bar_horizontal",
        "x": "accuracy",
        "y": "label",
    },
}

# TrainConfig fields that are output paths fixed by the pipeline, not params.
TRAIN_PATHS = {
    "manifest": MANIFEST,
    "metrics": TRAIN_METRICS,
    "live_dir": LIVE_DIR,
    "model_out": MODEL,
    "split_out": SPLIT,
    "export_out": EXPORT,
    "checkpoint_dir": CHECKPOINTS,
}

# PipelineSpec field -> the param that holds it (init reads them back on a re-run).
SPEC_PARAMS = {
    "root": ("list", "root"),
    "extensions": ("list", "extensions"),
    "shards": ("write", "out"),
    "name": ("write", "name"),
    "image_size": ("train", "image_size"),
}

# Comments written beside each param (params.yaml is the file users edit).
PARAM_COMMENTS = {
    "list": {
        "root": "local path or any fsspec URL (s3://bucket/prefix, gs://...)",
        "extensions": "comma-separated; files with other extensions are counted and skipped",
    },
    "validate": {
        "fail_on_leakage": "true: a payload in both training and validation records fails",
        "fail_on_label_conflict": "true: the same payload under two labels fails (false: counted)",
    },
    "write": {
        "out": "version directories go here (local path or fsspec URL)",
        "name": "shard prefix: NAME-00003-of-00016.tfrecord",
        "num_shards": "0 = from target_shard_mb (at least 16)",
        "seed": "global record shuffle",
        "group_by": "none | a regex over the path: its first (...) group's records share a shard",
        "compression": "none | gzip | zlib",
        "on_error": "fail | skip (skipped files are listed in the manifest)",
        "resize": "store images as RESIZE x RESIZE pixels (e.g. train.image_size); 0 = as listed",
        "resize_format": "jpeg (quality 90) | raw (uint8 pixels in a BMP: no decode, 16x larger)",
    },
    "train": {
        "model": "small_cnn | mobilenet_v3_small (needs image_size >= 32)",
        "image_size": "images are resized to this square size, in pixels",
        "val_fraction": "held out as whole shards (the effective fraction is logged)",
        "model_args": "keyword arguments for a package.module:function model",
        "batch_size": "global: split evenly over the replicas under strategy mirrored",
        "learning_rate": "the peak rate under a schedule",
        "optimizer": "adam | sgd | adamw",
        "momentum": "sgd only",
        "weight_decay": "adamw only (decoupled weight decay)",
        "lr_schedule": "constant | cosine (half cosine to 0 at the last step)",
        "warmup_epochs": "linear warm-up from 0 over this many epochs (cosine only)",
        "early_stopping": "stop after this many epochs without a better metric; 0 = off",
        "early_stopping_metric": "val_loss | val_accuracy",
        "label_smoothing": "share of each target spread over all classes, in [0, 1)",
        "class_weight": "none | balanced (from the training shards' label counts)",
        "augment": "none | flip | crop | flip,crop (on the device, training only)",
        "image_dtype": "float32 | uint8 (a quarter of the bytes; scaled in the model)",
        "scaled_decode": "decode large JPEGs at 1/2..1/8 scale, then resize (false: whole)",
        "seed": "seeds training: weights, dropout, input order",
        "split_seed": "picks the validation shards; null = the same as seed",
        "deterministic": "op determinism: the same seed gives the same run",
        "mixed_precision": "auto (on when a GPU is present) | on | off",
        "jit_compile": "XLA",
        "strategy": "one | mirrored (a replica per local GPU) | auto (mirrored with 2+ GPUs)",
    },
}


@dataclass(frozen=True)
class PipelineSpec:
    """What ``tfshards init`` asks: where the data is and the first params.

    Attributes:
        root: raw files in ImageFolder layout (``ROOT/<label>/...``), a path or URL.
        shards: where version directories go; a URL other than ``file://``
            gives the remote variant.
        name: shard file prefix.
        image_size: height = width images are resized to for training, in pixels.
        extensions: comma-separated suffixes the listing keeps.
    """

    root: str = "data/raw"
    shards: str = "data/shards"
    name: str = "data"
    image_size: int = 64
    extensions: str = ",".join(DEFAULT_EXTENSIONS)

    def __post_init__(self) -> None:
        for field in ("root", "shards", "name", "extensions"):
            if not str(getattr(self, field)).strip():
                raise ConfigError(f"{field} must not be empty", option=field)
        if any(c in self.name for c in "/ ${}"):
            raise ConfigError(f"name must be a plain file prefix, got {self.name!r}", option="name")
        TrainConfig(image_size=self.image_size)  # the default model accepts this size

    @property
    def remote(self) -> bool:
        """True when the shards go to a non-local fsspec URL (the remote variant)."""
        return is_remote(self.shards)


def is_remote(url: str) -> bool:
    """True for a URL whose protocol is not local disk (``s3://``, ``gs://``, ``memory://``)."""
    return fsspec.utils.get_protocol(url) not in ("file", "local")


def params(spec: PipelineSpec) -> dict[str, dict[str, Any]]:
    """The params.yaml sections the stages read, with ``spec``'s values and defaults."""
    train = TrainConfig(image_size=spec.image_size)
    return {
        "list": {"root": spec.root, "extensions": spec.extensions},
        "write": {
            "out": spec.shards,
            "name": spec.name,
            "num_shards": 0,
            "target_shard_mb": 128,
            "seed": 0,
            "group_by": "none",
            "compression": "none",
            "on_error": "fail",
            "resize": 0,
            "resize_format": "jpeg",
        },
        "validate": {"fail_on_leakage": False, "fail_on_label_conflict": True},
        "train": {
            f.name: _param(getattr(train, f.name))
            for f in dataclasses.fields(TrainConfig)
            if f.name not in TRAIN_PATHS
        },
    }


def stages(*, remote: bool, program: Callable[[str], str]) -> dict[str, dict[str, Any]]:
    """The four stages as DVC declares them, in pipeline order.

    Args:
        remote: the remote variant (only the manifest and metrics are outs).
        program: the command prefix that runs a stage, given its name, e.g.
            ``lambda s: f"tfshards {s}"``.
    """
    shard_outs: list[Any] = [] if remote else [{"${write.out}": {"persist": True}}]
    shard_deps = [] if remote else ["${write.out}"]
    return {
        "list": {
            "cmd": f"{program('list')} ${{list.root}} --out {LISTING} "
            f"--extensions ${{list.extensions}} --metrics {LIST_METRICS}",
            "deps": ["${list.root}"],
            "params": ["list"],
            "outs": [LISTING],
            "metrics": [{LIST_METRICS: {"cache": False}}],
        },
        "write": {
            # DVC unpacks the section into `--key value` words, each string through
            # shlex.quote: a group_by regex reaches the command as written, whatever
            # quotes or `$(...)` it holds (`'${write.group_by}'` let a quote end it).
            # The command reads `--num_shards` as `--num-shards` (cli.write.CONTEXT).
            "cmd": f"{program('write')} {LISTING} --manifest {MANIFEST} ${{write}}",
            "deps": [LISTING],
            "params": ["write"],
            "outs": [MANIFEST, *shard_outs],
        },
        "validate": {
            # The split params are train's: the same shards are held out here and there.
            "cmd": f"{program('validate')} {MANIFEST} --metrics {VALIDATE_METRICS} "
            f"--balance {BALANCE} --val-fraction ${{train.val_fraction}} "
            "--seed ${train.seed} --split-seed ${train.split_seed} "
            "--fail-on-leakage ${validate.fail_on_leakage} "
            "--fail-on-label-conflict ${validate.fail_on_label_conflict}",
            "deps": [MANIFEST, *shard_deps],
            "params": ["validate", "train.val_fraction", "train.seed", "train.split_seed"],
            "metrics": [{VALIDATE_METRICS: {"cache": False}}],
            "plots": [
                {f"{BALANCE}/train.json": dict(BALANCE_PLOT)},
                {f"{BALANCE}/val.json": dict(BALANCE_PLOT)},
            ],
        },
        "train": {
            "cmd": " ".join([program("train"), *_train_options()]),
            "deps": [MANIFEST, *shard_deps, VALIDATE_METRICS],
            "params": ["train"],
            "outs": [
                MODEL,
                EXPORT,
                {SPLIT: {"cache": False}},
                # dvclive's folder as a whole: under `dvc exp run` dvclive would
                # git-add any file in it that is not a DVC out. Persisted so a
                # resumed run continues its step count.
                {LIVE_DIR: {"cache": False, "persist": True}},
            ],
            "metrics": [{TRAIN_METRICS: {"cache": False}}],
        },
    }


def _train_options() -> list[str]:
    """``--field value`` for every TrainConfig field: fixed paths, else the param."""
    options = []
    for f in dataclasses.fields(TrainConfig):
        if f.name == "model_args":
            continue  # a mapping: DVC unpacks it into `--key value` words, after `--`
        value = TRAIN_PATHS.get(f.name, f"${{train.{f.name}}}")
        options.append(f"--{f.name.replace('_', '-')} {value}")
    return [*options, "-- ${train.model_args}"]


def _param(value: Any) -> Any:
    """A TrainConfig default as params.yaml holds it (augment: ``none`` or ``flip,crop``)."""
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return dict(value) if isinstance(value, dict) else value
