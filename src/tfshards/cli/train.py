"""``tfshards train``: the ``train`` stage (also run by ``stages/train.py``).

TensorFlow is imported when training starts, not with this module, so
``tfshards --help`` stays fast.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tfshards.cli._common import one_line_errors
from tfshards.project.stageoptions import optional_int, parse_bool
from tfshards.training.devices import STRATEGIES
from tfshards.training.models import AUGMENTATIONS, MODELS
from tfshards.training.optim import CLASS_WEIGHTS, OPTIMIZERS, SCHEDULES
from tfshards.training.trainconfig import MIXED_PRECISION, TrainConfig, from_options

DEFAULTS = TrainConfig()
# Arguments after `--` go to a user's model function: what DVC writes for ${train.model_args}.
CONTEXT = {"allow_extra_args": True}


def parse_model_args(args: list[str]) -> dict[str, Any]:
    """``--name value`` pairs (DVC's rendering of a params mapping) as keyword arguments.

    A value is read as JSON when it is JSON (``3``, ``0.5``, ``true``), else
    kept as text; ``--name`` alone is ``True``; several values make a list.
    """
    out: dict[str, Any] = {}
    name = None
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            name = arg[2:].replace("-", "_")
            out[name] = True
        elif name is None:
            raise typer.BadParameter(
                f"expected --name value pairs for the model, got {arg!r}", param_hint="model args"
            )
        else:
            value = _scalar(arg)
            current = out[name]
            out[name] = value if current is True else [*_listed(current), value]
    return out


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


ManifestOption = Annotated[
    str, typer.Option(help="manifest.json of the validated shards (path or fsspec URL).")
]
ModelOption = Annotated[
    str,
    typer.Option(
        help=f"Model to train: {' | '.join(MODELS)}, or package.module:function "
        "(called with the input shape, the class count and the arguments after --)."
    ),
]
EpochsOption = Annotated[int, typer.Option(help="Passes over the training shards.")]
BatchSizeOption = Annotated[int, typer.Option(help="Records per training step.")]
LearningRateOption = Annotated[
    float, typer.Option(help="Learning rate (the peak one under a schedule).")
]
OptimizerOption = Annotated[str, typer.Option(help=f"{' | '.join(OPTIMIZERS)}.")]
MomentumOption = Annotated[float, typer.Option(help="sgd's momentum.")]
WeightDecayOption = Annotated[float, typer.Option(help="adamw's decoupled weight decay.")]
LrScheduleOption = Annotated[
    str, typer.Option(help=f"{' | '.join(SCHEDULES)}: cosine decays to 0 at the last step.")
]
WarmupEpochsOption = Annotated[
    int, typer.Option(help="Epochs of linear warm-up from 0 (cosine only).")
]
EarlyStoppingOption = Annotated[
    int,
    typer.Option(help="Stop after N epochs without a better --early-stopping-metric; 0: off."),
]
EarlyStoppingMetricOption = Annotated[str, typer.Option(help="val_loss | val_accuracy.")]
LabelSmoothingOption = Annotated[
    float, typer.Option(help="Share of the target spread over all classes, in [0, 1).")
]
ClassWeightOption = Annotated[
    str,
    typer.Option(
        help=f"{' | '.join(CLASS_WEIGHTS)}: balanced weighs classes by the inverse of "
        "their training record counts."
    ),
]
AugmentOption = Annotated[
    str,
    typer.Option(
        help=f"none, or comma-separated among {', '.join(AUGMENTATIONS)}: random "
        "horizontal flip, random crop resized back; on the device, training only."
    ),
]
ImageDtypeOption = Annotated[
    str,
    typer.Option(help="float32 | uint8: uint8 sends a quarter of the bytes, scaled in the model."),
]
ImageSizeOption = Annotated[
    int,
    typer.Option(
        help="Images are resized to SIZE x SIZE (small_cnn >= 8, mobilenet_v3_small >= 32)."
    ),
]
ValFractionOption = Annotated[
    float, typer.Option(help="Share of records held out for validation, as whole shards.")
]
SeedOption = Annotated[
    int, typer.Option(help="Seeds Python, NumPy, TensorFlow and the input order.")
]
SplitSeedOption = Annotated[
    str,
    typer.Option(metavar="INT|none", help="Picks the validation shards; none: the same as --seed."),
]
DeterministicOption = Annotated[
    str,
    typer.Option(
        metavar="BOOL",
        help="true: the same seed gives the same run (op determinism, fixed input order); "
        "false: faster on GPU.",
    ),
]
ScaledDecodeOption = Annotated[
    str,
    typer.Option(
        metavar="BOOL",
        help="true: decode a JPEG at least twice --image-size at 1/2, 1/4 or 1/8 scale "
        "before resizing (~30% less CPU at 512 -> 224 px, slightly different pixels); "
        "false: decode whole.",
    ),
]
MixedPrecisionOption = Annotated[
    str,
    typer.Option(help=f"{' | '.join(MIXED_PRECISION)}: float16 compute; auto = on a GPU only."),
]
JitCompileOption = Annotated[
    str, typer.Option(metavar="BOOL", help="true: compile the steps with XLA.")
]
StrategyOption = Annotated[
    str,
    typer.Option(
        help=f"{' | '.join(STRATEGIES)}: mirrored copies the model to every local GPU and "
        "splits each batch (global) between them; auto: mirrored with 2+ GPUs."
    ),
]
MetricsOption = Annotated[str, typer.Option(help="Summary metrics JSON (the DVC metrics file).")]
LiveDirOption = Annotated[str, typer.Option(help="dvclive directory: per-epoch metrics and plots.")]
ModelOutOption = Annotated[str, typer.Option(help="Where to save the trained model (.keras).")]
SplitOutOption = Annotated[
    str, typer.Option(help="Where to save the train/val split (shards and records per side).")
]
ExportOutOption = Annotated[
    str,
    typer.Option(help="Local folder for a SavedModel serving encoded image bytes; '' for none."),
]
CheckpointDirOption = Annotated[
    str,
    typer.Option(
        help="Local folder for per-epoch checkpoints: a killed run resumes from it. "
        "It must be new, empty or made by tfshards, and hold no other output; "
        "its checkpoint files are removed when the run finishes. '' for none."
    ),
]


@one_line_errors
def train_command(
    ctx: typer.Context,
    manifest: ManifestOption = DEFAULTS.manifest,
    model: ModelOption = DEFAULTS.model,
    epochs: EpochsOption = DEFAULTS.epochs,
    batch_size: BatchSizeOption = DEFAULTS.batch_size,
    learning_rate: LearningRateOption = DEFAULTS.learning_rate,
    optimizer: OptimizerOption = DEFAULTS.optimizer,
    momentum: MomentumOption = DEFAULTS.momentum,
    weight_decay: WeightDecayOption = DEFAULTS.weight_decay,
    lr_schedule: LrScheduleOption = DEFAULTS.lr_schedule,
    warmup_epochs: WarmupEpochsOption = DEFAULTS.warmup_epochs,
    early_stopping: EarlyStoppingOption = DEFAULTS.early_stopping,
    early_stopping_metric: EarlyStoppingMetricOption = DEFAULTS.early_stopping_metric,
    label_smoothing: LabelSmoothingOption = DEFAULTS.label_smoothing,
    class_weight: ClassWeightOption = DEFAULTS.class_weight,
    augment: AugmentOption = "none",
    image_dtype: ImageDtypeOption = DEFAULTS.image_dtype,
    image_size: ImageSizeOption = DEFAULTS.image_size,
    val_fraction: ValFractionOption = DEFAULTS.val_fraction,
    seed: SeedOption = DEFAULTS.seed,
    split_seed: SplitSeedOption = "none",
    deterministic: DeterministicOption = "true",
    scaled_decode: ScaledDecodeOption = "true",
    mixed_precision: MixedPrecisionOption = DEFAULTS.mixed_precision,
    jit_compile: JitCompileOption = "false",
    strategy: StrategyOption = DEFAULTS.strategy,
    metrics: MetricsOption = DEFAULTS.metrics,
    live_dir: LiveDirOption = str(DEFAULTS.live_dir),
    model_out: ModelOutOption = str(DEFAULTS.model_out),
    split_out: SplitOutOption = str(DEFAULTS.split_out),
    export_out: ExportOutOption = "",
    checkpoint_dir: CheckpointDirOption = "",
) -> None:
    """Train a classifier on the validated shards of --manifest and log its metrics.

    The shards are split into train and validation by whole files (seeded).
    Every epoch logs loss, accuracy, val_loss, val_accuracy, examples/s and
    input_bound_fraction (the share of step time spent waiting for data: near
    1, the input pipeline is the bottleneck; near 0, the model is) to dvclive.
    On a GPU, mixed precision is on by default and XLA is optional; the same
    code runs on CPU.

    Arguments after -- (``--units 64``) are passed to a package.module:function model.
    """
    # The options are named as TrainConfig's fields; those given as text are parsed here.
    config = from_options(
        {
            **ctx.params,
            "model_args": parse_model_args(ctx.args),
            "scaled_decode": parse_bool(scaled_decode, "--scaled-decode"),
            "split_seed": optional_int(split_seed, "--split-seed"),
            "deterministic": parse_bool(deterministic, "--deterministic"),
            "jit_compile": parse_bool(jit_compile, "--jit-compile"),
        }
    )
    from tfshards.training.train import train

    result = train(config, log=lambda line: typer.echo(line, err=True))
    typer.echo(result.summary())
