"""What ``tfshards train`` trains and where its outputs go: one frozen, self-checking config."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfshards.errors import ConfigError
from tfshards.option import Option
from tfshards.training import models, optim, trainmix
from tfshards.training.devices import STRATEGIES

MIXED_PRECISION = ("auto", "on", "off")
STOP_METRICS = ("val_loss", "val_accuracy")
OUTPUTS = ("metrics", "live_dir", "model_out", "split_out", "export_out", "checkpoint_dir")
MAX_EPOCHS = 1_000_000  # 10**20 epochs overflowed the cosine schedule's step count
MAX_IMAGE_SIZE = 4096  # 100,000 px asked a 40-gigafloat dense layer: out of memory


@dataclass(frozen=True)
class TrainConfig:
    """What to train and where its outputs go; validated on construction.

    Attributes:
        manifest: manifest.json of the shard set (path or fsspec URL).
        model: a name in :data:`tfshards.training.models.MODELS`, or ``package.module:function``.
        model_args: keyword arguments for a ``package.module:function`` model.
        epochs: passes over the training shards, >= 1.
        batch_size: records per step, >= 1; global (split over the replicas).
        learning_rate: the optimizer's (peak) step size, > 0.
        optimizer: ``adam``, ``sgd`` (with ``momentum``) or ``adamw`` (``weight_decay``).
        lr_schedule: ``constant`` or ``cosine`` (decays to 0 at the last step).
        warmup_epochs: epochs of linear warm-up from 0 (cosine only).
        early_stopping: stop after this many epochs without a better
            ``early_stopping_metric``; 0 never stops early.
        label_smoothing: share of the target spread over all classes, in [0, 1).
        class_weight: ``none``, or ``balanced``: weights from the training labels' counts.
        augment: on-device training augmentations among ``flip`` and ``crop``.
        image_dtype: ``float32``, or ``uint8``: a quarter of the bytes, scaled in the model.
        image_size: height = width the images are resized to, in pixels.
        scaled_decode: decode a JPEG at least twice ``image_size`` at 1/2, 1/4 or
            1/8 scale before resizing (:func:`tfshards.reading.decode.decode_image`):
            less CPU, slightly different pixels; False decodes whole.
        val_fraction: share of records (whole split buckets of shards) held out, in [0, 1).
        seed: seeds Python, NumPy, TensorFlow and the input order.
        split_seed: picks the validation shards; None: ``seed``.
        mix: ``(manifest, weight)`` of other sets whose training sides are mixed
            in (:mod:`tfshards.training.trainmix`); ``manifest`` gets ``1 - sum``.
        deterministic: same seed, same result: op determinism and a fixed input order.
        mixed_precision: ``"auto"`` (on when a GPU is present), ``"on"`` or ``"off"``.
        jit_compile: compile the train and eval steps with XLA.
        strategy: ``one`` device, ``mirrored`` over all local GPUs, ``auto``, or
            ``multi_worker`` over the workers of ``TF_CONFIG`` (each its own block
            of every epoch; only the chief writes the outputs).
        metrics: summary JSON (the DVC metrics file).
        live_dir: dvclive directory for per-epoch metrics, or None.
        model_out: where the trained model goes (``.keras``), or None.
        split_out: where the split (shards and records per side) goes, or None.
        export_out: local folder for a SavedModel serving image bytes, or None.
        checkpoint_dir: local folder for per-epoch checkpoints, or None for none:
            new, empty or made by tfshards (:mod:`tfshards.training.checkpoint`),
            overlapping no other output; its files are removed when the run finishes.
        checkpoint_every_steps: also checkpoint every N training steps, so a
            killed run resumes mid-epoch at the last such step (the input
            order is seekable); 0: after every epoch only.
    """

    manifest: str = "data/manifest.json"
    model: str = "small_cnn"
    model_args: Mapping[str, Any] = field(default_factory=dict)
    epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    momentum: float = 0.9
    weight_decay: float = 0.004
    lr_schedule: str = "constant"
    warmup_epochs: int = 0
    early_stopping: int = 0
    early_stopping_metric: str = "val_loss"
    label_smoothing: float = 0.0
    class_weight: str = "none"
    augment: tuple[str, ...] = ()
    image_dtype: str = "float32"
    image_size: int = 16
    scaled_decode: bool = True
    val_fraction: float = 0.2
    seed: int = 0
    split_seed: int | None = None
    mix: trainmix.Pairs = ()
    deterministic: bool = True
    mixed_precision: str = "auto"
    jit_compile: bool = False
    strategy: str = "one"
    metrics: str = "results/train/metrics.json"
    live_dir: str | None = "results/train/live"
    model_out: str | None = "models/model.keras"
    split_out: str | None = "results/train/split.json"
    export_out: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0

    def __post_init__(self) -> None:
        for name in OUTPUTS:  # a local file:// URL is its path: the checks, dvclive and Keras
            value = getattr(self, name)  # took "file:///a" for the folder ./file:/a
            if isinstance(value, str) and value.startswith("file://"):
                object.__setattr__(self, name, value[len("file://") :] or "/")
        for name in ("epochs", "batch_size", "image_size"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}", option=name)
        for name in (
            "warmup_epochs",
            "early_stopping",
            "momentum",
            "weight_decay",
            "checkpoint_every_steps",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}", option=name)
        if not 0 < self.learning_rate < math.inf:
            raise ConfigError(f"learning_rate must be finite and > 0, got {self.learning_rate}")
        if not 0.0 <= self.momentum <= 1.0:  # NaN too; Keras takes [0, 1] only
            raise ConfigError(f"momentum must be in [0, 1], got {self.momentum}", option="momentum")
        if not 0.0 <= self.weight_decay < math.inf:
            raise ConfigError(
                f"weight_decay must be finite and >= 0, got {self.weight_decay}",
                option="weight_decay",
            )
        for name in ("seed", "split_seed"):  # NumPy seeds take 32 bits
            value = getattr(self, name)
            if value is not None and not 0 <= value < 2**32:
                raise ConfigError(f"{name} must be in [0, 2**32), got {value}", option=name)
        for name, most in (("epochs", MAX_EPOCHS), ("image_size", MAX_IMAGE_SIZE)):
            if getattr(self, name) > most:
                raise ConfigError(
                    f"{name} must be at most {most}, got {getattr(self, name)}", option=name
                )
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for option, value, valid in (
            ("mixed_precision", self.mixed_precision, MIXED_PRECISION),
            ("strategy", self.strategy, STRATEGIES),
            ("image_dtype", self.image_dtype, ("float32", "uint8")),
            ("early_stopping_metric", self.early_stopping_metric, STOP_METRICS),
            *(("augment", name, models.AUGMENTATIONS) for name in self.augment),
        ):
            if value not in valid:
                raise ConfigError(f"{option} must be one of {valid}, got {value!r}", option=option)
        optim.check(self.optimizer, self.lr_schedule, self.class_weight)
        if self.warmup_epochs and self.lr_schedule != "cosine":
            raise ConfigError("warmup_epochs needs lr_schedule cosine (constant has no warm-up)")
        if self.warmup_epochs >= self.epochs and self.warmup_epochs:
            raise ConfigError(f"warmup_epochs must be < epochs ({self.epochs})")
        if self.early_stopping and not self.val_fraction:
            raise ConfigError(
                f"early_stopping {self.early_stopping}: expected a validation side to watch "
                f"{self.early_stopping_metric} on, found val_fraction 0; set val_fraction "
                "above 0 or early_stopping 0",
                option="early_stopping",
            )
        if self.model_out is not None and not self.model_out.endswith(".keras"):
            raise ConfigError(f"model_out must end with .keras, got {self.model_out!r}")
        self._check_checkpoint_dir()
        self._check_outputs()
        trainmix.check(self.mix)
        if self.mix and self.strategy == "multi_worker":
            raise ConfigError(
                "mix: expected strategy one, mirrored or auto, found multi_worker", option="mix"
            )
        models.model_spec(self.model, self.image_size)
        if self.model_args and not models.is_user_model(self.model):
            raise ConfigError(f"model {self.model!r} is built in and takes no model_args")

    def _check_checkpoint_dir(self) -> None:
        """The checkpoint folder holds no output and lies in none: its files are removed."""
        if not self.checkpoint_dir:
            return
        folder = os.path.realpath(self.checkpoint_dir)  # links followed: one folder
        for name in OUTPUTS:
            value = getattr(self, name)
            if name == "checkpoint_dir" or not value or "://" in value:
                continue
            path = os.path.realpath(value)
            if path == folder or _inside(path, folder) or _inside(folder, path):
                raise ConfigError(
                    f"checkpoint_dir: expected a folder of its own, found {name} "
                    f"{value!r} overlapping {self.checkpoint_dir!r} (a finished run removes "
                    "its checkpoint files); pass another --checkpoint-dir",
                    option="checkpoint_dir",
                )

    def _check_outputs(self) -> None:
        """No two outputs share a path or lie one inside the other: the export replaced a
        folder holding the model or dvclive's plots, and a split file the metrics."""
        local = [  # as the system resolves them: a link to a folder is that folder
            (name, value, os.path.realpath(value))
            for name in OUTPUTS
            if name != "checkpoint_dir" and (value := getattr(self, name)) and "://" not in value
        ]
        for i, (name, value, path) in enumerate(local):
            for other, other_value, other_path in local[i + 1 :]:
                if path == other_path or _inside(path, other_path) or _inside(other_path, path):
                    raise ConfigError(
                        f"{other}: expected a path of its own, found {other_value!r} "
                        f"overlapping {name} {value!r} (one output would replace the "
                        "other); pass another",
                        option=other,
                    )

    def settings(self) -> dict[str, Any]:
        """Everything the epochs depend on (outputs left out): a checkpoint's key."""
        values = dataclasses.asdict(self)
        # How often a run checkpoints changes none of its steps: a run resumes under another.
        # No mix keeps the key of a run made before the option.
        left_out = (*OUTPUTS, "checkpoint_every_steps", *(() if self.mix else ("mix",)))
        return {k: v for k, v in values.items() if k not in left_out}


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def _augmentations(text: str) -> tuple[str, ...]:
    """``flip,crop`` as names; ``none`` (or ``''``) for none."""
    return tuple(a.strip() for a in text.split(",") if a.strip() not in ("", "none"))


def _none_if_empty(text: str) -> str | None:
    return text or None


_D = TrainConfig()
# The train stage's options, one per field, in field order: its `tfshards train` options
# (made by tfshards.project.stageoptions), its DVC command (the output paths fixed by
# the pipeline, model_args after `--`) and its params.yaml section with comments.
OPTIONS = (
    Option("manifest", str, _D.manifest, "manifest.json of the validated shards (path or URL)."),
    Option(
        "model", str, _D.model,
        f"Model to train: {' | '.join(models.MODELS)}, or package.module:function "
        "(called with the input shape, the class count and the arguments after --).",
        param=True,
        comment="small_cnn | mobilenet_v3_small (needs image_size >= 32) | package.module:function",
    ),
    Option(
        "model_args", dict, {}, "Keyword arguments for a package.module:function model, "
        "after --: --units 64 --rate 0.5.",
        param=True,
        comment="keyword arguments for a package.module:function model (built-ins take none)",
    ),
    Option("epochs", int, _D.epochs, "Passes over the training shards.", param=True),
    Option(
        "batch_size", int, _D.batch_size, "Records per training step.", param=True,
        comment="global: split evenly over the replicas (mirrored, multi_worker)",
    ),
    Option(
        "learning_rate", float, _D.learning_rate, "Learning rate (the peak one under a schedule).",
        param=True, comment="the peak rate under a schedule",
    ),
    Option(
        "optimizer", str, _D.optimizer, f"{' | '.join(optim.OPTIMIZERS)}.",
        param=True, comment="adam | sgd | adamw",
    ),
    Option(
        "momentum", float, _D.momentum, "sgd's momentum.", param=True, comment="sgd only"
    ),
    Option(
        "weight_decay", float, _D.weight_decay, "adamw's decoupled weight decay.",
        param=True, comment="adamw only (decoupled weight decay)",
    ),
    Option(
        "lr_schedule", str, _D.lr_schedule,
        f"{' | '.join(optim.SCHEDULES)}: cosine decays to 0 at the last step.",
        param=True, comment="constant | cosine (half cosine to 0 at the last step)",
    ),
    Option(
        "warmup_epochs", int, _D.warmup_epochs, "Epochs of linear warm-up from 0 (cosine only).",
        param=True, comment="linear warm-up from 0 over this many epochs (cosine only)",
    ),
    Option(
        "early_stopping", int, _D.early_stopping,
        "Stop after N epochs without a better --early-stopping-metric; 0: off.",
        param=True,
        comment="stop after this many epochs without a better early_stopping_metric; 0 = off",
    ),
    Option(
        "early_stopping_metric", str, _D.early_stopping_metric, "val_loss | val_accuracy.",
        param=True, comment="val_loss | val_accuracy",
    ),
    Option(
        "label_smoothing", float, _D.label_smoothing,
        "Share of the target spread over all classes, in [0, 1).",
        param=True, comment="share of each target spread over all classes, in [0, 1)",
    ),
    Option(
        "class_weight", str, _D.class_weight,
        f"{' | '.join(optim.CLASS_WEIGHTS)}: balanced weighs classes by the inverse of "
        "their training record counts.",
        param=True, comment="none | balanced (from the training shards' label counts)",
    ),
    Option(
        "augment", str, "none",
        f"none, or comma-separated among {', '.join(models.AUGMENTATIONS)}: random "
        "horizontal flip, random crop resized back; on the device, training only.",
        param=True, comment="none | flip | crop | flip,crop (on the device, training only)",
        convert=_augmentations,
    ),
    Option(
        "image_dtype", str, _D.image_dtype,
        "float32 | uint8: uint8 sends a quarter of the bytes, scaled in the model.",
        param=True, comment="float32 | uint8 (a quarter of the bytes; scaled in the model)",
    ),
    Option(
        "image_size", int, _D.image_size,
        "Images are resized to SIZE x SIZE (small_cnn >= 8, mobilenet_v3_small >= 32); "
        "the default suits the 8 px digits demo, `tfshards init` writes 64 for photos.",
        param=True, comment="images are resized to this square size, in pixels",
    ),
    Option(
        "scaled_decode", bool, _D.scaled_decode,
        "true: decode a JPEG at least twice --image-size at 1/2, 1/4 or 1/8 scale "
        "before resizing (~30% less CPU at 512 -> 224 px, slightly different pixels); "
        "false: decode whole.",
        param=True, comment="decode large JPEGs at 1/2..1/8 scale, then resize (false: whole)",
    ),
    Option(
        "val_fraction", float, _D.val_fraction,
        "Share of records held out for validation, as whole split buckets.",
        param=True, comment="held out as whole split buckets (the effective fraction is logged)",
    ),
    Option(
        "seed", int, _D.seed, "Seeds Python, NumPy, TensorFlow and the input order.",
        param=True, comment="seeds training: weights, dropout, input order",
    ),
    Option(
        "split_seed", int | None, _D.split_seed,
        "Picks the validation buckets; none: the same as --seed.",
        param=True, comment="picks the validation shards; null = the same as seed",
    ),
    Option(
        "mix", str, "none",
        "none, or PATH:WEIGHT[,PATH:WEIGHT...]: also train on these shard sets' training "
        "sides (manifest.json path or URL), each WEIGHT of every epoch's records, --manifest "
        "the rest (1 - sum); each set is split as --manifest is. Validation stays "
        "--manifest's validation side only. Differing labels, or a file one set trains on "
        "that another validates on, fail the run before training.",
        param=True,
        comment="none | PATH:WEIGHT,... sets mixed in; manifest gets 1 - sum; val: manifest's",
        convert=trainmix.parse,
    ),
    Option(
        "deterministic", bool, _D.deterministic,
        "true: the same seed gives the same run (op determinism, fixed input order); "
        "false: faster on GPU.",
        param=True, comment="op determinism: the same seed gives the same run",
    ),
    Option(
        "mixed_precision", str, _D.mixed_precision,
        f"{' | '.join(MIXED_PRECISION)}: float16 compute; auto = on a GPU only.",
        param=True, comment="auto (on when a GPU is present) | on | off",
    ),
    Option(
        "jit_compile", bool, _D.jit_compile, "true: compile the steps with XLA.",
        param=True, comment="XLA",
    ),
    Option(
        "strategy", str, _D.strategy,
        f"{' | '.join(STRATEGIES)}: mirrored copies the model to every local GPU and "
        "splits each batch (global) between them; auto: mirrored with 2+ GPUs; "
        "multi_worker: the workers of TF_CONFIG each train on their own block of every "
        "epoch, the chief (worker 0) writes the outputs.",
        param=True,
        comment="one | mirrored (a replica per local GPU) | auto (mirrored with 2+ GPUs)"
        " | multi_worker (the hosts of TF_CONFIG)",
    ),
    Option("metrics", str, _D.metrics, "Summary metrics JSON (the DVC metrics file)."),
    Option(
        "live_dir", str, str(_D.live_dir),
        "dvclive directory: per-epoch metrics and plots; '' for none.",
        convert=_none_if_empty,
    ),
    Option("model_out", str, str(_D.model_out), "Where to save the trained model (.keras)."),
    Option(
        "split_out", str, str(_D.split_out),
        "Where to save the train/val split (shards and records per side); '' for none.",
        convert=_none_if_empty,
    ),
    Option(
        "export_out", str, "",
        "Local folder for a SavedModel serving encoded image bytes; '' for none.",
        convert=_none_if_empty,
    ),
    Option(
        "checkpoint_dir", str, "",
        "Local folder for per-epoch checkpoints: a killed run resumes from it. "
        "It must be new, empty or made by tfshards, and hold no other output; "
        "its checkpoint files are removed when the run finishes. '' for none.",
        convert=_none_if_empty,
    ),
    Option(
        "checkpoint_every_steps", int, _D.checkpoint_every_steps,
        "Also checkpoint every N training steps: a killed run resumes mid-epoch; "
        "0: after every epoch only.",
        param=True, comment="also checkpoint every N steps (resume mid-epoch); 0 = per epoch only",
    ),
)  # fmt: skip
